"""The tasks the backend runs beside the calls it is given (a job's end reported once its logs
are read, a stop retried while the API server is away), all cancelled when it closes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable


class Background:
    """Tasks started and forgotten by the caller, kept here until they end or are cancelled."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task] = set()

    def spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def cancel(self) -> list[asyncio.Task]:
        """Cancel every task; the caller awaits the ones returned (with its own)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        return tasks


async def finish(tasks: list[asyncio.Task]) -> None:
    """Await cancelled tasks, whatever they end with."""
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
