"""The cycle's result: decisions in a fixed order, every pending job's reason, every plan's
figures (docs/scheduling.md "Admission 3" for the reasons' words).

Decisions come as Reject (in job order), Shrink and Preempt (in the order reclaim chose
them), Start (in the order admitted), Grow. Every job still pending waits: by default for
capacity, one message per shape (free capacity is fixed now); then the reasons the cycle gave
single jobs; the reservation holder's reason says so. Without ``explain`` (a forward run that
reads only the decisions) the reasons and figures are left out.
"""

from __future__ import annotations

from operator import attrgetter

from .admit import capacity_reason
from .decisions import CycleResult, Grow, PlanRows, Start
from .state import CycleState

_id_of = attrgetter("id")


def result(state: CycleState, explain: bool = True) -> CycleResult:
    out = CycleResult(reserved=state.reserved_for)
    decisions, names = out.decisions, state.ledger.names
    decisions.extend(state.decisions)
    for job_id, nodes in state.started.items():
        decisions.append(Start(job_id, tuple(names[i] for i in nodes)))
    for job, nodes in state.grown.values():
        added = tuple(names[i] for i in nodes)
        decisions.append(Grow(job.id, added, job.workers + len(added)))
    if explain:
        _waiting(state, out.waiting)
        out.rows = _figures(state)
    return out


def _waiting(state: CycleState, waiting: dict[str, str]) -> None:
    by_shape: dict[tuple, list[str]] = {}
    for plan in state.bottom_up:
        if not plan.buckets:
            continue
        for (w, n, _), jobs in plan.buckets.items():
            if jobs:
                ids = by_shape.get((w, n))
                if ids is None:
                    ids = by_shape[(w, n)] = []
                ids += map(_id_of, jobs)
    for (w, n), ids in by_shape.items():
        waiting.update(dict.fromkeys(ids, capacity_reason(state, w, n)))
    for job_id in state.started:
        del waiting[job_id]
    waiting.update(state.waits)
    held = state.reserved_for
    if held is not None:
        waiting[held] = f"{waiting[held]}; {state.reservation}"


def _figures(state: CycleState) -> PlanRows:
    """Leaves count their jobs and parents add their children's; a made-up leaf whose jobs
    are gone is not a plan any more. Recorded as columns: a tuple per plan would be thousands
    of objects for the garbage collector to walk every cycle."""
    rows = PlanRows()
    path, share, limit = rows.path.append, rows.share.append, rows.limit.append
    deserved, allocated, demand = rows.deserved.extend, rows.allocated.extend, rows.demand.extend
    pending, running = rows.pending.append, rows.running.append
    for plan in state.bottom_up:
        parent = plan.parent
        if parent is not None:
            parent.pending += plan.pending
            parent.running += plan.running
        if plan.implicit and not (plan.pending or plan.running):
            continue
        path(plan.path)
        share(plan.share)
        limit(plan.limit)
        deserved(plan.deserved)
        allocated(plan.alloc)
        demand(plan.demand)
        pending(plan.pending)
        running(plan.running)
    return rows
