"""What a preemption costs, measured the same way by the simulator, the service and the core
(docs/scheduling.md "Reclaim 4" and "Churn").

- ``lost_work``: the GPU-seconds a job would lose if it were stopped now: what it did since its
  last checkpoint, or since it (re)started when it reported none (it resumes from the
  checkpoint it had when it started, so that work is not at risk). A job without GPUs counts
  its workers instead, so CPU-only victims still compare among themselves.
- ``held_work``: the GPU-seconds a job has held since it (re)started (a preemption's
  "preempted GPU-seconds").
- ``within_one_gang`` (``steady_state``: the same for a reclaiming job): every plan with
  demand holds its deserved share within less than one gang (the reclaimer's minimum gang)
  in every resource that gang asks for: the steady state,
  in which the contract says nothing is preempted. A plan a whole gang short is owed it: that
  is a reclaim, not churn. The simulator and the service evaluate it on the figures of the
  cycle before the one that preempts, for a reclaimer whose leaf had demand then, so a
  preemption that a cycle's own starts provoked (the cascades of issue 18) counts as one in
  the steady state and a reclaim for a newcomer's demand does not.
"""

from __future__ import annotations

from collections.abc import Mapping

from .decisions import PlanFigures
from .model import Job
from .resources import Resources

EPS = 1e-9


def _width(job: Job) -> float:
    gpus = job.per_worker.gpu * job.workers
    return float(gpus) if gpus else float(job.workers)


def lost_work(job: Job, now: float) -> float:
    """GPU-seconds (CPU-only jobs: worker-seconds) done since the job's last checkpoint or
    (re)start; 0 for a job that is not running."""
    if job.started is None:
        return 0.0
    since = job.started
    if job.checkpointed is not None and job.checkpointed > since:
        since = job.checkpointed
    return max(0.0, now - since) * _width(job)


def held_work(job: Job, now: float) -> float:
    """GPU-seconds (CPU-only jobs: worker-seconds) held since the job (re)started."""
    if job.started is None:
        return 0.0
    return max(0.0, now - job.started) * _width(job)


def within_one_gang(
    plans: Mapping[str, PlanFigures], gang: Resources, leaf: str | None = None
) -> bool:
    """Every plan other than the root with demand holds its deserved share within less than
    ``gang`` in every resource ``gang`` asks for. With ``leaf`` (the reclaimer's user leaf):
    also, that leaf already had demand in ``plans``; a reclaim for demand that is new since
    those figures answers it and is never steady-state churn."""
    asked = [(r, getattr(gang, r)) for r in ("gpu", "cpu", "memory") if getattr(gang, r)]
    if leaf is not None:
        mine = plans.get(leaf)
        if mine is None or not any(getattr(mine.demand, r) for r, _ in asked):
            return False
    for path, f in plans.items():
        if path == "/" or not any(getattr(f.demand, r) for r, _ in asked):
            continue
        for r, size in asked:
            if abs(getattr(f.allocated, r) - getattr(f.deserved, r)) > size - EPS:
                return False
    return True


def steady_state(plans: Mapping[str, PlanFigures], reclaimer: Job) -> bool:
    """A preemption for ``reclaimer`` decided after a cycle with these figures is churn in the
    steady state: ``within_one_gang`` of its minimum gang, for its leaf."""
    gang = reclaimer.per_worker.times(reclaimer.min_workers)
    return within_one_gang(plans, gang, reclaimer.leaf)
