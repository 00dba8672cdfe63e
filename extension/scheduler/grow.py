"""Phase 7, grow: elastic jobs toward their max with what is left free (docs/scheduling.md
"Admission 5").

One worker at a time, the job whose leaf has the lowest dominant ratio first (then priority,
submission time, id), on the nodes it already runs on first; never reserved or claimed
capacity (the ledger no longer counts it free), never over a limit. A job started this cycle
gets one Start with all its workers, not a Start and a Grow.
"""

from __future__ import annotations

import heapq

from .admit import over_limit
from .ledger import EPS
from .model import JobState
from .placement import place_gang
from .shares import dominant_ratio
from .state import CycleState


def grow(state: CycleState) -> None:
    heap = _growers(state)
    ledger, started, grown = state.ledger, state.started, state.grown
    node_at = state.nodes.node_at
    while heap:
        ratio, prio, sub, jid, job, leaf = heapq.heappop(heap)
        if leaf.ratio > ratio + EPS:  # its leaf grew meanwhile: back in the queue at its ratio
            heapq.heappush(heap, (leaf.ratio, prio, sub, jid, job, leaf))
            continue
        w = job.per_worker
        if over_limit(state, leaf, tuple(w)):
            continue
        mine = started.get(job.id) or [node_at[n] for n in job.placement if n in node_at]
        spot = place_gang(ledger.free, ledger.names, w, 1, prefer=frozenset(mine))
        if spot is None:
            continue
        ledger.take(spot, w)
        ledger.charge(leaf, w, 1)
        for p in leaf.chain:
            p.ratio = dominant_ratio(p.alloc, p.deserved)
        if job.id in started:
            started[job.id].extend(spot)
            workers = len(started[job.id])
        else:
            added = grown.setdefault(job.id, (job, []))[1]
            added.extend(spot)
            workers = job.workers + len(added)
        if workers < job.max_workers:
            heapq.heappush(heap, (leaf.ratio, prio, sub, jid, job, leaf))


def _growers(state: CycleState) -> list:
    """Elastic jobs running or started this cycle, below their max, not victims or
    terminating nor under a plan that gives a victim back this cycle, as a heap in the order
    they grow."""
    heap = []
    losing = state.losing
    for job, leaf in state.elastic:
        if not job.elastic or job.id in state.victims or job.terminating:
            continue
        if leaf.first_in(losing):
            continue  # its plan gives a victim back this cycle (Reclaim 6): it does not grow
        if job.id in state.started:
            workers = len(state.started[job.id])
        elif job.state is JobState.RUNNING:
            workers = job.workers
        else:
            continue
        if workers < job.max_workers:
            heap.append((leaf.ratio, -job.priority, job.submitted, job.id, job, leaf))
    heapq.heapify(heap)
    return heap
