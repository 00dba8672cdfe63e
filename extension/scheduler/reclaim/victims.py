"""Who may lose capacity to a reclaimer (docs/scheduling.md "Reclaim 1", "Reclaim 3")."""

from __future__ import annotations

from ..churn import lost_work
from ..index import PlanNode
from ..ledger import EPS, Ledger
from ..model import Job
from ..state import CycleState


def may_be_victim(job: Job, now: float, min_runtime: float) -> bool:
    """Reclaim 3: a running job may be stopped or shrunk when it is preemptible, not already
    terminating (a victim in its grace period is never paid for twice) and has run at least
    ``min_runtime`` (so a reclaim does not thrash). A job younger than that also shields
    every job under the same borrowing plan that would lose more work than it
    (``order.victim_steps``)."""
    return (
        job.preemptible
        and not job.terminating
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
        elif job.preemptible and not job.terminating and job.started is not None:
            lost = lost_work(job, now)  # young: it shields the jobs that would lose more
            for p in leaf.chain:
                if lost < p.shield:
                    p.shield = lost
    return count


def within_deserved(
    promised: dict, leaf: PlanNode, w: tuple, low: int, high: int
) -> tuple[int, int]:
    """Reclaim 1: (the most workers k in [low, high] the job may run within its deserved
    share, the height of its chain that stays within it with k running): the leaf, and each
    ancestor up to that height, holds at most its deserved share of every resource the job
    asks for, counting what this cycle promised. (0, 0) when even the minimum gang would make
    its leaf a borrower: on a busy cluster most blocked leaves stop here."""
    w0, w1, w2 = w
    for k in range(high, low - 1, -1):
        height = 0
        for p in leaf.chain:
            if p.parent is None:
                break  # the root is the instance, not a share
            a, d = p.alloc, p.deserved
            change = promised.get(p.path)
            if change:
                a = (a[0] + change[0], a[1] + change[1], a[2] + change[2])
            if (
                (w0 and a[0] + w0 * k > d[0] + EPS)
                or (w1 and a[1] + w1 * k > d[1] + EPS)
                or (w2 and a[2] + w2 * k > d[2] + EPS)
            ):
                break
            height += 1
        if height:
            return k, height
    return 0, 0


def borrows(ledger: Ledger, plan: PlanNode, w: tuple) -> bool:
    """Reclaim 3: ``plan`` holds more than it deserves of a resource the reclaimer needs."""
    return any(w[r] and ledger.alloc(plan, r) > plan.deserved[r] + EPS for r in range(3))


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
                if victim.id not in victims
                and not (spare and any(p.path in spare for p in vleaf.chain))
            )
    return out
