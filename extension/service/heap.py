"""Giving the C heap's free pages back to the system, now and then (docs/service.md "Memory over
100,000 jobs").

What the service allocates per request and per cycle is freed, but glibc's malloc keeps the freed
memory of its heap wherever a block still in use sits above it: under a stream of submissions the
heap's free space grew by about 150 bytes per job (``mallinfo2``: 17 MiB more free, not used, after
40,000 jobs), and the RSS with it. ``malloc_trim(0)`` hands every whole free page back
(``madvise``), wherever it lies. ``HeapTrim.after_cycle`` is a cycle hook that does so at most
once per ``interval`` seconds, in a thread of its own (the call takes the allocator's locks, not
the GIL); where the C library has no ``malloc_trim`` (musl, macOS) it does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import time
from collections.abc import Callable
from typing import Any

INTERVAL = 30.0  # seconds between two trims at most


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


class HeapTrim:
    """A cycle hook (``Scheduler.cycle_hooks``) that trims the C heap every ``interval``
    seconds at most; ``trims`` counts the trims done."""

    def __init__(
        self,
        log: logging.Logger,
        interval: float = INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log = log
        self.interval = interval
        self.clock = clock
        self.trim = _malloc_trim()
        self.trims = 0
        self._last = clock()
        self._running: asyncio.Future | None = None

    @property
    def available(self) -> bool:
        return self.trim is not None

    def after_cycle(self, result: Any, now: float, seconds: float) -> None:
        """Start a trim in a thread when ``interval`` has passed since the last one began."""
        if self.trim is None or (self._running is not None and not self._running.done()):
            return
        at = self.clock()
        if at - self._last < self.interval:
            return
        self._last = at
        self._running = asyncio.get_running_loop().run_in_executor(None, self.run)

    def run(self) -> None:
        """One trim, now (in whatever thread calls it)."""
        if self.trim is None:
            return
        began = time.perf_counter()
        self.trim(0)
        self.trims += 1
        self.log.debug("heap trimmed in %.1f ms", 1000 * (time.perf_counter() - began))
