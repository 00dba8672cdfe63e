"""``python -m devcluster up|down|status|build [--var DIR] [--layout NxG]``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from . import components
from .build import Builder, BuildError
from .cluster import ClusterError, LocalCluster

REPO = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devcluster", description=__doc__)
    parser.add_argument("command", choices=("up", "down", "status", "build"))
    parser.add_argument(
        "--var",
        default=os.environ.get("WMLA_K8S_VAR") or str(REPO / "var" / "k8s"),
        help="where the cluster's state lives (default var/k8s, or $WMLA_K8S_VAR)",
    )
    parser.add_argument(
        "--layout",
        default=os.environ.get("WMLA_DEVICE_LAYOUT") or "1x4",
        help="KWOK nodes x GPUs per node (default $WMLA_DEVICE_LAYOUT, else 1x4)",
    )
    parser.add_argument("--with-kueue", action="store_true", help="build also include Kueue")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            # the kubelet too: the real node's tests start it without downloading anything
            wanted = (*components.CLUSTER, components.KUBELET)
            Builder().build((*wanted, components.KUEUE) if args.with_kueue else wanted)
            return 0
        cluster = LocalCluster(Path(args.var), layout=args.layout)
        if args.command == "up":
            cluster.up()
        elif args.command == "down":
            cluster.down()
            print(f"devcluster: down ({args.var})", file=sys.stderr)
        else:
            up = cluster.is_up()
            print(f"up at {cluster.server()}" if up else "down")
            return 0 if up else 3
    except (ClusterError, BuildError, ValueError) as err:
        print(err, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
