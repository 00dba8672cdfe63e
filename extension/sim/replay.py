"""Replay a scenario (a trace or a scenario file) under one scheduling policy, and measure it.

The clock jumps from one instant to the next at which something happens: a submission, a
finish or end of a grace period on the fake backend, or a policy's own timer (the operator's
deadlock timeout). The ``Recorder`` first integrates the figures over the span since the
previous instant (the state did not change within it); then the policy decides
(``Policy.step``). With ``interval`` > 0 the policy decides only on multiples of it (a periodic
scheduler); events in between wait for the next one. The policies live in ``policies.py``; what
is measured and how is in docs/simulate.md.

The scenario's ``timing`` (timing.py) says how the fake backend delays its events and stops
its victims, and when the wmla policy cycles (``Timing()``: as described here).

This module is the loop and the helpers the policies act through; the job records are in
``jobs.py``, the figures integrated over time in ``recorder.py``, and what a finished replay
reports in ``summary.py`` (their names stay importable from here).

The scenario runner (``engine.py``) is this loop with a policy that runs a core cycle at every
instant and records the timeline; ``Wmla`` here skips a cycle that cannot change anything,
which is what makes a month of Philly replay in seconds.
"""

from __future__ import annotations

import math
import sys
import time
from typing import TextIO, TypeVar

from extension.backends.fake import FINISHED, RELEASED, RUNNING, SHRUNK, FakeBackend
from extension.scheduler import Job, JobState

from .churnlog import ChurnLog
from .jobs import ReplayJob
from .metrics import EPS
from .recorder import Recorder
from .scenario import Scenario
from .summary import ReplaySummary

# the names callers import from here, wherever they are defined now
__all__ = [
    "EPS",
    "MAX_STEPS_PER_INSTANT",
    "Policy",
    "Recorder",
    "Replay",
    "ReplayJob",
    "ReplaySummary",
    "replay",
    "stderr_progress",
]

MAX_STEPS_PER_INSTANT = 50  # zero-grace releases can chain; this bounds one instant


class Policy:
    """What a policy implements; ``Replay`` calls these and offers the helpers it uses."""

    name = "policy"

    def attach(self, replay: Replay) -> None:
        self.replay = replay

    def arrive(self, jobs: list[ReplayJob], now: float) -> None:
        raise NotImplementedError

    def finished(self, job: ReplayJob, now: float) -> None:
        raise NotImplementedError

    def cancelled(self, job: ReplayJob, now: float) -> None:
        """The user cancels the job (scenario files only); called before it lets go."""
        raise NotImplementedError

    def released(self, job: ReplayJob, now: float) -> None:
        """A preempted gang's grace ended (only policies that preempt see this)."""

    def shrunk(self, job: ReplayJob, now: float) -> None:
        """A shrink's grace ended (only policies that shrink see this)."""

    def running(self, job: ReplayJob, now: float) -> None:
        """The backend reports the job's workers up (only under the service's timing)."""

    def step(self, now: float) -> None:
        raise NotImplementedError

    def next_timer(self) -> float | None:
        """The next instant the policy needs to act without any other event, or None."""
        return None

    def figures(self) -> dict:
        """Policy-specific figures for the summary (core cycles, deadlocks...)."""
        return {}


class Replay:
    def __init__(
        self,
        scenario: Scenario,
        policy: Policy,
        progress: TextIO | None = None,
        progress_every: float = 10.0,
        interval: float = 0.0,
        progress_after: float = 1.0,
        backend: FakeBackend | None = None,
    ) -> None:
        self.scenario = scenario
        self.policy = policy
        self.backend = backend or backend_for(scenario, FakeBackend)
        self.reports_checkpoints = scenario.timing.report_checkpoints
        self.instance = scenario.instance
        self.capacity_gpu = float(self.instance.capacity.gpu)
        self.jobs: dict[str, ReplayJob] = {}
        self.order = sorted(range(len(scenario.jobs)), key=lambda i: (scenario.jobs[i].at, i))
        self.arrival_at = [scenario.jobs[i].at for i in self.order]  # the same order
        self.next_arrival = 0
        # cancel events of a scenario file, in time order (after submissions at the same time)
        self.cancels = sorted(
            ((c.at, n, c.cancel) for n, c in enumerate(scenario.cancels)), reverse=True
        )
        self.n_done = 0
        self.n_pending = 0
        self.progress = progress
        self.progress_every = progress_every
        self.progress_after = progress_after  # a replay shorter than this prints no progress
        self._last_percent = 0
        if interval and scenario.timing.service_cycles:
            raise ValueError(
                "a cycle interval is a periodic scheduler; the service's timing has its own "
                "cycles (its tick): use one or the other"
            )
        self.interval = interval  # > 0: the policy decides only on multiples of it
        self.tick: float | None = None  # the next such multiple, when something waits for it
        self.recorder = Recorder(scenario, self.capacity_gpu)
        self.preemptions = 0
        self.churn = ChurnLog()
        self._touched: list[ReplayJob] = []  # placement changed during this instant
        self.shrinks = 0
        policy.attach(self)

    # the loop ----------------------------------------------------------------------------------
    def run(self) -> ReplaySummary:
        started = self._started = time.perf_counter()
        self._last_progress = started
        now = 0.0
        until = self.scenario.until
        while True:
            nxt = self._next_instant()
            if nxt is None:
                break
            now = nxt
            if now > until:
                now = until
                break
            self._instant(now)
            if self.progress is not None:
                self._report_progress(now)
        self.stopped_at = now  # the last instant (or ``until``)
        unfinished = sum(1 for j in self.jobs.values() if j.state in ("PENDING", "RUNNING"))
        unfinished += len(self.order) - self.next_arrival
        end = until if unfinished and math.isfinite(until) else now
        self.recorder.advance(max(end, self.recorder.last_t))
        wall = time.perf_counter() - started
        if self.progress is not None:
            print(
                f"{self.policy.name}: done, {self.n_done:,} of {len(self.order):,} jobs ended "
                f"in {wall:.1f} s",
                file=self.progress,
                flush=True,
            )
        return ReplaySummary(self, wall)

    def quiet(self) -> bool:
        """Nothing more is coming: no submission, cancel or backend event left."""
        return (
            self._arrival_time() is None and not self.cancels and self.backend.next_time() is None
        )

    def _arrival_time(self) -> float | None:
        if self.next_arrival < len(self.arrival_at):
            return self.arrival_at[self.next_arrival]
        return None

    def _next_instant(self) -> float | None:
        """The earliest of the next submission, cancel, backend event, policy timer and tick
        (the first of them on a tie, as ``min`` gives), or None when none is left."""
        t = self._arrival_time()
        for u in (
            self.cancels[-1][0] if self.cancels else None,
            self.backend.next_time(),
            self.policy.next_timer(),
            self.tick,
        ):
            if u is not None and (t is None or u < t):
                t = u
        return t

    def _instant(self, now: float) -> None:
        self.recorder.advance(now)  # the span up to now ran with the state before this instant
        decide = not self.interval or _on_multiple(now, self.interval) or self._timer_due(now)
        for _ in range(MAX_STEPS_PER_INSTANT):
            self._arrive(now)
            self._cancel(now)
            self._backend_events(now)
            if decide:
                self.policy.step(now)
                self.tick = None
            elif self.tick is None:
                self.tick = math.ceil(now / self.interval - EPS) * self.interval
            nxt = self.backend.next_time()
            if nxt is None or nxt > now + EPS:
                break
        for job in self._touched:  # a broken gang is one seen partial between instants
            if 0 < len(job.core.placement) < job.core.min_workers:
                job.broken = True
        self._touched.clear()
        self.recorder.observe(now)

    def _timer_due(self, now: float) -> bool:
        timer = self.policy.next_timer()
        return timer is not None and timer <= now + EPS

    def _arrive(self, now: float) -> None:
        batch = []
        jobs = self.scenario.jobs
        arrival_at, until = self.arrival_at, now + EPS
        while self.next_arrival < len(arrival_at) and arrival_at[self.next_arrival] <= until:
            seq = self.next_arrival
            spec = jobs[self.order[seq]]
            self.next_arrival += 1
            core = Job(
                id=spec.id,
                user=spec.user,
                plan=spec.plan,
                per_worker=spec.per_worker,
                min_workers=spec.min_workers,
                max_workers=spec.max_workers,
                priority=spec.priority,
                submitted=spec.at,
                preemptible=spec.preemptible,
            )
            team = spec.plan.split("/", 2)[1]
            job = ReplayJob(spec, seq, core, team, float(spec.per_worker.gpu))
            self.jobs[spec.id] = job
            self.backend.register(spec.id, spec.duration * spec.max_workers)
            self.n_pending += 1
            self.recorder.add_demand(job, +1)
            batch.append(job)
        if batch:
            self.policy.arrive(batch, now)

    def _cancel(self, now: float) -> None:
        while self.cancels and self.cancels[-1][0] <= now + EPS:
            _, _, job_id = self.cancels.pop()
            job = self.jobs.get(job_id)
            if job is None or job.state not in ("PENDING", "RUNNING"):
                continue
            self.policy.cancelled(job, now)
            self.backend.cancel(job_id, now)
            if job.state == "PENDING":
                self.n_pending -= 1
            job.core.state = JobState.CANCELLED
            job.core.placement = ()
            job.state, job.ended = "CANCELLED", now
            self.n_done += 1
            self._refresh(job)
            self.recorder.add_demand(job, -1)

    def _backend_events(self, now: float) -> None:
        for kind, job_id, nodes, at in self.backend.due(now):
            job = self.jobs[job_id]
            core = job.core
            if kind == RUNNING:
                self.policy.running(job, now)
            elif kind == FINISHED:
                self.policy.finished(job, now)
                core.state = JobState.FINISHED
                core.placement = ()
                # when its workers exited: the service stamps the end so, seen later or not
                job.state, job.ended = "FINISHED", at
                self._refresh(job)
                self.recorder.add_demand(job, -1)
                self.n_done += 1
            elif kind == RELEASED:
                core.state, core.placement, core.started = JobState.PENDING, (), None
                core.terminating, core.checkpointed = False, None
                job.state = "PENDING"
                job.preemptions += 1
                self.preemptions += 1
                self.n_pending += 1
                self._refresh(job)
                self.policy.released(job, now)
            elif kind == SHRUNK:
                placement = list(core.placement)
                for node in nodes:
                    placement.remove(node)
                core.placement = tuple(placement)
                core.terminating = False
                self._refresh(job)
                self.policy.shrunk(job, now)

    # helpers the policies use -----------------------------------------------------------------
    def start(self, job: ReplayJob, placement: tuple[str, ...], now: float) -> None:
        """The whole gang runs from now on (``placement``: one node per worker)."""
        core = job.core
        core.state, core.placement, core.started = JobState.RUNNING, tuple(placement), now
        core.checkpointed = None  # none yet in this run
        job.state = "RUNNING"
        if job.first_start is None:
            job.first_start = now
        self.n_pending -= 1
        self.backend.start(job.id, core.placement, now)
        self._refresh(job)

    def hold(self, job: ReplayJob, placement: tuple[str, ...]) -> None:
        """Workers bound to nodes that do not run yet (a partial gang under pod-fifo)."""
        job.core.placement = tuple(placement)
        self._refresh(job)

    def grow(self, job: ReplayJob, add: tuple[str, ...], now: float) -> None:
        job.core.placement = job.core.placement + tuple(add)
        self.backend.grow(job.id, tuple(add), now)
        self._refresh(job)

    def shrink(self, job: ReplayJob, release: tuple[str, ...], grace: float, now: float) -> None:
        job.core.terminating = True
        self.shrinks += 1
        self.backend.shrink(job.id, tuple(release), grace, now)
        self._refresh(job)

    def preempt(self, job: ReplayJob, grace: float, now: float, steady: bool = False) -> None:
        """SIGTERM to the whole gang; ``steady``: decided while every plan held its share
        within one gang (the policy's judgement, for the churn figures)."""
        core = job.core
        last = self.backend.checkpoint_time(job.id, now)  # its run's, whoever knows of it
        outcome = self.backend.preempt(job.id, grace, now)
        self.churn.preempted(job, now, last, outcome != "lost", steady)
        if outcome == "saved" and self.reports_checkpoints:
            core.checkpointed = now
        core.terminating = True
        self._refresh(job)

    def show_checkpoint(self, job: ReplayJob, now: float) -> None:
        """The job's last checkpoint as the core sees it (``Job.checkpointed``), when the
        runtime reports them (``Timing.report_checkpoints``): the reports reach the service
        without a cycle of their own, so a cycle sees the latest."""
        if self.reports_checkpoints:
            core = job.core
            if core.state is JobState.RUNNING and not core.terminating:
                core.checkpointed = self.backend.checkpoint_time(job.id, now)

    def reject(self, job: ReplayJob, reason: str, now: float) -> None:
        self.backend.cancel(job.id, now)
        job.core.state = JobState.REJECTED
        job.core.placement = ()
        job.state, job.error, job.ended = "REJECTED", reason, now
        self.n_pending -= 1
        self.n_done += 1
        self._refresh(job)
        self.recorder.add_demand(job, -1)

    def _refresh(self, job: ReplayJob) -> None:
        """Bring the recorder's held and busy GPUs up to date with the job's placement."""
        core = job.core
        workers = len(core.placement)
        held = workers * job.gpu
        whole = workers >= core.min_workers
        busy = held if job.state == "RUNNING" and whole and not core.terminating else 0.0
        self._touched.append(job)
        self.recorder.change(job, held - job.held, busy - job.busy)
        job.held, job.busy = held, busy

    def _report_progress(self, now: float) -> None:
        """A line at every 5 % of jobs done, and at least every ``progress_every`` seconds."""
        total = max(1, len(self.order))
        percent = 100 * self.n_done // total // 5 * 5
        clock = time.perf_counter()
        if clock - self._started < self.progress_after:
            return  # a short replay needs no progress lines
        if percent <= self._last_percent and clock - self._last_progress < self.progress_every:
            return
        self._last_percent = max(percent, self._last_percent)
        self._last_progress = clock
        print(
            f"{self.policy.name}: {100 * self.n_done / total:5.1f}% of jobs done "
            f"({self.n_done:,}/{total:,}), simulated day {now / 86400:.1f}",
            file=self.progress,
            flush=True,
        )


AnyFake = TypeVar("AnyFake", bound=FakeBackend)


def backend_for(scenario: Scenario, kind: type[AnyFake]) -> AnyFake:
    """The fake backend (``kind``) with the scenario's timing (its defaults: the simulator's
    old model)."""
    t = scenario.timing
    return kind(
        scenario.checkpoint_every,
        start_delay=t.start_delay,
        finish_seen_after=t.finish_seen_after,
        release_seen_after=t.release_seen_after,
        exit_after_term=t.exit_after_term,
        checkpoint_on_sigterm=t.checkpoint_on_sigterm,
        report_running=t.service_cycles,
    )


def _on_multiple(t: float, interval: float) -> bool:
    return abs(t / interval - round(t / interval)) < 1e-9


def replay(scenario: Scenario, policy: Policy, progress: TextIO | None = None) -> ReplaySummary:
    return Replay(scenario, policy, progress=progress).run()


def stderr_progress() -> TextIO:
    return sys.stderr
