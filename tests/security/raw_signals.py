"""What a supervisor that starts the hub or the service with signals ignored leaves them, set
past glibc (``worker_launcher.raw_sigaction``), for the tests of ``reset_signals``."""

from __future__ import annotations

import re
from pathlib import Path

from extension.backends.local.worker_launcher import RT_SIGACTION, SIG_IGN, raw_sigaction

RAW = RT_SIGACTION is not None  # the machine's rt_sigaction number is known
PLANTED = (10, 32)  # SIGUSR1, and glibc's own 32 that Python cannot touch


def ignored(pid: int | str = "self") -> set[int]:
    """The signals process ``pid`` ignores, from its SigIgn mask."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(re.search(r"^SigIgn:\s*(\w+)", status, re.M).group(1), 16)
    return {bit + 1 for bit in range(64) if mask >> bit & 1}


def ignore_planted() -> None:
    """A ``preexec_fn``: the child starts with ``PLANTED`` ignored, as under such a supervisor."""
    for sig in PLANTED:
        raw_sigaction(sig, SIG_IGN)
