"""Phase 5, admit: the fair order, all-or-nothing gangs, one reservation (docs/scheduling.md
"Admission 1", "Admission 2", "Admission 4").

The fair order walks from the root, at each level to the child with the lowest dominant ratio
that still has a job to try; equal ratios (rounded to 9 decimals) go to the child that
deserves more, then by path. Inside a leaf: priority (high first), submission time, job id.
Each parent keeps its active children in a heap (``PlanNode.heap``; entries go stale by
``version`` when a ratio moves) and each leaf its buckets' first jobs (``PlanNode.heads``).

Free capacity only shrinks during this phase, so a shape that found no room once finds none
again: where no limit or job cap could give a different reason, a bucket of such a shape is
passed over whole (its first job stands for it in reclaim), and a leaf of only such buckets at
once (docs/scheduling.md "Cost").
"""

from __future__ import annotations

import heapq
from operator import attrgetter

from . import messages
from .deserved import within_deserved
from .history import over_used
from .index import PlanNode
from .kept import SortedKept
from .ledger import EPS
from .model import Job
from .placement import gang_room
from .resources import RESOURCES
from .shares import dominant_ratio
from .state import CycleState

_by_time = attrgetter("submitted", "id")
_by_priority = attrgetter("priority")


def in_order(jobs: list[Job], kept: SortedKept) -> list[Job]:
    """Sort a bucket into the order inside a leaf (Admission 1): priority (high first), then
    submission time, then id. Through ``kept``, the index's sorts (kept.py): a bucket of the
    same jobs as last cycle reuses its order, and the next cycle knows what was sorted."""
    if len(jobs) > 1:
        kept.sort(jobs, _sort)
    return jobs


def _sort(jobs: list[Job]) -> None:
    """Two sorts in C: a stable sort keeps the time order among equal priorities."""
    jobs.sort(key=_by_time)
    jobs.sort(key=_by_priority, reverse=True)


def admit(state: CycleState) -> None:
    """The reservation holder first (Admission 4: what was freed since it blocked goes to it),
    then every leaf's turn in fair order until no plan has a job left to try. With
    ``min_runtime`` 0 in two rounds (Admission 1, within-share starts first): the first defers
    every preemptible job whose start would make a plan on its path borrow, the second walks
    the same fair order over what the first deferred. Without ``min_runtime`` nothing shields
    a new borrower: started before a job within its share that then finds no room, the next
    cycle's reclaim would stop it for that job (Reclaim 6)."""
    _activate(state)
    holder = state.holder
    starving = starved_gang(state) if state.config.max_gang_wait > 0 else None
    if starving is not None:
        holder = state.holder = starving  # Admission 6: it goes first, whatever the order says
    elif holder is not None and not worth_reserving(state, holder[0], holder[1]):
        holder = state.holder = None  # it takes its turn in the fair order like the others
    held, held_leaf = (None, None) if holder is None else holder
    if holder is not None and try_start(state, held, held_leaf) and starving is not None:
        state.aged = held.id
    elif starving is not None and state.reserved_for == held.id:
        waited = messages.starved(state.now - held.submitted)
        state.reservation = f"{state.reservation}; {waited}"
    state.defer = state.config.min_runtime <= 0  # Admission 1: within-share starts first
    _walk(state, held, held_leaf)
    state.defer = False
    late = state.unplaced
    if late is not None and state.reserved_for is None and any(late.per_worker):
        state.waits[late.id] = capacity_reason(state, late.per_worker, late.min_workers)
        _reserve(state, late)
    if state.deferred:
        _second_round(state)
        _walk(state, held, held_leaf)
    state.ledger.fits = {}  # free rows change again in reclaim and grow: not kept in step there


def _walk(state: CycleState, held: Job | None, held_leaf: PlanNode | None) -> None:
    """Every active leaf's turn in fair order until no plan has a job left to try."""
    root, failed, blocked = state.index.root, state.failed_shapes, state.blocked
    quick_ok = state.snapshot.instance.max_jobs is None  # no job cap: only capacity blocks
    while root.active:
        leaf = _pick(root)
        quick = quick_ok and not leaf.limited  # no limit could give another reason to wait
        if leaf.heads is None and quick and leaf is not held_leaf:
            if _pass_over(leaf, failed, blocked):
                continue
        _turn(state, leaf, quick, held)


def _activate(state: CycleState) -> None:
    """Mark the leaves with pending jobs and their ancestors active; heapify each parent's
    order of its active children at once."""
    for plan in state.bottom_up:
        if plan.pending:
            plan.active = 1
            plan.heads = None  # built on the leaf's first turn, if it needs them
    _heapify_active(state)


def _second_round(state: CycleState) -> None:
    """Admission 1, the second round: only the buckets deferred in the first, each from the
    job it was deferred at, in the same fair order (ratios as the first round left them)."""
    for plan in state.bottom_up:
        plan.active = 0
        plan.heap.clear()
    for leaf, entries in state.deferred.values():
        heads = [
            (-jobs[i].priority, jobs[i].submitted, jobs[i].id, seq, jobs, i)
            for seq, jobs, i in entries
        ]
        heapq.heapify(heads)
        leaf.heads, leaf.active = heads, 1
    state.deferred = {}
    _heapify_active(state)


def _heapify_active(state: CycleState) -> None:
    """Count each parent's active children and heapify its order of them at once."""
    bottom_up = state.bottom_up
    for plan in bottom_up:
        if plan.active and plan.parent is not None:
            plan.parent.active += 1
    for plan in bottom_up:
        if plan.active and plan.children:
            heap = plan.heap
            heap.extend(
                (round(c.ratio, 9), c.weight, c.path, c.version, c)
                for c in plan.children
                if c.active
            )
            heapq.heapify(heap)


def _pass_over(leaf: PlanNode, failed: set, blocked: dict) -> bool:
    """A leaf whose every shape already found no room leaves the walk at once, each bucket
    blocked whole (its first job, unsorted yet, found by reclaim if it needs it)."""
    buckets = leaf.buckets
    for (w, n, _), jobs in buckets.items():
        if jobs and (w, n) not in failed:
            return False
    for jobs in buckets.values():
        if jobs and id(jobs) not in blocked:
            blocked[id(jobs)] = jobs
    _deactivate(leaf)
    return True


def _turn(state: CycleState, leaf: PlanNode, quick: bool, held: Job | None) -> None:
    """One turn of ``leaf``: its jobs in order until one starts (its ratio moved: back to the
    walk) or none is left (the leaf leaves the walk). ``quick``: a job of a shape that found
    no room is passed over with the rest of its bucket."""
    failed, blocked = state.failed_shapes, state.blocked
    heads = leaf.heads
    if heads is None:
        heads = leaf.heads = _heads(leaf, state.index.sorted)
    heappop, heapreplace = heapq.heappop, heapq.heapreplace
    while heads:
        _, _, _, seq, jobs, i = heads[0]
        job = jobs[i]
        if quick and job is not held and (job.per_worker, job.min_workers) in failed:
            if id(jobs) not in blocked:
                blocked[id(jobs)] = job
            heappop(heads)  # the rest of the bucket has the same shape
            continue
        if (
            state.defer
            and job is not held
            and job.preemptible
            and not keeps_within(state, leaf, job)
        ):
            # Admission 1: it would borrow, and so would the rest of its bucket (same leaf
            # and shape): the bucket waits for the second round from this job on, unless it
            # finds no room either way (free capacity only shrinks)
            if quick and _no_room(state, job):
                _blocked_borrower(state, jobs, job, leaf)
            else:
                state.deferred.setdefault(id(leaf), (leaf, []))[1].append((seq, jobs, i))
            heappop(heads)
            continue
        if i + 1 < len(jobs):
            after = jobs[i + 1]
            heapreplace(heads, (-after.priority, after.submitted, after.id, seq, jobs, i + 1))
        else:
            heappop(heads)
        if job is held:
            continue  # tried first, in admit
        if try_start(state, job, leaf):
            break
    if not heads:
        _deactivate(leaf)


def _no_room(state: CycleState, job: Job) -> bool:
    """The job's minimum gang does not fit in what is free in all, or its shape already found
    no room: it waits for capacity in either round."""
    w, n = job.per_worker, job.min_workers
    if (w, n) in state.failed_shapes:
        return True
    tf = state.ledger.total_free
    return w[0] * n > tf[0] or w[1] * n > tf[1] or w[2] * n > tf[2]


def _blocked_borrower(state: CycleState, jobs: list[Job], job: Job, leaf: PlanNode) -> None:
    """A job the first round would defer that finds no room now: blocked by capacity at once,
    as ``try_start`` would mark it (no bucket kept for the second round, so a busy cycle stays
    as cheap as before), and the first such job is the reservation's candidate after the
    second round, where it would have been tried (Admission 4)."""
    shape, failed = (job.per_worker, job.min_workers), state.failed_shapes
    if state.unplaced is None and shape not in failed and not held_back(state, leaf):
        state.unplaced = job  # a shape that failed before is passed over, never reserved for
    failed.add(shape)
    state.blocked.setdefault(id(jobs), job)


def _heads(leaf: PlanNode, kept: SortedKept) -> list:
    """The first job of every bucket in the order inside a leaf, as a heap."""
    heads = []
    for seq, jobs in enumerate(leaf.buckets.values()):
        if jobs:
            first = in_order(jobs, kept)[0]
            heads.append((-first.priority, first.submitted, first.id, seq, jobs, 0))
    heapq.heapify(heads)
    return heads


def _pick(root: PlanNode) -> PlanNode:
    """The leaf the fair order reaches: from the root, the first active child of each heap."""
    plan = root
    while plan.children:
        heap = plan.heap
        while True:
            _, _, _, version, child = heap[0]
            if version == child.version and child.active:
                break
            heapq.heappop(heap)
        plan = child
    return plan


def _deactivate(plan: PlanNode) -> None:
    plan.active = 0
    parent = plan.parent
    while parent is not None:
        parent.active -= 1
        if parent.active:
            return
        parent = parent.parent


def _reorder(leaf: PlanNode) -> None:
    """After an admission the chain's ratios changed: re-queue them in their parents. The
    ratio is rounded so that equal ratios computed two ways tie; stale entries are skipped by
    version."""
    for plan in leaf.chain:
        plan.ratio = dominant_ratio(plan.alloc, plan.deserved)
        plan.version += 1
        if plan.parent is not None and plan.active:
            entry = (round(plan.ratio, 9), plan.weight, plan.path, plan.version, plan)
            heapq.heappush(plan.parent.heap, entry)


def try_start(state: CycleState, job: Job, leaf: PlanNode) -> bool:
    """Admission 2: start the whole minimum gang now, under every limit on its path and the
    job cap, each worker whole on one node; or say why it waits (Admission 4: the first gang
    blocked by capacity holds the reservation)."""
    w, n = job.per_worker, job.min_workers
    req = (w[0] * n, w[1] * n, w[2] * n)
    if state.hold_back:
        giving = held_back(state, leaf)
        if giving:
            state.waits[job.id] = messages.held_back(giving)
            return False
    if leaf.limited:
        over = over_limit(state, leaf, req)
        if over:
            state.waits[job.id] = over
            return False
    max_jobs = state.snapshot.instance.max_jobs
    if max_jobs is not None and state.running_jobs >= max_jobs:
        state.waits[job.id] = messages.job_cap(max_jobs)
        return False
    ledger = state.ledger
    shape = (w, n)
    tf = ledger.total_free
    placement = None
    if shape not in state.failed_shapes and req[0] <= tf[0] and req[1] <= tf[1] and req[2] <= tf[2]:
        placement = ledger.fit_index(w).place(n)  # place_gang's answer, without a full pass
    if placement is None:
        state.failed_shapes.add(shape)
        state.blocked.setdefault(id(leaf.buckets[(w, n, job.max_workers)]), job)
        if state.reserved_for is None and any(w):
            state.waits[job.id] = capacity_reason(state, w, n)
            _reserve(state, job)
        return False
    ledger.take(placement, w)
    ledger.charge(leaf, w, n)
    state.running_jobs += 1
    leaf.pending -= 1
    leaf.running += 1
    state.started[job.id] = placement
    state.started_in.append(leaf)
    _reorder(leaf)
    return True


def over_limit(state: CycleState, leaf: PlanNode, req: tuple) -> str | None:
    """Why ``req`` more would take a plan on ``leaf``'s path (or the quota) over its limit."""
    root = state.index.root
    for p in leaf.limited:
        a, lim = p.alloc, p.limit
        for r in range(3):
            if a[r] + req[r] > lim[r] + EPS:
                where = "the instance quota" if p is root else p.path
                return messages.at_limit(where, RESOURCES[r], a[r], lim[r], req[r])
    return None


def held_back(state: CycleState, leaf: PlanNode) -> str | None:
    """The plan on ``leaf``'s path that gives a victim back this cycle, if any (Reclaim 6)."""
    return leaf.first_in(state.hold_back)


def keeps_within(state: CycleState, leaf: PlanNode, job: Job) -> bool:
    """Reclaim 1's test on every plan of ``leaf``'s path, the root aside: with ``job``'s
    minimum gang running each holds at most its deserved share of every resource the job
    asks for, so no reclaim could ever stop it (Admission 1's first round, Admission 4)."""
    n = job.min_workers
    _, height = within_deserved(state.ledger.promised, leaf, job.per_worker, n, n)
    return height == len(leaf.chain) - 1


def worth_reserving(state: CycleState, job: Job, leaf: PlanNode) -> bool:
    """Admission 4, the carried holder re-validated: it goes before the fair order only when
    it would stay within its plans' deserved shares (as a reclaimer does: no reclaim can ever
    stop it), or when it is a gang that smaller work could overtake
    (``overtaken_by_smaller``), no plan below it in the fair order waits (``below_it``) and
    the next cycle's reclaim would not stop it (``reclaimed_next``). Going first is for the
    tie-break only: capacity freed after it blocked goes to it although the tie-break would now
    favour another plan, never to a start that borrows what the fair order owes a plan first
    or that a reclaim then undoes (the cascades of issue 18)."""
    if keeps_within(state, leaf, job):
        return True
    return (
        overtaken_by_smaller(state, job.per_worker, job.min_workers)
        and not below_it(leaf)
        and not reclaimed_next(state, job, leaf)
    )


def starved_gang(state: CycleState) -> tuple[Job, PlanNode] | None:
    """Admission 6: the pending gang submitted longest ago, more than ``max_gang_wait`` ago
    (then by id), among those smaller work could overtake (``overtaken_by_smaller``), with
    its leaf; a plan held back this cycle offers none, and with usage history on, neither
    does a gang of a plan that used more than its share (``over_used``) whose start would
    make a plan on its path borrow (``keeps_within``). A one-worker job of a plan at its
    share waits its turn in the fair order however long that is: it is never overtaken by
    smaller work."""
    latest = state.now - state.config.max_gang_wait
    standing = state.standing  # usage history weighs the shares: see below
    best: tuple[float, str, Job, PlanNode] | None = None
    for plan in state.bottom_up:
        if not plan.pending:
            continue
        for (w, n, _), jobs in plan.buckets.items():
            first: bool | None = None  # the bucket's: the same leaf and minimum gang
            for job in jobs:
                since = job.submitted
                if since > latest or (best is not None and (since, job.id) >= best[:2]):
                    continue
                if standing and first is None:
                    over = over_used(standing, (p.path for p in plan.chain))
                    first = not over or keeps_within(state, plan, job)
                if first is False:
                    # usage history on: a gang of a plan that used more than its share, whose
                    # start would make it borrow, waits its turn in the fair order; by age
                    # alone the team that had the cluster to itself, whose backlog is the
                    # oldest, would be served a gang a cycle at every level of load (issue 41)
                    continue
                if overtaken_by_smaller(state, w, n) and not held_back(state, plan):
                    best = (since, job.id, job, plan)
    return None if best is None else (best[2], best[3])


def overtaken_by_smaller(state: CycleState, w: tuple, n: int) -> bool:
    """Admission 4: the gang asks for more of its main resource than the smallest pending
    gang or elastic growth step of the cycle. A one-GPU job that would make its plan a
    borrower gains nothing by going first that the fair order would not give it."""
    main = 0 if w[0] else (1 if w[1] else 2)
    smallest = state.smallest
    if smallest is None:
        smallest = state.smallest = _smallest_gangs(state)
    return w[main] * n > smallest[main] + EPS


def below_it(leaf: PlanNode) -> bool:
    """Admission 4: at some level of ``leaf``'s path a sibling with a job to try has a
    strictly lower dominant ratio (rounded as Admission 1 rounds it): the fair order serves
    that plan first on its merits, not by the tie-break, so what was freed is not the
    holder's to take (a borrowing holder that took it would be reclaimed by that plan)."""
    for plan in leaf.chain:
        parent = plan.parent
        if parent is None:
            break
        mine = round(plan.ratio, 9)
        for sibling in parent.children:
            if sibling is not plan and sibling.active and round(sibling.ratio, 9) < mine:
                return True
    return False


def reclaimed_next(state: CycleState, job: Job, leaf: PlanNode) -> bool:
    """Admission 4 and Reclaim 6 (no start that the next cycle undoes): with the holder's
    minimum gang running, the next cycle's reclaim could stop it: it is preemptible,
    ``min_runtime`` (0) does not shield it, and a pending job of another leaf stays within its
    deserved share (Reclaim 1) at a level where the holder's side would then borrow a resource
    that job needs (Reclaim 3), both read on reclaim's lines (``floor``, ``ceiling``)."""
    if not job.preemptible or state.config.min_runtime > 0:
        return False
    w, n = job.per_worker, job.min_workers
    req = (w[0] * n, w[1] * n, w[2] * n)
    side_under = {id(p.parent): p for p in leaf.chain if p.parent is not None}
    ledger = state.ledger
    for other in state.bottom_up:
        if not other.pending or other is leaf:
            continue
        for (ow, on, _), jobs in other.buckets.items():
            if not jobs:
                continue
            _, height = within_deserved(ledger.promised, other, ow, on, on, floor=True)
            for mine in other.chain[:height]:
                side = side_under.get(id(mine.parent))
                if side is None:
                    continue  # the holder is not under this parent
                if side is mine:
                    break  # a plan above both: no level left where they are siblings
                if any(
                    ow[r] and ledger.alloc(side, r) + req[r] > side.ceiling[r] + EPS
                    for r in range(3)
                ):
                    return True
                break  # the one level where the two are siblings
    return False


def _smallest_gangs(state: CycleState) -> tuple:
    """Per resource, the smallest amount a pending gang (its minimum) or one more worker of an
    elastic job below its max asks for; infinity where none asks for any."""
    least = [float("inf")] * 3
    for plan in state.bottom_up:
        if plan.pending:
            for (w, n, _), jobs in plan.buckets.items():
                if jobs:
                    for r in range(3):
                        if w[r] and w[r] * n < least[r]:
                            least[r] = w[r] * n
    for job, _ in state.elastic:
        if job.workers < job.max_workers:
            w = job.per_worker
            for r in range(3):
                if w[r] and w[r] < least[r]:
                    least[r] = w[r]
    return tuple(least)


def capacity_reason(state: CycleState, w: tuple, n: int) -> str:
    return messages.for_capacity(w, n, gang_room(state.ledger.free, w, n))


def _reserve(state: CycleState, job: Job) -> None:
    """Admission 4: hold what is free on the nodes the gang will need, so capacity freed after
    it blocked goes to it first. Nodes are chosen by most free in the worker's main resource
    (gpu, else cpu, else memory), then name."""
    w = job.per_worker
    main = 0 if w[0] else (1 if w[1] else 2)
    room = dict(state.nodes.fits_on_empty_nodes(w))
    ledger = state.ledger
    free, names = ledger.free, ledger.names
    order = [(-free[i][main], names[i], i) for i in room]
    heapq.heapify(order)
    held: list[int] = []
    while order and len(held) < job.min_workers:
        _, _, i = heapq.heappop(order)
        room[i] -= 1
        ledger.reserve(i, w)
        held.append(i)
        if room[i] > 0:
            heapq.heappush(order, (-free[i][main], names[i], i))
    state.reserved_for = job.id
    state.reservation = messages.holds_reservation(", ".join(sorted({names[i] for i in held})))
