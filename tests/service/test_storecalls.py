"""The scheduling cycle's store calls (storecalls.StoreCalls.cycle_read / cycle_write): run in
the writer thread and held by the loop's thread for HOLD seconds at most, so that under load
they run at the speed of their own CPU; past HOLD, or while the store is down, the loop serves
everything else. And the loop's pacing: cycles apart by their own length, at most CYCLE_GAP."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import exc

from extension.service import storecalls
from extension.service.pacing import CYCLE_GAP, GAP_PER_CYCLE, cycle_gap
from extension.service.storecalls import StoreCalls, StoreUnavailable
from extension.webapi import Caller

from .test_faults import submission
from .test_scheduling import Rig


@pytest.fixture
def calls():
    calls = StoreCalls()
    yield calls
    calls.close()


async def test_a_held_call_is_answered_without_letting_the_loop_run_anything_else(calls) -> None:
    """Awaiting a thread's result queues the caller behind every callback ready (under load,
    50 handlers: 80 ms); a held call that is done within HOLD returns at once."""
    ran = []
    asyncio.get_running_loop().call_soon(ran.append, "other")
    assert await calls.cycle_write(threading.current_thread) is not threading.current_thread()
    assert ran == []  # nothing else ran meanwhile
    await calls.write(len, "ab")  # an ordinary write is awaited: the callback runs
    assert ran == ["other"]


async def test_the_cycle_read_runs_in_the_writer_thread_and_says_nothing_of_the_store(
    calls,
) -> None:
    def fail() -> None:
        raise exc.OperationalError("SELECT 1", {}, sqlite3.OperationalError("database is locked"))

    with pytest.raises(StoreUnavailable):
        await calls.cycle_write(fail)
    assert not calls.up
    name = await calls.cycle_read(lambda: threading.current_thread().name)
    assert name.startswith("wmla-store-write")
    assert not calls.up  # a read that gets through does not say the store takes writes
    with pytest.raises(StoreUnavailable):
        await calls.read(fail)
    await calls.cycle_write(lambda: None)  # the cycle's write is a probe: tried while down
    assert calls.up


async def _lateness(calls: StoreCalls, seconds: float) -> float:
    """How long a callback made ready before the cycle's write waits to run, when the write
    waits on that very callback (``seconds`` at most: then the write returns False)."""
    release = threading.Event()
    began = time.perf_counter()
    ran: list[float] = []

    def other() -> None:
        ran.append(time.perf_counter() - began)
        release.set()

    asyncio.get_running_loop().call_soon(other)
    assert await calls.cycle_write(release.wait, seconds) is True  # released by the callback
    return ran[0]


async def test_a_slow_store_holds_the_loop_up_for_hold_at_most(calls, monkeypatch) -> None:
    monkeypatch.setattr(storecalls, "HOLD", 0.2)
    late = await _lateness(calls, 2.0)
    assert 0.15 <= late < 1.0  # held for HOLD, then the loop went back to its work


async def test_a_store_slower_than_hold_is_not_held_until_it_is_fast_again(
    calls, monkeypatch
) -> None:
    monkeypatch.setattr(storecalls, "HOLD", 0.2)
    await calls.cycle_write(time.sleep, 0.3)  # answers, but slower than HOLD
    assert await _lateness(calls, 5.0) < 0.1  # not held: the loop went on at once
    # that call took a moment in its thread (released at once): the next is held again
    assert 0.15 <= await _lateness(calls, 5.0) < 1.0


async def test_while_the_store_is_down_the_loop_is_not_held(calls, monkeypatch) -> None:
    monkeypatch.setattr(storecalls, "HOLD", 5.0)
    calls.down_since = calls.clock()
    late = await _lateness(calls, 10.0)
    assert late < 1.0  # not the 5 s HOLD


async def _cycle_starts(rig: Rig, cycle: float, submissions: int) -> tuple[list, list]:
    """Run the loop with each cycle lasting at least ``cycle`` seconds; submit once while it is
    idle, then ``submissions`` one after the other, each as soon as the last was answered.
    The cycles' starts and lengths."""
    starts: list[float] = []
    lengths: list[float] = []
    real = rig.sched.run_cycle

    async def timed() -> bool:
        began = time.perf_counter()
        starts.append(began)
        ok = await real()
        await asyncio.sleep(max(0.0, cycle - (time.perf_counter() - began)))
        lengths.append(time.perf_counter() - began)
        return ok

    rig.sched.run_cycle = timed
    await rig.sched.start(rig.backend, run_loop=True)
    try:
        await asyncio.sleep(3 * CYCLE_GAP)  # idle: the first cycle came and went
        idle = time.perf_counter()
        await rig.sched.submit(Caller("user1"), submission(rig, "user1"))
        assert starts[-1] - idle < CYCLE_GAP  # an idle loop starts at once
        for _ in range(submissions):
            await rig.sched.submit(Caller("user1"), submission(rig, "user1"))
        assert len(rig.store.jobs(user="user1")) == submissions + 1
    finally:
        await rig.sched.stop()
        rig.store.close()
    return starts, lengths


async def test_long_cycles_under_a_stream_of_submissions_are_cycle_gap_apart(
    tmp_path: Path,
) -> None:
    """Cycles of 30 ms: each starts CYCLE_GAP (50 ms) after the last one began, what came
    meanwhile in one batch."""
    starts, _ = await _cycle_starts(Rig(tmp_path, gpus=64), 0.03, 4)
    gaps = [b - a for a, b in zip(starts, starts[1:])][-4:]
    assert all(gap >= CYCLE_GAP * 0.99 for gap in gaps), gaps


def test_the_gap_after_a_cycle_follows_its_length_up_to_cycle_gap() -> None:
    """A fixed 50 ms gave a client who waits for each answer one answer per 51 ms."""
    assert cycle_gap(0.0) == 0.0  # an idle loop's first cycle starts at once
    assert cycle_gap(0.004) == pytest.approx((1 + GAP_PER_CYCLE) * 0.004)
    assert cycle_gap(0.004) < CYCLE_GAP / 2
    assert cycle_gap(0.03) == cycle_gap(1.0) == CYCLE_GAP


async def test_short_cycles_answer_one_request_after_another_without_the_full_gap(
    tmp_path: Path,
) -> None:
    """Cycles of 2 ms (the store left out): a caller who asks for a cycle and waits for it,
    again and again, is not held to CYCLE_GAP; the cycles still start cycle_gap apart."""
    rig = Rig(tmp_path, gpus=64)
    starts: list[float] = []
    lengths: list[float] = []

    async def quick() -> bool:
        began = time.perf_counter()
        starts.append(began)
        await asyncio.sleep(0.002)
        lengths.append(time.perf_counter() - began)
        return True

    rig.sched.run_cycle = quick
    await rig.sched.start(rig.backend, run_loop=True)
    try:
        await asyncio.sleep(3 * CYCLE_GAP)  # idle: the first cycle came and went
        for _ in range(8):
            await rig.sched.kick()
    finally:
        await rig.sched.stop()
        rig.store.close()
    pairs = list(zip([b - a for a, b in zip(starts, starts[1:])], lengths))[-8:]
    for gap, before in pairs:
        assert gap >= cycle_gap(before) * 0.99, pairs
    gaps = sorted(gap for gap, _ in pairs)
    assert gaps[len(gaps) // 2] < CYCLE_GAP / 2, pairs  # the fixed gap held each to 50 ms
