"""Fair share over days in the simulator: the options (``--fair-share-half-life``,
``--max-gang-wait``, ``--usage-reset-period``) and the usage a replay charges its leaves.

The core reads usage history only as ``Snapshot.usage`` (docs/scheduling.md "Deserved share
2"); the simulated wmla policy keeps it as the service does: a ``UsageHistory`` charged with
what every user leaf held between two changes (held amounts are constant in between, so the
integral is exact), advanced at every change of what a leaf holds and before every cycle.
With a half-life of 0 nothing is kept and every snapshot's usage is empty: today's behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from extension.durations import DurationError, parse_duration_or_off
from extension.scheduler import Job, SchedulerConfig
from extension.scheduler.history import UsageHistory


class FairShareError(ValueError):
    """A bad fair-share option; the message names the option and what to write."""


@dataclass(frozen=True)
class FairShare:
    """Usage history and the starved-gang bound of a replay; 0 turns each off."""

    half_life: float = 0.0  # SchedulerConfig.fair_share_half_life
    max_gang_wait: float = 0.0  # SchedulerConfig.max_gang_wait
    reset_period: float = 0.0  # UsageHistory.reset_period

    def __post_init__(self) -> None:
        if self.reset_period > 0 and self.half_life <= 0:
            raise FairShareError(
                "a usage reset period needs usage history: give a fair-share half-life too"
            )

    @property
    def off(self) -> bool:
        return self.half_life <= 0 and self.max_gang_wait <= 0

    def config(self, config: SchedulerConfig) -> SchedulerConfig:
        """``config`` with this half-life and bound (the same object when both are off)."""
        if self.off:
            return config
        return replace(
            config, fair_share_half_life=self.half_life, max_gang_wait=self.max_gang_wait
        )


def parse_span(value: Any, option: str) -> float:
    """Seconds from ``0`` (off), a number of seconds or a duration (``7d``, ``12h``,
    ``1h30m``: ``extension.durations``); anything else is a ``FairShareError`` naming
    ``option``."""
    try:
        return parse_duration_or_off(value, option)
    except DurationError as problem:
        raise FairShareError(str(problem)) from None


class LeafUsage:
    """What every user leaf holds now and its decayed usage (``UsageHistory``), for one
    replay. ``count`` is told every change of a job's workers; it charges the time since
    the last change at the amounts held until then first."""

    def __init__(self, half_life: float, reset_period: float = 0.0) -> None:
        self.history = UsageHistory(half_life, reset_period=reset_period)
        self.held: dict[str, list[float]] = {}  # leaf -> [gpu, cpu millicores, memory bytes]
        self.workers: dict[str, int] = {}  # job id -> workers counted in ``held``

    def charge(self, now: float) -> None:
        """Decay to ``now`` and charge every leaf for what it held since the last call."""
        self.history.advance(now, ((leaf, tuple(v)) for leaf, v in self.held.items()))

    def count(self, job: Job, workers: int, now: float) -> None:
        """``job`` holds ``workers`` workers from ``now`` on."""
        before = self.workers.get(job.id, 0)
        if workers == before:
            return
        self.charge(now)
        if workers:
            self.workers[job.id] = workers
        else:
            self.workers.pop(job.id, None)
        leaf = job.leaf
        held = self.held.setdefault(leaf, [0.0, 0.0, 0.0])
        delta = workers - before
        for r in range(3):
            held[r] += job.per_worker[r] * delta
        if not any(held):
            del self.held[leaf]

    def usage(self, now: float) -> dict[str, float]:
        """The decayed usage by leaf at ``now`` (charged up to it): ``Snapshot.usage``."""
        self.charge(now)
        return self.history.usage
