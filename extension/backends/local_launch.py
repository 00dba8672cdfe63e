"""The tiny parent of every local worker: runs the command, records how it ended.

The backend starts ``python -I local_launch.py --exit-file F [--uid U --gid G --groups A,B] --
argv...`` as the leader of a new session (its own process group). It runs the worker as its
child in the same group, so SIGTERM/SIGKILL to the group reach both, and writes the worker's exit
status to ``F`` (``{"code": .., "at": ..}``, atomically) before exiting itself. That file is how a
backend that restarted, and so is no longer the parent, still learns a worker's exit code.

It ignores SIGTERM, SIGINT and SIGHUP with a no-op handler (not SIG_IGN, which the worker would
inherit): the worker decides what SIGTERM means, this process only waits for it. SIGKILL ends
both, and then there is no file, which the backend reads as "killed".

When the service runs as root, the launcher stays root (so it can write the exit file into the
backend's state directory) and only the worker runs as the user's account.

Standard library only; run with ``-I`` so nothing from the job's environment is imported here.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time


def _noop(signum, frame):  # noqa: ANN001 - signal handler signature
    pass


def _write_exit(path: str, code: int) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as out:
        json.dump({"code": code, "at": time.time()}, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="wmla-launch")
    parser.add_argument("--exit-file", required=True)
    parser.add_argument("--uid", type=int)
    parser.add_argument("--gid", type=int)
    parser.add_argument("--groups", default="")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command after --")
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _noop)
    kwargs: dict = {}
    if args.uid is not None:
        kwargs["user"] = args.uid
        kwargs["group"] = args.gid
        kwargs["extra_groups"] = [int(g) for g in args.groups.split(",") if g]
    try:
        child = subprocess.Popen(command, **kwargs)
    except OSError as err:
        print(f"wmla: cannot start {command[0]!r}: {err}", file=sys.stderr, flush=True)
        code = 127
    else:
        code = child.wait()
    _write_exit(args.exit_file, code)
    # A worker killed by signal N reads as -N in the file; the launcher itself exits like a shell.
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
