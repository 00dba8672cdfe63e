"""The scheduler core: pure, standard library only (a test enforces it).

``schedule(snapshot, now)`` runs one cycle over a snapshot of plans, nodes and jobs and returns
typed decisions; ``check_submission`` answers at submit time whether a job can ever run.
"""

from .cycle import check_submission, schedule
from .decisions import CycleResult, Grow, PlanFigures, Preempt, Reject, Shrink, Start, Wait
from .model import Instance, Job, JobState, Node, SchedulerConfig, Snapshot
from .plans import Plan, PlanError, PlanTree, leaf_path
from .resources import NO_LIMIT, UNLIMITED, QuantityError, Resources, parse_quantity

__all__ = [
    "CycleResult",
    "Grow",
    "Instance",
    "Job",
    "JobState",
    "NO_LIMIT",
    "Node",
    "Plan",
    "PlanError",
    "PlanFigures",
    "PlanTree",
    "Preempt",
    "QuantityError",
    "Reject",
    "Resources",
    "SchedulerConfig",
    "Shrink",
    "Snapshot",
    "Start",
    "UNLIMITED",
    "Wait",
    "check_submission",
    "leaf_path",
    "parse_quantity",
    "schedule",
]
