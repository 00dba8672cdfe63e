"""Checkpoint reports and churn figures in the service, over a real store (SQLite and
PostgreSQL) and the in-process test double backend, cycles driven by hand.

A ``checkpoint`` event is stored on the job (jobs.checkpointed, migration 0003), given to the
core as ``Job.checkpointed``, shown by the API; it asks for no cycle of its own and only the
latest counts. Every Preempt stores what it cost (held and lost GPU-seconds at the decision,
steady state or not), and metering's churn counters sum those per plan, also after a restart.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from extension.backends.base import BackendEvent
from extension.metering.meter import Metering
from extension.scheduler import SchedulerConfig, lost_work
from extension.service.admin import views
from extension.service.handlers import job_json

from .test_scheduling import Rig

LEAF = "/sample-project/training/user1"


@pytest.fixture
async def rig(tmp_path: Path, store_url: str):
    rig = Rig(tmp_path, store_url)
    await rig.start()
    rig.meter = Metering(store=rig.store, clock=rig.clock, sample_interval=0)
    rig.meter.attach(rig.sched)
    yield rig
    await rig.sched.stop()
    rig.store.close()


def checkpoint(rig: Rig, job: str, at: float, progress: float | None = None) -> None:
    rig.sched.emit(BackendEvent(job, "checkpoint", at, progress=progress))


async def big_job(rig: Rig) -> str:
    """user1's rigid 4-GPU job, running, borrowing /project1's half of the instance."""
    big = await rig.submit("user1", "/sample-project/training", "4")
    await rig.cycle()
    await rig.cycle()  # its running event
    assert [e for e, _ in rig.events(big)] == ["submitted", "started", "running"]
    return big


async def test_a_checkpoint_is_stored_shown_and_given_to_the_core(rig: Rig) -> None:
    big = await big_job(rig)
    history = rig.events(big)
    at = rig.clock() - 1
    checkpoint(rig, big, at - 5, progress=1)
    checkpoint(rig, big, at, progress=2.5)  # the latest wins
    await rig.cycle()
    row = rig.store.job(big)
    assert (row.checkpointed, row.checkpoint_progress) == (pytest.approx(at), 2.5)
    assert job_json(row)["checkpoint"] == {"at": row.checkpointed, "progress": 2.5}
    assert rig.sched.jobs[big].checkpointed == row.checkpointed
    assert rig.events(big) == history  # no transition: nothing changed state or workers
    checkpoint(rig, big, at - 60, progress=0)  # an older one (a re-adopted gang's, late)
    checkpoint(rig, big, at + 3600)  # from the future: never later than now
    await rig.cycle()
    row = rig.store.job(big)
    assert at < row.checkpointed <= rig.clock() and row.checkpoint_progress is None


async def test_no_checkpoint_is_null_and_a_restart_keeps_it(rig: Rig) -> None:
    big = await big_job(rig)
    assert job_json(rig.store.job(big))["checkpoint"] is None
    at = rig.clock()
    checkpoint(rig, big, at, progress=4)
    await rig.cycle()
    await rig.sched.stop()
    rig.store.close()
    rig.open()  # a new service over the same database
    await rig.start()
    assert rig.sched.jobs[big].checkpointed == pytest.approx(at)


async def test_checkpoints_ask_for_no_cycle_and_the_next_one_folds_the_latest(rig: Rig) -> None:
    big = await big_job(rig)
    rig.sched.start_loop()  # the loop, tick 5 s
    await asyncio.sleep(0.2)  # its first wait begins
    cycles = rig.sched.cycles
    at = rig.clock()
    for n in range(1000):  # a flood: each replaces the one before
        checkpoint(rig, big, at - 1000 + n, progress=n)
    await asyncio.sleep(0.5)
    assert rig.sched.cycles == cycles
    await rig.sched.kick()  # any later cycle (a tick, an event) folds them
    row = rig.store.job(big)
    assert (row.checkpointed, row.checkpoint_progress) == (pytest.approx(at - 1), 999)
    assert rig.sched.cycles == cycles + 1


async def test_a_preemption_stores_what_it_cost_and_the_counters_sum_it(rig: Rig) -> None:
    big = await big_job(rig)
    started = rig.store.job(big).started
    rig.clock.offset += 20
    saved = rig.clock() - 8
    checkpoint(rig, big, saved, progress=3)
    await rig.cycle()
    small = await rig.submit("user2", "/project1/qa-team", "2")
    for _ in range(3):
        await rig.cycle()
    assert rig.store.job(big).preemptions == 1 and rig.state(small) == "RUNNING"
    [decision] = [d for d in rig.store.decisions(big) if d.kind == "preempt"]
    detail = decision.detail
    assert detail["lost_gpu_seconds"] == pytest.approx(4 * (decision.at - saved))
    assert detail["held_gpu_seconds"] == pytest.approx(4 * (decision.at - started))
    # decided in the cycle that took the submission in: in the cycle before, the reclaimer's
    # leaf had no demand, so the reclaim answers new demand and is not steady-state churn
    assert detail["steady_state"] is False
    for path in (LEAF, "/sample-project/training", "/sample-project", "/"):
        figures = rig.meter.churn.of(path)
        assert figures.preemptions == 1, path
        assert figures.lost_gpu_seconds == pytest.approx(detail["lost_gpu_seconds"])
        assert figures.preempted_gpu_seconds == pytest.approx(detail["held_gpu_seconds"])
        assert figures.steady_state_preemptions == 0
    assert rig.meter.churn.of("/project1").preemptions == 0  # the reclaimer's plan lost nothing
    # the job keeps its checkpoint while it waits: it resumes from it
    assert rig.store.job(big).checkpointed == pytest.approx(saved)
    restarted = Metering(store=rig.store, clock=rig.clock, sample_interval=0)
    assert restarted.churn.answer() == rig.meter.churn.answer()  # from the stored decisions
    cells = {r["path"]: r["churn"] for r in views.plan_rows(rig.sched, rig.meter.churn)}
    assert cells[LEAF]["preemptions"] == 1
    assert cells[LEAF]["lost"] == f"{detail['lost_gpu_seconds']:.1f}"


async def test_a_reclaim_while_a_plan_is_short_by_more_than_a_gang_is_not_steady(
    rig: Rig,
) -> None:
    rig.sched.config = SchedulerConfig(grace=0.0, min_runtime=30.0)
    big = await big_job(rig)
    # two one-GPU jobs for /project1 while ``big`` is too young to be a victim: a cycle with
    # /project1 short of its deserved 2 GPUs by 2, more than the reclaimer's gang of 1
    for _ in range(2):
        await rig.submit("user2", "/project1/qa-team", "1")
    await rig.cycle()
    assert rig.state(big) == "RUNNING"
    short = rig.sched.figures["/project1"]
    assert (short.deserved.gpu, short.allocated.gpu) == (2, 0)
    rig.clock.offset += 31
    await rig.cycle()
    [decision] = [d for d in rig.store.decisions(big) if d.kind == "preempt"]
    assert decision.detail["steady_state"] is False
    job = rig.sched.jobs[big]
    assert decision.detail["lost_gpu_seconds"] == pytest.approx(lost_work(job, decision.at))
    assert rig.meter.churn.of("/").steady_state_preemptions == 0
    assert rig.meter.churn.of("/").preemptions == 1


async def test_a_victim_without_gpus_costs_no_gpu_seconds(rig: Rig) -> None:
    """As the simulator counts it: the core's functions count its workers instead."""
    from extension.scheduler import Preempt
    from extension.service.changes import preemption_cost

    big = await big_job(rig)
    job = rig.sched.jobs[big]
    job.per_worker = job.per_worker._replace(gpu=0)
    cost = preemption_cost(rig.sched, Preempt(big, 0.0, "test", "nobody"), job, rig.clock() + 9)
    assert cost == {"held_gpu_seconds": 0.0, "lost_gpu_seconds": 0.0, "steady_state": False}
