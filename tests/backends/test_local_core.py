"""The real scheduler core driving the local backend's real processes: S5 and S4
(docs/scheduling.md "Scenarios every implementation must pass").

A small driver stands in for the service's loop (which has its own tests): it runs a cycle,
carries out the decisions on the backend, and feeds the backend's events back into the jobs.
"""

from __future__ import annotations

import asyncio

from extension.backends.base import BackendEvent
from extension.runtime import metrics
from extension.scheduler import (
    Grow,
    Instance,
    Job,
    JobState,
    PlanTree,
    Preempt,
    Resources,
    Shrink,
    Snapshot,
    Start,
    schedule,
)

PLAN = "/sample-project/training"


class Driver:
    def __init__(self, rig, layout: str = "1x4") -> None:
        self.rig = rig
        self.events: list[BackendEvent] = []
        self.backend = rig.backend(layout, events=self)
        self.plans = PlanTree()
        self.plans.add("/sample-project")
        self.plans.add(PLAN)
        self.jobs: dict[str, Job] = {}
        self.specs = {}
        self.samples: list[dict[str, list[tuple[str, tuple[int, ...]]]]] = []

    def __call__(self, event: BackendEvent) -> None:  # the backend's emit
        self.events.append(event)
        job = self.jobs[event.job_id]
        if event.kind in ("finished", "failed"):
            job.state = JobState.FINISHED if event.kind == "finished" else JobState.FAILED
            job.placement = ()
        elif event.kind == "released":
            job.state, job.placement = JobState.PENDING, ()
        elif event.kind == "checkpoint":  # as the service folds it: the victims' order
            job.checkpointed = event.at

    def submit(self, job_id: str, user: str, workers: tuple[int, int], env: dict) -> None:
        self.jobs[job_id] = Job(
            job_id, user, PLAN, Resources(1, 1000, 2**30), workers[0], workers[1], submitted=0
        )
        self.specs[job_id] = self.rig.spec(job_id, user=user, env=env)

    async def cycle(self, now: float) -> list:
        instance = Instance(tuple(self.backend.capacity()))
        snapshot = Snapshot(self.plans, instance, list(self.jobs.values()))
        decisions = schedule(snapshot, now).decisions
        for d in decisions:
            job = self.jobs[d.job_id]
            if isinstance(d, Start):
                job.state, job.placement, job.started = JobState.RUNNING, d.placement, now
                await self.backend.start(self.specs[job.id], d.placement)
            elif isinstance(d, Shrink):
                kept = list(job.placement)
                for node in d.release:  # the highest ranks go first
                    del kept[len(kept) - 1 - kept[::-1].index(node)]
                job.placement = tuple(kept)
                await self.backend.resize(self.specs[job.id], job.placement, d.grace)
            elif isinstance(d, Grow):
                job.placement = (*job.placement, *d.add)
                await self.backend.resize(self.specs[job.id], job.placement, 30)
            elif isinstance(d, Preempt):
                await self.backend.stop(job.id, d.grace, d.reason)
        return decisions

    def sample(self) -> None:
        self.samples.append({j: self.backend.gang_devices(j) for j in self.jobs})


async def test_s5_six_two_worker_gangs_on_four_devices_all_finish_never_partly(
    local_rig,
) -> None:
    driver = Driver(local_rig)
    for i in range(1, 7):
        driver.submit(f"pytorch-{i}", f"user{i}", (2, 2), {"STEPS": "8"})

    async def watch() -> None:
        while True:
            driver.sample()
            await asyncio.sleep(0.02)

    watcher = asyncio.get_running_loop().create_task(watch())
    try:
        now = 0.0
        while any(j.state in (JobState.PENDING, JobState.RUNNING) for j in driver.jobs.values()):
            await driver.cycle(now)
            driver.sample()
            await asyncio.sleep(0.1)
            now += 0.1
            assert now < 300, "S5 did not drain"
    finally:
        watcher.cancel()

    assert all(j.state == JobState.FINISHED for j in driver.jobs.values())
    assert max(sum(1 for held in s.values() if held) for s in driver.samples) == 2
    for sample in driver.samples:
        devices = [d for held in sample.values() for _, ds in held for d in ds]
        assert len(devices) == len(set(devices)) <= 4  # no device in two gangs at once
        for held in sample.values():
            assert len(held) in (0, 2)  # a gang holds all of its workers or nothing
    for i in range(1, 7):
        assert len(list((local_rig.workdir(f"pytorch-{i}", f"user{i}") / "logs").iterdir())) == 2


async def test_s4_an_elastic_job_shrinks_for_a_second_user_and_resumes(local_rig) -> None:
    driver = Driver(local_rig)
    driver.submit("elastic-1", "user1", (1, 4), {})
    await driver.cycle(0)
    assert driver.backend.gang_devices("elastic-1") == [("local", (d,)) for d in range(4)]
    first = local_rig.workdir("elastic-1", "user1") / "metrics.jsonl"
    await local_rig.wait_until(lambda: len(metrics.read(str(first))) >= 5, "user1 progress")

    driver.submit("elastic-2", "user2", (1, 4), {})
    for now in (1.0, 2.0, 3.0):  # the shrink, then the start on what it freed
        await driver.cycle(now)
    assert len(driver.backend.gang_devices("elastic-1")) == 2  # users share 1:1
    assert len(driver.backend.gang_devices("elastic-2")) == 2
    kinds = [e.kind for e in driver.events if e.job_id == "elastic-1"]
    # the checkpoint it wrote on SIGTERM was reported before the resize ended
    assert kinds == ["running", "checkpoint", "resized"]
    assert driver.jobs["elastic-1"].checkpointed is not None

    await local_rig.wait_until(
        lambda: metrics.read(str(first))[-1].get("world") == 2, "user1 running at 2"
    )
    starts = [x for x in metrics.read(str(first)) if x.get("phase") == "start"]
    assert [x["world"] for x in starts] == [4, 2]
    assert starts[1]["step"] > 0  # resumed from the checkpoint written on SIGTERM
    for job_id in ("elastic-1", "elastic-2"):
        await driver.backend.stop(job_id, grace=30, reason="test over")
    assert driver.backend.devices_in_use() == {}
