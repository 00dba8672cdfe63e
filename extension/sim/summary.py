"""What a finished replay reports: the summary of docs/simulate.md "Metrics", one per policy.

``ReplaySummary.to_json`` is the object ``wmla simulate --json`` prints under each policy;
``queueing_delays`` feeds the report's CDFs (``report.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from extension.scheduler import FINAL_STATES

from .churnlog import ChurnLog
from .jobs import ReplayJob
from .metrics import num, percentiles
from .recorder import Recorder


class _Figured(Protocol):
    name: str

    def figures(self) -> dict: ...


class FinishedReplay(Protocol):
    """What the summary reads of a finished replay; a ``Replay`` (replay.py) has all of it.

    A protocol rather than an import of ``Replay``: replay.py imports this module to build the
    summary, and the modules of a package import one way only (tests/scheduler/test_layering.py).
    """

    policy: _Figured
    jobs: dict[str, ReplayJob]
    order: list[int]
    recorder: Recorder
    capacity_gpu: float
    preemptions: int
    shrinks: int
    churn: ChurnLog


@dataclass
class ReplaySummary:
    replay: FinishedReplay
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
            **churn_figures(r),
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


def churn_figures(r: FinishedReplay) -> dict:
    """What preemptions cost and how fair and full the cluster was (docs/simulate.md
    "Churn"): the same four keys in the trace replay's summary and the scenario runner's."""
    rec = r.recorder
    return {
        "churn": r.churn.to_json(),
        "held_gpu_s": rec.held_gpu_s(),
        "gpu_utilization": _ratio(rec.held_all, rec.capacity * rec.span),
        "share_deviation": rec.share_deviation(),
    }


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 4) if b > 0 else None
