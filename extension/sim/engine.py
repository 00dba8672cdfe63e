"""Drive the real scheduler core in simulated time over the fake backend.

At every time something happens (a submission, a finish, the end of a grace period, a cancel)
the simulation builds a snapshot, runs ``schedule(snapshot, now)``, and carries out the
decisions. The timeline gets an entry whenever the allocation changes.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from extension.backends.fake import FINISHED, RELEASED, SHRUNK, FakeBackend
from extension.scheduler import (
    Grow,
    Job,
    JobState,
    Preempt,
    Reject,
    Shrink,
    Snapshot,
    Start,
    schedule,
)

from .scenario import Scenario

MAX_CYCLES_PER_INSTANT = 50  # zero-grace releases can chain; this bounds one instant


@dataclass
class SimJob:
    job: Job
    duration: float
    state: str = "PENDING"
    started: float | None = None  # first start
    ended: float | None = None
    preemptions: int = 0
    error: str | None = None
    reason: str | None = None


@dataclass
class SimResult:
    jobs: dict[str, SimJob]
    timeline: list[dict] = field(default_factory=list)
    end: float = 0.0
    capacity_gpu: float = 0.0
    cycles: int = 0

    def to_json(self) -> dict:
        return {
            "jobs": {
                jid: {
                    "state": s.state,
                    "charged_to": s.job.leaf,
                    "submitted": _num(s.job.submitted),
                    "started": _num(s.started),
                    "ended": _num(s.ended),
                    "preemptions": s.preemptions,
                    "error": s.error,
                }
                for jid, s in self.jobs.items()
            },
            "timeline": self.timeline,
            "summary": self.summary(),
        }

    def summary(self) -> dict:
        """gpu_allocation: allocated GPU-seconds over min(capacity, demand) GPU-seconds;
        broken_gangs: jobs ever seen holding fewer workers than their gang (must be 0);
        max_share_deviation_gpu: the largest |allocated - deserved| GPUs of any plan at any
        timeline entry."""
        used = wanted = 0.0
        broken: set[str] = set()
        deviation = 0.0
        for n, entry in enumerate(self.timeline):
            t_next = self.timeline[n + 1]["t"] if n + 1 < len(self.timeline) else self.end
            span = max(0.0, t_next - entry["t"])
            used += entry["_gpu_allocated"] * span
            wanted += min(self.capacity_gpu, entry["_gpu_demand"]) * span
            for jid, workers in entry["running"].items():
                if workers < self.jobs[jid].job.min_workers:
                    broken.add(jid)
            for figures in entry["plans"].values():
                gap = abs(figures["allocated"].get("gpu", 0) - figures["deserved"].get("gpu", 0))
                deviation = max(deviation, gap)
        return {
            "gpu_allocation": round(used / wanted, 4) if wanted else 1.0,
            "broken_gangs": len(broken),
            "max_share_deviation_gpu": _num(round(deviation, 4)),
            "cycles": self.cycles,
        }


class Simulation:
    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.plans = scenario.plans.copy()
        self.backend = FakeBackend(scenario.checkpoint_every)
        self.jobs: dict[str, SimJob] = {}
        self.live: dict[str, Job] = {}  # pending and running, in the core's terms
        self.arrivals: list[tuple[float, int, str, object]] = []
        for n, sj in enumerate(scenario.jobs):
            heapq.heappush(self.arrivals, (sj.at, 0, f"{n:09d}", sj))
        for n, c in enumerate(scenario.cancels):
            heapq.heappush(self.arrivals, (c.at, 1, f"{n:09d}", c))
        self.result = SimResult(self.jobs, capacity_gpu=scenario.instance.capacity.gpu)
        self._last_running: dict[str, int] | None = None
        self.reserved: str | None = None  # carried from cycle to cycle (Admission 4)

    def run(self) -> SimResult:
        now = 0.0
        until = self.scenario.until
        while True:
            times = [t for t in (self._next_arrival(), self.backend.next_time()) if t is not None]
            if not times:
                break
            now = min(times)
            if now > until:
                now = until
                break
            self._instant(now)
        self.result.end = max(now, self.result.timeline[-1]["t"] if self.result.timeline else 0)
        return self.result

    def _next_arrival(self) -> float | None:
        return self.arrivals[0][0] if self.arrivals else None

    def _instant(self, now: float) -> None:
        for _ in range(MAX_CYCLES_PER_INSTANT):
            self._arrive(now)
            self._backend_events(now)
            self._cycle(now)
            if self.backend.next_time() is None or self.backend.next_time() > now + 1e-9:
                break

    def _arrive(self, now: float) -> None:
        while self.arrivals and self.arrivals[0][0] <= now + 1e-9:
            _, kind, _, item = heapq.heappop(self.arrivals)
            if kind == 1:
                self._cancel(item.cancel, now)
                continue
            sj = item
            job = Job(
                id=sj.id,
                user=sj.user,
                plan=sj.plan,
                per_worker=sj.per_worker,
                min_workers=sj.min_workers,
                max_workers=sj.max_workers,
                priority=sj.priority,
                submitted=sj.at,
                preemptible=sj.preemptible,
            )
            self.jobs[sj.id] = SimJob(job, sj.duration)
            self.live[sj.id] = job
            self.backend.register(sj.id, sj.duration * sj.max_workers)

    def _cancel(self, job_id: str, now: float) -> None:
        sim = self.jobs.get(job_id)
        if sim is None or sim.state not in ("PENDING", "RUNNING"):
            return
        self.backend.cancel(job_id, now)
        self.live.pop(job_id, None)
        sim.state, sim.ended = "CANCELLED", now

    def _backend_events(self, now: float) -> None:
        for kind, job_id, nodes in self.backend.due(now):
            sim = self.jobs[job_id]
            job = sim.job
            if kind == FINISHED:
                self.live.pop(job_id, None)
                sim.state, sim.ended = "FINISHED", now
            elif kind == RELEASED:
                job.state, job.placement, job.started = JobState.PENDING, (), None
                job.terminating = False
                sim.state = "PENDING"
                sim.preemptions += 1
            elif kind == SHRUNK:
                placement = list(job.placement)
                for node in nodes:
                    placement.remove(node)
                job.placement = tuple(placement)
                job.terminating = False

    def _cycle(self, now: float) -> None:
        snapshot = Snapshot(
            self.plans,
            self.scenario.instance,
            list(self.live.values()),
            self.scenario.config,
            reserved=self.reserved,
        )
        result = schedule(snapshot, now)
        self.reserved = result.reserved
        self.result.cycles += 1
        for d in result.decisions:
            sim = self.jobs[d.job_id]
            job = sim.job
            if isinstance(d, Start):
                job.state, job.placement, job.started = JobState.RUNNING, d.placement, now
                sim.state = "RUNNING"
                sim.started = now if sim.started is None else sim.started
                self.backend.start(d.job_id, d.placement, now)
            elif isinstance(d, Grow):
                job.placement = job.placement + d.add
                self.backend.grow(d.job_id, d.add, now)
            elif isinstance(d, Shrink):
                job.terminating = True
                self.backend.shrink(d.job_id, d.release, d.grace, now)
            elif isinstance(d, Preempt):
                job.terminating = True
                self.backend.preempt(d.job_id, d.grace, now)
            elif isinstance(d, Reject):
                self.live.pop(d.job_id, None)
                self.backend.cancel(d.job_id, now)
                sim.state, sim.error, sim.ended = "REJECTED", d.reason, now
        for job_id, reason in result.waiting.items():
            self.jobs[job_id].reason = reason
        for job in self.live.values():  # user leaves are created on first use
            if job.leaf not in self.plans:
                self.plans.ensure_user_leaf(job.plan, job.user)
        self._record(now, result)

    def _record(self, now: float, result) -> None:
        running = {jid: j.workers for jid, j in self.live.items() if j.workers}
        if running == self._last_running:
            return
        self._last_running = running
        plans = {
            path: {"allocated": f.allocated.to_dict(), "deserved": f.deserved.to_dict()}
            for path, f in result.plans.items()
            if path != "/"
        }
        root = result.plans["/"]
        entry = {
            "t": _num(now),
            "running": running,
            "plans": plans,
            "_gpu_allocated": sum(
                j.per_worker.gpu * j.workers for j in self.live.values() if j.workers
            ),
            "_gpu_demand": root.demand.gpu,
        }
        if self.result.timeline and self.result.timeline[-1]["t"] == entry["t"]:
            self.result.timeline[-1] = entry
        else:
            self.result.timeline.append(entry)


def simulate(scenario: Scenario) -> SimResult:
    return Simulation(scenario).run()


def public_json(result: SimResult) -> dict:
    """The ``--json`` document: the timeline without the internal figures."""
    out = result.to_json()
    out["timeline"] = [
        {k: v for k, v in e.items() if not k.startswith("_")} for e in out["timeline"]
    ]
    return out


def _num(value: float | None) -> float | None:
    if value is None:
        return None
    return int(value) if value == int(value) else round(value, 3)
