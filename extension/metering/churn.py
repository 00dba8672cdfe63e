"""Churn figures per plan: what preemptions cost (docs/metering.md "Churn").

Every Preempt the service stores carries its cost in the decision's detail
(``extension/service/changes.py`` ``preemption_cost``): the victim's held and lost GPU-seconds
at the decision (``extension.scheduler.churn``'s ``held_work`` and ``lost_work``) and whether it
was decided in the steady state (``within_one_gang`` of the previous cycle's figures). ``Churn``
sums them for the victim's user leaf and every plan above it: read once from the store's
``decisions`` at start (so the counters survive a restart, like the ledger's), then fed by the
scheduling loop's ``decision_hooks`` with each cycle's stored decisions.

A Preempt stored before these figures existed counts as a preemption of 0 seconds, not in the
steady state.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily

from .accounting import ROOT, ancestors


@dataclass
class PlanChurn:
    preemptions: int = 0
    preempted_gpu_seconds: float = 0.0
    lost_gpu_seconds: float = 0.0
    steady_state_preemptions: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Churn:
    """The counters of every plan that had a preemption in its subtree (and the root's)."""

    def __init__(self) -> None:
        self.plans: dict[str, PlanChurn] = {ROOT: PlanChurn()}

    def add(self, leaf: str, detail: Any) -> None:
        """One Preempt of a job charged to ``leaf``, with its decision's ``detail``."""
        detail = detail if isinstance(detail, dict) else {}
        held = _seconds(detail.get("held_gpu_seconds"))
        lost = _seconds(detail.get("lost_gpu_seconds"))
        steady = detail.get("steady_state") is True
        for path in ancestors(leaf):
            plan = self.plans.setdefault(path, PlanChurn())
            plan.preemptions += 1
            plan.preempted_gpu_seconds += held
            plan.lost_gpu_seconds += lost
            plan.steady_state_preemptions += int(steady)

    def load(self, rows: Iterable[tuple[str, Any]]) -> int:
        """The history: (leaf, detail) of every stored Preempt; returns how many."""
        n = 0
        for leaf, detail in rows:
            self.add(leaf, detail)
            n += 1
        return n

    def of(self, path: str) -> PlanChurn:
        return self.plans.get(path) or PlanChurn()

    def answer(self, paths: Iterable[str] | None = None) -> dict[str, Any]:
        """``GET /churn``: every plan's counters (``paths``: only these), root first."""
        wanted = sorted(self.plans) if paths is None else sorted(set(paths) & set(self.plans))
        return {
            "plans": [{"path": p, **self.plans[p].to_dict()} for p in wanted],
            "units": {
                "preempted_gpu_seconds": "GPU-seconds held by the victim since it (re)started",
                "lost_gpu_seconds": "GPU-seconds since the victim's last checkpoint or "
                "(re)start, whichever is later",
            },
        }


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0.0
    return float(value) if math.isfinite(value) and value > 0 else 0.0


def churn_families(churn: Churn, paths: Iterable[str]) -> Iterator[CounterMetricFamily]:
    """The Prometheus counters of ``paths`` (plans with a preemption in their subtree)."""
    labels = ["plan"]
    held = CounterMetricFamily(
        "wmla_preempted_gpu_seconds",
        "GPU-seconds the preempted jobs of the plan's subtree had held since they (re)started, "
        "at the decision (0 for jobs without GPUs).",
        labels=labels,
    )
    lost = CounterMetricFamily(
        "wmla_lost_gpu_seconds",
        "GPU-seconds of work the preempted jobs of the plan's subtree lost: since their last "
        "reported checkpoint, or their (re)start when later or none.",
        labels=labels,
    )
    steady = CounterMetricFamily(
        "wmla_steady_state_preemptions",
        "Preemptions in the plan's subtree decided while every plan was within one gang of its "
        "deserved share (the contract says there should be none); plan / is the total.",
        labels=labels,
    )
    for path in sorted(set(paths) & set(churn.plans)):
        figures = churn.plans[path]
        held.add_metric([path], figures.preempted_gpu_seconds)
        lost.add_metric([path], figures.lost_gpu_seconds)
        steady.add_metric([path], figures.steady_state_preemptions)
    yield from (held, lost, steady)
