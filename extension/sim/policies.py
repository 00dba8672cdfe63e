"""The policies a replay compares (docs/simulate.md "Policies"), and the first of them.

- ``wmla``: the product's scheduler core, ``extension.scheduler.schedule``, unchanged
  (``Wmla`` below; its aggregated snapshots in ``aggregate.py``).
- ``gang-fifo``: all-or-nothing admission in submission order (``gang_fifo.py``).
- ``pod-fifo``: every worker a pod placed on its own, first come first served, the default
  Kubernetes behaviour (``pod_fifo.py``).

The baselines place workers with the core's own placement (``FitIndex``, ``place_gang``'s
answer kept between cycles) so that only the admission policy differs, not the bin-packing
(``baseline.py``).

``Wmla`` stays in this module because it calls ``schedule`` by this module's name, which is
where the golden recorder (tests/scheduler/golden_record.py) swaps it for a recording one.
"""

from __future__ import annotations

import heapq

from extension.scheduler import (
    CycleResult,
    Grow,
    IndexCache,
    PlanError,
    Preempt,
    Reject,
    Shrink,
    Snapshot,
    Start,
    dispatch,
    schedule,
    steady_state,
)

from .aggregate import RunningGroup
from .fairshare import LeafUsage
from .gang_fifo import GangFifo
from .jobs import ReplayJob
from .metrics import EPS
from .pod_fifo import DEFAULT_DEADLOCK_TIMEOUT, PodFifo
from .replay import Policy, Replay

# the names callers import from here, wherever they are defined now
__all__ = [
    "DEFAULT_DEADLOCK_TIMEOUT",
    "POLICIES",
    "GangFifo",
    "PodFifo",
    "Policy",
    "Wmla",
    "expand_policies",
    "make_policy",
    "schedule",
]

POLICIES = ("wmla", "gang-fifo", "pod-fifo")


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

    Under the service's timing (``Timing.cycles == "service"``) a cycle runs only when the
    service would run one: at an instant with a submission, a cancel or a backend event
    (``running`` included), or ``tick`` seconds after the last cycle; no ``min_runtime`` timer.
    Cycles that cannot decide anything are still skipped, but they count as the last cycle for
    the tick, as the service's do.

    When the runtime reports its checkpoints (``Timing.report_checkpoints``), every running
    job shows the core its last one (``Job.checkpointed``) before a full-snapshot cycle; the
    aggregated snapshot is kept only when no job waits, so no victim is chosen on it. A
    preemption is counted as steady-state churn when the previous cycle's plan figures were
    within one of the reclaimer's gangs and its leaf had demand then (``steady_state``). A
    skipped cycle had nothing pending: a reclaimer after it brings new demand, never steady.

    Fair share over days (``fairshare.py``): with ``config.fair_share_half_life`` > 0 the
    policy keeps every user leaf's decayed usage, charged at every change of what a leaf holds,
    and shows it to the core as ``Snapshot.usage`` (both snapshots); a job the core started as
    a starved gang (``CycleResult.aged``, Admission 6) gets ``Job.aged``.
    """

    name = "wmla"

    def __init__(self, aggregate: bool = True) -> None:
        self.aggregate = aggregate

    def attach(self, replay: Replay) -> None:
        super().attach(replay)
        self.groups: dict[tuple, RunningGroup] = {}
        self.grouped: dict[str, tuple] = {}  # job id -> its group
        # the groups' jobs as the aggregated snapshot shows them (the non-empty groups in the
        # order of ``groups``): only the groups that changed are asked again; None when a group
        # came or went, so that the order is rebuilt
        self.shown: dict[tuple, object] | None = None
        self.regrouped: set[tuple] = set()  # groups changed since ``shown`` was brought up to date
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
        self.working: dict[str, ReplayJob] = {}  # started and not being stopped
        self.timing = replay.scenario.timing
        self.service = self.timing.service_cycles
        self.last_cycle: float | None = None  # service timing: the last cycle, for the tick
        self.idle = False  # service timing: nothing will ever change; stop ticking
        self.previous: CycleResult | None = None  # the last cycle's result (steady state)
        half_life = self.config.fair_share_half_life
        self.usage: LeafUsage | None = None  # usage history (fairshare.py); None: off
        if half_life > 0:
            self.usage = LeafUsage(half_life, replay.scenario.usage_reset_period)

    def holds(self, job: ReplayJob, now: float, workers: int | None = None) -> None:
        """The usage history learns what ``job`` holds from ``now`` on (its placement, or
        ``workers``)."""
        if self.usage is not None:
            count = len(job.core.placement) if workers is None else workers
            self.usage.count(job.core, count, now)

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

    def gone(self, job: ReplayJob) -> None:
        self.ungroup(job)
        self.working.pop(job.id, None)
        self.live.pop(job.id, None)
        self.core_jobs.pop(job.id, None)
        self.loose.pop(job.id, None)
        if job.core.elastic:
            self.elastic -= 1

    def finished(self, job: ReplayJob, now: float) -> None:
        self.holds(job, now, 0)
        self.gone(job)
        self.dirty = True

    def cancelled(self, job: ReplayJob, now: float) -> None:
        self.holds(job, now, 0)
        self.gone(job)
        self.dirty = True

    def released(self, job: ReplayJob, now: float) -> None:
        self.holds(job, now, 0)
        self.dirty = True

    def shrunk(self, job: ReplayJob, now: float) -> None:
        self.holds(job, now)
        self.dirty = True

    def running(self, job: ReplayJob, now: float) -> None:
        self.dirty = True  # the service runs a cycle on every backend event

    def next_timer(self) -> float | None:
        timer = self.timers[0] if self.timers else None
        tick = self.timing.tick
        if self.service and tick > 0 and self.last_cycle is not None and not self.idle:
            if self.replay.n_pending or self.elastic:  # else the tick cannot decide anything
                due = self.last_cycle + tick
                timer = due if timer is None else min(timer, due)
        return timer

    def step(self, now: float) -> None:
        self.pop_timers(now)
        if not self.wants_cycle(now):
            return
        self.dirty = False
        if not self.replay.n_pending and not self.elastic:
            self.reserved = None  # what the skipped cycle would have answered: no holder
            self.previous = None  # skipped: nothing was pending
            return
        self.cycle(now)

    def wants_cycle(self, now: float) -> bool:
        """Whether a cycle runs at ``now``: something changed, or (service timing) the tick
        is due, as the service's loop waits for a wake-up or ``tick`` seconds."""
        if not self.service:
            return self.dirty
        tick = self.timing.tick
        last = self.last_cycle
        due = tick > 0 and last is not None and now >= last + tick - EPS
        if not (self.dirty or due):
            return False
        self.last_cycle = now
        if self.dirty:
            self.idle = False
        return True

    def pop_timers(self, now: float) -> None:
        """Timers due by now (a ``min_runtime`` running out) make the next cycle worth running."""
        while self.timers and self.timers[0] <= now + 1e-9:
            heapq.heappop(self.timers)
            self.dirty = True

    def cycle(self, now: float) -> CycleResult:
        """One core cycle on the live jobs, its decisions carried out on the replay."""
        r = self.replay
        usage = {} if self.usage is None else self.usage.usage(now)
        result = self._aggregated_cycle(now, usage) if self.aggregate else None
        if result is None:
            if r.reports_checkpoints:
                for job in self.working.values():
                    r.show_checkpoint(job, now)
            snapshot = Snapshot(
                self.plans,
                r.instance,
                list(self.core_jobs.values()),
                self.config,
                reserved=self.reserved,
                usage=usage,
            )
            result = schedule(snapshot, now, self.cache)
            self.full_cycles += 1
        self.reserved = result.reserved  # carried from cycle to cycle (Admission 4)
        self.cycles += 1
        for d in result.decisions:
            dispatch(d, self.carry, now)
        if result.aged is not None and result.aged in self.live:
            self.live[result.aged].core.aged = True  # Admission 6: no reclaim stops it
        self.previous = result
        if self.service and not result.decisions and r.quiet():
            self.idle = True  # a tick would decide the same nothing for ever
        return result

    def steady(self, d: Preempt) -> bool:
        """The preemption comes while the previous cycle had every plan within one of the
        reclaimer's gangs of its deserved share and the reclaimer's leaf had demand then
        (``within_one_gang``)."""
        reclaimer = self.live.get(d.for_job)
        if self.previous is None or reclaimer is None:
            return False  # after a skipped cycle (nothing pending) the reclaimer's demand is new
        return steady_state(self.previous.plans, reclaimer.core)

    def _aggregated_cycle(self, now: float, usage: dict[str, float]) -> CycleResult | None:
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
        snapshot = Snapshot(
            self.plans,
            r.instance,
            self._merged() + jobs,
            self.config,
            reserved=self.reserved,
            usage=usage,
        )
        result = schedule(snapshot, now, self.cache)
        if result.waiting:
            return None
        return result

    def _merged(self) -> list:
        """Every non-empty group's job, in the order of ``groups``."""
        shown = self.shown
        if shown is None:
            shown = self.shown = {k: g.job() for k, g in self.groups.items() if g.size}
        else:
            for key in self.regrouped:
                shown[key] = self.groups[key].job()
        self.regrouped.clear()
        return list(shown.values())

    def group(self, job: ReplayJob) -> None:
        core = job.core
        if core.elastic:
            return  # elastic jobs grow and shrink: the core sees them as they are
        key = (core.plan, core.user, tuple(core.per_worker))
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = RunningGroup(key)
        if not group.size:
            self.shown = None  # a group comes: the order is rebuilt
        group.add(core.placement)
        self.regrouped.add(key)
        self.grouped[job.id] = key
        self.loose.pop(job.id, None)

    def ungroup(self, job: ReplayJob) -> None:
        key = self.grouped.pop(job.id, None)
        if key is not None:
            group = self.groups[key]
            group.remove(job.core.placement)
            if group.size:
                self.regrouped.add(key)
            else:
                self.shown = None  # a group goes: the order is rebuilt
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
        p.holds(job, now)
        p.group(job)
        p.working[job.id] = job
        if p.config.min_runtime > 0 and not p.service:  # the service has no such timer
            heapq.heappush(p.timers, now + p.config.min_runtime)

    def grow(self, d: Grow, now: float) -> None:
        job = self.policy.live[d.job_id]
        self.policy.replay.grow(job, d.add, now)
        self.policy.holds(job, now)

    def shrink(self, d: Shrink, now: float) -> None:
        self.policy.replay.shrink(self.policy.live[d.job_id], d.release, d.grace, now)

    def preempt(self, d: Preempt, now: float) -> None:
        p = self.policy
        job = p.live[d.job_id]
        steady = p.steady(d)
        p.ungroup(job)
        p.working.pop(job.id, None)
        p.replay.preempt(job, d.grace, now, steady)

    def reject(self, d: Reject, now: float) -> None:
        p = self.policy
        job = p.live[d.job_id]
        p.gone(job)
        p.replay.reject(job, d.reason, now)


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
