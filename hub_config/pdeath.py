"""Run a command that ends when the process that started it dies, even by ``kill -9``.

JupyterHub stops its managed services when it shuts down, but a hub killed outright (SIGKILL,
the OOM killer, a crash) stops nothing: a service that does not watch for it keeps running with
init as its parent, polling a hub that is gone with a token the next hub will not know. On Linux
the kernel can signal a process when its parent dies (``prctl(PR_SET_PDEATHSIG)``); the setting
survives ``execve``, so this module sets it and then execs the command in its place: no extra
process, and the command's own signal handling is untouched (SIGTERM by default, which
jupyterhub-idle-culler, a plain tornado program, dies of).

    python -m hub_config.pdeath [--signal=TERM] COMMAND [ARG ...]

Used by ``hub_config.culler.culler_services`` for the idle cullers. Where the call is not
available (not Linux) the command runs without it, with one line on stderr saying so.

The kernel sends the signal when the *thread* that forked the child exits; JupyterHub starts its
services from its event loop's thread, which lives as long as the hub. A parent that dies after
the call is always noticed, and one that died between reading its pid and the call too; one that
died while this interpreter was still starting (tens of milliseconds after the fork) is not,
since its pid is then already the reaper's.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Sequence

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
USAGE = "usage: python -m hub_config.pdeath [--signal=TERM] COMMAND [ARG ...]"


def set_parent_death_signal(signum: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send ``signum`` to this process when its parent dies; False where the
    call is not available (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return False
    if prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")
    return True


def parse(argv: Sequence[str]) -> tuple[int, list[str]]:
    """(signal number, command) from the arguments; ValueError with the usage when wrong."""
    args = list(argv)
    signum = int(signal.SIGTERM)
    if args and args[0].startswith("--signal="):
        name = args.pop(0).split("=", 1)[1].upper().removeprefix("SIG")
        try:
            signum = int(name) if name.isdigit() else int(getattr(signal, f"SIG{name}"))
        except AttributeError:
            raise ValueError(f"unknown signal {name!r}\n{USAGE}") from None
    if args and args[0] == "--":
        args.pop(0)
    if not args:
        raise ValueError(USAGE)
    return signum, args


def main(argv: Sequence[str] | None = None) -> None:
    """Set the parent-death signal, then become the command (``os.execvp``)."""
    try:
        signum, command = parse(sys.argv[1:] if argv is None else argv)
    except ValueError as err:
        print(err, file=sys.stderr)
        raise SystemExit(2) from None
    parent = os.getppid()
    if set_parent_death_signal(signum):
        # the parent may have died before the call: then nobody would ever send the signal
        if os.getppid() != parent:
            raise SystemExit(f"pdeath: the parent ({parent}) is gone; not starting {command[0]}")
    else:
        print(
            f"pdeath: no parent-death signal on {sys.platform}; {command[0]} may outlive its "
            "parent",
            file=sys.stderr,
        )
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
