"""The policies a replay compares (docs/simulate.md "Policies").

- ``wmla``: the product's scheduler core, ``extension.scheduler.schedule``, unchanged.
- ``gang-fifo``: all-or-nothing admission in submission order with no fair share, no
  reservation and no preemption (Volcano's gang plugin alone): each cycle walks the queue
  oldest first and starts every gang that fits whole; one that does not fit is passed over.
- ``pod-fifo``: the default Kubernetes behaviour of seed 002: every worker is a pod placed on
  its own, first come first served, with no notion of a gang. A bound pod holds its GPUs while
  it waits for its siblings; the job runs only once every pod is bound. The operator that
  creates the pods of jobs submitted at the same instant does so concurrently, so their pods
  interleave in the queue (rank 0 of each job, then rank 1, ...). Deadlock detection and the
  operator's timeout are described on ``PodFifo``.

The baselines place workers with the core's own ``place_gang`` so that only the admission
policy differs, not the bin-packing.
"""

from __future__ import annotations

import heapq

from extension.scheduler import (
    CycleResult,
    Grow,
    IndexCache,
    Job,
    JobState,
    PlanError,
    Preempt,
    Reject,
    Resources,
    Shrink,
    Snapshot,
    Start,
    dispatch,
    schedule,
)
from extension.scheduler.placement import max_workers_on, place_gang

from .replay import Policy, Replay, ReplayJob

POLICIES = ("wmla", "gang-fifo", "pod-fifo")
DEFAULT_DEADLOCK_TIMEOUT = 1800.0  # an operator notices a stuck job after half an hour


class Wmla(Policy):
    """The real core. A cycle runs only when it could decide something: after an arrival, a
    finish, a release or a shrink (the snapshot changed), and only while a job is pending or an
    elastic job could grow. With nothing pending and no elastic job below its max, ``schedule``
    returns no decision at all, so skipping it changes nothing; a cycle with an unchanged
    snapshot decides what the previous one did, except for the ``min_runtime`` protection
    running out, which is why a timer fires then.

    Aggregated snapshots (``aggregate``, on by default): running rigid jobs of one user leaf
    with the same worker size are shown to the core as one running job holding all their
    workers. Free capacity per node, every plan's allocation and demand are the same, so when
    every pending job can start the core admits the same jobs in the same order on the same
    nodes; what differs is only what reclaim would see (victims) and the job count. So the
    aggregated snapshot is tried only when the free GPUs cover every pending job and the
    instance has no job-count quota, and its answer is kept only if no job is left waiting;
    otherwise the cycle is run again on the full snapshot. A test checks both give the same
    replay. It makes a cycle cost O(leaves x sizes) instead of O(running jobs) on an
    uncontended cluster.
    """

    name = "wmla"

    def __init__(self, aggregate: bool = True) -> None:
        self.aggregate = aggregate

    def attach(self, replay: Replay) -> None:
        super().attach(replay)
        self.groups: dict[tuple, _Group] = {}
        self.grouped: dict[str, tuple] = {}  # job id -> its group
        self.loose: dict[str, ReplayJob] = {}  # live jobs not in a group (pending, ...)
        self.full_cycles = 0
        self.plans = replay.scenario.plans.copy()
        self.config = replay.scenario.config
        self.live: dict[str, ReplayJob] = {}
        self.core_jobs: dict[str, object] = {}
        self.dirty = False
        self.cycles = 0
        self.elastic = 0  # live elastic jobs (they may grow even with nothing pending)
        self.timers: list[float] = []
        self.reserved: str | None = None
        self.cache = IndexCache()  # this replay's plan index, kept between its cycles
        self.carry = _CarryOut(self)

    def arrive(self, jobs: list[ReplayJob], now: float) -> None:
        for job in jobs:
            self.live[job.id] = job
            self.core_jobs[job.id] = job.core
            self.loose[job.id] = job
            if job.core.elastic:
                self.elastic += 1
            if job.leaf not in self.plans:  # user leaves are created on first use
                try:
                    self.plans.ensure_user_leaf(job.spec.plan, job.spec.user)
                except PlanError:
                    pass  # the core rejects the job and says why
        self.dirty = True

    def _gone(self, job: ReplayJob) -> None:
        self._ungroup(job)
        self.live.pop(job.id, None)
        self.core_jobs.pop(job.id, None)
        self.loose.pop(job.id, None)
        if job.core.elastic:
            self.elastic -= 1

    def finished(self, job: ReplayJob, now: float) -> None:
        self._gone(job)
        self.dirty = True

    def cancelled(self, job: ReplayJob, now: float) -> None:
        self._gone(job)
        self.dirty = True

    def released(self, job: ReplayJob, now: float) -> None:
        self.dirty = True

    def shrunk(self, job: ReplayJob, now: float) -> None:
        self.dirty = True

    def next_timer(self) -> float | None:
        return self.timers[0] if self.timers else None

    def step(self, now: float) -> None:
        self.pop_timers(now)
        if not self.dirty:
            return
        self.dirty = False
        if not self.replay.n_pending and not self.elastic:
            self.reserved = None  # what the skipped cycle would have answered: no holder
            return
        self.cycle(now)

    def pop_timers(self, now: float) -> None:
        """Timers due by now (a ``min_runtime`` running out) make the next cycle worth running."""
        while self.timers and self.timers[0] <= now + 1e-9:
            heapq.heappop(self.timers)
            self.dirty = True

    def cycle(self, now: float) -> CycleResult:
        """One core cycle on the live jobs, its decisions carried out on the replay."""
        r = self.replay
        result = self._aggregated_cycle(now) if self.aggregate else None
        if result is None:
            snapshot = Snapshot(
                self.plans,
                r.instance,
                list(self.core_jobs.values()),
                self.config,
                reserved=self.reserved,
            )
            result = schedule(snapshot, now, self.cache)
            self.full_cycles += 1
        self.reserved = result.reserved  # carried from cycle to cycle (Admission 4)
        self.cycles += 1
        for d in result.decisions:
            dispatch(d, self.carry, now)
        return result

    def _aggregated_cycle(self, now: float):
        """The cycle on the aggregated snapshot, or None when its answer may differ."""
        r = self.replay
        if r.instance.max_jobs is not None:
            return None
        free = r.capacity_gpu - r.recorder.held
        jobs = []
        for job in self.loose.values():
            if job.state == "PENDING":
                free -= job.gpu * job.core.min_workers
                if free < 0:
                    return None  # someone may wait: reclaim and reservation need every job
            jobs.append(job.core)
        merged = [g.job() for g in self.groups.values() if g.size]
        snapshot = Snapshot(
            self.plans, r.instance, merged + jobs, self.config, reserved=self.reserved
        )
        result = schedule(snapshot, now, self.cache)
        if result.waiting:
            return None
        return result

    def _group(self, job: ReplayJob) -> None:
        core = job.core
        if core.elastic:
            return  # elastic jobs grow and shrink: the core sees them as they are
        key = (core.plan, core.user, tuple(core.per_worker))
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = _Group(key)
        group.add(core.placement)
        self.grouped[job.id] = key
        self.loose.pop(job.id, None)

    def _ungroup(self, job: ReplayJob) -> None:
        key = self.grouped.pop(job.id, None)
        if key is not None:
            self.groups[key].remove(job.core.placement)
            if job.id in self.live:
                self.loose[job.id] = job

    def figures(self) -> dict:
        return {"core_cycles": self.cycles, "core_cycles_full_snapshot": self.full_cycles}


class _CarryOut:
    """The wmla policy's handler of the core's decisions (``extension.scheduler.dispatch``):
    each is carried out on the replay at ``now``."""

    def __init__(self, policy: Wmla) -> None:
        self.policy = policy

    def start(self, d: Start, now: float) -> None:
        p = self.policy
        job = p.live[d.job_id]
        p.replay.start(job, d.placement, now)
        p._group(job)
        if p.config.min_runtime > 0:
            heapq.heappush(p.timers, now + p.config.min_runtime)

    def grow(self, d: Grow, now: float) -> None:
        self.policy.replay.grow(self.policy.live[d.job_id], d.add, now)

    def shrink(self, d: Shrink, now: float) -> None:
        self.policy.replay.shrink(self.policy.live[d.job_id], d.release, d.grace, now)

    def preempt(self, d: Preempt, now: float) -> None:
        p = self.policy
        job = p.live[d.job_id]
        p._ungroup(job)
        p.replay.preempt(job, d.grace, now)

    def reject(self, d: Reject, now: float) -> None:
        p = self.policy
        job = p.live[d.job_id]
        p._gone(job)
        p.replay.reject(job, d.reason, now)


class _Group:
    """Running rigid jobs of one leaf and worker size, as one running job for the core."""

    def __init__(self, key: tuple) -> None:
        self.plan, self.user, self.per_worker = key
        self.id = f"(running jobs of {self.plan}/{self.user} with {list(self.per_worker)})"
        self.counts: dict[str, int] = {}
        self.size = 0
        self._job: Job | None = None

    def add(self, placement: tuple[str, ...]) -> None:
        for node in placement:
            self.counts[node] = self.counts.get(node, 0) + 1
        self.size += len(placement)
        self._job = None

    def remove(self, placement: tuple[str, ...]) -> None:
        for node in placement:
            left = self.counts[node] - 1
            if left:
                self.counts[node] = left
            else:
                del self.counts[node]
        self.size -= len(placement)
        self._job = None

    def job(self) -> Job:
        if self._job is None:
            placement = tuple(n for n in sorted(self.counts) for _ in range(self.counts[n]))
            self._job = Job(
                id=self.id,
                user=self.user,
                plan=self.plan,
                per_worker=Resources(*self.per_worker),
                min_workers=self.size,
                state=JobState.RUNNING,
                placement=placement,
                started=0.0,
            )
        return self._job


class _Baseline(Policy):
    """Free GPUs per node, kept by the policy itself (the core is not involved)."""

    def attach(self, replay: Replay) -> None:
        super().attach(replay)
        nodes = replay.instance.nodes
        self.names = [n.name for n in nodes]
        self.node_at = {name: i for i, name in enumerate(self.names)}
        self.capacity = [list(n.capacity) for n in nodes]
        self.free = [list(n.capacity) for n in nodes]
        self.dirty = False
        self.cycles = 0
        self.running: dict[str, ReplayJob] = {}
        self._most: dict[tuple, float] = {}  # worker shape -> most such workers on the nodes
        self.free_gpus = sum(row[0] for row in self.free)

    def _start(self, job: ReplayJob, placement: tuple[str, ...], now: float) -> None:
        self.running[job.id] = job
        self.replay.start(job, placement, now)

    def _never_fits(self, job: ReplayJob) -> str | None:
        w, n = job.core.per_worker, job.core.min_workers
        most = self._most.get(w)
        if most is None:
            most = self._most[w] = max_workers_on(self.capacity, w)
        if most < n:
            return (
                f"rejected: the gang of {n} x {w.describe()} cannot be placed even on empty nodes"
            )
        return None

    def _take(self, placement: list[int], w: tuple, sign: int = -1) -> None:
        for i in placement:
            row = self.free[i]
            for r in range(3):
                row[r] += sign * w[r]
        self.free_gpus += sign * w[0] * len(placement)

    def _give_back(self, job: ReplayJob) -> None:
        idx = [self.node_at[n] for n in job.core.placement]
        self._take(idx, job.core.per_worker, +1)

    def finished(self, job: ReplayJob, now: float) -> None:
        self._give_back(job)
        self.running.pop(job.id, None)
        self.dirty = True

    def cancelled(self, job: ReplayJob, now: float) -> None:
        self._give_back(job)  # running or holding part of its gang
        self.running.pop(job.id, None)
        self._forget(job)
        self.dirty = True

    def _forget(self, job: ReplayJob) -> None:
        """Drop a cancelled job from the policy's queues."""


class GangFifo(_Baseline):
    name = "gang-fifo"

    def attach(self, replay: Replay) -> None:
        super().attach(replay)
        self.queue: list[ReplayJob] = []

    def arrive(self, jobs: list[ReplayJob], now: float) -> None:
        for job in jobs:
            reason = self._never_fits(job)
            if reason:
                self.replay.reject(job, reason, now)
            else:
                self.queue.append(job)
        self.dirty = True

    def _forget(self, job: ReplayJob) -> None:
        self.queue = [j for j in self.queue if j is not job]

    def step(self, now: float) -> None:
        if not self.dirty or not self.queue:
            self.dirty = False
            return
        self.dirty = False
        self.cycles += 1
        failed: set = set()
        left = []
        for job in self.queue:  # submission order: arrivals are appended in order
            core = job.core
            w, n = core.per_worker, core.min_workers
            shape = (tuple(w), n)
            if shape in failed or w[0] * n > self.free_gpus:
                left.append(job)
                continue
            placement = place_gang(self.free, self.names, w, n)
            if placement is None:
                failed.add(shape)
                left.append(job)
                continue
            self._take(placement, w)
            self._start(job, tuple(self.names[i] for i in placement), now)
        self.queue = left

    def figures(self) -> dict:
        return {"policy_cycles": self.cycles}


class PodFifo(_Baseline):
    """Pods first come, first served, no gangs.

    Deadlock: after each cycle, the jobs holding part of their gang are checked by the
    banker's rule: assume every running job finishes and gives its GPUs back, then let any
    partial job whose missing pods would fit complete and give its GPUs back, until no more
    can. The partial jobs left can never run: they are deadlocked, and the GPUs they hold are
    counted as deadlocked GPU-hours for as long as that lasts.

    The operator: once the cluster has been deadlocked for ``timeout`` seconds, the operator
    deletes the deadlocked job that has held GPUs the longest (then the earliest submitted)
    and submits it again (its pods go to the back of the queue), and watches again for
    ``timeout`` before the next deletion. ``timeout`` None or 0: nobody intervenes.
    """

    name = "pod-fifo"

    def __init__(self, timeout: float | None = DEFAULT_DEADLOCK_TIMEOUT) -> None:
        self.timeout = timeout if timeout else None

    def attach(self, replay: Replay) -> None:
        super().attach(replay)
        self.pods: list[ReplayJob] = []  # one entry per pod not bound yet, queue order
        self.partial: dict[str, ReplayJob] = {}  # hold some pods, not running
        self.holding_since: dict[str, float] = {}
        self.deadlocked: list[ReplayJob] = []
        self.deadlock_since: float | None = None
        self.deadlocks = 0
        self.kills = 0
        self.max_deadlocked = 0

    def arrive(self, jobs: list[ReplayJob], now: float) -> None:
        ok = []
        for job in jobs:
            reason = self._never_fits(job)
            if reason:
                self.replay.reject(job, reason, now)
            else:
                ok.append(job)
        self._enqueue(ok)
        self.dirty = True

    def _enqueue(self, jobs: list[ReplayJob]) -> None:
        most = max((j.core.min_workers for j in jobs), default=0)
        for rank in range(most):
            for job in jobs:
                if rank < job.core.min_workers:
                    self.pods.append(job)

    def _forget(self, job: ReplayJob) -> None:
        self.pods = [j for j in self.pods if j is not job]
        self.partial.pop(job.id, None)
        self.holding_since.pop(job.id, None)

    def next_timer(self) -> float | None:
        if self.deadlock_since is not None and self.timeout:
            return self.deadlock_since + self.timeout
        return None

    def step(self, now: float) -> None:
        if self.deadlock_since is not None and self.timeout and now >= self.next_timer() - 1e-9:
            self._operator_kill(now)
        if not self.dirty:
            return
        self.dirty = False
        if self.pods:
            self._bind(now)
        self._check_deadlock(now)

    def _bind(self, now: float) -> None:
        self.cycles += 1
        failed: set = set()
        left = []
        r = self.replay
        for job in self.pods:
            core = job.core
            w = core.per_worker
            shape = tuple(w)
            if shape in failed or w[0] > self.free_gpus:
                left.append(job)
                continue
            spot = place_gang(self.free, self.names, w, 1)
            if spot is None:
                failed.add(shape)
                left.append(job)
                continue
            self._take(spot, w)
            placement = core.placement + (self.names[spot[0]],)
            if len(placement) == core.min_workers:
                self.partial.pop(job.id, None)
                self.holding_since.pop(job.id, None)
                self._start(job, placement, now)
            else:
                if job.id not in self.partial:
                    self.partial[job.id] = job
                    self.holding_since[job.id] = now
                r.hold(job, placement)
        self.pods = left

    def _check_deadlock(self, now: float) -> None:
        stuck = self._banker() if self.partial else []
        self.deadlocked = stuck
        self.replay.recorder.deadlocked = sum(j.held for j in stuck)
        if stuck and self.deadlock_since is None:
            self.deadlocks += 1
            self.deadlock_since = now
        elif not stuck:
            self.deadlock_since = None
        self.max_deadlocked = max(self.max_deadlocked, len(stuck))

    def _banker(self) -> list[ReplayJob]:
        avail = [row[:] for row in self.free]
        for job in self.running.values():
            self._add(avail, job)
        waiting = sorted(self.partial.values(), key=lambda j: j.seq)
        progress = True
        while progress and waiting:
            progress = False
            for job in list(waiting):
                core = job.core
                missing = core.min_workers - len(core.placement)
                if place_gang(avail, self.names, core.per_worker, missing) is not None:
                    self._add(avail, job)
                    waiting.remove(job)
                    progress = True
        return waiting

    def _add(self, avail: list, job: ReplayJob) -> None:
        w = job.core.per_worker
        for name in job.core.placement:
            row = avail[self.node_at[name]]
            for r in range(3):
                row[r] += w[r]

    def _operator_kill(self, now: float) -> None:
        if not self.deadlocked:
            self.deadlock_since = None
            return
        victim = min(self.deadlocked, key=lambda j: (self.holding_since[j.id], j.seq, j.id))
        self._give_back(victim)
        self.partial.pop(victim.id, None)
        self.holding_since.pop(victim.id, None)
        self.pods = [j for j in self.pods if j is not victim]
        self.replay.hold(victim, ())
        self._enqueue([victim])
        self.kills += 1
        self.deadlock_since = now  # the operator watches again before the next deletion
        self.dirty = True

    def figures(self) -> dict:
        return {
            "policy_cycles": self.cycles,
            "deadlocks": {
                "detected": self.deadlocks,
                "broken_by_timeout": self.kills,
                "timeout_s": self.timeout,
                "most_jobs_deadlocked": self.max_deadlocked,
                "deadlocked_at_end": len(self.deadlocked),
            },
        }


def make_policy(name: str, deadlock_timeout: float | None = DEFAULT_DEADLOCK_TIMEOUT) -> Policy:
    if name == "wmla":
        return Wmla()
    if name == "gang-fifo":
        return GangFifo()
    if name == "pod-fifo":
        return PodFifo(deadlock_timeout)
    raise ValueError(f"unknown policy {name!r}; the policies are {', '.join(POLICIES)}")


def expand_policies(names: list[str] | None) -> list[str]:
    """``--policy`` values in the order given; ``all`` means every policy; no value: wmla."""
    out: list[str] = []
    for name in names or ["wmla"]:
        for part in name.split(","):
            part = part.strip()
            todo = list(POLICIES) if part == "all" else [part]
            for p in todo:
                if p not in POLICIES:
                    raise ValueError(
                        f"--policy {part!r} is not a policy; use wmla, gang-fifo, pod-fifo or all"
                    )
                if p not in out:
                    out.append(p)
    return out
