"""Signal dispositions set past glibc, which refuses its own 32 and 33: what a supervisor that
starts the hub or the service with signals ignored leaves them (tests of ``reset_signals``)."""

from __future__ import annotations

import ctypes
import os
import platform
import re
import sys
from pathlib import Path

RAW = platform.machine() == "x86_64"  # the raw call's number below is x86_64's
SIG_DFL, SIG_IGN = 0, 1
PLANTED = (10, 32)  # SIGUSR1, and glibc's own 32 that Python cannot touch


def raw_disposition(sig: int, handler: int) -> None:
    """rt_sigaction(sig, handler) in this process (SIG_DFL 0, SIG_IGN 1)."""
    action = ctypes.create_string_buffer(64)
    action[:8] = handler.to_bytes(8, sys.byteorder)
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.syscall(13, sig, action, None, 8) == 0, os.strerror(ctypes.get_errno())


def ignored(pid: int | str = "self") -> set[int]:
    """The signals process ``pid`` ignores, from its SigIgn mask."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(re.search(r"^SigIgn:\s*(\w+)", status, re.M).group(1), 16)
    return {bit + 1 for bit in range(64) if mask >> bit & 1}


def ignore_planted() -> None:
    """A ``preexec_fn``: the child starts with ``PLANTED`` ignored, as under such a supervisor."""
    for sig in PLANTED:
        raw_disposition(sig, SIG_IGN)
