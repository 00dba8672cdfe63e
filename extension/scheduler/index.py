"""The plan index a cycle works on, and the cache that keeps it between cycles.

A cycle sees the plan tree as ``PlanNode`` vertices (with their chains, limits and the
per-cycle figures it writes) and the instance as ``NodeFigures`` (names, capacity rows). Both
depend only on the plan tree's version and the instance, so an ``IndexCache`` keeps them from
one cycle to the next (docs/scheduling.md "Cost": the plan index is kept between cycles). The
caller owns the cache: the service or a simulator passes its own to ``schedule``; one that
passes none shares ``SHARED_CACHE``, the module's own.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable
from itertools import chain
from operator import attrgetter

from . import messages
from .held import HoldKept
from .kept import FitCarry, SortedKept, WaitingKept
from .model import Instance, Job
from .placement import fit_count
from .plans import ROOT, PlanError, PlanTree, leaf_path
from .resources import UNLIMITED, Resources

INF = float("inf")
SHAPES_KEPT = 64  # a leaf with more bucket shapes starts the next cycle with none


class PlanNode:
    """A plan vertex as the cycle sees it; vectors are mutable [gpu, cpu, memory] lists.

    The vertex itself (path, share, limit, parent, children, chain) lives as long as the plan
    tree's version and the instance do; the per-cycle fields are zeroed by ``PlanIndex.reset``
    at the start of every cycle.
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
        "floor",
        "ceiling",
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
        "shield",
    )

    def __init__(
        self, path: str, share: float, limit: Resources, parent: PlanNode | None, leaf: bool
    ) -> None:
        self.path = path
        self.share = share
        self.limit = tuple(limit)
        self.parent = parent
        self.children: list[PlanNode] = []
        self.user_leaf = leaf
        self.implicit = False  # a user leaf the tree does not have, made for a job's first use
        self.chain: list[PlanNode] = []  # self and its ancestors up to the root, bottom-up
        self.limited: list[PlanNode] = []  # the members of chain with any limit
        self.answers: dict[tuple, str | None] = {}  # leaf: Admission 3 by (worker, min)
        # leaf: pending jobs by (worker, min, max); the lists are kept between cycles and
        # emptied by reset, so a settled cycle allocates (and the GC walks) next to nothing
        self.buckets: dict[tuple, list[Job]] = {}
        # per cycle -------------------------------------------------------------------------
        self.alloc = [0, 0, 0]  # held by running jobs (Ledger.charge)
        self.demand = [0, 0, 0]  # Words: Demand, capped by the limit
        self.deserved = [0.0, 0.0, 0.0]  # Deserved share
        # Deserved share 2, reclaim's two lines: with usage history weighing ``deserved``, the
        # lower and the higher of it and the share-only deserved share, so a reclaim is one
        # that the share-only rule would make too; without history both are ``deserved``
        self.floor = self.ceiling = self.deserved
        self.ratio = 0.0  # dominant ratio max_r(alloc_r / deserved_r) (Admission 1)
        self.weight = 0.0  # minus the deserved fraction of the instance: the order's tie-break
        self.version = 0  # bumped when the ratio changes: older heap entries are stale
        self.heap: list = []  # inner plan: its active children in fair order
        self.active = 0  # leaf: has jobs left to try; inner: number of active children
        self.heads: list | None = None  # leaf: the buckets' first jobs in fair order (a heap)
        self.pending = 0
        self.running = 0
        self.under: list[tuple[Job, PlanNode]] = []  # reclaim: victims-to-be in this subtree
        # reclaim: the least work a job under min_runtime here would lose (Reclaim 3: no job
        # past min_runtime that would lose more is taken instead of it)
        self.shield = INF

    def first_in(self, paths: frozenset[str] | set[str]) -> str | None:
        """The first plan on this plan's path (itself, then its ancestors) whose path is in
        ``paths``: Reclaim 6's held-back, losing and spared plans are sets of paths."""
        if paths:
            for p in self.chain:
                if p.path in paths:
                    return p.path
        return None


class NodeFigures:
    """What a cycle derives from an instance's nodes alone (names, capacity rows, totals)."""

    def __init__(self, inst: Instance) -> None:
        self.names = [n.name for n in inst.nodes]
        self.node_at = {name: i for i, name in enumerate(self.names)}
        self.capacity = [list(n.capacity) for n in inst.nodes]  # never written by a cycle
        # every amount an int: rows that stay whole while running jobs' ints are held
        self.integral = all(type(v) is int for row in self.capacity for v in row)
        self.total = tuple(inst.capacity)  # quota applied
        self.largest = [max((row[r] for row in self.capacity), default=0) for r in range(3)]
        self.machines = tuple(sum(row[r] for row in self.capacity) for r in range(3))
        self.fits_on_empty: dict[tuple, dict[int, int]] = {}  # shape -> {node: workers}

    def fits_on_empty_nodes(self, w: tuple) -> dict[int, int]:
        """How many workers of this shape each node could hold empty (those that hold one)."""
        key = tuple(w)
        fits = self.fits_on_empty.get(key)
        if fits is None:
            fits = {}
            for i, row in enumerate(self.capacity):
                k = fit_count(row, w)
                if k >= 1:
                    fits[i] = int(min(k, 1 << 30))
            self.fits_on_empty[key] = fits
        return fits


class PlanMark:
    """``PlanIndex.mark``'s answer: per plan, in ``plans`` order, its allocation (three
    numbers each), ratio and job counts."""

    __slots__ = ("plans", "alloc", "ratios", "pending", "running")

    plans: list[PlanNode]
    alloc: list[float]
    ratios: list[float]
    pending: list[int]
    running: list[int]


def _path_of(plan: PlanNode) -> str:
    return plan.path


# a plan's per-cycle figures, read in C by ``PlanIndex.mark``
_alloc_of, _ratio_of = attrgetter("alloc"), attrgetter("ratio")
_pending_of, _running_of = attrgetter("pending"), attrgetter("running")


class PlanIndex:
    """The plan vertices of one plan tree version on one instance, with what depends on those
    alone: the (plan, user) -> leaf answers and each leaf's Admission 3 answers. Building it is
    O(plans) of Python and it changes only when an admin changes a plan, so an ``IndexCache``
    keeps it between cycles."""

    def __init__(self, tree: PlanTree, version: int | None, inst: Instance) -> None:
        self.tree, self.version, self.instance = tree, version, inst
        root = PlanNode(ROOT, 1.0, inst.quota, None, False)
        root.chain = [root]
        root.limited = [root] if any(v != UNLIMITED for v in root.limit) else []
        self.root = root
        self.plans: dict[str, PlanNode] = {ROOT: root}
        self.leaves: dict[tuple[str, str], tuple[PlanNode | None, str | None]] = {}
        self.too_big: dict[tuple, str | None] = {}  # Admission 3, the instance part, by shape
        self.implicit: list[PlanNode] = []
        self.order: list[PlanNode] | None = None  # bottom_up, rebuilt after a plan is added
        # per node, rewritten in place by every cycle's Ledger: free, held by terminating jobs,
        # and (reclaim) free plus what is being released
        self.free = [list(node.capacity) for node in inst.nodes]
        self.incoming = [[0, 0, 0] for _ in inst.nodes]
        self.pool = [[0, 0, 0] for _ in inst.nodes]
        self.waiting = WaitingKept()  # the last cycle's waiting reasons (kept.py)
        self.sorted = SortedKept()  # the buckets the last cycle sorted (kept.py)
        self.intake_kept: object | None = None  # what the last intake derived: intake.Kept
        self.fit_carry = FitCarry()  # the fit indexes admission used, after hold (kept.py)
        self.hold_kept = HoldKept()  # the rows after the last hold (held.py)
        self.shares_kept: object | None = None  # the last deserved shares: deserved.SharesKept
        self.split_lines = False  # some plan's floor or ceiling is not its deserved share
        for plan in sorted(tree, key=lambda p: (p.path.count("/"), p.path)):
            self.add(plan.path, plan.share, plan.limit, plan.user_leaf)

    def add(self, path: str, share: float, limit: Resources, user_leaf: bool) -> PlanNode:
        parent = self.plans[path.rsplit("/", 1)[0] or ROOT]
        plan = PlanNode(path, share, limit, parent, user_leaf)
        # children stay in path order however the vertices were made, so a kept index and a
        # fresh one hand out shares (and break ties) identically
        bisect.insort(parent.children, plan, key=_path_of)
        plan.chain = [plan, *parent.chain]
        own = any(v != UNLIMITED for v in plan.limit)
        plan.limited = [plan, *parent.limited] if own else parent.limited
        self.plans[path] = plan
        self.order = None
        return plan

    def leaf_of(self, job: Job) -> tuple[PlanNode | None, str | None]:
        """The user leaf ``job`` is charged to, or None and why it can never run (Words: User
        leaf; Admission 3), answered once per (plan, user) for as long as the index."""
        key = (job.plan, job.user)
        found = self.leaves.get(key)
        if found is None:
            found = self.leaves[key] = self._find_leaf(job.plan, job.user)
        return found

    def _find_leaf(self, plan_path: str, user: str) -> tuple[PlanNode | None, str | None]:
        plan = self.plans.get(plan_path)
        if plan is None or plan is self.root:
            return None, messages.no_such_plan(plan_path)
        if plan.user_leaf:
            return None, messages.submit_to_parent(plan_path, plan.parent.path)
        try:
            path = leaf_path(plan_path, user)
        except PlanError as err:
            return None, str(err)
        leaf = self.plans.get(path)
        if leaf is None:  # created on first use at share 1 (Words: User leaf)
            unlimited = Resources(UNLIMITED, UNLIMITED, UNLIMITED)
            leaf = self.add(path, 1.0, unlimited, True)
            leaf.implicit = True
            self.implicit.append(leaf)
        elif leaf.children:
            return None, messages.not_a_user_leaf(path)
        return leaf, None

    def bottom_up(self) -> list[PlanNode]:
        """Deepest first, then by path: a total order, the same for a kept or a fresh index."""
        if self.order is None:
            self.order = sorted(self.plans.values(), key=lambda p: (-len(p.chain), p.path))
        return self.order

    def reset(self) -> None:
        """Zero what the last cycle wrote; keep the vertices and the bucket lists (intake
        empties them, or keeps them as the last cycle's intake left them: intake.Kept)."""
        self.sorted.next_cycle()
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
            p.shield = INF

    def empty_buckets(self) -> None:
        """Before intake reads the jobs afresh: every bucket emptied (``reset`` leaves them to
        intake, which may keep the last cycle's: intake.Kept), the lists kept."""
        for p in self.plans.values():
            if p.buckets:
                for jobs in p.buckets.values():
                    jobs.clear()
                if len(p.buckets) > SHAPES_KEPT:  # shapes nobody asks for any more
                    p.buckets.clear()

    def mark(self) -> PlanMark:
        """What admission and reclaim change in the per-cycle figures, as phases 1-4 left
        them, for ``rewind`` (Reclaim 6's reruns start from here). Flat lists of numbers:
        cheap to take every cycle, and nothing for the garbage collector to walk."""
        plans = list(self.plans.values())
        mark = PlanMark()
        mark.plans = plans
        mark.alloc = list(chain.from_iterable(map(_alloc_of, plans)))
        mark.ratios = list(map(_ratio_of, plans))
        mark.pending = list(map(_pending_of, plans))
        mark.running = list(map(_running_of, plans))
        return mark

    def rewind(self, mark: PlanMark, intake_order: Callable[[Job], int]) -> None:
        """Back to the figures ``mark`` took: allocations, ratios and job counts as phases 1-4
        left them; the walk's heaps, the victim lists and the shields as ``reset`` does; and
        every bucket in the order intake filled it (``intake_order``: a job's place in the
        snapshot). Admission sorts buckets in place, and the waiting reasons list their jobs
        in bucket order."""
        alloc, ratios, pending, running = mark.alloc, mark.ratios, mark.pending, mark.running
        for n, p in enumerate(mark.plans):
            p.alloc[:] = alloc[3 * n : 3 * n + 3]
            p.ratio = ratios[n]
            p.pending, p.running = pending[n], running[n]
            p.active = 0
            p.heads = None
            if p.heap:
                p.heap.clear()
            if p.under:
                p.under.clear()
            p.shield = INF
            if p.pending:
                for jobs in p.buckets.values():
                    if len(jobs) > 1:
                        jobs.sort(key=intake_order)

    def rewinds_as_reset(self) -> bool:
        """Whether ``rewind`` leaves every leaf's buckets as a ``reset`` and intake now would:
        unless a reset would drop a leaf's shapes and let intake add them again in another
        order (the order a walk passes over a leaf's buckets in, and sums its demand in), or
        hand the cycle a new index (``stale``)."""
        if self.stale():
            return False
        return all(len(p.buckets) <= SHAPES_KEPT for p in self.plans.values())

    def stale(self) -> bool:
        """Made-up leaves whose jobs are all gone cost every cycle a little: start afresh when
        they are most of the tree."""
        idle = sum(1 for p in self.implicit if not (p.pending or p.running))
        return idle > 256 and idle * 2 > len(self.plans)


class IndexCache:
    """The last instance's ``NodeFigures`` and the last cycle's ``PlanIndex``, kept for the
    next cycle on the same tree version and instance.

    One cycle at a time holds the index: ``checkout`` hands it to one cycle and ``give_back``
    returns it when the cycle is over; a cycle that raises never gives it back, so a
    half-updated index is never reused, and a second thread meanwhile builds its own. The
    instance's figures are immutable per instance and swapped in one assignment.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: PlanIndex | None = None
        self._nodes: tuple = (None, None)  # (instance, its NodeFigures)

    def nodes(self, inst: Instance) -> NodeFigures:
        """An Instance is immutable, so the last one's figures are kept: a service or a
        simulator passes the same nodes every cycle and would otherwise pay O(nodes) of Python
        per cycle."""
        held, figures = self._nodes
        if held is not inst and held != inst:
            figures = NodeFigures(inst)
        self._nodes = (inst, figures)
        return figures

    def checkout(self, tree: PlanTree, inst: Instance) -> PlanIndex:
        with self._lock:
            held, self._kept = self._kept, None
        version = getattr(tree, "version", None)  # a tree without one is never kept
        if (
            held is None
            or version is None
            or held.tree is not tree
            or held.version != version
            or (held.instance is not inst and held.instance != inst)
        ):
            return PlanIndex(tree, version, inst)
        held.instance = inst
        return held

    def give_back(self, index: PlanIndex) -> None:
        if index.version is not None and not index.stale():
            with self._lock:
                self._kept = index


# The cache of callers that pass none (the service today): the same one every cycle, as the
# module-level index of before, so their cycles stay as fast.
SHARED_CACHE = IndexCache()
