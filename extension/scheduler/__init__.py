"""The scheduler core: pure, standard library only (a test enforces it).

``schedule(snapshot, now)`` runs one cycle over a snapshot of plans, nodes and jobs and returns
typed decisions; ``check_submission`` answers at submit time whether a job can ever run;
``dispatch(decision, handler)`` carries a decision out with a handler's method of its kind.
The contract it keeps is docs/scheduling.md; cycle.py maps its phases to their modules.
"""

from .churn import held_work, lost_work, steady_state, within_one_gang
from .cycle import check_submission, schedule
from .decisions import (
    KINDS,
    CycleResult,
    Decision,
    DecisionHandler,
    Grow,
    PlanFigures,
    PlanRows,
    Preempt,
    Reject,
    Shrink,
    Start,
    Wait,
    dispatch,
)
from .index import SHARED_CACHE, IndexCache
from .model import FINAL_STATES, Instance, Job, JobState, Node, SchedulerConfig, Snapshot
from .names import MAX_USER_NAME, USER_NAME, is_user_name, user_name_problem
from .plans import Plan, PlanError, PlanTree, leaf_path
from .resources import NO_LIMIT, UNLIMITED, QuantityError, Resources, parse_quantity

__all__ = [
    "CycleResult",
    "Decision",
    "DecisionHandler",
    "FINAL_STATES",
    "Grow",
    "IndexCache",
    "Instance",
    "Job",
    "JobState",
    "KINDS",
    "MAX_USER_NAME",
    "NO_LIMIT",
    "Node",
    "Plan",
    "PlanError",
    "PlanFigures",
    "PlanRows",
    "PlanTree",
    "Preempt",
    "QuantityError",
    "Reject",
    "Resources",
    "SHARED_CACHE",
    "SchedulerConfig",
    "Shrink",
    "Snapshot",
    "Start",
    "UNLIMITED",
    "USER_NAME",
    "Wait",
    "check_submission",
    "dispatch",
    "held_work",
    "is_user_name",
    "leaf_path",
    "lost_work",
    "parse_quantity",
    "schedule",
    "steady_state",
    "user_name_problem",
    "within_one_gang",
]
