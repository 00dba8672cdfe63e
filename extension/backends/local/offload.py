"""Blocking work of the local backend, off the event loop: a cgroup's mkdir or rmdir waits for
the kernel's cgroup lock, and a file of the state directory for the disk's journal, milliseconds
each on a busy machine (a start made 6 such calls per worker, a gang's end 7), which the loop
must not wait for while it answers submissions."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class Offload:
    """A few threads of their own (``threads``, named ``name``) that run blocking calls for
    the event loop; what each call touches must be safe from a thread."""

    def __init__(self, name: str, threads: int) -> None:
        self.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in one of the threads, awaited."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, functools.partial(fn, *args))

    def close(self) -> None:
        """No new calls; those under way finish."""
        self.executor.shutdown(wait=False)
