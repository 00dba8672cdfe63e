"""A job's store row in the core's terms (``Job``) and the backend's (``JobSpec``)."""

from __future__ import annotations

from extension.backends.base import JobSpec
from extension.scheduler import Job, JobState, Resources

from .rows import JobRow


def core_job(row: JobRow) -> Job:
    """The job as the core sees it (its last checkpoint included: the victims' order)."""
    return Job(
        id=row.id,
        user=row.user,
        plan=row.plan,
        per_worker=Resources(row.gpu, row.cpu, row.memory),
        min_workers=row.min_workers,
        max_workers=row.max_workers,
        priority=row.priority,
        submitted=row.submitted,
        preemptible=row.preemptible,
        state=JobState(row.state),
        placement=tuple(row.placement or ()),
        started=row.started,
        terminating=bool(row.terminating),
        checkpointed=row.checkpointed,
        aged=bool(row.aged),
    )


def job_spec(row: JobRow) -> JobSpec:
    """What the backend needs to run the job's workers."""
    return JobSpec(
        id=row.id,
        user=row.user,
        leaf=row.leaf,
        per_worker=Resources(row.gpu, row.cpu, row.memory),
        command=tuple(row.command or ()),
        workdir=row.workdir,
        min_workers=row.min_workers,
        max_workers=row.max_workers,
        env=dict(row.env or {}),
        kind=row.kind,
        limits=_limits(row),
    )


def _limits(row: JobRow) -> Resources | None:
    """The row's per-worker limits (stored as a dict of amounts; a missing one: the request)."""
    stored = row.limits or {}
    if not isinstance(stored, dict) or not stored:
        return None
    request = (row.gpu, row.cpu, row.memory)
    return Resources(*(float(stored.get(n, r)) for n, r in zip(("gpu", "cpu", "memory"), request)))
