"""The scheduling cycle's writes as executemany statements (Store.commit_cycle): the values a
new job's row and a transition hold, and one UPDATE per set of changed columns. Cheaper than
the ORM's unit of work by about half, which is most of the service's cost per submission
(benchmarks/bench_service.py)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam

from extension.metering.transitions import Transition

from .rows import JobRow

# what a transition copies from its job, and what commit_cycle reads of a job it changes
ROW_COLUMNS = ("id", "leaf", "state", "gpu", "cpu", "memory", "placement", "preemptions")


def job_values(row: JobRow) -> dict[str, Any]:
    return {c.key: getattr(row, c.key) for c in JobRow.__table__.columns}


def transition_values(
    job: dict[str, Any], at: float, kind: Transition, reason: str
) -> dict[str, Any]:
    placement = list(job.get("placement") or [])
    return {
        "at": at,
        "job_id": job["id"],
        "leaf": job["leaf"],
        "event": kind.value,
        "state": job["state"],
        "workers": len(placement),
        "gpu": job["gpu"],
        "cpu": job["cpu"],
        "memory": job["memory"],
        "placement": placement,
        "reason": reason or "",
    }


def update_jobs(conn: Any, updates: dict[str, dict]) -> None:
    """One executemany UPDATE per set of changed columns."""
    jobs = JobRow.__table__
    groups: dict[tuple[str, ...], list[dict]] = {}
    for job_id, values in updates.items():
        groups.setdefault(tuple(sorted(values)), []).append({"_id": job_id, **values})
    for keys, params in groups.items():
        statement = (
            jobs.update()
            .where(jobs.c.id == bindparam("_id"))
            .values({k: bindparam(k) for k in keys})
        )
        conn.execute(statement, params)
