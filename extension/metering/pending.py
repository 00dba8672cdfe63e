"""Prometheus figures of the waiting lines: pending jobs per plan and the longest estimated wait.

- ``wmla_pending_jobs{plan}``: the last cycle's pending jobs in the plan's subtree (the core's
  ``PlanFigures.pending``, the figure ``wmla_plan_jobs{state="pending"}`` also carries, under the
  name a queue dashboard looks for);
- ``wmla_pending_estimated_wait_seconds{plan}``: the longest estimated wait, from now, among the
  subtree's pending jobs that the service's forward run estimated (``Scheduler.queue.views()``,
  the ``queue`` objects of the job JSON); ``+Inf`` when one of them does not start within the
  run's horizon. A plan whose pending jobs have no estimate yet has no series.

Pure: the scheduler's state is passed in (read through ``extension.queue_text``, as every
surface reads the queue object), never imported: metering does not import the service.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client.core import GaugeMetricFamily

from extension.queue_text import waiting
from extension.scheduler import JobState

from .accounting import ancestors


def pending_families(
    figures: Mapping[str, Any],
    views: Mapping[str, Any],
    jobs: Mapping[str, Any],
    now: float,
    shown: Callable[[Iterable[str]], set[str]],
) -> list[GaugeMetricFamily]:
    """``figures``: the last cycle's plan figures by path; ``views``: job id -> queue object;
    ``jobs``: the live jobs by id (for each one's user leaf); ``shown``: the paths /metrics
    shows (user leaves only when asked)."""
    pending = GaugeMetricFamily(
        "wmla_pending_jobs",
        "Pending jobs in the plan's subtree, last cycle.",
        labels=["plan"],
    )
    for path in sorted(shown(figures)):
        pending.add_metric([path], figures[path].pending)
    waits = longest_waits(views, jobs, now)
    wait = GaugeMetricFamily(
        "wmla_pending_estimated_wait_seconds",
        "Longest estimated wait from now among the estimated pending jobs of the plan's "
        "subtree (+Inf: one does not start within the estimate's horizon).",
        labels=["plan"],
    )
    for path in sorted(shown(waits)):
        wait.add_metric([path], waits[path])
    return [pending, wait]


def longest_waits(
    views: Mapping[str, Any], jobs: Mapping[str, Any], now: float
) -> dict[str, float]:
    """Plan path -> the longest estimated wait (seconds from ``now``) of a pending job at or
    below it; the job counts at its user leaf and every plan above it, as the other per-plan
    figures do."""
    out: dict[str, float] = {}
    for job_id, queue in views.items():
        job = jobs.get(job_id)
        found = waiting({"queue": queue})
        if job is None or found is None or not found.estimated:
            continue
        if getattr(job, "state", None) is not JobState.PENDING:
            continue  # started or ended since the forward run
        if found.start is not None:
            seconds = max(0.0, found.start - now)
        elif found.when:  # estimated, no start reached: beyond the horizon
            seconds = math.inf
        else:
            continue  # an estimate with nothing in it says nothing
        for path in ancestors(job.leaf):
            out[path] = max(out.get(path, 0.0), seconds)
    return out


def queue_views(scheduler: Any) -> Mapping[str, Any]:
    """The scheduler's ``queue.views()``, or nothing (no line, or it failed): a scrape always
    answers."""
    line = getattr(scheduler, "queue", None)
    try:
        views = line.views() if line is not None else {}
    except Exception:
        return {}
    return views if isinstance(views, Mapping) else {}
