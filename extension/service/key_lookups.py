"""Idempotency-Key look-ups, batched: every submission with a key asks the store whether the
key made a job already, and almost never did. Asked one by one, those reads were a thread
hop and a query each, queued four at a time behind each other (the store's readers): a fifth
of a submission's time under load, and most of the first hundred's. Here the look-ups that
arrive while one read is in the store wait for the next, which asks for all of them at once;
an idle service still answers the first alone, at once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from .store import JobRow

Pair = tuple[str, str]  # (user, key)
Read = Callable[[list[Pair]], Awaitable[dict[Pair, JobRow]]]


class KeyLookups:
    """``find(user, key)``: the job ``user`` made with ``key``, or None; ``read`` answers a
    batch (``Store.jobs_by_keys`` in a store thread)."""

    def __init__(self, read: Read) -> None:
        self._read = read
        self._queued: dict[Pair, list[asyncio.Future]] = {}
        self._drainer: asyncio.Future | None = None  # held: the loop keeps tasks only weakly

    async def find(self, user: str, key: str) -> JobRow | None:
        answer: asyncio.Future = asyncio.get_running_loop().create_future()
        self._queued.setdefault((user, key), []).append(answer)
        if self._drainer is None:
            self._drainer = asyncio.ensure_future(self._drain())
        return await answer

    async def _drain(self) -> None:
        try:
            while self._queued:
                batch, self._queued = self._queued, {}
                try:
                    found = await self._read(list(batch))
                except Exception as err:  # the store's error is each asker's own answer
                    for answer in _waiting(batch):
                        answer.set_exception(err)
                    continue
                for pair, answers in batch.items():
                    for answer in answers:
                        if not answer.done():  # its asker went away (cancelled)
                            answer.set_result(found.get(pair))
        finally:
            self._drainer = None


def _waiting(batch: dict[Pair, list[asyncio.Future]]) -> list[asyncio.Future]:
    """The answers still awaited (an asker that went away was cancelled)."""
    return [answer for answers in batch.values() for answer in answers if not answer.done()]
