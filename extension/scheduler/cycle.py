"""One scheduling cycle: ``schedule(snapshot, now) -> CycleResult``.

Written as numbered phases over one snapshot (the shape of Kueue's ``schedule()``); each phase
is a module, named after the section of docs/scheduling.md it implements. No I/O, no clock,
no randomness: the same snapshot and ``now`` give the same decisions.

1. intake     one pass over the jobs: leaves, pending buckets, running jobs   intake.py
2. reject     jobs that can never run as asked (Admission 3), inside 1.      reject.py
   (the ledger then holds the running jobs' nodes and charges their leaves)   ledger.py
3. demand     per plan, capped by its limit (Words: demand)                  deserved.py
4. deserved   hierarchical weighted water-filling per resource (Deserved share)
5. admit      fair order, all-or-nothing gangs, one reservation (Admission 1, 2, 4)  admit.py
6. reclaim    borrowers only, elastic shrink first, whole gangs, least loss (Reclaim)  reclaim/
   (a plan that gives a victim back starts nothing in the same cycle: phases 5-6 run again
   with its jobs held back; see below)
7. grow       elastic jobs toward max with what is left free (Admission 5)    grow.py
   result     decisions, reasons, every plan's figures                      result.py

What the phases share is one declared ``CycleState`` (state.py); every change of capacity goes
through its ``Ledger`` (ledger.py). The plan index is kept between cycles by an ``IndexCache``
the caller owns (index.py); a caller that passes none shares ``SHARED_CACHE``.

Reruns (Reclaim 6). Phases 1-4 run once per cycle: none of them reads the held-back or
spared plans, so a rerun would compute exactly what the first run did (at 1,000 pending on 512
nodes a third of each of up to 8 runs). After phase 4 ``state.mark`` notes what admission and
reclaim change (plan allocations, ratios and job counts, the ledger's rows and totals: flat
lists of numbers, under a millisecond), and each rerun (``state.rerun``) rewinds the index and
the ledger to it, puts every bucket back in intake's order (admission sorts buckets in place)
and starts phases 5-6 on a fresh state that carries phases 1-4's fields: the first run's work
is discarded whole, as an uncommitted Statement in Volcano. Two rare cases run phases 1-4
again instead, as before: a leaf with more than ``SHAPES_KEPT`` bucket shapes (a reset would
drop them and intake add them back in another order) and an index a reset would not keep
(``PlanIndex.stale``). The golden files check that this decides byte for byte as running
phases 1-6 again did.

``schedule(..., explain=False)`` decides exactly the same but leaves out what only explains
the decisions: ``CycleResult.waiting`` is empty (no reason per pending job) and
``CycleResult.plans`` is empty (no plan figures). A forward run in simulated time
(extension/sim/estimate.py) reads only the decisions and the reservation, and the two parts
are about an eighth of a busy cycle (6 of 50 ms at 1,000 pending on 512 nodes).
"""

from __future__ import annotations

from .admit import admit
from .decisions import CycleResult
from .deserved import compute_demand, compute_deserved
from .grow import grow
from .index import SHARED_CACHE, IndexCache
from .intake import intake
from .model import Job, Snapshot
from .reclaim import reclaim
from .reject import impossible
from .result import result
from .state import CycleState, mark, open_cycle, rerun


def schedule(
    snapshot: Snapshot, now: float, cache: IndexCache | None = None, *, explain: bool = True
) -> CycleResult:
    """Run one cycle and return what to do. ``cache`` keeps the plan index for the caller's
    next cycle (default: the module's shared one). A cycle that raises does not give its
    index back, so a half-updated one is never reused. ``explain=False``: the same decisions
    and reservation without the waiting reasons and plan figures (module docstring)."""
    cache = SHARED_CACHE if cache is None else cache
    state = _first_phases(snapshot, now, cache)
    start = mark(state)  # where a rerun of 5-6 starts (module docstring)
    hold: frozenset[str] = frozenset()
    spare: frozenset[str] = frozenset()
    while True:
        admit(state)  # 5.
        reclaim(state)  # 6.
        # Reclaim 6: no plan gives a victim back in the cycle that starts one of its jobs.
        # Run again with its jobs held back; a held-back plan that then gives nothing back
        # was held for nothing: its jobs start and its running jobs are spared this cycle
        # instead (each run moves a plan on, so this ends).
        needless = frozenset(p for p in hold if p not in state.losing)
        undone = _undone(state)
        if not undone and not needless:
            break
        hold, spare = (hold - needless) | undone, spare | needless
        if state.index.rewinds_as_reset():
            state = rerun(state, start, hold, spare)
        else:  # phases 1-4 again, as they would run on a reset or new index
            cache.give_back(state.index)
            state = _first_phases(snapshot, now, cache)
            start = mark(state)
            state.hold_back, state.spare = hold, spare
    grow(state)  # 7.
    out = result(state, explain)
    cache.give_back(state.index)
    return out


def _first_phases(snapshot: Snapshot, now: float, cache: IndexCache) -> CycleState:
    """Phases 1-4, which do not depend on the plans held back or spared (module docstring)."""
    state = open_cycle(snapshot, now, cache)
    intake(state)  # 1., with 2. reject
    state.ledger.hold(state.running, state.running_leaves, state.nodes)
    compute_demand(state)  # 3.
    compute_deserved(state)  # 4.
    return state


def _undone(state) -> frozenset[str]:
    """The plans that lost a victim this cycle under which a job also started in it."""
    losing = state.losing
    if not losing:
        return frozenset()
    return frozenset(p.path for leaf in state.started_in for p in leaf.chain if p.path in losing)


def check_submission(snapshot: Snapshot, job: Job, cache: IndexCache | None = None) -> str | None:
    """The reason ``job`` can never run as asked (Admission 3), or None; the service calls it
    at submit time, before the job is stored."""
    cache = SHARED_CACHE if cache is None else cache
    state = open_cycle(snapshot, 0.0, cache)
    intake(state, extra=[job])
    answer = impossible(state, job)
    cache.give_back(state.index)
    return answer
