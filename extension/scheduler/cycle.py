"""One scheduling cycle: ``schedule(snapshot, now) -> CycleResult``.

Written as numbered phases over one snapshot (the shape of Kueue's ``schedule()``); each phase
cites the section of SCHEDULING.md it implements. No I/O, no clock, no randomness: the same
snapshot and ``now`` give the same decisions.

1. index      plans (with implicit user leaves), nodes, running allocations; in the same pass
              over the jobs, 2. and the per-leaf part of 3. (one pass: this is the hot loop)
2. reject     jobs that can never run as asked (Admission 3)
3. demand     per plan, capped by its limit (Words: Demand)
4. deserved   hierarchical weighted water-filling per resource (Deserved share)
5. admit      fair order, all-or-nothing gangs, one reservation (Admission 1, 2, 4)
6. reclaim    borrowers only, elastic shrink first, whole gangs, least loss (Reclaim)
7. grow       elastic jobs toward max with what is left free (Admission 5)
"""

from __future__ import annotations

import bisect
import heapq
import threading
from collections.abc import Iterable
from operator import attrgetter

from .decisions import (
    CycleResult,
    Decision,
    Grow,
    Preempt,
    Reject,
    Shrink,
    Start,
)
from .model import Instance, Job, JobState, Snapshot
from .placement import FitIndex, fit_count, gang_room, max_workers_on, place_gang
from .plans import ROOT, PlanError, PlanTree, leaf_path
from .resources import RESOURCES, UNLIMITED, Resources, format_amount
from .shares import dominant_ratio, water_fill

EPS = 1e-9


class _Plan:
    """A plan vertex as the cycle sees it; vectors are mutable [gpu, cpu, memory] lists.

    The vertex itself (path, share, limit, parent, children, chain) lives as long as the plan
    tree's version and the instance do (see ``_Index``); the per-cycle fields are zeroed by
    ``_Index.reset`` at the start of every cycle.
    """

    __slots__ = (
        "path",
        "share",
        "limit",
        "parent",
        "children",
        "user_leaf",
        "implicit",
        "alloc",
        "demand",
        "deserved",
        "ratio",
        "version",
        "heap",
        "active",
        "buckets",
        "heads",
        "answers",
        "pending",
        "running",
        "chain",
        "limited",
        "weight",
        "under",
    )

    def __init__(self, path: str, share: float, limit: Resources, parent: _Plan | None, leaf: bool):
        self.path = path
        self.share = share
        self.limit = tuple(limit)
        self.parent = parent
        self.children: list[_Plan] = []
        self.user_leaf = leaf
        self.implicit = False  # a user leaf the tree does not have, made for a job's first use
        self.alloc = [0, 0, 0]
        self.demand = [0, 0, 0]
        self.deserved = [0.0, 0.0, 0.0]
        self.ratio = 0.0
        self.version = 0
        self.heap: list = []
        self.active = 0  # leaf: has jobs left to try; inner: number of active children
        # leaf: pending jobs by (worker, min, max); the lists are kept between cycles and
        # emptied by reset, so a settled cycle allocates (and the GC walks) next to nothing
        self.buckets: dict[tuple, list[Job]] = {}
        self.heads: list | None = None  # leaf: the buckets' first jobs in fair order (a heap)
        self.answers: dict[tuple, str | None] = {}  # leaf: Admission 3 by (worker, min)
        self.pending = 0
        self.running = 0
        self.chain: list[_Plan] = []  # self and its ancestors up to the root, bottom-up
        self.limited: list[_Plan] = []  # the members of chain with any limit
        self.weight = 0.0  # minus the deserved fraction of the instance: the order's tie-break
        self.under: list[tuple[Job, _Plan]] = []  # reclaim: victims-to-be in this subtree


def schedule(snapshot: Snapshot, now: float) -> CycleResult:
    """Run one cycle and return what to do; see the module docstring for the phases."""
    cycle = _Cycle(snapshot, now)
    cycle.index()
    cycle.compute_demand()
    cycle.compute_deserved()
    cycle.admit()
    cycle.reclaim()
    cycle.grow()
    out = cycle.result()
    cycle.done()
    return out


def check_submission(snapshot: Snapshot, job: Job) -> str | None:
    """The reason ``job`` can never run as asked, or None; the service calls it at submit time."""
    cycle = _Cycle(snapshot, 0.0)
    cycle.index(extra=[job])
    answer = cycle.impossible(job)
    cycle.done()
    return answer


class _NodeFigures:
    """What a cycle derives from an instance's nodes alone (names, capacity rows, totals)."""

    def __init__(self, inst: Instance) -> None:
        self.names = [n.name for n in inst.nodes]
        self.node_at = {name: i for i, name in enumerate(self.names)}
        self.capacity = [list(n.capacity) for n in inst.nodes]  # never written by a cycle
        self.total = tuple(inst.capacity)  # quota applied
        self.largest = [max((row[r] for row in self.capacity), default=0) for r in range(3)]
        self.machines = tuple(sum(row[r] for row in self.capacity) for r in range(3))
        self.fits_on_empty: dict[tuple, dict[int, int]] = {}  # shape -> {node: workers}


_last_nodes: tuple = (None, None)  # (instance, its _NodeFigures), swapped in one assignment


def _nodes(inst: Instance) -> _NodeFigures:
    """An Instance is immutable, so the last one's figures are kept: a service or a simulator
    passes the same nodes every cycle and would otherwise pay O(nodes) of Python per cycle."""
    global _last_nodes
    held, figures = _last_nodes
    if held is not inst and held != inst:
        figures = _NodeFigures(inst)
    _last_nodes = (inst, figures)
    return figures


class _Index:
    """The plan vertices of one plan tree version on one instance, with what depends on those
    alone: the (plan, user) -> leaf answers and each leaf's Admission 3 answers. Building it is
    O(plans) of Python and it changes only when an admin changes a plan, so it is kept between
    cycles (one at a time: ``_checkout`` hands it to one cycle and ``_Cycle.done`` returns it;
    a cycle that raises never returns it, so a half-updated index is never reused)."""

    def __init__(self, tree: PlanTree, version: int | None, inst: Instance) -> None:
        self.tree, self.version, self.instance = tree, version, inst
        root = _Plan(ROOT, 1.0, inst.quota, None, False)
        root.chain = [root]
        root.limited = [root] if any(v != UNLIMITED for v in root.limit) else []
        self.root = root
        self.plans: dict[str, _Plan] = {ROOT: root}
        self.leaves: dict[tuple[str, str], tuple[_Plan | None, str | None]] = {}
        self.too_big: dict[tuple, str | None] = {}
        self.implicit: list[_Plan] = []
        self.order: list[_Plan] | None = None  # bottom_up, rebuilt after a plan is added
        # per node, rewritten in place by every cycle: free, held by terminating jobs, and
        # (reclaim) free plus what is being released
        self.free = [list(node.capacity) for node in inst.nodes]
        self.incoming = [[0, 0, 0] for _ in inst.nodes]
        self.pool = [[0, 0, 0] for _ in inst.nodes]
        for plan in sorted(tree, key=lambda p: (p.path.count("/"), p.path)):
            self.add(plan.path, plan.share, plan.limit, plan.user_leaf)

    def add(self, path: str, share: float, limit: Resources, user_leaf: bool) -> _Plan:
        parent = self.plans[path.rsplit("/", 1)[0] or ROOT]
        plan = _Plan(path, share, limit, parent, user_leaf)
        # children stay in path order however the vertices were made, so a kept index and a
        # fresh one hand out shares (and break ties) identically
        bisect.insort(parent.children, plan, key=_path_of)
        plan.chain = [plan, *parent.chain]
        own = any(v != UNLIMITED for v in plan.limit)
        plan.limited = [plan, *parent.limited] if own else parent.limited
        self.plans[path] = plan
        self.order = None
        return plan

    def bottom_up(self) -> list[_Plan]:
        """Deepest first, then by path: a total order, the same for a kept or a fresh index."""
        if self.order is None:
            self.order = sorted(self.plans.values(), key=lambda p: (-len(p.chain), p.path))
        return self.order

    def reset(self) -> None:
        """Zero what the last cycle wrote; keep the vertices and the emptied bucket lists."""
        for p in self.plans.values():
            p.alloc[:] = (0, 0, 0)
            p.demand[:] = (0, 0, 0)
            p.deserved[:] = (0.0, 0.0, 0.0)
            p.ratio = p.weight = 0.0
            p.active = p.pending = p.running = 0
            if p.heap:
                p.heap.clear()
            if p.under:
                p.under.clear()
            if p.buckets:
                for jobs in p.buckets.values():
                    jobs.clear()
                if len(p.buckets) > 64:  # shapes nobody asks for any more
                    p.buckets.clear()

    def stale(self) -> bool:
        """Made-up leaves whose jobs are all gone cost every cycle a little: start afresh when
        they are most of the tree."""
        idle = sum(1 for p in self.implicit if not (p.pending or p.running))
        return idle > 256 and idle * 2 > len(self.plans)


_index_lock = threading.Lock()
_kept: _Index | None = None


def _checkout(tree: PlanTree, inst: Instance) -> _Index:
    global _kept
    with _index_lock:
        held, _kept = _kept, None
    version = getattr(tree, "version", None)  # a tree without one is never kept
    if (
        held is None
        or version is None
        or held.tree is not tree
        or held.version != version
        or (held.instance is not inst and held.instance != inst)
    ):
        return _Index(tree, version, inst)
    held.instance = inst
    return held


def _give_back(index: _Index) -> None:
    global _kept
    if index.version is not None and not index.stale():
        with _index_lock:
            _kept = index


def _path_of(plan: _Plan) -> str:
    return plan.path


_by_time = attrgetter("submitted", "id")
_by_priority = attrgetter("priority")


def _in_order(jobs: list[Job]) -> list[Job]:
    """Sort a bucket into the order inside a leaf: priority (high first), then submission
    time, then id (two sorts in C: a stable sort keeps the time order among equal priorities)."""
    if len(jobs) > 1:
        jobs.sort(key=_by_time)
        jobs.sort(key=_by_priority, reverse=True)
    return jobs


class _Cycle:
    def __init__(self, snapshot: Snapshot, now: float) -> None:
        self.snap = snapshot
        self.now = now
        self.config = snapshot.config
        self.decisions: list[Decision] = []
        self.waits: dict[str, str] = {}
        self.started: dict[str, list[int]] = {}  # job id -> node indexes (Start this cycle)
        self.grown: dict[str, tuple[Job, list[int]]] = {}  # job id -> (job, nodes added)
        # capacity-blocked, first of each bucket (leaf and shape) in fair order: the reclaim
        # candidates, keyed by the bucket's identity (no key to build per bucket); a whole
        # bucket stands for its first job until reclaim needs to know which that is
        self.blocked: dict[int, Job | list[Job]] = {}
        self.running: list[Job] = []
        self.elastic: list[tuple[Job, _Plan]] = []  # pending (not rejected) and running
        self.holder: tuple[Job, _Plan] | None = None
        self.reserved_for: str | None = None
        self.victims: set[str] = set()
        self._index: _Index | None = None
        self._fits: dict[tuple, FitIndex] = {}

    def done(self) -> None:
        """The cycle is over: the plan index may serve the next one."""
        if self._index is not None:
            _give_back(self._index)
            self._index = None

    # 1. index ----------------------------------------------------------------------------------
    def index(self, extra: Iterable[Job] = ()) -> None:
        inst = self.snap.instance
        nodes = _nodes(inst)
        self.names, self.node_at, self.capacity = nodes.names, nodes.node_at, nodes.capacity
        self.largest = nodes.largest
        self.fits_on_empty = nodes.fits_on_empty
        self.total_capacity = list(nodes.total)
        index = self._index = _checkout(self.snap.plans, inst)
        index.reset()
        self.free, self.incoming = index.free, index.incoming  # held by terminating jobs
        for row, cap in zip(self.free, self.capacity):
            row[:] = cap
        for row in self.incoming:
            row[:] = (0, 0, 0)
        self.root, self.plans, self.leaves = index.root, index.plans, index.leaves
        self._too_big_cache = index.too_big
        self.running_jobs = 0
        leaves, decisions, elastic = self.leaves, self.decisions, self.elastic
        pending, running = JobState.PENDING, JobState.RUNNING
        wanted = self.snap.reserved
        free, incoming, node_at = self.free, self.incoming, self.node_at
        for job in [*self.snap.jobs, *extra]:  # the hot loop: locals, one lookup per question
            found = leaves.get((job.plan, job.user))
            if found is None:
                found = leaves[(job.plan, job.user)] = self._find_leaf(job)
            leaf = found[0]
            state = job.state
            if state is pending:
                if leaf is None:  # 2. reject (Admission 3): no such plan or leaf
                    decisions.append(Reject(job.id, found[1]))
                    continue
                w = job.per_worker
                key = (w, job.min_workers, job.max_workers)
                bucket = leaf.buckets.get(key)
                if bucket is None:  # a bucket exists only for a shape its leaf can run
                    # 2. reject, answered once per leaf and shape for as long as the index
                    problem = self.impossible(job, leaf)
                    if problem:
                        decisions.append(Reject(job.id, problem))
                        continue
                    bucket = leaf.buckets[key] = []
                bucket.append(job)
                leaf.pending += 1
                if job.max_workers > job.min_workers:
                    elastic.append((job, leaf))
                if wanted is not None and job.id == wanted:
                    self.holder = (job, leaf)
            elif state is not running or leaf is None:
                continue
            else:
                self.running_jobs += 1
                leaf.running += 1
                w0, w1, w2 = w = job.per_worker
                for name in job.placement:
                    i = node_at.get(name)
                    if i is None:
                        continue
                    row = free[i]
                    row[0] -= w0
                    row[1] -= w1
                    row[2] -= w2
                    if job.terminating:
                        inc = incoming[i]
                        inc[0] += w0
                        inc[1] += w1
                        inc[2] += w2
                k = job.workers  # charged to the leaf here, to its ancestors in compute_demand
                a, d, m = leaf.alloc, leaf.demand, job.max_workers
                a[0] += w0 * k
                a[1] += w1 * k
                a[2] += w2 * k
                d[0] += w0 * m  # 3. demand, leaf part (pending jobs: per bucket, below)
                d[1] += w1 * m
                d[2] += w2 * m
                self.running.append(job)
                if job.max_workers > job.min_workers:
                    elastic.append((job, leaf))
        self.total_free = [sum(column) for column in zip(*self.free)] or [0, 0, 0]
        for r in range(3):  # the quota can be below the machines
            used = nodes.machines[r] - self.total_free[r]
            self.total_free[r] = min(self.total_free[r], self.total_capacity[r] - used)

    def _leaf_of(self, job: Job) -> tuple[_Plan | None, str | None]:
        key = (job.plan, job.user)
        found = self.leaves.get(key)
        if found is None:
            found = self.leaves[key] = self._find_leaf(job)
        return found

    def _find_leaf(self, job: Job) -> tuple[_Plan | None, str | None]:
        plan = self.plans.get(job.plan)
        if plan is None or plan is self.root:
            return None, f"there is no plan {job.plan!r}; ask an admin to create it"
        if plan.user_leaf:
            return None, f"{job.plan} is a user leaf; submit to its parent {plan.parent.path}"
        try:
            path = leaf_path(job.plan, job.user)
        except PlanError as err:
            return None, str(err)
        leaf = self.plans.get(path)
        if leaf is None:  # created on first use at share 1 (Words: User leaf)
            unlimited = Resources(UNLIMITED, UNLIMITED, UNLIMITED)
            leaf = self._index.add(path, 1.0, unlimited, True)
            leaf.implicit = True
            self._index.implicit.append(leaf)
        elif leaf.children:
            return None, f"{path} is a plan with children, not a user leaf"
        return leaf, None

    def _nodes_of(self, job: Job) -> list[int]:
        return [self.node_at[n] for n in job.placement if n in self.node_at]

    def _charge(self, leaf: _Plan, worker: tuple, count: int) -> None:
        g, c, m = worker[0] * count, worker[1] * count, worker[2] * count
        for p in leaf.chain:
            a = p.alloc
            a[0] += g
            a[1] += c
            a[2] += m

    # 2. reject (in index's pass) ------------------------------------------------------------
    def impossible(self, job: Job, leaf: _Plan | None = None) -> str | None:
        """Admission 3: over a limit on its path, over the instance, or no node can hold it."""
        if leaf is None:
            leaf, problem = self._leaf_of(job)
            if problem:
                return problem
        w, n = job.per_worker, job.min_workers
        key = (w, n)
        cache = leaf.answers
        if key in cache:
            return cache[key]
        req = [w[r] * n for r in range(3)]
        answer = None
        for p in leaf.limited:
            if p is self.root:
                continue
            for r, name in enumerate(RESOURCES):
                if req[r] > p.limit[r]:
                    answer = (
                        f"rejected: plan {p.path} has a {name} limit of "
                        f"{format_amount(name, p.limit[r])} and this job asks for "
                        f"{format_amount(name, req[r])} ({_size(w, n)}); ask for at most "
                        f"{format_amount(name, p.limit[r])} or submit to a plan with a higher limit"
                    )
                    break
            if answer:
                break
        cache[key] = answer or self._too_big(w, n)
        return cache[key]

    def _too_big(self, w: Resources, n: int) -> str | None:
        """The instance part of Admission 3, which depends on the shape only (cached by it)."""
        key = (w, n)
        cache = self._too_big_cache
        if key in cache:
            return cache[key]
        answer = None
        for r, name in enumerate(RESOURCES):
            if w[r] * n > self.total_capacity[r]:
                answer = (
                    f"rejected: the instance has {format_amount(name, self.total_capacity[r])}"
                    f" in all (capacity and quota) and this job asks for "
                    f"{format_amount(name, w[r] * n)} ({_size(w, n)})"
                )
                break
        if answer is None:
            for r, name in enumerate(RESOURCES):
                if w[r] > self.largest[r]:
                    answer = (
                        f"rejected: one worker asks for {format_amount(name, w[r])} but the "
                        f"largest node has {format_amount(name, self.largest[r])}; use more, "
                        f"smaller workers"
                    )
                    break
        if answer is None:
            most = max_workers_on(self.capacity, w)  # the empty nodes; once per shape (cached)
            if most < n:
                answer = (
                    f"rejected: the gang of {_size(w, n)} cannot be placed: the nodes hold at "
                    f"most {int(most)} such workers at once"
                )
        cache[key] = answer
        return answer

    # 3. demand ---------------------------------------------------------------------------------
    def compute_demand(self) -> None:
        """Leaves add up their pending buckets (running jobs were added while indexing); then
        bottom-up, each plan's demand is capped by its limit and handed to its parent together
        with what it holds."""
        self.bottom_up = self._index.bottom_up()
        for plan in self.bottom_up:
            d, lim = plan.demand, plan.limit
            if plan.pending:
                for (w, _, most), jobs in plan.buckets.items():
                    if jobs:
                        k = most * len(jobs)
                        d[0] += w[0] * k
                        d[1] += w[1] * k
                        d[2] += w[2] * k
            for r in range(3):
                if d[r] > lim[r]:
                    d[r] = lim[r]
            parent = plan.parent
            if parent is not None:
                pd, pa, a = parent.demand, parent.alloc, plan.alloc
                pd[0] += d[0]
                pd[1] += d[1]
                pd[2] += d[2]
                pa[0] += a[0]
                pa[1] += a[1]
                pa[2] += a[2]
        rd = self.root.demand
        for r in range(3):
            rd[r] = min(rd[r], self.total_capacity[r])

    # 4. deserved -------------------------------------------------------------------------------
    def compute_deserved(self) -> None:
        """Top-down water-filling per resource (``water_fill``), parents before children. A plan
        with nothing of a resource to hand out leaves its children at zero; where every child's
        demand fits, each gets its demand (water_fill's own first case, without the call)."""
        self.root.deserved[:] = self.root.demand
        for plan in reversed(self.bottom_up):  # parents before their children
            kids = plan.children
            if not kids:
                continue
            have = plan.deserved
            if len(kids) == 1:  # most plans above a user leaf: no lists to build
                kid = kids[0]
                for r in range(3):
                    amount, cap = have[r], kid.demand[r]
                    if amount and cap <= amount:
                        kid.deserved[r] = float(cap)
                    elif amount:
                        kid.deserved[r] = water_fill(amount, [cap], [kid.share])[0]
                continue
            weights = None
            for r in range(3):
                amount = have[r]
                if not amount:
                    continue
                caps = [k.demand[r] for k in kids]
                if sum(caps) <= amount:  # water_fill's own first case, without the call
                    for kid, cap in zip(kids, caps):
                        kid.deserved[r] = float(cap)
                    continue
                if weights is None:
                    weights = [k.share for k in kids]
                for kid, got in zip(kids, water_fill(amount, caps, weights)):
                    kid.deserved[r] = got
        c0, c1, c2 = self.total_capacity
        for plan in self.bottom_up:
            a, d = plan.alloc, plan.deserved
            if a[0] > 0 or a[1] > 0 or a[2] > 0:  # else the ratio stays the reset's 0
                plan.ratio = dominant_ratio(a, d)
            if d[0] or d[1] or d[2]:
                plan.weight = -(
                    (d[0] / c0 if c0 > 0 else 0)
                    + (d[1] / c1 if c1 > 0 else 0)
                    + (d[2] / c2 if c2 > 0 else 0)
                )

    # 5. admit ----------------------------------------------------------------------------------
    def admit(self) -> None:
        """Admission 1, 2, 4: walk the fair order; start whole gangs; reserve for the first
        capacity-blocked gang.

        Order: from the root, the child with the lowest dominant ratio that still has a job to
        try; equal ratios go to the child that deserves more (its deserved fractions of the
        instance summed over resources), then by path; inside a leaf, priority (high first),
        then submission time, then job id. A leaf merges its buckets (jobs of one priority and
        shape) by their first jobs.
        """
        self._failed_shapes: set[tuple] = set()
        # per worker shape tried this pass: nodes by how many such workers they hold, kept in
        # step with self.free by _take and _reserve (the only writers during admission)
        self._fits: dict[tuple, FitIndex] = {}
        for plan in self.bottom_up:
            if plan.pending:
                plan.active = 1
                plan.heads = None  # built on the leaf's first turn, if it needs them
            if plan.active and plan.parent is not None:
                plan.parent.active += 1
        for plan in self.bottom_up:  # each parent's order of its children, heapified at once
            if plan.active and plan.children:
                heap = plan.heap
                heap.extend(
                    (round(c.ratio, 9), c.weight, c.path, c.version, c)
                    for c in plan.children
                    if c.active
                )
                heapq.heapify(heap)
        holder = self.holder
        if holder is not None:  # Admission 4: what was freed since it blocked goes to it first
            self._try_start(*holder)
        held = holder[0] if holder is not None else None
        held_leaf = holder[1] if holder is not None else None
        failed, blocked = self._failed_shapes, self.blocked
        unbounded = self.snap.instance.max_jobs is None
        heappop, heapreplace = heapq.heappop, heapq.heapreplace
        while self.root.active:
            leaf = self._pick()
            # Free capacity only shrinks during this pass, so a shape that found no room once
            # finds none again; where no limit or job cap could give a different reason, a
            # bucket of such a shape is passed over whole (its first job stands for it in
            # reclaim), and a leaf of only such buckets at once: this is how a busy tick with
            # 10,000 pending jobs costs a few thousand steps.
            quick = unbounded and not leaf.limited
            heads = leaf.heads
            if heads is None:
                if quick and leaf is not held_leaf:
                    for (w, n, _), jobs in leaf.buckets.items():
                        if jobs and (w, n) not in failed:
                            break
                    else:  # every shape failed: each bucket is blocked, first job unsorted yet
                        for jobs in leaf.buckets.values():
                            if jobs and id(jobs) not in blocked:
                                blocked[id(jobs)] = jobs
                        self._deactivate(leaf)
                        continue
                heads = leaf.heads = []
                for seq, jobs in enumerate(leaf.buckets.values()):
                    if not jobs:
                        continue
                    first = _in_order(jobs)[0]
                    heads.append((-first.priority, first.submitted, first.id, seq, jobs, 0))
                heapq.heapify(heads)
            while heads:
                _, _, _, seq, jobs, i = heads[0]
                job = jobs[i]
                if quick and job is not held and (job.per_worker, job.min_workers) in failed:
                    if id(jobs) not in blocked:
                        blocked[id(jobs)] = job
                    heappop(heads)  # the rest of the bucket has the same shape
                    continue
                if i + 1 < len(jobs):
                    after = jobs[i + 1]
                    entry = (-after.priority, after.submitted, after.id, seq, jobs, i + 1)
                    heapreplace(heads, entry)
                else:
                    heappop(heads)
                if job is held:
                    continue  # tried first, above
                if self._try_start(job, leaf):
                    break
            if not heads:
                self._deactivate(leaf)
        self._fits = {}  # free rows change again in reclaim and grow: not kept in step there

    def _pick(self) -> _Plan:
        plan = self.root
        while plan.children:
            heap = plan.heap
            while True:
                _, _, _, version, child = heap[0]
                if version == child.version and child.active:
                    break
                heapq.heappop(heap)
            plan = child
        return plan

    def _deactivate(self, plan: _Plan) -> None:
        plan.active = 0
        parent = plan.parent
        while parent is not None:
            parent.active -= 1
            if parent.active:
                return
            parent = parent.parent

    def _reorder(self, leaf: _Plan) -> None:
        """After an admission the chain's ratios changed: re-queue them in their parents."""
        for plan in leaf.chain:
            plan.ratio = dominant_ratio(plan.alloc, plan.deserved)
            plan.version += 1
            if plan.parent is not None and plan.active:
                self._enqueue(plan)

    def _enqueue(self, plan: _Plan) -> None:
        """(Re)queue a plan in its parent's order; stale entries are skipped by version. The
        ratio is rounded so that equal ratios computed two ways tie."""
        entry = (round(plan.ratio, 9), plan.weight, plan.path, plan.version, plan)
        heapq.heappush(plan.parent.heap, entry)

    def _try_start(self, job: Job, leaf: _Plan) -> bool:
        w, n = job.per_worker, job.min_workers
        req = (w[0] * n, w[1] * n, w[2] * n)
        if leaf.limited:
            over = self._over_limit(leaf, req)
            if over:
                self.waits[job.id] = over
                return False
        max_jobs = self.snap.instance.max_jobs
        if max_jobs is not None and self.running_jobs >= max_jobs:
            self.waits[job.id] = f"waiting: the instance runs at most {max_jobs} jobs at once"
            return False
        shape = (w, n)
        tf = self.total_free
        placement = None
        if (
            shape not in self._failed_shapes
            and req[0] <= tf[0]
            and req[1] <= tf[1]
            and req[2] <= tf[2]
        ):
            fits = self._fits.get(w)
            if fits is None:
                fits = self._fits[w] = FitIndex(self.free, self.names, w)
            placement = fits.place(n)  # what place_gang would give, without a pass over all
        if placement is None:
            self._failed_shapes.add(shape)
            self.blocked.setdefault(id(leaf.buckets[(w, n, job.max_workers)]), job)
            if self.reserved_for is None and any(w):
                self.waits[job.id] = self._capacity_reason(w, n)
                self._reserve(job)
            return False
        self._take(placement, w)
        self._charge(leaf, w, n)
        self.running_jobs += 1
        leaf.pending -= 1
        leaf.running += 1
        self.started[job.id] = placement
        self._reorder(leaf)
        return True

    def _over_limit(self, leaf: _Plan, req: tuple) -> str | None:
        for p in leaf.limited:
            a, lim = p.alloc, p.limit
            for r in range(3):
                if a[r] + req[r] > lim[r] + EPS:
                    name = RESOURCES[r]
                    where = "the instance quota" if p is self.root else p.path
                    return (
                        f"waiting: {where} at its {name} limit: "
                        f"{_amount(name, a[r])} of {_amount(name, lim[r])} in use, "
                        f"this job needs {_amount(name, req[r])} more"
                    )
        return None

    def _take(self, placement: list[int], w: tuple) -> None:
        for i in placement:
            row = self.free[i]
            row[0] -= w[0]
            row[1] -= w[1]
            row[2] -= w[2]
        n = len(placement)
        tf = self.total_free
        tf[0] -= w[0] * n
        tf[1] -= w[1] * n
        tf[2] -= w[2] * n
        for fits in self._fits.values():
            for i in dict.fromkeys(placement):
                fits.update(i)

    def _reserve(self, job: Job) -> None:
        """Admission 4: hold what is free on the nodes the gang will need, so capacity freed
        after it blocked goes to it first. Nodes are chosen by most free in the worker's main
        resource (gpu, else cpu, else memory), then name."""
        w = job.per_worker
        main = 0 if w[0] else (1 if w[1] else 2)
        room = dict(self._fits_on_empty(w))
        free, names = self.free, self.names
        order = [(-free[i][main], names[i], i) for i in room]
        heapq.heapify(order)
        held: list[int] = []
        while order and len(held) < job.min_workers:
            _, _, i = heapq.heappop(order)
            room[i] -= 1
            row = free[i]
            take = [max(0, min(row[r], w[r])) for r in range(3)]
            for r in range(3):
                row[r] -= take[r]
                self.total_free[r] -= take[r]
            held.append(i)
            for fits in self._fits.values():
                fits.update(i)
            if room[i] > 0:
                heapq.heappush(order, (-row[main], names[i], i))
        self.reserved_for = job.id
        nodes = ", ".join(sorted({self.names[i] for i in held}))
        self.reservation = f"holds the reservation: capacity freed on {nodes} goes to it first"

    def _fits_on_empty(self, w: tuple) -> dict[int, int]:
        """How many workers of this shape each node could hold empty (those that hold one)."""
        fits = self.fits_on_empty.get(tuple(w))
        if fits is None:
            fits = {}
            for i, row in enumerate(self.capacity):
                k = fit_count(row, w)
                if k >= 1:
                    fits[i] = int(min(k, 1 << 30))
            self.fits_on_empty[tuple(w)] = fits
        return fits

    # 6. reclaim --------------------------------------------------------------------------------
    def reclaim(self) -> None:
        """Reclaim: for each capacity-blocked job whose leaf (and ancestors up to where the
        borrowing happened) stays within its deserved share, take back from borrowers."""
        self.delta: dict[str, list[float]] = {}  # plan path -> alloc change promised this cycle
        if not self.blocked:  # nothing to reclaim for: skip the O(jobs) victim list
            return
        # victims-to-be by plan subtree, so a reclaimer looks only under borrowing siblings
        now, min_runtime = self.now, self.config.min_runtime
        victims = 0
        for job in self.running:
            if (
                job.preemptible
                and not job.terminating
                and job.started is not None
                and now - job.started >= min_runtime
            ):
                leaf = self._leaf_of(job)[0]
                entry = (job, leaf)
                for p in leaf.chain:
                    p.under.append(entry)
                victims += 1
        if not victims:
            return
        self.total_incoming = [sum(row[r] for row in self.incoming) for r in range(3)]
        # per node: free now plus what terminating jobs (and this cycle's victims) will free;
        # kept up to date by _commit_victims and _claim for the rest of the phase
        self.pool = self._index.pool
        for row, f, i in zip(self.pool, self.free, self.incoming):
            row[0] = f[0] + i[0]
            row[1] = f[1] + i[1]
            row[2] = f[2] + i[2]
        self._pool_rooms: dict[tuple, float] = {}
        delta = self.delta
        for job in self.blocked.values():
            some = job[0] if job.__class__ is list else job  # every job of a bucket alike
            leaf, w, n = self._leaf_of(some)[0], some.per_worker, some.min_workers
            # the leaf's own check of _within_deserved, inline: on a busy cluster most blocked
            # leaves already hold their share and stop here
            a, d = leaf.alloc, leaf.deserved
            promised = delta.get(leaf.path)
            if promised:
                a = (a[0] + promised[0], a[1] + promised[1], a[2] + promised[2])
            if (
                (w[0] and a[0] + w[0] * n > d[0] + EPS)
                or (w[1] and a[1] + w[1] * n > d[1] + EPS)
                or (w[2] and a[2] + w[2] * n > d[2] + EPS)
            ):
                continue
            self._reclaim_for(_in_order(job)[0] if job.__class__ is list else job, leaf)

    def _alloc(self, plan: _Plan, r: int) -> float:
        d = self.delta.get(plan.path)
        return plan.alloc[r] + (d[r] if d else 0)

    def _within_deserved(self, leaf: _Plan, job: Job) -> tuple[int, int]:
        """(workers k this job may take within its deserved share, height of the chain that
        stays within it). k is 0 when even its minimum gang would make its leaf a borrower."""
        w0, w1, w2 = job.per_worker
        chain = leaf.chain[:-1]
        delta = self.delta
        for k in range(job.max_workers, job.min_workers - 1, -1):
            ok = 0
            for p in chain:
                a, d = p.alloc, p.deserved
                promised = delta.get(p.path)
                if promised:
                    a = (a[0] + promised[0], a[1] + promised[1], a[2] + promised[2])
                if (
                    (w0 and a[0] + w0 * k > d[0] + EPS)
                    or (w1 and a[1] + w1 * k > d[1] + EPS)
                    or (w2 and a[2] + w2 * k > d[2] + EPS)
                ):
                    break
                ok += 1
            if ok:
                return k, ok
        return 0, 0

    def _reclaim_for(self, job: Job, leaf: _Plan) -> None:
        k, height = self._within_deserved(leaf, job)
        if not k:
            return
        w = job.per_worker
        need = [w[r] * job.min_workers for r in range(3)]
        # What terminating jobs will free is enough: wait for it, claim it, preempt no more.
        on_its_way = "waiting: resources being released by preempted jobs go to it"
        if any(need) and all(need[r] <= self.total_incoming[r] for r in range(3)):
            # Claimed by amount: where it lands is checked when it has landed. This keeps a
            # busy tick O(1) per waiting gang instead of O(nodes).
            for r in range(3):
                self.total_incoming[r] -= need[r]
            self.waits[job.id] = on_its_way
            return
        if all(need[r] <= self.total_free[r] + self.total_incoming[r] for r in range(3)):
            if self._pool_room(w, job.min_workers) >= job.min_workers:
                self._claim(job, k)
                self.waits[job.id] = on_its_way
                return
        eligible = self._eligible(leaf, height, w)
        if not eligible:
            return
        could_free = [sum(v.per_worker[r] * v.workers for v, _, _ in eligible) for r in range(3)]
        if any(
            need[r] > self.total_free[r] + self.total_incoming[r] + could_free[r] for r in range(3)
        ):
            return  # even every borrower's job would not make room: preempt nothing
        steps = self._victim_steps(eligible, w)
        chosen: list[tuple] = []  # (victim, vleaf, nodes released)
        gained = [0.0, 0.0, 0.0]
        want = [w[r] * k for r in range(3)]
        base = self._pool_room(w, k)
        for victim, vleaf, nodes in steps:
            for r in range(3):
                gained[r] += victim.per_worker[r] * len(nodes)
            chosen.append((victim, vleaf, nodes))
            if (
                all(
                    want[r] <= self.total_free[r] + self.total_incoming[r] + gained[r]
                    for r in range(3)
                )
                and self._room_with(chosen, w, k, base) >= k
            ):
                break
        target = k
        while target >= job.min_workers:
            if (
                self._enough(chosen, w, target)
                and self._room_with(chosen, w, target, self._pool_room(w, target)) >= target
            ):
                break
            target -= 1
        if target < job.min_workers:
            return  # never preempt for nothing
        chosen = self._prune(chosen, w, target)
        if not chosen:  # what is free or on its way already makes room
            self._claim(job, target)
            self.waits[job.id] = on_its_way
            return
        self._commit_victims(job, leaf, chosen)
        self._claim(job, target)
        names = ", ".join(sorted({v.id for v, _, _ in chosen}))
        self.waits[job.id] = f"waiting: reclaiming from {names} (grace {self.config.grace:g} s)"

    def _eligible(self, leaf: _Plan, height: int, w: tuple) -> list[tuple]:
        """Victims for a reclaimer: running jobs under a sibling that borrows (holds more than
        it deserves in a resource the reclaimer needs), at each level where the reclaimer's
        side stays within its share (the first ``height`` plans of its chain)."""
        out = []
        for mine in leaf.chain[:height]:
            parent = mine.parent
            if parent is None:
                break
            for sibling in parent.children:
                if sibling is mine or not sibling.under:
                    continue
                if not any(
                    w[r] and self._alloc(sibling, r) > sibling.deserved[r] + EPS for r in range(3)
                ):
                    continue
                out.extend(
                    (victim, vleaf, sibling)
                    for victim, vleaf in sibling.under
                    if victim.id not in self.victims
                )
        return out

    def _victim_steps(self, eligible: list[tuple], w: tuple) -> list[tuple]:
        """Reclaim: elastic shrink first, then whole gangs; victims that stay at or above their
        deserved share first; then lower priority, most recently started, fewest resources,
        job id."""

        def stays(vleaf: _Plan, side: _Plan, release: tuple) -> bool:
            for p in vleaf.chain:
                for r in range(3):
                    if w[r] and self._alloc(p, r) - release[r] < p.deserved[r] - EPS:
                        return False
                if p is side:
                    break
            return True

        def rank(victim: Job) -> tuple:
            size = tuple(v * victim.workers for v in victim.per_worker)
            return (victim.priority, -(victim.started or 0), size, victim.id)

        shrinks, gangs = [], []
        for victim, vleaf, side in eligible:
            vw = victim.per_worker
            extra = victim.workers - victim.min_workers
            whole = tuple(v * victim.workers for v in vw)
            if victim.elastic and extra > 0:
                one = tuple(vw)
                nodes = self._nodes_of(victim)
                # shrink one worker at a time, highest rank first
                for j in range(extra):
                    release = tuple(v * (j + 1) for v in one)
                    first = 0 if stays(vleaf, side, release) else 1
                    shrinks.append(((first, *rank(victim), j), (victim, vleaf, [nodes[-1 - j]])))
            first = 0 if stays(vleaf, side, whole) else 1
            gangs.append(((first, *rank(victim)), (victim, vleaf, self._nodes_of(victim))))
        shrinks.sort(key=lambda s: s[0])
        gangs.sort(key=lambda s: s[0])
        steps = [s for _, s in shrinks]
        # A gang stop replaces any shrink steps of the same job taken before it.
        return steps + [s for _, s in gangs]

    def _prune(self, chosen: list[tuple], w: tuple, target: int) -> list[tuple]:
        """Least loss: drop any whole-gang victim, newest choice first, that is not needed."""
        merged = self._merge(chosen)
        base = self._pool_room(w, target)
        for item in reversed(list(merged)):
            trial = [c for c in merged if c is not item]
            if self._enough(trial, w, target) and self._room_with(trial, w, target, base) >= target:
                merged = trial
        return merged

    def _enough(self, chosen: list[tuple], w: tuple, count: int) -> bool:
        """In total, what is free, what is on its way and not promised yet, and what ``chosen``
        would release cover ``count`` workers. A claim by amount takes from the totals alone,
        so the per-node pool by itself could promise the same released capacity twice."""
        for r in range(3):
            if w[r]:
                have = self.total_free[r] + self.total_incoming[r]
                have += sum(v.per_worker[r] * len(nodes) for v, _, nodes in chosen)
                if w[r] * count > have + EPS:
                    return False
        return True

    def _room_with(self, chosen: list[tuple], w: tuple, count: int, base: float) -> float:
        """gang_room of the pool once ``chosen`` let go; ``base`` is the pool's own room. Only
        the nodes the victims free are recounted, so a step costs its victims, not the nodes."""
        touched: dict[int, list] = {}
        for victim, _, nodes in chosen:
            vw = victim.per_worker
            for i in nodes:
                row = touched.get(i)
                if row is None:
                    row = touched[i] = self.pool[i][:]
                row[0] += vw[0]
                row[1] += vw[1]
                row[2] += vw[2]
        for i, row in touched.items():
            base += min(fit_count(row, w), count) - min(fit_count(self.pool[i], w), count)
        return base

    def _merge(self, chosen: list[tuple]) -> list[tuple]:
        """Shrink steps and a later stop of the same job become the stop alone."""
        out: dict[str, tuple] = {}
        for victim, vleaf, nodes in chosen:
            if victim.id in out and len(nodes) == victim.workers:
                out[victim.id] = (victim, vleaf, list(nodes))
            elif victim.id in out:
                v, vl, have = out[victim.id]
                if len(have) < victim.workers:
                    out[victim.id] = (v, vl, have + list(nodes))
            else:
                out[victim.id] = (victim, vleaf, list(nodes))
        return list(out.values())

    def _pool_room(self, w: tuple, count: int) -> float:
        """gang_room of the pool, remembered until the pool changes (a claim or a victim):
        most reclaimers of a busy tick ask about the same few shapes."""
        key = (w, count)
        room = self._pool_rooms.get(key)
        if room is None:
            room = self._pool_rooms[key] = gang_room(self.pool, w, count)
        return room

    def _commit_victims(self, job: Job, leaf: _Plan, chosen: list[tuple]) -> None:
        self._pool_rooms.clear()
        for victim, vleaf, nodes in chosen:
            self.victims.add(victim.id)
            count = len(nodes)
            vw = victim.per_worker
            for i in nodes:  # freed after the grace period: incoming, like any terminating job
                for r in range(3):
                    self.incoming[i][r] += vw[r]
                    self.total_incoming[r] += vw[r]
                    self.pool[i][r] += vw[r]
            for p in vleaf.chain:
                d = self.delta.setdefault(p.path, [0.0, 0.0, 0.0])
                for r in range(3):
                    d[r] -= victim.per_worker[r] * count
            reason = f"reclaimed by {leaf.path} for job {job.id}"
            if count < victim.workers:
                release = tuple(self.names[i] for i in nodes)
                left = victim.workers - count
                self.decisions.append(Shrink(victim.id, release, left, self.config.grace, reason))
            else:
                self.decisions.append(Preempt(victim.id, self.config.grace, reason, job.id))

    def _claim(self, job: Job, k: int) -> None:
        """Hold what the reclaimer will use, free capacity first, then what is being released:
        it is not free for growth or for another reclaimer in this cycle."""
        self._pool_rooms.clear()
        w = job.per_worker
        placement = place_gang(self.pool, self.names, w, k) or place_gang(
            self.pool, self.names, w, job.min_workers
        )
        if placement is None:
            return
        for i in placement:
            row, inc, pool = self.free[i], self.incoming[i], self.pool[i]
            for r in range(3):
                from_free = max(0, min(row[r], w[r]))
                from_incoming = min(inc[r], w[r] - from_free)
                row[r] -= from_free
                inc[r] -= from_incoming
                pool[r] -= from_free + from_incoming
                self.total_free[r] -= from_free
                self.total_incoming[r] -= from_incoming
        d = self.delta.setdefault
        for p in self._leaf_of(job)[0].chain:
            dp = d(p.path, [0.0, 0.0, 0.0])
            for r in range(3):
                dp[r] += w[r] * len(placement)

    # 7. grow -----------------------------------------------------------------------------------
    def grow(self) -> None:
        """Admission 5: elastic jobs grow one worker at a time toward max, the job whose leaf has
        the lowest dominant ratio first (then priority, submission time, id)."""
        heap = []
        for job, leaf in self.elastic:
            if not job.elastic or job.id in self.victims or job.terminating:
                continue
            if job.id in self.started:
                workers = len(self.started[job.id])
            elif job.state is JobState.RUNNING:
                workers = job.workers
            else:
                continue
            if workers < job.max_workers:
                heap.append((leaf.ratio, -job.priority, job.submitted, job.id, job, leaf))
        heapq.heapify(heap)
        while heap:
            ratio, prio, sub, jid, job, leaf = heapq.heappop(heap)
            if leaf.ratio > ratio + EPS:
                heapq.heappush(heap, (leaf.ratio, prio, sub, jid, job, leaf))
                continue
            w = job.per_worker
            if self._over_limit(leaf, tuple(w)):
                continue
            mine = self.started.get(job.id) or self._nodes_of(job)
            spot = place_gang(self.free, self.names, w, 1, prefer=frozenset(mine))
            if spot is None:
                continue
            self._take(spot, w)
            self._charge(leaf, w, 1)
            for p in leaf.chain:
                p.ratio = dominant_ratio(p.alloc, p.deserved)
            if job.id in self.started:
                self.started[job.id].extend(spot)
                workers = len(self.started[job.id])
            else:
                added = self.grown.setdefault(job.id, (job, []))[1]
                added.extend(spot)
                workers = job.workers + len(added)
            if workers < job.max_workers:
                heapq.heappush(heap, (leaf.ratio, prio, sub, jid, job, leaf))

    # result ------------------------------------------------------------------------------------
    def result(self) -> CycleResult:
        out = CycleResult(reserved=self.reserved_for)
        decisions = out.decisions
        decisions.extend(self.decisions)
        names = self.names
        for job_id, nodes in self.started.items():
            decisions.append(Start(job_id, tuple(names[i] for i in nodes)))
        for job, nodes in self.grown.values():
            added = tuple(names[i] for i in nodes)
            decisions.append(Grow(job.id, added, job.workers + len(added)))
        # Every job still pending waits: by default for capacity, one message per shape (free
        # capacity is fixed now); then the reasons the cycle gave single jobs.
        waiting = out.waiting
        by_shape: dict[tuple, list[str]] = {}
        for plan in self.bottom_up:
            if not plan.buckets:
                continue
            for (w, n, _), jobs in plan.buckets.items():
                if jobs:
                    ids = by_shape.get((w, n))
                    if ids is None:
                        ids = by_shape[(w, n)] = []
                    ids += map(_id_of, jobs)
        for (w, n), ids in by_shape.items():
            waiting.update(dict.fromkeys(ids, self._capacity_reason(w, n)))
        for job_id in self.started:
            del waiting[job_id]
        waiting.update(self.waits)
        if self.reserved_for is not None:
            held = self.reserved_for
            waiting[held] = f"{waiting[held]}; {self.reservation}"
        # one flat list of numbers (FIGURE_FIELDS per plan): a tuple per plan would be thousands
        # of objects for the garbage collector to walk every cycle
        flat = out.figure_data
        for plan in self.bottom_up:  # leaves count their jobs; parents add their children's
            parent = plan.parent
            if parent is not None:
                parent.pending += plan.pending
                parent.running += plan.running
            if plan.implicit and not (plan.pending or plan.running):
                continue  # a made-up leaf whose jobs are gone is not a plan any more
            d, a, m = plan.deserved, plan.alloc, plan.demand
            flat += (plan.path, plan.share, plan.limit, d[0], d[1], d[2], a[0], a[1], a[2])
            flat += (m[0], m[1], m[2], plan.pending, plan.running)
        return out

    def _capacity_reason(self, w: tuple, n: int) -> str:
        room = int(gang_room(self.free, w, n))
        return (
            f"waiting for capacity: needs {_size(w, n)}, each worker on one node; "
            f"room now for {room}"
        )


def _size(w: tuple, n: int) -> str:
    """``4 workers x 1 gpu`` for messages."""
    return f"{n} worker{'s' if n > 1 else ''} x {Resources(*w).describe()}"


def _amount(name: str, value: float) -> str:
    return (
        format_amount(name, value).rsplit(" ", 1)[0]
        if name == "gpu"
        else format_amount(name, value)
    )


_id_of = attrgetter("id")
