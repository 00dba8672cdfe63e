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

import heapq
from collections.abc import Iterable

from .decisions import (
    CycleResult,
    Decision,
    Grow,
    PlanFigures,
    Preempt,
    Reject,
    Shrink,
    Start,
    Wait,
)
from .model import Job, JobState, Snapshot
from .placement import fit_count, gang_room, max_workers_on, place_gang
from .plans import ROOT, PlanError, leaf_path
from .resources import RESOURCES, UNLIMITED, Resources, format_amount
from .shares import dominant_ratio, water_fill

EPS = 1e-9
_UNKNOWN = object()  # a cache miss, where None is a cached answer


class _Plan:
    """A plan vertex as the cycle sees it; vectors are mutable [gpu, cpu, memory] lists."""

    __slots__ = (
        "path",
        "share",
        "limit",
        "parent",
        "children",
        "user_leaf",
        "alloc",
        "demand",
        "deserved",
        "ratio",
        "version",
        "heap",
        "active",
        "queue",
        "pos",
        "pending",
        "running",
        "chain",
        "limited",
        "weight",
    )

    def __init__(self, path: str, share: float, limit: Resources, parent: _Plan | None, leaf: bool):
        self.path = path
        self.share = share
        self.limit = tuple(limit)
        self.parent = parent
        self.children: list[_Plan] = []
        self.user_leaf = leaf
        self.alloc = [0, 0, 0]
        self.demand = [0, 0, 0]
        self.deserved = [0.0, 0.0, 0.0]
        self.ratio = 0.0
        self.version = 0
        self.heap: list = []
        self.active = 0  # leaf: has jobs left to try; inner: number of active children
        self.queue: list[Job] = []
        self.pos = 0
        self.pending = 0
        self.running = 0
        self.chain: list[_Plan] = []  # self and its ancestors up to the root, bottom-up
        self.limited: list[_Plan] = []  # the members of chain with any limit
        self.weight = 0.0  # minus the deserved fraction of the instance: the order's tie-break


def schedule(snapshot: Snapshot, now: float) -> CycleResult:
    """Run one cycle and return what to do; see the module docstring for the phases."""
    cycle = _Cycle(snapshot, now)
    cycle.index()
    cycle.compute_demand()
    cycle.compute_deserved()
    cycle.admit()
    cycle.reclaim()
    cycle.grow()
    return cycle.result()


def check_submission(snapshot: Snapshot, job: Job) -> str | None:
    """The reason ``job`` can never run as asked, or None; the service calls it at submit time."""
    cycle = _Cycle(snapshot, 0.0)
    cycle.index(extra=[job])
    return cycle.impossible(job)


class _NodeFigures:
    """What a cycle derives from an instance's nodes alone (names, capacity rows, totals)."""

    def __init__(self, inst) -> None:
        self.names = [n.name for n in inst.nodes]
        self.node_at = {name: i for i, name in enumerate(self.names)}
        self.capacity = [list(n.capacity) for n in inst.nodes]  # never written by a cycle
        self.total = tuple(inst.capacity)  # quota applied
        self.largest = [max((row[r] for row in self.capacity), default=0) for r in range(3)]
        self.machines = tuple(sum(row[r] for row in self.capacity) for r in range(3))
        self.most_on_empty: dict[tuple, float] = {}  # worker shape -> max_workers_on


_last_nodes: tuple = (None, None)  # (instance, its _NodeFigures), swapped in one assignment


def _nodes(inst) -> _NodeFigures:
    """An Instance is immutable, so the last one's figures are kept: a simulator passes the same
    one every cycle and would otherwise pay O(nodes) of Python per cycle for them."""
    global _last_nodes
    held, figures = _last_nodes
    if held is not inst:
        figures = _NodeFigures(inst)
        _last_nodes = (inst, figures)
    return figures


class _Cycle:
    def __init__(self, snapshot: Snapshot, now: float) -> None:
        self.snap = snapshot
        self.now = now
        self.config = snapshot.config
        self.decisions: list[Decision] = []
        self.waits: dict[str, str] = {}
        self.started: dict[str, list[int]] = {}  # job id -> node indexes (Start this cycle)
        self.grown: dict[str, tuple[Job, list[int]]] = {}  # job id -> (job, nodes added)
        # capacity-blocked, first of each (leaf, shape) in fair order: the reclaim candidates
        self.blocked: dict[tuple, tuple[Job, _Plan]] = {}
        self.running: list[tuple[Job, _Plan]] = []
        self.reserved_for: str | None = None
        self.victims: set[str] = set()
        self._impossible_cache: dict[tuple, str | None] = {}
        self._too_big_cache: dict[tuple, str | None] = {}
        self._leaves: dict[tuple[str, str], tuple[_Plan | None, str | None]] = {}

    # 1. index ----------------------------------------------------------------------------------
    def index(self, extra: Iterable[Job] = ()) -> None:
        inst = self.snap.instance
        nodes = _nodes(inst)
        self.names, self.node_at, self.capacity = nodes.names, nodes.node_at, nodes.capacity
        self.largest, self.most_on_empty = nodes.largest, nodes.most_on_empty
        self.free = [row[:] for row in self.capacity]
        self.incoming = [[0, 0, 0] for _ in inst.nodes]  # held by terminating jobs
        self.total_capacity = list(nodes.total)
        root = _Plan(ROOT, 1.0, inst.quota, None, False)
        root.chain = [root]
        root.limited = [root] if any(v != UNLIMITED for v in root.limit) else []
        self.root = root
        self.plans: dict[str, _Plan] = {ROOT: root}
        for plan in sorted(self.snap.plans, key=lambda p: (p.path.count("/"), p.path)):
            self._add_plan(plan.path, plan.share, plan.limit, plan.user_leaf)
        self.live: list[tuple[Job, _Plan]] = []  # pending (not rejected) and running
        self.running_jobs = 0
        cache, leaves = self._impossible_cache, self._leaves
        live, decisions = self.live, self.decisions
        pending, running = JobState.PENDING, JobState.RUNNING
        for job in [*self.snap.jobs, *extra]:  # the hot loop: locals, one lookup per question
            found = leaves.get((job.plan, job.user))
            if found is None:
                found = leaves[(job.plan, job.user)] = self._find_leaf(job)
            leaf, problem = found
            w = job.per_worker
            if job.state is pending:
                # 2. reject (Admission 3); answers are per leaf and shape, so mostly a lookup
                if problem is None:
                    problem = cache.get((leaf, w, job.min_workers), _UNKNOWN)
                    if problem is _UNKNOWN:
                        problem = self.impossible(job, leaf)
                if problem:
                    decisions.append(Reject(job.id, problem))
                    continue
                leaf.queue.append(job)
                leaf.pending += 1
            elif job.state is not running or leaf is None:
                continue
            else:
                self.running_jobs += 1
                leaf.running += 1
                for i in self._nodes_of(job):
                    row = self.free[i]
                    row[0] -= w[0]
                    row[1] -= w[1]
                    row[2] -= w[2]
                    if job.terminating:
                        inc = self.incoming[i]
                        inc[0] += w[0]
                        inc[1] += w[1]
                        inc[2] += w[2]
                self._charge(leaf, w, job.workers)
                self.running.append((job, leaf))
            live.append((job, leaf))
            k, d = job.max_workers, leaf.demand  # 3. demand, leaf part
            d[0] += w[0] * k
            d[1] += w[1] * k
            d[2] += w[2] * k
        self.total_free = [sum(column) for column in zip(*self.free)] or [0, 0, 0]
        for r in range(3):  # the quota can be below the machines
            used = nodes.machines[r] - self.total_free[r]
            self.total_free[r] = min(self.total_free[r], self.total_capacity[r] - used)

    def _add_plan(self, path: str, share: float, limit: Resources, user_leaf: bool) -> _Plan:
        parent = self.plans[path.rsplit("/", 1)[0] or ROOT]
        plan = _Plan(path, share, limit, parent, user_leaf)
        parent.children.append(plan)
        plan.chain = [plan, *parent.chain]
        own = any(v != UNLIMITED for v in plan.limit)
        plan.limited = [plan, *parent.limited] if own else parent.limited
        self.plans[path] = plan
        return plan

    def _leaf_of(self, job: Job) -> tuple[_Plan | None, str | None]:
        key = (job.plan, job.user)
        found = self._leaves.get(key)
        if found is None:
            found = self._leaves[key] = self._find_leaf(job)
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
            leaf = self._add_plan(path, 1.0, Resources(UNLIMITED, UNLIMITED, UNLIMITED), True)
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
        key = (leaf, job.per_worker, job.min_workers)
        cache = self._impossible_cache
        if key in cache:
            return cache[key]
        w, n = job.per_worker, job.min_workers
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
        if answer is None and self._most(w) < n:
            answer = (
                f"rejected: the gang of {_size(w, n)} cannot be placed: the nodes hold at most "
                f"{int(self._most(w))} such workers at once"
            )
        cache[key] = answer
        return answer

    def _most(self, w: tuple) -> float:
        """max_workers_on the empty nodes, kept per worker shape with the instance's figures."""
        most = self.most_on_empty.get(tuple(w))
        if most is None:
            most = self.most_on_empty[tuple(w)] = max_workers_on(self.capacity, w)
        return most

    # 3. demand ---------------------------------------------------------------------------------
    def compute_demand(self) -> None:
        """Leaves summed their jobs' max requests while indexing; cap by limits, bottom-up."""
        self.bottom_up = sorted(self.plans.values(), key=lambda p: -len(p.chain))
        for plan in self.bottom_up:
            d, lim = plan.demand, plan.limit
            for r in range(3):
                if d[r] > lim[r]:
                    d[r] = lim[r]
            if plan.parent is not None:
                pd = plan.parent.demand
                pd[0] += d[0]
                pd[1] += d[1]
                pd[2] += d[2]
        rd = self.root.demand
        for r in range(3):
            rd[r] = min(rd[r], self.total_capacity[r])

    # 4. deserved -------------------------------------------------------------------------------
    def compute_deserved(self) -> None:
        self.root.deserved = list(self.root.demand)
        stack = [self.root]
        while stack:
            plan = stack.pop()
            kids = plan.children
            if not kids:
                continue
            weights = [k.share for k in kids]
            for r in range(3):
                got = water_fill(plan.deserved[r], [k.demand[r] for k in kids], weights)
                for kid, amount in zip(kids, got):
                    kid.deserved[r] = amount
            stack.extend(kids)
        cap = self.total_capacity
        for plan in self.plans.values():
            plan.ratio = dominant_ratio(plan.alloc, plan.deserved)
            plan.weight = -sum(plan.deserved[r] / cap[r] for r in range(3) if cap[r] > 0)

    # 5. admit ----------------------------------------------------------------------------------
    def admit(self) -> None:
        """Admission 1, 2, 4: walk the fair order; start whole gangs; reserve for the first
        capacity-blocked gang.

        Order: from the root, the child with the lowest dominant ratio that still has a job to
        try; equal ratios go to the child that deserves more (its deserved fractions of the
        instance summed over resources), then by path; inside a leaf, priority (high first),
        then submission time, then job id.
        """
        self._failed_shapes: set[tuple] = set()
        for plan in self.bottom_up:
            if plan.queue:
                plan.queue.sort(key=lambda j: (-j.priority, j.submitted, j.id))
                plan.active = 1
            if plan.active and plan.parent is not None:
                plan.parent.active += 1
                self._enqueue(plan)
        holder = self._holder()
        if holder is not None:  # Admission 4: what was freed since it blocked goes to it first
            self._try_start(*holder)
        held = holder[0] if holder is not None else None
        failed, blocked = self._failed_shapes, self.blocked
        unbounded = self.snap.instance.max_jobs is None
        while self.root.active:
            leaf = self._pick()
            queue = leaf.queue
            # Free capacity only shrinks during this pass, so a shape that found no room once
            # finds none again; where no limit or job cap could give a different reason, the
            # job is passed over without the full attempt (this is the loop 10,000 pending
            # jobs go through).
            quick = unbounded and not leaf.limited
            while leaf.pos < len(queue):
                job = queue[leaf.pos]
                leaf.pos += 1
                if job is held:
                    continue  # tried first, above
                if quick and (job.per_worker, job.min_workers) in failed:
                    key = (leaf, job.per_worker, job.min_workers, job.max_workers)
                    if key not in blocked:
                        blocked[key] = (job, leaf)
                    continue
                if self._try_start(job, leaf):
                    break
            if leaf.pos >= len(queue):
                self._deactivate(leaf)

    def _holder(self) -> tuple[Job, _Plan] | None:
        """The pending job that held the reservation after the last cycle, if still pending."""
        wanted = self.snap.reserved
        if wanted is None:
            return None
        for job, leaf in self.live:
            if job.id == wanted:
                return (job, leaf) if job.state is JobState.PENDING else None
        return None

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
            placement = place_gang(self.free, self.names, w, n)
        if placement is None:
            self._failed_shapes.add(shape)
            self.blocked.setdefault((leaf, w, n, job.max_workers), (job, leaf))
            if self.reserved_for is None and any(w):
                self.waits[job.id] = self._capacity_reason(job)
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

    def _reserve(self, job: Job) -> None:
        """Admission 4: hold what is free on the nodes the gang will need, so capacity freed
        after it blocked goes to it first. Nodes are chosen by most free in the worker's main
        resource (gpu, else cpu, else memory), then name."""
        w = job.per_worker
        main = 0 if w[0] else (1 if w[1] else 2)
        room = {
            i: int(fit_count(self.capacity[i], w))
            for i in range(len(self.names))
            if fit_count(self.capacity[i], w) >= 1
        }
        held: list[int] = []
        for _ in range(job.min_workers):
            choices = [i for i, k in room.items() if k > 0]
            if not choices:
                break
            i = min(choices, key=lambda i: (-self.free[i][main], self.names[i]))
            room[i] -= 1
            row = self.free[i]
            take = [max(0, min(row[r], w[r])) for r in range(3)]
            for r in range(3):
                row[r] -= take[r]
                self.total_free[r] -= take[r]
            held.append(i)
        self.reserved_for = job.id
        nodes = ", ".join(sorted({self.names[i] for i in held}))
        self.reservation = f"holds the reservation: capacity freed on {nodes} goes to it first"

    # 6. reclaim --------------------------------------------------------------------------------
    def reclaim(self) -> None:
        """Reclaim: for each capacity-blocked job whose leaf (and ancestors up to where the
        borrowing happened) stays within its deserved share, take back from borrowers."""
        self.delta: dict[str, list[float]] = {}  # plan path -> alloc change promised this cycle
        if not self.blocked:  # nothing to reclaim for: skip the O(jobs) victim list
            return
        # victims-to-be by plan subtree, so a reclaimer looks only under borrowing siblings
        self.under: dict[int, list[tuple[Job, _Plan]]] = {}
        for job, leaf in self.running:
            if (
                job.preemptible
                and not job.terminating
                and job.started is not None
                and self.now - job.started >= self.config.min_runtime
            ):
                for p in leaf.chain:
                    self.under.setdefault(id(p), []).append((job, leaf))
        if not self.under:
            return
        self.total_incoming = [sum(row[r] for row in self.incoming) for r in range(3)]
        # per node: free now plus what terminating jobs (and this cycle's victims) will free;
        # kept up to date by _commit_victims and _claim for the rest of the phase
        self.pool = [
            [f[0] + i[0], f[1] + i[1], f[2] + i[2]] for f, i in zip(self.free, self.incoming)
        ]
        self._pool_rooms: dict[tuple, float] = {}
        delta = self.delta
        for (leaf, w, n, _), (job, _) in self.blocked.items():
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
            self._reclaim_for(job, leaf)

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
            if self._room_with(chosen, w, target, self._pool_room(w, target)) >= target:
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
                if sibling is mine or id(sibling) not in self.under:
                    continue
                if not any(
                    w[r] and self._alloc(sibling, r) > sibling.deserved[r] + EPS for r in range(3)
                ):
                    continue
                out.extend(
                    (victim, vleaf, sibling)
                    for victim, vleaf in self.under[id(sibling)]
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
            if self._room_with(trial, w, target, base) >= target:
                merged = trial
        return merged

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
        for p in self._leaf_for(job).chain:
            dp = d(p.path, [0.0, 0.0, 0.0])
            for r in range(3):
                dp[r] += w[r] * len(placement)

    def _leaf_for(self, job: Job) -> _Plan:
        return self.plans[leaf_path(job.plan, job.user)]

    # 7. grow -----------------------------------------------------------------------------------
    def grow(self) -> None:
        """Admission 5: elastic jobs grow one worker at a time toward max, the job whose leaf has
        the lowest dominant ratio first (then priority, submission time, id)."""
        heap = []
        for job, leaf in self.live:
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
        reasons: dict[tuple, str] = {}  # free capacity is fixed now: one message per shape
        started, waits = self.started, self.waits
        for plan in self.bottom_up:
            for job in plan.queue:
                if job.id in started:
                    continue
                reason = waits.get(job.id)
                if job.id == self.reserved_for:
                    reason = f"{reason}; {self.reservation}"
                if not reason:
                    shape = (job.per_worker, job.min_workers)
                    reason = reasons.get(shape)
                    if reason is None:
                        reason = reasons[shape] = self._capacity_reason(job)
                decisions.append(Wait(job.id, reason))
        for plan in self.bottom_up:  # leaves count their jobs; parents add their children's
            if plan.parent is not None:
                plan.parent.pending += plan.pending
                plan.parent.running += plan.running
            out.plans[plan.path] = PlanFigures(
                path=plan.path,
                share=plan.share,
                limit=Resources(*plan.limit),
                deserved=Resources(*plan.deserved),
                allocated=Resources(*plan.alloc),
                demand=Resources(*plan.demand),
                pending=plan.pending,
                running=plan.running,
            )
        return out

    def _capacity_reason(self, job: Job) -> str:
        w, n = job.per_worker, job.min_workers
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
