"""The service's usage history (docs/scheduling.md "Deserved share 2"): advanced every cycle
with what each user leaf held since the one before, handed to the core as ``Snapshot.usage``,
kept in the store's meta table so that a restart does not forget the week.

What the leaves held comes from the live jobs (their placements), the same figures the core
charges its plans with: the simulator advances its history the same way, so the two agree.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from traitlets import TraitError

from extension.durations import DurationError, parse_duration_or_off
from extension.scheduler import Job, JobState
from extension.scheduler.history import (
    PlanStanding,
    UsageHistory,
    UsageWeights,
    standings,
    subtree_usage,
)
from extension.scheduler.plans import PlanTree

META_KEY = "usage_history"
SAVE_EVERY = 60.0  # seconds between saves: a crash forgets at most this much usage


@dataclass(frozen=True)
class FairShareSettings:
    """The knobs, as ``c.WmlaService`` validated them (seconds; 0: off)."""

    half_life: float = 0.0
    weights: UsageWeights = UsageWeights()
    reset_period: float = 0.0
    max_gang_wait: float = 0.0

    @property
    def history_on(self) -> bool:
        return self.half_life > 0


class FairShareHistory:
    """Keeps the decayed usage per leaf and saves it every ``SAVE_EVERY`` seconds."""

    def __init__(self, settings: FairShareSettings, log: logging.Logger | None = None) -> None:
        self.settings = settings
        self.log = log or logging.getLogger("wmla.service")
        self.history = (
            UsageHistory(settings.half_life, settings.weights, settings.reset_period)
            if settings.history_on
            else None
        )
        self.saved_at: float | None = None

    def load(self, saved: str | None) -> None:
        """Take back what the last service saved (a broken value is logged and ignored)."""
        if self.history is None or not saved:
            return
        try:
            self.history.load(json.loads(saved))
        except (ValueError, TypeError, AttributeError) as err:
            self.log.warning(
                "wmla: usage history in the store is unreadable (%s): starting empty", err
            )

    def advance(self, now: float, jobs: Iterable[Job]) -> Mapping[str, float]:
        """Charge what the running jobs held since the last cycle; the usage for the core."""
        if self.history is None:
            return {}
        self.history.advance(now, held_by_leaf(jobs))
        return self.history.usage

    def usage_now(self, now: float) -> dict[str, float]:
        """The usage decayed to ``now`` (a copy: the loop goes on charging the kept one)."""
        return self.history.decayed(now) if self.history is not None else {}

    def to_save(self, now: float) -> str | None:
        """The JSON to store when a save is due, else None."""
        if self.history is None or (self.saved_at is not None and now - self.saved_at < SAVE_EVERY):
            return None
        self.saved_at = now
        return json.dumps(self.history.to_json(), sort_keys=True)

    def standings(self, plans: PlanTree, now: float) -> dict[str, PlanStanding]:
        """Every plan's row for ``wmla shares`` and the admin page, decayed to ``now``."""
        usage = self.history.decayed(now) if self.history is not None else {}
        children: dict[str, list[tuple[str, float]]] = {}
        for plan in plans:
            parent = plan.path.rsplit("/", 1)[0] or "/"
            children.setdefault(parent, []).append((plan.path, plan.share))
        return standings(children, subtree_of(plans, usage))

    def reset(self, now: float) -> None:
        """Forget all usage now (an admin's reset); saved at the next cycle."""
        if self.history is not None:
            self.history.reset(now)
            self.saved_at = None


def held_by_leaf(jobs: Iterable[Job]) -> list[tuple[str, tuple]]:
    """What each running job holds, by its user leaf (a leaf may come more than once)."""
    out = []
    for job in jobs:
        if job.state is JobState.RUNNING and job.placement:
            n, w = len(job.placement), job.per_worker
            out.append((job.leaf, (w[0] * n, w[1] * n, w[2] * n)))
    return out


def subtree_of(plans: PlanTree, usage: Mapping[str, float]) -> dict[str, float]:
    """Each plan's subtree usage (``history.subtree_usage`` over the tree's paths)."""
    return subtree_usage((p.path for p in plans), usage)


def seconds_or_off(value: object, name: str) -> float:
    """A knob in seconds or a duration ("7d"); 0 (or "0") turns it off. Raises TraitError
    naming the knob and what to write."""
    try:
        return parse_duration_or_off(value, name)
    except DurationError as err:
        raise TraitError(str(err)) from None


def usage_weights(value: Mapping, name: str) -> UsageWeights:
    """``{"gpu": 1, "cpu": 0.05, "memory": 0}`` as ``UsageWeights`` (missing: gpu 1, others
    0); raises TraitError naming the knob on an unknown resource or a bad number."""
    unknown = sorted(set(value) - {"gpu", "cpu", "memory"})
    if unknown:
        raise TraitError(f"{name}: unknown resource {unknown[0]!r}; use gpu, cpu or memory")
    try:
        return UsageWeights(
            float(value.get("gpu", 1.0)),
            float(value.get("cpu", 0.0)),
            float(value.get("memory", 0.0)),
        )
    except (TypeError, ValueError) as err:
        raise TraitError(f"{name}: {err}") from None
