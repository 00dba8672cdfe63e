"""The live jobs' collection: its runtime-limited subset stays what a pass over all would find."""

from __future__ import annotations

import logging
import random

from extension.backends.base import JobSpec
from extension.scheduler import Job, JobState, Resources
from extension.service.live import LiveJob, LiveJobs
from extension.service.notebook_devices import NotebookDevices
from extension.service.records import JobKind

ONE = Resources(0, 100, 2**20)


def _record(job_id: str, max_runtime: float | None) -> LiveJob:
    job = Job(id=job_id, user="u", plan="/p", per_worker=ONE, min_workers=1, max_workers=1)
    spec = JobSpec(job_id, "u", "/p/u", ONE, ["true"], "/nowhere")
    return LiveJob(job=job, kind=JobKind.TRAIN, spec=spec, max_runtime=max_runtime)


def test_the_limited_jobs_are_those_with_a_runtime_limit_after_any_changes() -> None:
    rng = random.Random(31)
    live = LiveJobs(NotebookDevices(lambda: None, logging.getLogger("test")))
    for _ in range(2_000):
        job_id = f"job-{rng.randrange(40)}"
        step = rng.random()
        if step < 0.6:  # a new record, or one that replaces the record of the same id
            live.add(_record(job_id, rng.choice([None, 60.0, 0.5])))
        elif step < 0.95 and job_id in live:
            live.end(live[job_id].job, JobState.FINISHED)
        elif step >= 0.995:
            live.clear()
        expected = {i for i, r in live.items() if r.max_runtime is not None}
        assert {r.job.id for r in live.limited()} == expected
        assert set(live.runtimes()) == expected
        assert live.jobs.values() == [r.job for r in live.values()]
        assert live.jobs.get(job_id) is (live[job_id].job if job_id in live else None)
