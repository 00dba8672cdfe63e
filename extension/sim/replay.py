"""Replay a scenario (a trace or a scenario file) under one scheduling policy, and measure it.

The clock jumps from one instant to the next at which something happens: a submission, a
finish or end of a grace period on the fake backend, or a policy's own timer (the operator's
deadlock timeout). The ``Recorder`` first integrates the figures over the span since the
previous instant (the state did not change within it); then the policy decides
(``Policy.step``). With ``interval`` > 0 the policy decides only on multiples of it (a periodic
scheduler); events in between wait for the next one. The policies live in ``policies.py``; what
is measured and how is in docs/simulate.md.

The scenario runner (``engine.py``) is this loop with a policy that runs a core cycle at every
instant and records the timeline; ``Wmla`` here skips a cycle that cannot change anything,
which is what makes a month of Philly replay in seconds.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

from extension.backends.fake import FINISHED, RELEASED, SHRUNK, FakeBackend
from extension.scheduler import FINAL_STATES, Job, JobState

from .metrics import PlanShape, deserved_gpus, num, percentiles
from .scenario import Scenario, ScenarioJob

MAX_STEPS_PER_INSTANT = 50  # zero-grace releases can chain; this bounds one instant
EPS = 1e-9


@dataclass
class ReplayJob:
    """One job as the replay tracks it; ``core`` is the core's view (state, placement)."""

    spec: ScenarioJob
    seq: int  # submission order (time, then trace order)
    core: Job
    team: str
    gpu: float  # GPUs per worker
    state: str = "PENDING"  # PENDING RUNNING FINISHED REJECTED
    first_start: float | None = None  # first time the whole gang ran
    ended: float | None = None
    preemptions: int = 0
    broken: bool = False  # ever held some but not all of its gang
    error: str | None = None
    held: float = 0.0  # GPUs it holds now (counted in the recorder)
    busy: float = 0.0  # GPUs it holds and computes on now

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def leaf(self) -> str:
        return self.core.leaf


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
    ) -> None:
        self.scenario = scenario
        self.policy = policy
        self.backend = FakeBackend(scenario.checkpoint_every)
        self.instance = scenario.instance
        self.capacity_gpu = float(self.instance.capacity.gpu)
        self.jobs: dict[str, ReplayJob] = {}
        self.order = sorted(range(len(scenario.jobs)), key=lambda i: (scenario.jobs[i].at, i))
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
        self.interval = interval  # > 0: the policy decides only on multiples of it
        self.tick: float | None = None  # the next such multiple, when something waits for it
        self.recorder = Recorder(self)
        self.preemptions = 0
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
            times = [
                t
                for t in (
                    self._arrival_time(),
                    self.cancels[-1][0] if self.cancels else None,
                    self.backend.next_time(),
                    self.policy.next_timer(),
                    self.tick,
                )
                if t is not None
            ]
            if not times:
                break
            now = min(times)
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

    def _arrival_time(self) -> float | None:
        if self.next_arrival < len(self.order):
            return self.scenario.jobs[self.order[self.next_arrival]].at
        return None

    def _instant(self, now: float) -> None:
        self.recorder.advance(now)  # the span up to now ran with the state before this instant
        timer = self.policy.next_timer()
        decide = (
            not self.interval
            or _on_multiple(now, self.interval)
            or (timer is not None and timer <= now + EPS)
        )
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

    def _arrive(self, now: float) -> None:
        batch = []
        jobs = self.scenario.jobs
        while self.next_arrival < len(self.order) and jobs[self.order[self.next_arrival]].at <= (
            now + EPS
        ):
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
        for kind, job_id, nodes in self.backend.due(now):
            job = self.jobs[job_id]
            core = job.core
            if kind == FINISHED:
                self.policy.finished(job, now)
                core.state = JobState.FINISHED
                core.placement = ()
                job.state, job.ended = "FINISHED", now
                self._refresh(job)
                self.recorder.add_demand(job, -1)
                self.n_done += 1
            elif kind == RELEASED:
                core.state, core.placement, core.started = JobState.PENDING, (), None
                core.terminating = False
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

    def preempt(self, job: ReplayJob, grace: float, now: float) -> None:
        job.core.terminating = True
        self.backend.preempt(job.id, grace, now)
        self._refresh(job)

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


class Recorder:
    """Integrates the figures over time; ``observe(now)`` closes the span since the last call.

    Contention: the total GPU demand (max request of every pending and running job) is above
    the capacity. Fairness: |held - deserved| GPUs per plan, time-averaged, per depth of the
    plan tree (1: teams, 2: user leaves for a trace).
    """

    def __init__(self, replay: Replay) -> None:
        self.replay = replay
        self.capacity = replay.capacity_gpu
        plans = [(p.path, p.share, p.limit.gpu) for p in replay.scenario.plans]
        self.shape = PlanShape(plans)
        self.teams = sorted(p for p in self.shape.paths if p.count("/") == 1)
        self.team_index = {t[1:]: i for i, t in enumerate(self.teams)}
        self.leaf_held: dict[str, float] = {}
        self.held_by_plan: dict[str, float] = {}  # GPUs held per plan, leaves summed up
        self.leaf_demand: dict[str, float] = {}
        self.team_held = [0.0] * len(self.teams)
        self.held = 0.0
        self.busy = 0.0
        self.demand = 0.0
        self.last_t: float = 0.0
        self.first_t: float | None = None
        self.deserved: dict[str, float] = {}
        self.deserved_stale = True
        self.deadlocked = 0.0  # GPUs held by deadlocked jobs now (set by pod-fifo)
        # integrals (GPU-seconds or seconds)
        self.span = 0.0
        self.contended = 0.0
        self.held_contended = 0.0
        self.busy_contended = 0.0
        self.held_all = 0.0
        self.busy_all = 0.0
        self.wanted_all = 0.0
        self.partial_gs = 0.0
        self.deadlocked_gs = 0.0
        self.dev_all: dict[str, float] = {}
        self.dev_contended: dict[str, float] = {}
        self.timeline: list[tuple[float, tuple[float, ...], float]] = []
        self._last_point: tuple | None = None

    def add_demand(self, job: ReplayJob, sign: int) -> None:
        leaf = job.leaf
        if leaf not in self.shape.share:
            self.shape.add(leaf)
        amount = sign * job.gpu * job.core.max_workers
        self.leaf_demand[leaf] = self.leaf_demand.get(leaf, 0.0) + amount
        self.demand += amount
        self.deserved_stale = True

    def change(self, job: ReplayJob, held: float, busy: float) -> None:
        if held:
            leaf = job.leaf
            self.leaf_held[leaf] = self.leaf_held.get(leaf, 0.0) + held
            path = leaf
            while path != "/":  # every plan above the leaf holds it too
                self.held_by_plan[path] = self.held_by_plan.get(path, 0.0) + held
                path = path.rsplit("/", 1)[0] or "/"
            self.held += held
            i = self.team_index.get(job.team)
            if i is not None:
                self.team_held[i] += held
        self.busy += busy

    def advance(self, now: float) -> None:
        """Integrate the figures from the last instant to ``now`` with the state as it was."""
        if self.first_t is None:
            self.first_t = self.last_t = now
        dt = now - self.last_t
        if dt > 0:
            self._integrate(dt)
        self.last_t = now

    def observe(self, now: float) -> None:
        """The state after the decisions at ``now``: deserved shares, a timeline point."""
        if self.deserved_stale:
            self.deserved = deserved_gpus(self.shape, self.leaf_demand, self.capacity)
            self.deserved_stale = False
        point = (tuple(self.team_held), self.demand)
        if point != self._last_point:
            self._last_point = point
            if self.timeline and self.timeline[-1][0] == now:
                self.timeline[-1] = (now, *point)
            else:
                self.timeline.append((now, *point))

    def _integrate(self, dt: float) -> None:
        self.span += dt
        contended = self.demand > self.capacity + EPS
        self.held_all += self.held * dt
        self.busy_all += self.busy * dt
        self.wanted_all += min(self.capacity, self.demand) * dt
        self.partial_gs += (self.held - self.busy) * dt
        self.deadlocked_gs += self.deadlocked * dt
        if contended:
            self.contended += dt
            self.held_contended += self.held * dt
            self.busy_contended += self.busy * dt
        held = self.held_by_plan
        for path in self.shape.paths:
            gap = abs(held.get(path, 0.0) - self.deserved.get(path, 0.0)) * dt
            if gap:
                self.dev_all[path] = self.dev_all.get(path, 0.0) + gap
                if contended:
                    self.dev_contended[path] = self.dev_contended.get(path, 0.0) + gap

    def fairness(self) -> dict:
        """Per depth: the mean over plans of the time-averaged |held - deserved| GPUs, the worst
        plan, and every plan's figure; over contended time and over the whole replay."""
        out = {}
        depths = sorted({self.shape.depth(p) for p in self.shape.paths})
        for depth in depths:
            paths = [p for p in self.shape.paths if self.shape.depth(p) == depth]
            level = {}
            for key, gs, span in (
                ("contended", self.dev_contended, self.contended),
                ("whole", self.dev_all, self.span),
            ):
                per = {p: (gs.get(p, 0.0) / span if span else 0.0) for p in paths}
                worst = max(paths, key=lambda p: (per[p], p)) if paths else None
                level[key] = {
                    "mean_abs_dev_gpu": num(sum(per.values()) / len(paths)) if paths else 0,
                    "mean_abs_dev_share": (
                        num(sum(per.values()) / len(paths) / self.capacity) if paths else 0
                    ),
                    "worst_plan": worst,
                    "plans": {p: num(per[p]) for p in sorted(paths)},
                }
            out[str(depth)] = level
        return out


@dataclass
class ReplaySummary:
    replay: Replay
    wall: float
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        r = self.replay
        rec = r.recorder
        jobs = list(r.jobs.values())
        finished = [j for j in jobs if j.state == "FINISHED"]
        started = [j for j in jobs if j.first_start is not None]
        teams = sorted({j.team for j in jobs})

        def per_team(values: Callable[[ReplayJob], float], pool: list[ReplayJob]) -> dict:
            return {
                "overall": percentiles(values(j) for j in pool),
                "per_team": {t: percentiles(values(j) for j in pool if j.team == t) for t in teams},
            }

        hours = 3600.0
        return {
            "policy": r.policy.name,
            "jobs": {
                "submitted": len(r.order),
                "finished": len(finished),
                "rejected": sum(1 for j in jobs if j.state == "REJECTED"),
                "cancelled": sum(1 for j in jobs if j.state == "CANCELLED"),
                "unfinished": len(r.order) - sum(1 for j in jobs if j.state in FINAL_STATES),
            },
            "capacity_gpu": num(r.capacity_gpu),
            "span_s": num(rec.span),
            "end_s": num(rec.last_t),
            "gpu_allocation": {
                "contended_s": num(rec.contended),
                "held_while_contended": _ratio(rec.held_contended, rec.contended * rec.capacity),
                "busy_while_contended": _ratio(rec.busy_contended, rec.contended * rec.capacity),
                "held_over_wanted": _ratio(rec.held_all, rec.wanted_all),
                "busy_over_wanted": _ratio(rec.busy_all, rec.wanted_all),
                "busy_gpu_hours": num(rec.busy_all / hours),
                "held_idle_gpu_hours": num(rec.partial_gs / hours),
            },
            "jct_s": per_team(lambda j: j.ended - j.spec.at, finished),
            "queueing_delay_s": per_team(lambda j: j.first_start - j.spec.at, started),
            "fairness": rec.fairness(),
            "preemptions": r.preemptions,
            "shrinks": r.shrinks,
            "broken_gangs": sum(1 for j in jobs if j.broken),
            "deadlocked_gpu_hours": num(rec.deadlocked_gs / hours),
            **r.policy.figures(),
            "sim_wall_s": round(self.wall, 3),
        }

    def queueing_delays(self) -> dict[str, list[float]]:
        """Queueing delay of every job that started, per team and ``*`` for all (report CDFs)."""
        out: dict[str, list[float]] = {"*": []}
        for j in self.replay.jobs.values():
            if j.first_start is not None:
                d = j.first_start - j.spec.at
                out["*"].append(d)
                out.setdefault(j.team, []).append(d)
        return out


def _on_multiple(t: float, interval: float) -> bool:
    return abs(t / interval - round(t / interval)) < 1e-9


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 4) if b > 0 else None


def replay(scenario: Scenario, policy: Policy, progress: TextIO | None = None) -> ReplaySummary:
    return Replay(scenario, policy, progress=progress).run()


def stderr_progress() -> TextIO:
    return sys.stderr
