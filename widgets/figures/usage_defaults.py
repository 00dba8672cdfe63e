"""The metering widget's defaults: the user's recent jobs, the plan holding them, a range that
shows their runs whole and the step the usage API is asked for."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .common import is_number

RECENT_DAYS = 7  # jobs submitted within this count as recent for the usage widget's defaults
RECENT_JOBS = 5


def recent_jobs(jobs: Sequence[Mapping[str, Any]], now: float) -> list[Mapping[str, Any]]:
    """The latest few jobs submitted in the last week, newest first."""
    since = now - RECENT_DAYS * 86400
    mine = [j for j in jobs if is_number(j.get("submitted")) and j["submitted"] >= since]
    mine.sort(key=lambda j: j["submitted"], reverse=True)
    return mine[:RECENT_JOBS]


def common_plan(plans: Iterable[str]) -> str | None:
    """The deepest plan holding every one of ``plans`` (``/a/x``, ``/a/y`` -> ``/a``)."""
    parts = [[p for p in str(plan).split("/") if p] for plan in plans]
    if not parts:
        return None
    shared: list[str] = []
    for names in zip(*parts):
        if any(n != names[0] for n in names):
            break
        shared.append(names[0])
    return "/" + "/".join(shared)


def recent_window(jobs: Sequence[Mapping[str, Any]], now: float) -> tuple[float, float] | None:
    """A range that shows the recent jobs' runs whole: from a little before the first of them
    started (or was submitted) to now, at least 10 minutes so a short run is not a wall."""
    starts = [j.get("started") if is_number(j.get("started")) else j.get("submitted") for j in jobs]
    starts = [t for t in starts if is_number(t)]
    if not starts:
        return None
    span = max(600.0, (now - min(starts)) * 1.1)
    return now - span, now


def fine_step(span: float, points: int = 3600) -> float:
    """The finest whole-second step giving at most ``points`` steps: at 1 s (an hour) the
    averages per step are the metering's exact amounts, but for a second at a change."""
    return float(max(1, math.ceil(span / points)))


def plan_options(tree: Mapping[str, Any]) -> list[str]:
    """Plan paths from ``GET /plans`` for a picker (user leaves included, sorted)."""
    return sorted(p["path"] for p in tree.get("plans", []) if isinstance(p, Mapping))
