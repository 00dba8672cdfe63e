"""KeyLookups: the Idempotency-Key look-ups that arrive while one read is in the store are
answered by the next read, all at once; each asker gets its own pair's answer or the store's
error."""

from __future__ import annotations

import asyncio

import pytest

from extension.service.key_lookups import KeyLookups, Pair


class Store:
    """A read that waits until released, and remembers the batches it was asked."""

    def __init__(self, jobs: dict[Pair, str], fail: int = -1) -> None:
        self.jobs = jobs
        self.batches: list[list[Pair]] = []
        self.release = asyncio.Event()
        self.fail = fail

    async def read(self, pairs: list[Pair]) -> dict:
        self.batches.append(pairs)
        await self.release.wait()
        if len(self.batches) - 1 == self.fail:
            raise OSError("database is locked")
        return {p: self.jobs[p] for p in pairs if p in self.jobs}


async def test_lookups_that_arrive_meanwhile_go_in_one_read() -> None:
    store = Store({("u1", "k1"): "job-1", ("u2", "k2"): "job-2"})
    lookups = KeyLookups(store.read)
    first = asyncio.ensure_future(lookups.find("u1", "k1"))
    await asyncio.sleep(0)
    asked = [("u2", "k2"), ("u1", "k2"), ("u1", "k1"), *((f"n{i}", "k") for i in range(30))]
    rest = [asyncio.ensure_future(lookups.find(u, k)) for u, k in asked]
    rest.append(asyncio.ensure_future(lookups.find("u2", "k2")))  # the same pair twice
    await asyncio.sleep(0)
    store.release.set()
    answers = await asyncio.gather(first, *rest)
    assert store.batches[0] == [("u1", "k1")]  # an idle store answers the first alone
    assert len(store.batches) == 2 and len(store.batches[1]) == 33  # the rest together
    assert answers[:4] == ["job-1", "job-2", None, "job-1"] and answers[-1] == "job-2"
    assert answers[4:-1] == [None] * 30


async def test_a_failed_read_fails_its_askers_only() -> None:
    store = Store({("u1", "k1"): "job-1"}, fail=0)
    lookups = KeyLookups(store.read)
    failing = [asyncio.ensure_future(lookups.find("u1", "k1")) for _ in range(2)]
    await asyncio.sleep(0)
    later = asyncio.ensure_future(lookups.find("u1", "k1"))
    await asyncio.sleep(0)
    store.release.set()
    for answer in failing:
        with pytest.raises(OSError, match="locked"):
            await answer
    assert await later == "job-1"
    assert await lookups.find("u1", "k1") == "job-1"  # and it goes on


async def test_an_asker_that_went_away_does_not_stop_the_others() -> None:
    store = Store({("u1", "k1"): "job-1"})
    lookups = KeyLookups(store.read)
    gone = asyncio.ensure_future(lookups.find("u1", "k1"))
    stays = asyncio.ensure_future(lookups.find("u1", "k1"))
    await asyncio.sleep(0)
    gone.cancel()
    store.release.set()
    assert await stays == "job-1"
    assert gone.cancelled()
