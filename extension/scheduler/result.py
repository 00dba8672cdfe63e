"""The cycle's result: decisions in a fixed order, every pending job's reason, every plan's
figures (docs/scheduling.md "Admission 3" for the reasons' words).

Decisions come as Reject (in job order), Shrink and Preempt (in the order reclaim chose
them), Start (in the order admitted), Grow. Every job still pending waits: by default for
capacity, one message per shape (free capacity is fixed now); then the reasons the cycle gave
single jobs; the reservation holder's reason says so. Without ``explain`` (a forward run that
reads only the decisions) the reasons and figures are left out.
"""

from __future__ import annotations

from functools import partial
from itertools import chain
from operator import attrgetter

from . import messages
from .admit import capacity_reason
from .decisions import CycleResult, Grow, PlanRows, Start
from .model import Job
from .state import CycleState

_path_of, _share_of, _limit_of = attrgetter("path"), attrgetter("share"), attrgetter("limit")
_deserved_of, _alloc_of, _demand_of = (
    attrgetter("deserved"),
    attrgetter("alloc"),
    attrgetter("demand"),
)
_pending_of, _running_of = attrgetter("pending"), attrgetter("running")


def result(state: CycleState, explain: bool = True) -> CycleResult:
    out = CycleResult(reserved=state.reserved_for, aged=state.aged)
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
    """Every job left in a bucket waits for capacity (one reason per shape, in the order the
    shapes first come bottom-up; the index keeps them for the next cycle: kept.py), then the
    reasons the cycle gave single jobs. A leaf's started jobs stay in its buckets; a leaf
    whose pending count fell to 0 has started them all, and is not listed."""
    groups: dict[tuple, list[list[Job]]] = {}
    for plan in state.bottom_up:
        if not plan.buckets:
            continue
        every_job_started = not plan.pending
        for (w, n, _), jobs in plan.buckets.items():
            if jobs:
                parts = groups.get((w, n))
                if parts is None:
                    parts = groups[(w, n)] = []
                if not every_job_started:
                    parts.append(jobs)
    # a shape whose every job started lists nothing: no room to count (a pass over the nodes
    # each), while a shape's place in the order is where it first came, listed or not
    groups = {shape: parts for shape, parts in groups.items() if parts}
    waiting.update(state.index.waiting.reasons(groups, partial(capacity_reason, state)))
    for job_id in state.started:
        waiting.pop(job_id, None)
    waiting.update(state.waits)
    held = state.reserved_for
    if held is not None:
        waiting[held] = f"{waiting[held]}; {state.reservation}"
    if state.standing:
        _history_reasons(state, waiting)


def _history_reasons(state: CycleState, waiting: dict[str, str]) -> None:
    """Deserved share 2: a waiting job of a plan that used more than its share over the
    half-life says so, naming the sibling that borrows before it (the one that used the
    least for its share among those with demand)."""
    standing, half_life = state.standing, state.config.fair_share_half_life
    for leaf in state.bottom_up:
        if not leaf.pending:
            continue
        said = None
        for plan in leaf.chain:
            mine = standing.get(plan.path)
            if mine is None or mine.usage_over_share <= 1.0 or plan.parent is None:
                continue
            rivals = [
                standing[c.path]
                for c in plan.parent.children
                if c is not plan and c.demand != [0, 0, 0] and c.path in standing
            ]
            if rivals:
                first = min(rivals, key=lambda r: (r.usage_over_share, r.path))
                if first.usage_over_share < mine.usage_over_share:
                    said = messages.used_more(
                        plan.path, mine.usage_over_share, half_life, first.path
                    )
                    break
        if said is None:
            continue
        for jobs in leaf.buckets.values():
            for job in jobs:
                if job.id in waiting:
                    waiting[job.id] = f"{waiting[job.id]}; {said}"


def _figures(state: CycleState) -> PlanRows:
    """Leaves count their jobs and parents add their children's; a made-up leaf whose jobs
    are gone is not a plan any more. Recorded as columns, each filled in C: a tuple per plan
    would be thousands of objects for the garbage collector to walk every cycle."""
    shown = state.bottom_up
    gone = False
    for plan in shown:
        parent = plan.parent
        if parent is not None:
            parent.pending += plan.pending
            parent.running += plan.running
        if plan.implicit and not (plan.pending or plan.running):
            gone = True
    if gone:
        shown = [p for p in shown if not (p.implicit and not (p.pending or p.running))]
    rows = PlanRows()
    rows.path = list(map(_path_of, shown))
    rows.share = list(map(_share_of, shown))
    rows.limit = list(map(_limit_of, shown))
    rows.deserved = list(chain.from_iterable(map(_deserved_of, shown)))
    rows.allocated = list(chain.from_iterable(map(_alloc_of, shown)))
    rows.demand = list(chain.from_iterable(map(_demand_of, shown)))
    rows.pending = list(map(_pending_of, shown))
    rows.running = list(map(_running_of, shown))
    return rows
