"""The rough tail of a forward run: a start for every job the real core did not reach within the
budget (docs/simulate.md "Estimated start").

At 1,000 pending on 512 nodes a core cycle costs 10-30 ms, and the one that takes back the
victims' resources after their grace 100+ ms, so an estimate's budget (0.15 s) affords one or
two of the hundreds of cycles a forward run needs. The jobs left get their starts from a
capacity model continued from where the core stopped, in about 30 ms:

- the instance is one pool (no nodes: a gang never waits for a whole node);
- running jobs give back what they hold when the forward run's events say (ends, victims'
  releases, shrinks); a victim is pending again then, with its runtime left;
- pending jobs start, whole gangs at their minimum, in a weighted fair order: from the top
  down, the child whose holding over its weight is lowest (the most of any resource over the
  capacity; at a tie the bigger weight), down to a leaf, whose head (priority, then submission,
  as the core) goes next. A plan's weight is its share among the siblings that have jobs,
  multiplied down the tree: the deserved shares when every plan wants more than there is.
  At ``min_runtime`` 0, as the core's two rounds there (Admission 1), heads that keep their
  leaf within its share go before any that would borrow: the descent then only takes
  subtrees that hold such a head (a count per plan, kept as holdings and heads change);
- strict: nothing starts past a head that does not fit (the core lets smaller jobs past under
  its reservation); limits, the instance's job count and reclaim are not modelled: a borrower
  holds on to its end, so a job the core would start by reclaim errs late.

So a tail start is rough: the estimate says so (``Estimate.rough``), and
benchmarks/bench_estimate.py measures it against a forward run of the core with a roomy
budget (median error about a tenth of the wait at 1,000 pending on 512 nodes).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from extension.scheduler import Job, JobState, PlanTree, Resources
from extension.scheduler.plans import ROOT, parent_of


@dataclass
class TailWorld:
    """Where the core stopped: the time, the capacity, the live jobs, and what each running
    one gives back when: ``gives`` is (time, job id, workers, back) with ``back`` the runtime
    it runs again once it is pending again (a victim), None when it is gone."""

    t: float
    capacity: Resources
    plans: PlanTree
    jobs: dict[str, Job]
    left: dict[str, float]  # pending job -> how long it runs once started
    gives: list[tuple[float, str, int, float | None]] = field(default_factory=list)
    min_runtime: float = 0.0  # the core's: at 0 its admission runs in two rounds (Admission 1)


def rough_starts(world: TailWorld, wanted: Iterable[str]) -> dict[str, float]:
    """The capacity model's start of each job of ``wanted`` it reaches (module docstring); a
    job it never reaches (what it waits for never ends) is left out."""
    wanted = set(wanted)
    left = dict(world.left)  # a victim's runtime left is written in: the caller's stays
    two_rounds = world.min_runtime <= 0
    order = _FairOrder(world.plans, world.jobs.values(), world.capacity, two_rounds)
    for job in world.jobs.values():
        if job.state is JobState.RUNNING:
            order.hold(job.leaf, job.per_worker, job.workers)
    for job in world.jobs.values():
        if job.state is JobState.PENDING:
            order.queue(job)
    events = [(t, i, job_id, w, back) for i, (t, job_id, w, back) in enumerate(world.gives)]
    heapq.heapify(events)
    seq = len(events)
    starts: dict[str, float] = {}
    t = world.t
    while order.queued:
        blocked = None
        while (leaf := order.lowest()) is not None:
            job = order.head(leaf)
            if not _fits(order.free, job.per_worker, job.min_workers):
                blocked = leaf
                break  # strict: nothing passes a head that does not fit
            order.pop(leaf)
            order.hold(leaf, job.per_worker, job.min_workers)
            if job.id in wanted:
                starts[job.id] = t
            runtime = left.get(job.id, math.inf)
            if math.isfinite(runtime):
                seq += 1
                heapq.heappush(events, (t + runtime, seq, job.id, job.min_workers, None))
        if not events:
            if blocked is None:
                break
            order.pop(blocked)  # nothing more frees: it never starts, the ones behind it may
            continue
        t = events[0][0]
        while events and events[0][0] <= t:
            _, _, job_id, workers, back = heapq.heappop(events)
            job = world.jobs[job_id]
            order.hold(job.leaf, job.per_worker, -workers)
            if back is not None:  # a victim: pending again with its runtime left
                left[job_id] = back
                order.queue(job)
    return starts


class _FairOrder:
    """The fair order of the rough tail: from the top down, the child with the lowest holding
    over its weight (the most of any resource, over the capacity) among those with a job
    queued (with ``two_rounds``, among those holding a head within its leaf's share while there
    is one), to a leaf; its head job next (priority, then submission)."""

    def __init__(
        self, plans: PlanTree, jobs: Iterable[Job], capacity: Resources, two_rounds: bool
    ) -> None:
        self.children: dict[str, list[str]] = {}
        self.parent: dict[str, str] = {}
        for job in jobs:
            path = job.leaf
            while path != ROOT and path not in self.parent:
                parent = self.parent[path] = parent_of(path)
                self.children.setdefault(parent, []).append(path)
                path = parent
        self.weight = _weights(plans, self.children)
        # holding over weight; at a tie the bigger weight (the most unmet), then the path
        self.ratio = {p: (0.0, -self.weight[p], p) for p in self.parent}
        self.scale = [1.0 / c if c > 0 and math.isfinite(c) else 0.0 for c in capacity]
        self.free = list(capacity)  # the pool's, less what every plan holds
        self.held: dict[str, list[float]] = {p: [0.0, 0.0, 0.0] for p in self.parent}
        self.ready: dict[str, int] = dict.fromkeys(self.parent, 0)  # leaves with a job queued
        self.ready[ROOT] = 0
        self.queues: dict[str, list] = {}
        # leaves whose head stays within the leaf's share, per subtree: those go first
        self.within: dict[str, int] = dict.fromkeys(self.parent, 0)
        self.within[ROOT] = 0
        self.head_within: dict[str, bool] = {}
        self.two_rounds = two_rounds

    @property
    def queued(self) -> bool:
        return self.ready[ROOT] > 0  # some leaf has a job queued

    def queue(self, job: Job) -> None:
        queue = self.queues.setdefault(job.leaf, [])
        if not queue:
            self._add_up(self.ready, job.leaf, 1)
        heapq.heappush(queue, (-job.priority, job.submitted, job.id, job))
        self._judge(job.leaf)

    def head(self, leaf: str) -> Job:
        return self.queues[leaf][0][3]

    def pop(self, leaf: str) -> None:
        queue = self.queues[leaf]
        heapq.heappop(queue)
        if not queue:
            self._add_up(self.ready, leaf, -1)
        self._judge(leaf)

    def hold(self, leaf: str, per_worker: Resources, workers: int) -> None:
        """``workers`` more of ``per_worker`` held by ``leaf`` (fewer when negative): taken
        from the pool, counted in the holdings up the tree."""
        for r, amount in enumerate(per_worker):
            self.free[r] -= amount * workers
        path, scale = leaf, self.scale
        while path != ROOT:
            held = self.held[path]
            for r, amount in enumerate(per_worker):
                held[r] += amount * workers
            dominant = max(held[0] * scale[0], held[1] * scale[1], held[2] * scale[2])
            self.ratio[path] = (dominant / self.weight[path], -self.weight[path], path)
            path = self.parent[path]
        self._judge(leaf)

    def _judge(self, leaf: str) -> None:
        """Whether the leaf's head would keep it within its share, kept in the counts up."""
        queue = self.queues.get(leaf)
        now = False
        if queue and self.two_rounds:
            job, held, scale = queue[0][3], self.held[leaf], self.scale
            after = [(h + a * job.min_workers) * s for h, a, s in zip(held, job.per_worker, scale)]
            now = max(after) <= self.weight[leaf] + 1e-12
        if now != self.head_within.get(leaf, False):
            self.head_within[leaf] = now
            self._add_up(self.within, leaf, 1 if now else -1)

    def lowest(self) -> str | None:
        if not self.queued:
            return None
        path, ready, ratio, within = ROOT, self.ready, self.ratio, self.within
        first = within[ROOT] > 0  # a head within its leaf's share goes before any borrower
        while path in self.children:
            kids = [c for c in self.children[path] if ready[c] > 0]
            if first:
                kids = [c for c in kids if within[c] > 0]
            path = min(ratio[c] for c in kids)[2]
        return path

    def _add_up(self, counts: dict[str, int], leaf: str, change: int) -> None:
        """``change`` to ``counts`` of ``leaf`` and of every plan above it, the top included."""
        path = leaf
        while True:
            counts[path] += change
            if path == ROOT:
                return
            path = self.parent[path]


def _weights(plans: PlanTree, children: dict[str, list[str]]) -> dict[str, float]:
    """Each plan's weight: its share among the siblings with jobs, multiplied down from the
    top (a user leaf not in the tree counts share 1)."""

    def share(path: str) -> float:
        return plans.get(path).share if path in plans else 1.0

    weight = {ROOT: 1.0}
    stack = [ROOT]
    while stack:
        parent = stack.pop()
        kids = children.get(parent, ())
        total = sum(share(k) for k in kids) or 1.0
        for kid in kids:
            weight[kid] = max(weight[parent] * share(kid) / total, 1e-300)
            stack.append(kid)
    return weight


def _fits(free: list[float], per_worker: Resources, workers: int) -> bool:
    return all(f + 1e-9 >= a * workers for f, a in zip(free, per_worker))
