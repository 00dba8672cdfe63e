"""The reclaim phase (docs/scheduling.md "Reclaim"): for each job blocked by capacity, in fair
order (once per leaf and job shape), take back from borrowers what it deserves."""

from __future__ import annotations

from .. import messages
from ..admit import in_order
from ..decisions import Preempt, Shrink
from ..deserved import within_deserved
from ..index import PlanNode
from ..ledger import Release
from ..model import Job
from ..placement import place_gang
from ..state import CycleState
from .order import victim_steps
from .search import least_loss, most_that_fit, take_until_room
from .victims import eligible, index_victims


def reclaim(state: CycleState) -> None:
    if not state.blocked:  # nothing to reclaim for: skip the O(jobs) victim list
        return
    if not index_victims(state):
        return
    ledger = state.ledger
    ledger.open_pool()
    promised, leaves = ledger.promised, state.index.leaves
    for blocked in state.blocked.values():
        bucket = blocked.__class__ is list  # a whole bucket stands for its first job
        some = blocked[0] if bucket else blocked  # every job of a bucket has its shape and leaf
        leaf = leaves[(some.plan, some.user)][0]
        k, height = within_deserved(
            promised, leaf, some.per_worker, some.min_workers, some.max_workers, floor=True
        )
        if k:
            job = in_order(blocked, state.index.sorted)[0] if bucket else blocked
            _reclaim_for(state, job, leaf, k, height)


def _reclaim_for(state: CycleState, job: Job, leaf: PlanNode, k: int, height: int) -> None:
    """Reclaim 2 (already on its way), then 3-5 (victims, order, search), then 6 (decisions)."""
    ledger = state.ledger
    w, low = job.per_worker, job.min_workers
    need = [w[r] * low for r in range(3)]
    if any(need) and all(need[r] <= ledger.total_incoming[r] for r in range(3)):
        # Claimed by amount: where it lands is checked when it has landed. This keeps a busy
        # tick O(1) per waiting gang instead of O(nodes).
        ledger.claim_amount(need)
        state.waits[job.id] = messages.ON_ITS_WAY
        return
    if ledger.within_totals(need) and ledger.pool_room(w, low) >= low:
        _claim(state, job, leaf, k)
        state.waits[job.id] = messages.ON_ITS_WAY
        return
    candidates = eligible(state, leaf, height, w)
    if not candidates:
        return
    could_free = [sum(v.per_worker[r] * v.workers for v, _, _ in candidates) for r in range(3)]
    if not ledger.within_totals(need, could_free):
        return  # even every borrower's job would not make room: preempt nothing
    steps = victim_steps(ledger, candidates, w, state.nodes.node_at, state.now)
    release = take_until_room(ledger, steps, w, k)
    target = most_that_fit(ledger, release, w, k, low)
    if target < low:
        return  # never preempt for nothing
    release = least_loss(ledger, release, w, target)
    if not release.steps:  # what is free or on its way already makes room
        _claim(state, job, leaf, target)
        state.waits[job.id] = messages.ON_ITS_WAY
        return
    sides = {v.id: side for v, _, side in candidates}
    _commit(state, job, leaf, release, sides)
    _claim(state, job, leaf, target)
    names = ", ".join(sorted({v.id for v, _, _ in release.steps}))
    state.waits[job.id] = messages.reclaiming(names, state.config.grace)


def _claim(state: CycleState, job: Job, leaf: PlanNode, k: int) -> None:
    """Reclaim 2: hold what the reclaimer will use, ``k`` workers where they fit in the pool,
    else its minimum gang."""
    ledger, w = state.ledger, job.per_worker
    placement = place_gang(ledger.pool, ledger.names, w, k) or place_gang(
        ledger.pool, ledger.names, w, job.min_workers
    )
    if placement is not None:
        ledger.claim(placement, w, leaf)


def _commit(
    state: CycleState, job: Job, leaf: PlanNode, release: Release, sides: dict[str, PlanNode]
) -> None:
    """Reclaim 6: the victims' decisions, with the reason naming the reclaiming leaf and job;
    a victim keeps its resources through the grace period (they are incoming). The plans
    they were taken under are noted: none of their jobs may start in this cycle."""
    release.commit()
    grace, names = state.config.grace, state.ledger.names
    reason = messages.reclaimed_by(leaf.path, job.id)
    for victim, _, nodes in release.steps:
        state.victims.add(victim.id)
        state.losing.add(sides[victim.id].path)
        count = len(nodes)
        if count < victim.workers:
            released = tuple(names[i] for i in nodes)
            state.decisions.append(
                Shrink(victim.id, released, victim.workers - count, grace, reason)
            )
        else:
            state.decisions.append(Preempt(victim.id, grace, reason, job.id))
