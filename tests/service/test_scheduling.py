"""The scheduling loop over a real store (SQLite and PostgreSQL) and the in-process test double
backend.

Cycles are driven by hand (``run_loop=False``) with an injected clock, so every step is
deterministic: submit, cycle, backend events, cycle, and the transitions written for each.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from extension.backends.base import AdmissionRefused
from extension.scheduler import UNLIMITED, Node, Resources, SchedulerConfig
from extension.service.actions import Forbidden, NotFound
from extension.service.cancels import Conflict
from extension.service.records import InstanceBounds
from extension.service.scheduling import Scheduler
from extension.service.store import PlanRecord, Store, sqlite_url
from extension.service.submission import LimitRange, Rejected, SubmissionError, parse_submission
from extension.webapi import Caller

from .backend_double import InProcessBackend

GPU = Resources(1, 250, 2**29)
PLANS = {
    "/sample-project": {},
    "/sample-project/training": {},
    "/project1": {},
    "/project1/dev-team": {"share": 4, "limit": {"gpu": 4}},
    "/project1/qa-team": {"share": 2, "limit": {"gpu": 2}, "members": {"users": ["user2"]}},
}


class Clock:
    """Wall-clock time plus what a test added (the double stamps events with time.time())."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


class Rig:
    """A scheduler, its store, the test double backend and a clock, in a temp folder."""

    def __init__(self, tmp: Path, url: str | None = None, gpus: int = 4) -> None:
        """``url``: the store's database (the ``store_url`` fixture); a SQLite file in ``tmp``
        when not given."""
        self.tmp = tmp
        self.clock = Clock()
        self.url = url or sqlite_url(tmp / "wmla.sqlite")
        self.storage = tmp / "storage"
        self.gpus = gpus
        self.open()

    def open(self) -> None:
        self.store = Store.open(self.url)
        self.sched = Scheduler(
            self.store,
            InstanceBounds(Resources(UNLIMITED, UNLIMITED, UNLIMITED)),
            SchedulerConfig(grace=0.0),
            storage_root=self.storage,
            python="python3",
            clock=self.clock,
        )
        self.sched.load(PLANS)
        nodes = [Node("local", Resources(self.gpus, 8000, 64 * 2**30))]
        self.backend = InProcessBackend(self.sched.emit, nodes, str(self.tmp / "backend"))

    async def start(self) -> None:
        await self.sched.start(self.backend, run_loop=False)

    async def cycle(self) -> None:
        await self.sched.cycle()
        await self.sched.drain()

    async def submit(self, user: str, plan: str, workers="1", cpu="250m", **extra) -> str:
        folder = self.storage / user / "models"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "main.py").write_text("print('hi')\n")
        body = {
            "plan": plan,
            "workers": workers,
            "resources": {"gpu": 1, "cpu": cpu},
            "command": {"model_dir": "models", "model_main": "main.py"},
            **extra,
        }
        sub = parse_submission(
            body,
            user=user,
            storage_root=self.storage,
            limit_range=LimitRange.from_config({"default_request": {"cpu": "250m"}}),
            max_workers=64,
        )
        row = await self.sched.submit(Caller(user), sub)
        return row.id

    def state(self, job_id: str) -> str:
        return self.store.job(job_id).state

    def events(self, job_id: str) -> list[tuple[str, int]]:
        return [(t.event, t.workers) for t in self.store.transitions(job_id)]


@pytest.fixture
async def rig(tmp_path: Path, store_url: str):
    rig = Rig(tmp_path, store_url)
    await rig.start()
    yield rig
    await rig.sched.stop()
    rig.store.close()


async def test_submit_start_finish_records_every_transition(rig: Rig) -> None:
    job = await rig.submit("user1", "/project1/dev-team", "2", env={"DOUBLE_RUN_SECONDS": "0"})
    assert rig.state(job) == "PENDING"
    assert "/project1/dev-team/user1" in rig.sched.plans  # the user leaf, created on first use
    await rig.cycle()  # Start -> backend.start -> running event queued
    assert rig.state(job) == "RUNNING"
    assert rig.backend.calls[-1] == ("start", job, ("local", "local"))
    await asyncio.sleep(0.01)  # the double's zero-second run ends
    rig.clock.offset += 5
    await rig.cycle()
    row = rig.store.job(job)
    assert row.state == "FINISHED" and row.placement == []
    assert rig.events(job) == [("submitted", 0), ("started", 2), ("running", 2), ("finished", 0)]
    history = rig.store.transitions(job)
    assert history[1].leaf == "/project1/dev-team/user1"
    ids = [t.id for t in history]
    assert [t.id for t in rig.store.transitions(leaf_prefix="/project1")] == ids
    assert rig.store.transitions(leaf_prefix="/project") == []  # a plan, not a string prefix
    assert [t.id for t in rig.store.transitions(since_id=ids[1])] == ids[2:]
    assert (history[1].gpu, history[1].cpu) == (1, 250)
    assert [d.kind for d in rig.store.decisions(job)] == ["start"]


async def test_failed_worker_fails_the_job_with_the_message(rig: Rig) -> None:
    env = {"DOUBLE_RUN_SECONDS": "0", "DOUBLE_EXIT_CODE": "3"}
    job = await rig.submit("user1", "/sample-project/training", env=env)
    await rig.cycle()
    await asyncio.sleep(0.01)
    await rig.cycle()
    row = rig.store.job(job)
    assert (row.state, row.exit_code) == ("FAILED", 3)
    assert "exited with code 3" in row.reason


async def test_elastic_reclaim_shrinks_then_starts_the_other_user(rig: Rig) -> None:
    """S4 through the loop: user1's elastic job holds 4, user2's arrives, user1 shrinks to 2."""
    first = await rig.submit("user1", "/sample-project/training", "1:4")
    await rig.cycle()
    assert len(rig.store.job(first).placement) == 4  # started at 1 and grown to 4 at once
    second = await rig.submit("user2", "/sample-project/training", "1:4")
    for _ in range(4):
        await rig.cycle()
    assert len(rig.store.job(first).placement) == 2
    assert len(rig.store.job(second).placement) == 2
    assert ("shrinking", 4) in rig.events(first) and ("resized", 2) in rig.events(first)
    resize = [c for c in rig.backend.calls if c[0] == "resize" and c[1] == first]
    assert resize[-1][2] == ("local", "local")


async def test_rigid_preemption_requeues_and_restarts(rig: Rig) -> None:
    """A borrower's rigid gang is stopped whole, goes back to the queue, and runs again."""
    big = await rig.submit("user1", "/sample-project/training", "4")  # borrows /project1's half
    await rig.cycle()
    assert rig.state(big) == "RUNNING"
    # the same cpu as ``big``: when both are pending at ratio 0 the fair order's tie-break
    # would favour ``big``; the reservation carried from the reclaiming cycle gives the freed
    # GPUs to ``small`` instead, so ``big`` is not started and preempted again (thrash)
    small = await rig.submit("user2", "/project1/qa-team", "2")
    for _ in range(6):
        await rig.cycle()
    row = rig.store.job(big)
    assert row.preemptions == 1 and row.state == "PENDING"
    assert rig.state(small) == "RUNNING"
    assert [e for e, _ in rig.events(big)][-2:] == ["preempting", "released"]
    await rig.sched.cancel(Caller("user2"), small)
    await rig.sched.drain()
    for _ in range(2):
        await rig.cycle()
    assert rig.state(small) == "CANCELLED"
    assert rig.state(big) == "RUNNING"


async def test_cancel_pending_and_running(rig: Rig) -> None:
    running = await rig.submit("user1", "/sample-project/training", "4")
    await rig.cycle()
    waiting = await rig.submit("user1", "/sample-project/training", "4")
    await rig.cycle()
    assert rig.state(waiting) == "PENDING"
    assert "waiting" in rig.store.job(waiting).reason
    await rig.sched.cancel(Caller("user1"), waiting)
    assert rig.state(waiting) == "CANCELLED"
    with pytest.raises(NotFound):
        await rig.sched.cancel(Caller("user2"), running)  # not yours: as if it did not exist
    await rig.sched.cancel(Caller("user1"), running)  # its cycle stores it, then the stop
    await rig.sched.drain()
    await rig.cycle()
    assert rig.state(running) == "CANCELLED"
    assert rig.store.job(running).reason == "cancelled by user1"
    with pytest.raises(Conflict):
        await rig.sched.cancel(Caller("user1"), running)


async def test_rejected_at_submit_names_plan_resource_limit_request(rig: Rig) -> None:
    with pytest.raises(Rejected) as err:
        await rig.submit("user2", "/project1/qa-team", "4")
    message = str(err.value)
    assert "/project1/qa-team" in message and "gpu limit of 2" in message
    assert "asks for 4" in message
    assert rig.store.jobs() == []  # nothing written


async def test_membership_refusal_names_usable_plans(rig: Rig) -> None:
    with pytest.raises(Forbidden) as err:
        await rig.submit("user1", "/project1/qa-team", "1")
    message = str(err.value)
    assert "/project1/qa-team" in message and "/project1/dev-team" in message
    assert "/sample-project/training" in message
    usable = rig.sched.usable_plans(Caller("user1"))
    assert "/project1/qa-team" not in usable
    assert "/project1/qa-team" in rig.sched.usable_plans(Caller("someone", admin=True))
    assert "/project1/qa-team" in rig.sched.usable_plans(Caller("user2"))


async def test_group_membership_on_an_ancestor_admits(rig: Rig) -> None:
    rec = rig.sched.record("/project1")
    rec.groups = ["ml"]
    await rig.sched.change_plans([rec], create=False)
    assert not rig.sched.may_submit(Caller("user3"), "/project1/dev-team")
    assert rig.sched.may_submit(Caller("user3", frozenset({"ml"})), "/project1/dev-team")


async def test_restart_keeps_plans_jobs_and_readopts_running(rig: Rig) -> None:
    running = await rig.submit("user1", "/project1/dev-team", "2")
    await rig.cycle()
    waiting = await rig.submit("user1", "/project1/dev-team", "4")
    await rig.cycle()
    rec = PlanRecord("/project2", 3.0, Resources(2, UNLIMITED, UNLIMITED))
    await rig.sched.change_plans([rec], create=True)
    await rig.sched.stop()
    rig.store.close()

    rig.open()  # a new service process over the same database
    await rig.start()
    assert rig.backend.calls[0] == ("recover", (running,))
    assert rig.state(running) == "RUNNING" and rig.state(waiting) == "PENDING"
    assert rig.sched.plans.get("/project2").share == 3.0
    assert rig.sched.plans.get("/project2").limit.gpu == 2
    assert rig.sched.plans.get("/project1/dev-team/user1").user_leaf
    assert rig.sched.members["/project1/qa-team"] == (["user2"], [])
    assert set(rig.sched.jobs) == {running, waiting}
    await rig.cycle()
    assert rig.state(running) == "RUNNING"  # nothing restarted twice
    assert [c for c in rig.backend.calls if c[0] == "start"] == []


async def test_plan_changes_validate_on_a_copy(rig: Rig) -> None:
    from extension.scheduler import PlanError

    before = [p.to_dict() for p in rig.sched.plans]
    bad = PlanRecord("/project1/dev-team", 1.0, Resources(8, UNLIMITED, UNLIMITED))
    rec = rig.sched.record("/project1")
    rec.limit = Resources(2, UNLIMITED, UNLIMITED)  # below dev-team's 4: refused
    with pytest.raises(PlanError):
        await rig.sched.change_plans([rec], create=False)
    with pytest.raises(PlanError):
        await rig.sched.change_plans([bad], create=True)  # exists already
    assert [p.to_dict() for p in rig.sched.plans] == before
    assert {p.path for p in rig.store.plans()} == {p["path"] for p in before}


def test_alembic_schema_matches_the_models(store_url: str) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from extension.service.rows import Base

    store = Store.open(store_url)
    with store.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    store.close()
    assert diff == []


class PlatformBackend(InProcessBackend):
    """The test double plus the optional hooks a cluster backend has (quota, admission check,
    queue sync), as the Kubernetes backend offers them."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.synced: list[list[str]] = []

    def quota(self) -> Resources:
        return Resources(2, UNLIMITED, UNLIMITED)

    def admission_problem(self, per_worker: Resources, workers: int):
        if per_worker.cpu > 1000:
            return ("LimitRange lr-test allows at most 1 cpu per container", True)
        return None

    async def sync_queues(self, plans) -> None:
        self.synced.append([p.path for p in plans])


async def test_optional_platform_hooks(tmp_path: Path, store_url: str) -> None:
    rig = Rig(tmp_path, store_url)
    nodes = rig.backend.nodes
    rig.backend = PlatformBackend(rig.sched.emit, nodes, str(tmp_path / "backend"))
    await rig.start()
    try:
        assert rig.sched.instance.capacity.gpu == 2  # the platform's quota cuts the 4 GPUs
        with pytest.raises(Rejected, match="at most 1 cpu per container"):
            await rig.submit("user1", "/sample-project/training", "1", cpu="2")
        await rig.submit("user1", "/sample-project/training", "1")
        await rig.sched.drain()
        assert "/sample-project/training/user1" in rig.backend.synced[-1]
    finally:
        await rig.sched.stop()
        rig.store.close()


async def test_a_cycle_the_store_refuses_carries_out_nothing(rig: Rig, monkeypatch) -> None:
    job = await rig.submit("user1", "/sample-project/training", "2")
    real = rig.store.commit_cycle

    def refuse(*args, **kwargs):
        raise RuntimeError("database is locked")

    monkeypatch.setattr(rig.store, "commit_cycle", refuse)
    with pytest.raises(RuntimeError):
        await rig.sched.cycle()
    assert rig.backend.calls == []  # no start went out for a decision that was not stored
    assert rig.sched.jobs[job].state.value == "PENDING"
    monkeypatch.setattr(rig.store, "commit_cycle", real)
    await rig.cycle()
    assert rig.state(job) == "RUNNING" and rig.backend.calls[-1][0] == "start"


async def test_cycle_hooks_see_every_cycle_and_cannot_break_it(rig: Rig) -> None:
    seen = []

    def broken(result, now, seconds) -> None:
        raise RuntimeError("listener bug")

    rig.sched.cycle_hooks += [broken, lambda r, now, s: seen.append((sorted(r.plans), s >= 0))]
    job = await rig.submit("user1", "/sample-project/training", "1")
    await rig.cycle()
    assert rig.state(job) == "RUNNING"
    assert seen and "/sample-project/training/user1" in seen[-1][0] and seen[-1][1]


class _RefusedForNow(AdmissionRefused):
    """What KubernetesBackend raises when a namespace quota would refuse a pod for now."""

    def __init__(self, message: str) -> None:
        super().__init__(message, permanent=False)


async def test_a_start_the_platform_refuses_for_now_goes_back_to_the_queue(rig: Rig) -> None:
    real_start = rig.backend.start
    refusals = []

    async def refuse_once(spec, placement):  # noqa: ANN001, ANN202 - the double's own signature
        if not refusals:
            refusals.append(spec.id)
            raise _RefusedForNow("exceeded quota: pods=3, used: pods=3, limited: pods=3")
        await real_start(spec, placement)

    rig.backend.start = refuse_once
    job = await rig.submit("user1", "/project1/dev-team", "1")
    await rig.cycle()
    await rig.sched.drain()
    await rig.cycle()  # the refusal is folded in: pending again, not failed
    row = rig.store.job(job)
    assert refusals == [job]
    assert row.state in ("PENDING", "RUNNING") and row.preemptions == 0
    assert "refused" in [e for e, _ in rig.events(job)]
    await rig.cycle()
    await rig.sched.drain()
    await rig.cycle()
    assert rig.state(job) == "RUNNING"  # started again once the platform took it


async def test_only_plans_without_child_plans_take_jobs(rig: Rig) -> None:
    """Issue 38: /sample-project was offered and accepted; its user leaf then sat beside its
    child plans and took a part of each one's share."""
    with pytest.raises(SubmissionError) as err:
        await rig.submit("user1", "/sample-project", "1")
    message = str(err.value)
    assert message.startswith("/sample-project has plans under it") and message.endswith(
        "pick one of /sample-project/training"
    )
    assert "/sample-project/user1" not in rig.sched.plans and rig.store.jobs() == []
    for caller in (Caller("user1"), Caller("someone", admin=True)):
        usable = rig.sched.usable_plans(caller)
        assert "/sample-project" not in usable and "/project1" not in usable
        assert "/sample-project/training" in usable
    # a plan whose users have submitted keeps taking jobs: their leaves are not child plans
    await rig.submit("user1", "/sample-project/training", "1")
    assert "/sample-project/training/user1" in rig.sched.plans
    assert "/sample-project/training" in rig.sched.usable_plans(Caller("user1"))
    await rig.submit("user2", "/sample-project/training", "1")
