"""Who may lose capacity to a reclaimer (docs/scheduling.md "Reclaim 3"; "Reclaim 1", whether
the reclaimer stays within its share, is ``deserved.within_deserved``)."""

from __future__ import annotations

from ..churn import lost_work
from ..index import PlanNode
from ..ledger import EPS, Ledger
from ..model import Job
from ..state import CycleState


def may_be_victim(job: Job, now: float, min_runtime: float) -> bool:
    """Reclaim 3: a running job may be stopped or shrunk when it is preemptible, not already
    terminating (a victim in its grace period is never paid for twice), not a starved gang
    started first by Admission 6 (``Job.aged``: it runs to its end) and has run at least
    ``min_runtime`` (so a reclaim does not thrash). A job younger than that also shields
    every job under the same borrowing plan that would lose more work than it
    (``order.victim_steps``)."""
    return (
        job.preemptible
        and not job.terminating
        and not job.aged
        and job.started is not None
        and now - job.started >= min_runtime
    )


def index_victims(state: CycleState) -> int:
    """List every job that may be a victim under each plan of its chain (``PlanNode.under``),
    so a reclaimer looks only under borrowing siblings; returns how many there are."""
    now, min_runtime = state.now, state.config.min_runtime
    count = 0
    for job, leaf in zip(state.running, state.running_leaves):
        if may_be_victim(job, now, min_runtime):
            entry = (job, leaf)
            for p in leaf.chain:
                p.under.append(entry)
            count += 1
        elif job.preemptible and not job.terminating and not job.aged and job.started is not None:
            lost = lost_work(job, now)  # young: it shields the jobs that would lose more
            for p in leaf.chain:
                if lost < p.shield:
                    p.shield = lost
    return count


def borrows(ledger: Ledger, plan: PlanNode, w: tuple) -> bool:
    """Reclaim 3: ``plan`` holds more than it deserves of a resource the reclaimer needs (its
    ``ceiling``: with usage history, more than both its deserved shares, Deserved share 2)."""
    c = plan.ceiling
    return any(w[r] and ledger.alloc(plan, r) > c[r] + EPS for r in range(3))


def eligible(state: CycleState, leaf: PlanNode, height: int, w: tuple) -> list[tuple]:
    """Reclaim 3, borrowers only: (victim, its leaf, the sibling it is under) for every
    victim-to-be under a sibling that borrows, at each level where the reclaimer's side stays
    within its share (the first ``height`` plans of its chain). A user never reclaims from
    their own leaf: it is the reclaimer's side, never a sibling. Jobs under a plan that starts
    one of its jobs this cycle are spared in it (Reclaim 6)."""
    out = []
    ledger, victims, spare = state.ledger, state.victims, state.spare
    for mine in leaf.chain[:height]:
        parent = mine.parent
        if parent is None:
            break
        for sibling in parent.children:
            if sibling is mine or not sibling.under or not borrows(ledger, sibling, w):
                continue
            out.extend(
                (victim, vleaf, sibling)
                for victim, vleaf in sibling.under
                if victim.id not in victims and not vleaf.first_in(spare)
            )
    return out
