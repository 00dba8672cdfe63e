"""The ``wmla`` command.

``wmla simulate --scenario FILE --json`` replays a scenario file through the real scheduler core
in simulated time (SCENARIO-FORMAT.md); ``wmla simulate --trace CSV --nodes N --gpus-per-node G
--policy all`` replays a cluster trace under the core and baseline policies (docs/simulate.md).
Bad input exits 2 with a message and prints no JSON. ``wmla backup FOLDER`` (an admin's, on the
hub's machine) copies the databases while they run (extension/backup.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="wmla", description="Resource plans and gang-scheduled training for JupyterHub."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sim = sub.add_parser(
        "simulate",
        help="replay a scenario or a cluster trace through the scheduler core and baselines",
    )
    from extension.sim.command import add_arguments

    add_arguments(sim)
    from extension import backup

    backup.add_arguments(
        sub.add_parser(
            "backup",
            help="(admin, on the hub's machine) copy the hub's and the service's databases "
            "while they run",
            description="Consistent copies of the hub's and the wmla service's SQLite "
            "databases and of the password hashes, taken while they run (SQLite's backup API), "
            "0600 in FOLDER. A PostgreSQL store: use pg_dump (docs/deploy.md).",
        )
    )
    from extension.cli_client import add_commands

    add_commands(sub)  # logon, exec-start, exec-get, ... (dlicmd parity)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from extension.cli_client import COMMANDS, dlicmd_argv, run, slurm_hint

    argv = dlicmd_argv(argv)
    hint = slurm_hint(argv)
    if hint:
        print(hint, file=sys.stderr)
        return 2
    args = build_parser().parse_args(argv)
    if args.command in COMMANDS:
        return run(args)
    if args.command == "simulate":
        return _simulate(args)
    if args.command == "backup":
        from extension.backup import run as run_backup

        return run_backup(args)
    return 2  # pragma: no cover - argparse refuses unknown commands


def _simulate(args: argparse.Namespace) -> int:
    from extension.sim.command import run

    return run(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
