"""In which order victims lose (docs/scheduling.md "Reclaim 4: order of loss").

Elastic shrink steps (one worker at a time, highest rank first) before any whole-gang stop;
within each, victims whose plans stay at or above their deserved share first (the reclaimer
may still take a victim below its own share, as seed 000 says); then lower priority, then the
least work lost since the last checkpoint, then the most recently started, then the fewest
resources, then job id. Every key is total.
"""

from __future__ import annotations

from ..churn import lost_work
from ..index import PlanNode
from ..ledger import EPS, Ledger
from ..model import Job


def stays_at_or_above(
    ledger: Ledger, vleaf: PlanNode, side: PlanNode, release: tuple, w: tuple
) -> bool:
    """The victim's plans, from its leaf up to the sibling it is under, keep at least their
    deserved share (its ``ceiling``, as ``victims.borrows`` reads it) of the resources the
    reclaimer needs once ``release`` is let go."""
    for p in vleaf.chain:
        for r in range(3):
            if w[r] and ledger.alloc(p, r) - release[r] < p.ceiling[r] - EPS:
                return False
        if p is side:
            break
    return True


def loss_rank(victim: Job, now: float) -> tuple:
    """Lower priority first, then the least work lost since the last checkpoint (GPU-seconds,
    ``churn.lost_work``), then the most recently started, then the fewest resources held,
    then job id."""
    size = tuple(v * victim.workers for v in victim.per_worker)
    return (victim.priority, lost_work(victim, now), -(victim.started or 0), size, victim.id)


def victim_steps(
    ledger: Ledger, eligible: list[tuple], w: tuple, node_at: dict[str, int], now: float
) -> list[tuple]:
    """Every step a reclaim may take, in the order of loss: (victim, its leaf, node indexes it
    would release). A shrink step releases one more worker of an elastic job (its highest
    ranks; the runtime checkpoints before a resize, so it loses nothing); a gang step stops
    the whole job, and replaces any shrink steps of it taken before. A job that would lose
    more than a job under ``min_runtime`` of the same borrowing plan is not stopped whole:
    ``min_runtime`` never pushes the choice onto a job that would lose more."""
    shrinks, gangs = [], []
    for victim, vleaf, side in eligible:
        nodes = [node_at[n] for n in victim.placement if n in node_at]
        rank = loss_rank(victim, now)
        extra = victim.workers - victim.min_workers
        if victim.elastic and extra > 0:
            one = tuple(victim.per_worker)
            for j in range(extra):  # shrink one worker at a time, highest rank first
                release = tuple(v * (j + 1) for v in one)
                first = 0 if stays_at_or_above(ledger, vleaf, side, release, w) else 1
                shrinks.append(((first, *rank, j), (victim, vleaf, [nodes[-1 - j]])))
        if rank[1] > side.shield + EPS:
            continue  # shielded: a younger job here would lose less once its time is up
        whole = tuple(v * victim.workers for v in victim.per_worker)
        first = 0 if stays_at_or_above(ledger, vleaf, side, whole, w) else 1
        gangs.append(((first, *rank), (victim, vleaf, list(nodes))))
    shrinks.sort(key=_key)
    gangs.sort(key=_key)
    return [s for _, s in shrinks] + [s for _, s in gangs]


def _key(entry: tuple) -> tuple:
    return entry[0]
