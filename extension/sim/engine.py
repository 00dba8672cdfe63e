"""The scenario runner: the real scheduler core in simulated time over the fake backend.

It is the replay loop (``replay.py``: arrivals, cancels, the fake backend's finishes and ends
of grace periods) with ``EveryInstant``, the ``wmla`` policy running a core cycle at every
instant whatever happened, and a timeline entry whenever the allocation changes: the output
the scenario files under tests/scenarios pin down (SCENARIO-FORMAT.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from extension.scheduler import CycleResult

from .jobs import ReplayJob
from .policies import Wmla
from .replay import Replay
from .scenario import Scenario
from .segments import SegmentLog
from .summary import churn_figures


@dataclass
class SimResult:
    jobs: dict[str, ReplayJob]
    timeline: list[dict] = field(default_factory=list)
    end: float = 0.0
    capacity_gpu: float = 0.0
    cycles: int = 0
    figures: dict = field(default_factory=dict)  # summary.churn_figures of the replay

    def to_json(self) -> dict:
        return {
            "jobs": {
                jid: {
                    "state": j.state,
                    "charged_to": j.leaf,
                    "submitted": _num(j.core.submitted),
                    "started": _num(j.first_start),
                    "ended": _num(j.ended),
                    "preemptions": j.preemptions,
                    "error": j.error,
                }
                for jid, j in self.jobs.items()
            },
            "timeline": self.timeline,
            "summary": self.summary(),
        }

    def summary(self) -> dict:
        """gpu_allocation: allocated GPU-seconds over min(capacity, demand) GPU-seconds;
        broken_gangs: jobs ever seen holding fewer workers than their gang (must be 0);
        max_share_deviation_gpu: the largest |allocated - deserved| GPUs of any plan at any
        timeline entry; churn, held_gpu_s, gpu_utilization, share_deviation: as the trace
        replay's (summary.churn_figures, docs/simulate.md "Churn")."""
        used = wanted = 0.0
        broken: set[str] = set()
        deviation = 0.0
        for n, entry in enumerate(self.timeline):
            t_next = self.timeline[n + 1]["t"] if n + 1 < len(self.timeline) else self.end
            span = max(0.0, t_next - entry["t"])
            used += entry["_gpu_allocated"] * span
            wanted += min(self.capacity_gpu, entry["_gpu_demand"]) * span
            for jid, workers in entry["running"].items():
                if workers < self.jobs[jid].core.min_workers:
                    broken.add(jid)
            for figures in entry["plans"].values():
                gap = abs(figures["allocated"].get("gpu", 0) - figures["deserved"].get("gpu", 0))
                deviation = max(deviation, gap)
        return {
            "gpu_allocation": round(used / wanted, 4) if wanted else 1.0,
            "broken_gangs": len(broken),
            "max_share_deviation_gpu": _num(round(deviation, 4)),
            "cycles": self.cycles,
            **self.figures,
        }


class EveryInstant(Wmla):
    """The core at every instant (no skipped cycles, no aggregation), recording the timeline:
    an entry whenever the set of running workers changes, with every plan's figures."""

    def __init__(self) -> None:
        super().__init__(aggregate=False)
        self.timeline: list[dict] = []
        self._last_running: dict[str, int] | None = None

    def step(self, now: float) -> None:
        self.pop_timers(now)
        if self.service and not self.wants_cycle(now):
            return  # the service's loop runs no cycle at this instant
        self.dirty = False
        self._record(now, self.cycle(now))

    def _record(self, now: float, result: CycleResult) -> None:
        running = {jid: j.core.workers for jid, j in self.live.items() if j.core.workers}
        if running == self._last_running:
            return
        self._last_running = running
        plans = {
            path: {"allocated": f.allocated.to_dict(), "deserved": f.deserved.to_dict()}
            for path, f in result.plans.items()
            if path != "/"
        }
        entry = {
            "t": _num(now),
            "running": running,
            "plans": plans,
            "_gpu_allocated": sum(
                j.core.per_worker.gpu * j.core.workers for j in self.live.values()
            ),
            "_gpu_demand": result.plans["/"].demand.gpu,
        }
        if self.timeline and self.timeline[-1]["t"] == entry["t"]:
            self.timeline[-1] = entry
        else:
            self.timeline.append(entry)


def simulate(scenario: Scenario, segments: SegmentLog | None = None) -> SimResult:
    """The scenario runner's replay; ``segments``: a log to record every job's run segments
    in (``--jobs-csv``)."""
    policy = EveryInstant()
    replay = Replay(scenario, policy)
    replay.recorder.segments = segments
    replay.run()
    timeline = policy.timeline
    end = max(replay.stopped_at, timeline[-1]["t"] if timeline else 0)
    figures = churn_figures(replay)
    return SimResult(replay.jobs, timeline, end, replay.capacity_gpu, policy.cycles, figures)


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
