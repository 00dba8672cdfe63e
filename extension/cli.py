"""The ``wmla`` command.

``wmla simulate --scenario FILE --json`` replays a scenario file through the real scheduler core
in simulated time (SCENARIO-FORMAT.md). Bad input exits 2 with a message and prints no JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="wmla", description="Resource plans and gang-scheduled training for JupyterHub."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sim = sub.add_parser("simulate", help="replay a scenario through the scheduler core")
    sim.add_argument("--scenario", required=True, metavar="FILE", help="scenario YAML file")
    sim.add_argument("--json", action="store_true", help="print the result as one JSON object")
    from extension.cli_client import add_commands

    add_commands(sub)  # logon, exec-start, exec-get, ... (dlicmd parity)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from extension.cli_client import COMMANDS, dlicmd_argv, run

    args = build_parser().parse_args(dlicmd_argv(argv))
    if args.command in COMMANDS:
        return run(args)
    if args.command == "simulate":
        return _simulate(args)
    return 2  # pragma: no cover - argparse refuses unknown commands


def _simulate(args: argparse.Namespace) -> int:
    from extension.sim.engine import public_json, simulate
    from extension.sim.scenario import ScenarioError, load_scenario

    try:
        scenario = load_scenario(args.scenario)
    except ScenarioError as err:
        print(f"wmla simulate: {err}", file=sys.stderr)
        return 2
    result = public_json(simulate(scenario))
    if args.json:
        json.dump(result, sys.stdout, indent=1, sort_keys=True)
        print()
    else:
        for job_id, job in result["jobs"].items():
            line = f"{job_id:<12} {job['state']:<10} {job['charged_to']:<40}"
            print(line + f" start={job['started']} end={job['ended']}")
        print(json.dumps(result["summary"]))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
