"""The spawn page's progress: the admission's events, kept in the spawn's record and streamed to
JupyterHub while the admission waits."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from .record import SpawnRecord
from .spawn_log import SpawnLog


class SpawnProgress:
    """Notes events into a spawn's record (and the hub's log) and streams them."""

    def __init__(self, log: SpawnLog) -> None:
        self.log = log

    def note(self, spawn: SpawnRecord, message: str, progress: int | None = None) -> None:
        event: dict[str, Any] = {"message": message}
        if progress is not None:
            event["progress"] = progress
        spawn.events.append(event)
        if spawn.changed is not None:
            spawn.changed.set()
        self.log.info("%s", message)

    @staticmethod
    async def stream(spawn: SpawnRecord) -> AsyncIterator[dict]:
        """Every event noted so far, then each new one until the admission stops waiting."""
        sent = 0
        while True:
            while sent < len(spawn.events):
                yield spawn.events[sent]
                sent += 1
            if not spawn.waiting:
                break
            changed = spawn.changed
            if changed is None:
                break
            changed.clear()
            try:
                await asyncio.wait_for(changed.wait(), timeout=1)
            except asyncio.TimeoutError:
                pass
