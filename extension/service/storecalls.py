"""Store calls off the event loop, and what the service does while the database is unavailable.

Every store call runs in a thread. Writes go through one writer thread (SQLite has one writer
anyway, and one order of writes keeps the history in the order it happened); reads through a
small pool (SQLite's WAL readers are not blocked by a writer, PostgreSQL serves them
concurrently). The loop awaits them, except the scheduling cycle's own read and write: while
the store is up the loop's thread blocks on those for ``HOLD`` (50 ms) at most, then awaits
(``StoreCalls._held``), so a locked or slow store holds the loop up for no longer than that.

A database that is locked by another process, read-only, full or unreachable makes a call fail
with ``StoreUnavailable`` (the REST API answers 503 JSON with ``Retry-After``). From then on the
store counts as down: writes of requests fail at once, without queueing behind the lock, until
one of the scheduling loop's own writes (``probe=True``: its cycle, its lease) gets through.
The loop keeps the backend events it could not store and folds them again (scheduling.py).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, TypeVar

from sqlalchemy import exc

from extension.webapi import Unavailable

T = TypeVar("T")
log = logging.getLogger(__name__)

# what a database says when it cannot serve now (locked, read-only, disk I/O, connection lost,
# pool exhausted); an IntegrityError or a programming error is not among them
UNAVAILABLE = (exc.OperationalError, exc.InterfaceError, exc.TimeoutError, exc.DisconnectionError)
# the longest the loop's thread blocks on a scheduling cycle's store call (``_held``): several
# times a cycle's writes at 500 submissions/s (5-15 ms)
HOLD = 0.05


class StoreUnavailable(Unavailable):
    """The database cannot serve now; the caller may try again after ``retry_after`` seconds
    (the API answers 503 with ``Retry-After``)."""


class StoreCalls:
    """Runs the store's blocking calls in threads and keeps track of whether it is up."""

    def __init__(
        self,
        readers: int = 4,
        retry_after: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        reset: Callable[[], None] | None = None,
    ) -> None:
        """``reset``: drops the pool's idle connections after a failure (a SQLite connection
        opened while the file was read-only stays read-only for good)."""
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="wmla-store-write")
        self._readers = ThreadPoolExecutor(readers, thread_name_prefix="wmla-store-read")
        self.retry_after = retry_after
        self.clock = clock
        self.reset = reset
        self.down_since: float | None = None  # monotonic time of the first failure in a row
        self.error: str | None = None  # the database's words, while down
        self.held_took = 0.0  # seconds the last held call took in its thread (``_held``)

    @property
    def up(self) -> bool:
        return self.down_since is None

    def unavailable(self) -> StoreUnavailable:
        down = 0.0 if self.down_since is None else self.clock() - self.down_since
        return StoreUnavailable(
            f"the service's database is unavailable ({self.error or 'unknown error'}; for "
            f"{down:.0f} s); nothing was changed: try again in {self.retry_after:.0f} s",
            self.retry_after,
        )

    async def read(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        # reads are tried while down: SQLite's WAL serves them past a writer's lock
        call = functools.partial(self._call, False, False, fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._readers, call)

    async def write(
        self, fn: Callable[..., T], *args: Any, probe: bool = False, **kwargs: Any
    ) -> T:
        """``probe``: try even while the store is down (the loop's writes find out it is back)."""
        if not probe and not self.up:
            raise self.unavailable()
        call = functools.partial(self._call, True, not probe, fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._writer, call)

    async def cycle_read(self, fn: Callable[..., T], *args: Any) -> T:
        """The scheduling cycle's read: in the writer thread (in the readers' pool it would
        queue behind the requests' reads, one per submission), held (``_held``)."""
        return await self._held(functools.partial(self._call, False, False, fn, *args))

    async def cycle_write(self, fn: Callable[..., T], *args: Any) -> T:
        """The scheduling cycle's write: a probe (``write``), held (``_held``)."""
        return await self._held(functools.partial(self._call, True, False, fn, *args))

    async def _held(self, call: Callable[[], T]) -> T:
        """``call`` in the writer thread; while the store is up the loop's thread blocks on it
        for ``HOLD`` seconds at most before it awaits it. Why: a call in a thread takes the GIL
        back after every row it steps, and while request handlers hold it each take waits up to
        the interpreter's switch interval (5 ms), and an awaited result then queues behind every
        callback ready: under 450 submissions/s the cycle's store calls took 3 to 10 times their
        own CPU (loop p99 124-144 ms; held: 34-40 ms, benchmarks/bench_service.py). Past
        ``HOLD`` (a locked or slow store) the loop goes back to serving requests, and holds
        none until one takes less than ``HOLD`` again (a remote database that answers slowly
        but answers)."""

        def timed() -> T:
            began = time.perf_counter()
            try:
                return call()
            finally:
                self.held_took = time.perf_counter() - began

        hold = self.up and self.held_took < HOLD
        future = self._writer.submit(timed)
        if hold and wait([future], timeout=HOLD).done:
            return future.result()  # not awaited: see above
        return await asyncio.wrap_future(future)

    def _call(
        self, write: bool, fail_fast: bool, fn: Callable[..., T], *args: Any, **kwargs: Any
    ) -> T:
        # checked again in the thread: a write queued behind one that waits on a lock fails
        # as soon as that one has found the store down, instead of waiting its own turn
        if fail_fast and not self.up:
            raise self.unavailable()
        try:
            result = fn(*args, **kwargs)
        except UNAVAILABLE as err:
            self._down(err)
            raise self.unavailable() from err
        if write:  # only a write that got through says the store is back
            self._back()
        return result

    def _down(self, err: Exception) -> None:
        words = str(getattr(err, "orig", None) or err).splitlines()[0][:200]
        if self.down_since is None:
            self.down_since = self.clock()
            log.error("wmla: the database is unavailable: %s", words)
        self.error = words
        if self.reset is not None:
            try:
                self.reset()
            except Exception:  # the next call finds out again
                log.debug("could not reset the store's connections", exc_info=True)

    def _back(self) -> None:
        if self.down_since is not None:
            log.warning("wmla: the database is back after %.1f s", self.clock() - self.down_since)
        self.down_since, self.error = None, None

    def close(self) -> None:
        self._writer.shutdown(wait=True)
        self._readers.shutdown(wait=True)
