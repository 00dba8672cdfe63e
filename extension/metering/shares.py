"""Fair share in the metering: every plan's decayed usage and fair-share factor, sampled into a
bounded ring for the admin page's chart, and as the ``/metrics`` gauges.

- ``ShareSamples``: after a cycle (``Metering.on_cycle``), at most every ``interval`` seconds
  (the half-life over ``SAMPLES``, at least ``MIN_INTERVAL``), one sample of the standings the
  service's usage history gives (``Scheduler.fair_share.standings``): the ring spans about one
  half-life whatever its length, and holds ``SAMPLES`` samples at most. A sample keeps only the
  plans with usage, as two columns of floats (a plan without usage has usage 0 and factor 1:
  ``2 ** 0``), so its memory follows the plans that ran recently, not every plan. The ring lives
  in memory: a restarted service starts a new one (the usage itself is in the store).
- ``share_families``: ``wmla_plan_fair_share_factor{plan}`` and ``wmla_plan_usage{plan}``, the
  standings decayed to the moment of the scrape; no series while the history is off.

The scheduler is passed in (``fair_share``, ``plans``), never imported: metering does not import
the service.
"""

from __future__ import annotations

import math
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily

SAMPLES = 360  # samples the ring holds: one half-life
MIN_INTERVAL = 1.0  # seconds: a short half-life is still sampled at most once a second


@dataclass(frozen=True)
class ShareSample:
    """One moment's standings of the plans with usage: their paths and, in the same order,
    their decayed usage and their fair-share factors."""

    at: float
    paths: tuple[str, ...]
    usage: array
    factor: array

    def of(self, path: str, where: Mapping[str, int]) -> tuple[float, float]:
        """(usage, factor) of ``path`` at this moment, ``where`` being ``positions(paths)``:
        (0, 1) for a plan without usage."""
        i = where.get(path)
        if i is None:
            return 0.0, 1.0
        return self.usage[i], self.factor[i]


def positions(paths: tuple[str, ...]) -> dict[str, int]:
    """Each path's index in ``paths``."""
    return {p: i for i, p in enumerate(paths)}


def sample_of(at: float, standings: Mapping[str, Any], like: ShareSample | None) -> ShareSample:
    """The sample of ``standings`` (path -> ``PlanStanding``); the paths tuple of ``like`` is
    shared when it is the same (most samples have the same plans as the one before)."""
    used = sorted(p for p, s in standings.items() if s.raw_usage > 0)
    paths = tuple(used)
    if like is not None and like.paths == paths:
        paths = like.paths
    usage = array("d", (standings[p].raw_usage for p in used))
    factor = array("d", (standings[p].factor for p in used))
    return ShareSample(at, paths, usage, factor)


class ShareSamples:
    """The ring of samples (``take`` after each cycle; ``series`` for the API)."""

    def __init__(self, size: int = SAMPLES, min_interval: float = MIN_INTERVAL) -> None:
        self.ring: deque[ShareSample] = deque(maxlen=size)
        self.min_interval = min_interval
        self.taken = -math.inf

    def interval(self, half_life: float) -> float:
        """Seconds between samples: the ring spans one half-life (at least ``min_interval``)."""
        return max(self.min_interval, half_life / (self.ring.maxlen or SAMPLES))

    def take(self, scheduler: Any, now: float) -> bool:
        """Sample the scheduler's standings when one is due; True when one was taken."""
        fair_share = getattr(scheduler, "fair_share", None)
        if fair_share is None or not fair_share.settings.history_on:
            return False
        if now - self.taken < self.interval(fair_share.settings.half_life):
            return False
        self.taken = now
        last = self.ring[-1] if self.ring else None
        self.ring.append(sample_of(now, fair_share.standings(scheduler.plans, now), last))
        return True

    def series(self, paths: Iterable[str], now: ShareSample | None = None) -> dict:
        """``{"t": [...], "plans": [{"plan", "raw_usage": [...], "fair_share_factor": [...]}]}``
        for ``paths`` over the ring, then ``now`` (the standings of this moment) when given."""
        samples = [*self.ring, *([now] if now is not None else [])]
        index: dict[int, dict[str, int]] = {}  # by paths tuple: most samples share one
        wheres = [index.setdefault(id(s.paths), positions(s.paths)) for s in samples]
        out = []
        for path in paths:
            pairs = [s.of(path, where) for s, where in zip(samples, wheres)]
            out.append(
                {
                    "plan": path,
                    "raw_usage": [u for u, _ in pairs],
                    "fair_share_factor": [f for _, f in pairs],
                }
            )
        return {"t": [s.at for s in samples], "plans": out}


def share_families(scheduler: Any, now: float, shown: Callable[[Iterable[str]], set[str]]) -> list:
    """The two gauges, per plan that /metrics shows (``shown``), decayed to ``now``."""
    factor = GaugeMetricFamily(
        "wmla_plan_fair_share_factor",
        "Fair-share factor among the plan's siblings, 2^(-U/S): 1 no usage, 0.5 exactly its "
        "share, less above it (only while the usage history is on).",
        labels=["plan"],
    )
    usage = GaugeMetricFamily(
        "wmla_plan_usage",
        "Decayed usage of the plan's subtree in weighted resource-seconds (GPU-seconds by "
        "default; c.WmlaService.fair_share_weights), halved every fair_share_half_life.",
        labels=["plan"],
    )
    fair_share = getattr(scheduler, "fair_share", None)
    if fair_share is not None and fair_share.settings.history_on:
        standings = fair_share.standings(scheduler.plans, now)
        for path in sorted(shown(standings)):
            factor.add_metric([path], standings[path].factor)
            usage.add_metric([path], standings[path].raw_usage)
    return [factor, usage]
