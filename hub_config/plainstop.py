"""Run a Python module as ``__main__`` so that SIGINT and SIGTERM end it at once, quietly.

JupyterHub stops a managed service with SIGINT, then (30 s later) SIGTERM, then SIGKILL, one
service after another. A Python program dies of SIGINT with a ``KeyboardInterrupt`` traceback,
and one started from a shell script, ``nohup`` or a supervisor that ignores SIGINT inherits it
ignored (an ignored signal survives ``execve``): the hub then waits the whole 30 s for it. This
module gives both signals back their default action (the kernel ends the process, nothing is
printed) before it runs the module, whatever was inherited:

    python -m hub_config.plainstop MODULE [ARG ...]

Used for the idle cullers (``hub_config.culler``), plain tornado programs with nothing to save
at their end. A signal that arrives while this interpreter itself is starting (tens of
milliseconds, before this module runs) still gets Python's own handling.
"""

from __future__ import annotations

import runpy
import signal
import sys
from collections.abc import Sequence

USAGE = "usage: python -m hub_config.plainstop MODULE [ARG ...]"


def plain_stop_signals() -> None:
    """SIGINT and SIGTERM back to the kernel's default action: the process ends at once."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0].startswith("-"):
        print(USAGE, file=sys.stderr)
        raise SystemExit(2)
    plain_stop_signals()
    sys.argv = args  # the module sees its own arguments (argv[0] becomes its file)
    runpy.run_module(args[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
