"""The admin page's waiting lines: each plan's pending jobs in the order the service expects to
start them, with their places, estimated starts and reasons.

From ``Scheduler.queue.views()`` (``{job_id: queue object}``, queue.py; the object is the one in
a job's JSON, docs/service.md "Why a job waits, and until when"), read through
``extension.queue_text`` as every other surface reads it. Pure over the scheduler's state; no
line (no ``queue``, nothing placed yet, a failing estimator) is an empty list, and the page then
shows no queue section.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from extension.queue_text import reason_text, starts_text, utc_minute, waiting
from extension.scheduler import JobState


def queue_tables(sched: Any) -> list[dict]:
    """``[{"plan", "jobs": [{"id", "user", "kind", "position", "leaf", "instance", "start",
    "when", "assumption", "reason"}]}]``, plans by path, jobs by their place in the plan's line
    (then overall, then id: a total order even for jobs not placed yet)."""
    by_plan: dict[str, list[dict]] = {}
    for job_id, queue in _views(sched).items():
        record = sched.live.get(job_id)
        # views are the last forward run's: a job that started or ended since is not waiting
        if record is None or record.job.state is not JobState.PENDING:
            continue
        job = record.job
        found = waiting({"queue": queue, "plan": job.plan})
        if found is None:
            continue
        by_plan.setdefault(found.plan, []).append(
            {
                "id": job_id,
                "user": job.user,
                "kind": record.kind.value,
                "position": found.in_plan,
                "leaf": found.leaf,
                "instance": found.instance,
                "start": utc_minute(found.start),
                "when": starts_text(found) or "not estimated yet",
                "assumption": found.assumption,
                "reason": reason_text(found),
            }
        )
    return [
        {"plan": plan, "jobs": sorted(rows, key=_order)} for plan, rows in sorted(by_plan.items())
    ]


def _views(sched: Any) -> Mapping[str, Any]:
    """The scheduler's line, or nothing: the page must render without one."""
    line = getattr(sched, "queue", None)
    if line is None or not hasattr(line, "views"):
        return {}
    try:
        views = line.views()
    except Exception:  # the line is a view of the page, never a reason for it to fail
        sched.log.exception("the admin page could not read the waiting line")
        return {}
    return views if isinstance(views, Mapping) else {}


def _order(row: dict) -> tuple:
    def place(key: str) -> float:
        return row[key] if row[key] is not None else math.inf

    return (place("position"), place("instance"), row["id"])
