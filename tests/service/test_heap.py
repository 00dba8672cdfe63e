"""The service gives the C heap's free pages back (extension/service/heap.py, issue 31): a trim
at most once per interval, in a thread, and what a fragmented heap held freed returns to the
system."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest

from extension.service.heap import HeapTrim

LOG = logging.getLogger("test")


def rss_mib() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_a_trim_runs_at_most_once_per_interval_in_a_thread() -> None:
    now = [0.0]
    heap = HeapTrim(LOG, interval=30.0, clock=lambda: now[0])
    threads = []
    heap.trim = lambda pad: threads.append(pad) or 0

    async def cycles() -> None:
        for at in (1.0, 29.0, 31.0, 40.0, 62.0):
            now[0] = at
            heap.after_cycle(None, at, 0.01)
            await asyncio.sleep(0.05)  # the trim's thread

    asyncio.run(cycles())
    assert heap.trims == 2 and threads == [0, 0]  # at 31 and at 62


@pytest.mark.skipif(not HeapTrim(LOG).available, reason="the C library has no malloc_trim")
def test_a_fragmented_heap_gives_its_free_pages_back() -> None:
    """Blocks of 1 KB (malloc's, not Python's small-object pools), one in 64 kept, the rest
    freed: glibc keeps the freed ones (below the blocks kept) until the trim."""
    blocks = [os.urandom(8) * 128 for _ in range(60_000)]  # 60 MiB
    kept = blocks[::64]
    del blocks
    held = rss_mib()
    HeapTrim(LOG).run()
    assert held - rss_mib() > 30, f"{held:.0f} MiB before the trim, {rss_mib():.0f} after"
    assert len(kept) == 938
