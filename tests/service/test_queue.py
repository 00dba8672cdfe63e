"""The waiting line (extension/service/queue.py): places in line, reasons and estimated starts of
pending jobs, from the real core run forward over the service's live state.

The rig is test_scheduling's: a real store, the in-process double backend, an injected clock,
cycles driven by hand. The forward runs go through a thread here (``in_process = False``) except
in the tests that check the child process and the loop's own refreshes.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from extension.service.queue import (
    WaitingLine,
    duration_words,
    in_words,
    ordinal,
    waiting_reason,
)
from extension.service.records import StoreChange
from extension.webapi import Caller

from .test_scheduling import Rig

PLAN = "/sample-project/training"


@pytest.fixture
async def rig(tmp_path: Path):
    rig = Rig(tmp_path)
    rig.sched.queue.in_process = False
    await rig.start()
    yield rig
    await rig.sched.stop()
    rig.store.close()


async def fill(rig: Rig, user: str = "user9") -> str:
    """A 4-GPU job that holds every GPU of the rig until stopped (not preemptible: the
    pending jobs of the other users in the plan wait for it instead of reclaiming)."""
    job = await rig.submit(user, PLAN, "4", preemptible=False)
    await rig.cycle()
    assert rig.state(job) == "RUNNING"
    return job


def started(rig: Rig, job: str) -> float:
    return rig.store.job(job).started


@pytest.mark.parametrize(
    ("n", "word"),
    [(1, "1st"), (2, "2nd"), (3, "3rd"), (4, "4th"), (11, "11th"), (12, "12th"), (13, "13th")]
    + [(21, "21st"), (22, "22nd"), (101, "101st"), (111, "111th")],
)
def test_ordinals(n: int, word: str) -> None:
    assert ordinal(n) == word


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "within a minute"),
        (59, "within a minute"),
        (60, "in about 1 minute"),
        (720, "in about 12 minutes"),
        (89 * 60, "in about 89 minutes"),
        (3 * 3600, "in about 3 hours"),
        (3 * 86400, "in about 3 days"),
    ],
)
def test_estimate_words(seconds: float, text: str) -> None:
    assert in_words(seconds) == text
    assert duration_words(6 * 3600) == "6 hours"


async def test_places_reasons_and_estimates_of_jobs_behind_a_full_cluster(rig: Rig) -> None:
    """Every GPU is held by a job without a limit and without history: it is assumed to end at
    the default runtime, and then the three pending 1-GPU jobs all start."""
    big = await fill(rig)
    a = await rig.submit("user1", PLAN)
    b = await rig.submit("user2", PLAN)
    c = await rig.submit("user1", PLAN)
    await rig.cycle()
    line = rig.sched.queue
    line.default_runtime = 3600.0
    await line.refresh()
    views = line.views()
    assert set(views) == {a, b, c}
    places = {job: views[job]["position"] for job in (a, b, c)}
    assert sorted(p["instance"] for p in places.values()) == [1, 2, 3]
    assert [p["plan"] for p in places.values()] == [p["instance"] for p in places.values()]
    assert sorted(places[j]["leaf"] for j in (a, c)) == [1, 2]  # user1's own line
    assert places[b]["leaf"] == 1
    assert places[a]["leaf"] < places[c]["leaf"]  # same user, same shape: submitted first
    first = min(views.values(), key=lambda v: v["position"]["instance"])
    assert first["reason"].startswith(f"1st in line in {PLAN}; training holds 4 of its ")
    assert "waiting for capacity" in first["reason"]
    for view in views.values():
        estimate = view["estimate"]
        assert estimate["start"] == pytest.approx(started(rig, big) + 3600.0)
        assert estimate["text"] == "in about 60 minutes"
        assert estimate["exact"] is True
        assert "1 has none" in estimate["assumption"]
        assert "no new submissions" in estimate["assumption"]
    # the API's view of one job is the same object; a running job has none
    assert line.view(rig.store.job(a)) == views[a]
    assert line.view(rig.store.job(big)) is None


async def test_a_running_job_ends_at_its_users_median_runtime_in_that_plan(rig: Rig) -> None:
    """History: user9 ran two jobs of 100 s and 300 s in the plan before: the running one is
    assumed to end 200 s after its start, and the pending job starts then."""
    for seconds in (100.0, 300.0):
        done = await rig.submit("user9", PLAN, env={"DOUBLE_RUN_SECONDS": "0"})
        await rig.cycle()
        await asyncio.sleep(0.01)
        await rig.cycle()
        assert rig.state(done) == "FINISHED"
        at = rig.store.job(done).started
        rig.store.update_jobs([StoreChange(done, {"started": at, "ended": at + seconds})], at)
    big = await fill(rig)
    waiting = await rig.submit("user1", PLAN)
    await rig.cycle()
    await rig.sched.queue.refresh()
    estimate = rig.sched.queue.views()[waiting]["estimate"]
    assert estimate["start"] == pytest.approx(started(rig, big) + 200.0)
    # a user without history in the plan gets the plan's median (the same two jobs here)
    assert rig.sched.queue._history.median("nobody", PLAN, "train") == pytest.approx(200.0)


async def test_jobs_that_started_or_arrived_since_the_last_estimate(rig: Rig) -> None:
    """A job that started is shown as running (no queue); one submitted since the estimate
    has its reason but no place or estimate until the next run."""
    big = await fill(rig)
    first = await rig.submit("user1", PLAN)
    await rig.cycle()
    await rig.sched.queue.refresh()
    assert first in rig.sched.queue.views()
    late = await rig.submit("user2", PLAN)
    await rig.cycle()
    view = rig.sched.queue.view(rig.store.job(late))
    assert view["position"] is None and view["estimate"] is None
    assert "waiting for capacity" in view["reason"]
    await rig.sched.cancel(Caller("user9"), big)
    await rig.sched.drain()
    await rig.cycle()
    await rig.cycle()
    assert rig.state(first) == "RUNNING"
    assert rig.sched.queue.view(rig.store.job(first)) is None
    await rig.sched.queue.refresh()
    assert set(rig.sched.queue.views()) <= {late}


async def test_the_forward_run_happens_in_a_child_process(rig: Rig) -> None:
    await fill(rig)
    waiting = await rig.submit("user1", PLAN)
    await rig.cycle()
    line = rig.sched.queue
    line.in_process = True
    await line.refresh()
    assert line.views()[waiting]["position"]["instance"] == 1
    pool = line._pool
    assert pool is not None and type(pool).__name__ == "ProcessPoolExecutor"
    children = list(pool._processes.values())  # the spawned child
    assert children and all(p.is_alive() for p in children)
    line.close()
    deadline = time.monotonic() + 10
    for child in children:
        # the pool's own thread reaps the child too: a join that loses that race to waitpid
        # returns at once with the exit not yet recorded, so look again until the deadline
        while child.is_alive() and time.monotonic() < deadline:
            child.join(0.1)
        assert not child.is_alive()  # closing the line ends its child


async def test_the_loop_refreshes_the_line_after_cycles(tmp_path: Path) -> None:
    """With the loop running, a submission that must wait gets its place and estimate within a
    few seconds, without anyone asking; the cycles go on meanwhile."""
    rig = Rig(tmp_path)
    rig.sched.queue.in_process = False
    rig.sched.queue.interval = 0.2
    rig.sched.tick = 0.1
    await rig.sched.start(rig.backend)
    try:
        big = await rig.submit("user9", PLAN, "4", preemptible=False)
        await rig.sched.kick()
        waiting = await rig.submit("user1", PLAN)
        await rig.sched.kick()
        for _ in range(100):
            view = rig.sched.queue.views().get(waiting)
            if view is not None:
                break
            await asyncio.sleep(0.05)
        assert view is not None, "the loop never refreshed the waiting line"
        assert view["position"] == {"leaf": 1, "plan": 1, "instance": 1}
        assert rig.state(big) == "RUNNING"
        runs = rig.sched.queue.runs
        await asyncio.sleep(0.6)
        assert rig.sched.queue.runs <= runs + 4  # bounded by the interval, not every tick
    finally:
        await rig.sched.stop()
        rig.store.close()


async def test_a_failing_estimate_is_logged_and_the_cycles_go_on(rig: Rig, monkeypatch) -> None:
    await fill(rig)
    waiting = await rig.submit("user1", PLAN)
    await rig.cycle()

    def broken(args, budget):
        raise RuntimeError("boom")

    monkeypatch.setattr("extension.service.queue._forward", broken)
    with pytest.raises(RuntimeError):
        await rig.sched.queue.refresh()
    await rig.cycle()
    assert rig.sched.last_error is None
    assert rig.sched.queue.view(rig.store.job(waiting))["estimate"] is None


class _Figures:
    def __init__(self, gpu: tuple, cpu: tuple) -> None:
        from extension.scheduler import Resources

        self.allocated = Resources(gpu[0], cpu[0] * 1000, 0)
        self.deserved = Resources(gpu[1], cpu[1] * 1000, 0)


def test_the_reason_names_the_jobs_main_resource() -> None:
    from extension.scheduler import Job, Resources

    gpu_job = Job("j", "ann", "/project1/qa-team", Resources(1, 1000, 0))
    cpu_job = Job("k", "ann", "/project1/qa-team", Resources(0, 500, 0))
    figures = _Figures(gpu=(8, 8), cpu=(6, 12.5))
    assert waiting_reason(gpu_job, 3, figures, "waiting for capacity: x") == (
        "3rd in line in /project1/qa-team; qa-team holds 8 of its 8 deserved GPUs; "
        "waiting for capacity: x"
    )
    assert "qa-team holds 6 of its 12.5 deserved CPUs" in waiting_reason(cpu_job, 1, figures, "")
    assert waiting_reason(gpu_job, 2, None, "") == "2nd in line in /project1/qa-team"


def test_a_line_without_estimates_never_starts_a_run() -> None:
    class Sched:
        loop_started = True

    line = WaitingLine(Sched(), interval=0)
    line.after_cycle(None, 0.0, 0.0)
    assert line._running is None and line._pool is None


async def test_with_runtime_limits_the_estimate_is_the_real_start(rig: Rig) -> None:
    """Every job runs to its limit: the estimates are exact and each job first starts when
    they said, through the service's own cycles (the filler is stopped at its limit and ends
    TIMEOUT; user1's 2-GPU job and user2's 4-GPU gang, which holds the reservation, then share
    the plan as the core decides, cycle after cycle: the forward run has those cycles too)."""
    big = await rig.submit("user9", PLAN, "4", preemptible=False, max_runtime="10m")
    await rig.cycle()
    waiting = await rig.submit("user1", PLAN, "2", max_runtime=300)
    gang = await rig.submit("user2", PLAN, "4", max_runtime=60)
    await rig.cycle()
    await rig.sched.queue.refresh()
    views = rig.sched.queue.views()
    t0 = started(rig, big)
    estimates = {job: views[job]["estimate"] for job in (waiting, gang)}
    assert all(e["exact"] and "none" not in e["assumption"] for e in estimates.values())
    assert estimates[waiting]["start"] == pytest.approx(t0 + 600)  # under its share: at once
    for step in (600, 300, 60):
        rig.clock.offset += step
        for _ in range(4):
            await rig.cycle()
        if step == 600:
            assert rig.state(big) == "TIMEOUT"
    for job in (waiting, gang):
        first = next(t.at for t in rig.store.transitions(job) if t.event == "started")
        assert first == pytest.approx(estimates[job]["start"], abs=2.0), job


def test_a_job_without_a_start_says_why_and_a_rough_one_says_so() -> None:
    from extension.service.queue import NO_START, ROUGH, _estimate
    from extension.sim.estimate import Estimate, Estimates

    estimates = Estimates({}, cycles=1, exact=False, horizon=5.0, seconds=0.1)
    view = _estimate(Estimate(None, 3), 0.0, estimates, "no new submissions")
    assert view == {
        "start": None,
        "in_seconds": None,
        "text": NO_START,
        "assumption": "no new submissions",
        "exact": False,
    }
    view = _estimate(Estimate(7200.0, 4, rough=True), 0.0, estimates, "no new submissions")
    assert view == {
        "start": 7200.0,
        "in_seconds": 7200,
        "text": "in about 2 hours",
        "assumption": f"no new submissions; {ROUGH}",
        "exact": False,
    }


def test_the_assumption_reads_right_for_one_job_without_a_limit_and_for_several() -> None:
    from extension.service.queue import _assumption

    assert _assumption(1, True) == (
        "running jobs end at their runtime limits (1 has none: its end is estimated from its "
        "user's finished jobs); no new submissions"
    )
    assert _assumption(3, True) == (
        "running jobs end at their runtime limits (3 have none: their ends are estimated from "
        "their users' finished jobs); no new submissions"
    )
