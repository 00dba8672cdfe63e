"""Runtime limits: which limit a job gets from its plan's path, which plan settings are
consistent, and what the service says when it stops a job at its limit (docs/runtime.md
"Runtime limits").

Pure functions over the plans' settings, a mapping ``path -> (runtime_default, runtime_max)``
(seconds or None) that the Scheduler keeps in a ``Limits`` next to the plan tree; each live job's
limit is on its record (live.py; the core knows nothing of runtimes; changes.py stops the jobs at
their deadline).
A job's path is its user leaf and every plan above it up to the root:

- its **default** is the nearest ``runtime_default`` from the leaf up, capped at the maximum;
- its **maximum** is the smallest ``runtime_max`` on the path (each plan admin's ceiling holds
  for everything under their plan, so a child can narrow it, never widen it).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from extension.durations import DurationError, format_duration, parse_optional_duration
from extension.scheduler import PlanError
from extension.scheduler.plans import ROOT, parent_of

from .submission import SubmissionError

PlanRuntime = tuple[float | None, float | None]  # (runtime_default, runtime_max), seconds
NONE: PlanRuntime = (None, None)
FIELDS = ("runtime_default", "runtime_max")


class Limits:
    """What the Scheduler keeps of runtime limits besides each live job's (live.py): each plan's
    (default, max), and whether notebook jobs get limits
    (``c.WmlaService.notebook_runtime_limit``)."""

    def __init__(self, notebooks: bool = False) -> None:
        self.notebooks = notebooks
        self.plans: dict[str, PlanRuntime] = {}

    def load(self, records: Iterable[Any]) -> None:
        """The plans' settings from their store records (``PlanRecord``)."""
        self.plans = {
            r.path: (r.runtime_default, r.runtime_max)
            for r in records
            if r.runtime_default is not None or r.runtime_max is not None
        }


@dataclass(frozen=True)
class Effective:
    """The default and maximum in force at a plan, and the plans they come from."""

    default: float | None = None
    default_from: str | None = None
    maximum: float | None = None
    maximum_from: str | None = None

    def to_dict(self) -> dict:
        return {
            "default": self.default,
            "default_from": self.default_from,
            "max": self.maximum,
            "max_from": self.maximum_from,
        }


def _path(path: str) -> Iterator[str]:
    """``path`` and every plan above it, nearest first (the root is no plan: no setting)."""
    while path and path != ROOT:
        yield path
        path = parent_of(path)


def _maximum(runtimes: Mapping[str, PlanRuntime], path: str) -> tuple[float | None, str | None]:
    """The smallest runtime_max on ``path``'s way to the root, and the plan that sets it."""
    maximum = maximum_from = None
    for plan in _path(path):
        own = runtimes.get(plan, NONE)[1]
        if own is not None and (maximum is None or own < maximum):
            maximum, maximum_from = own, plan
    return maximum, maximum_from


def effective(runtimes: Mapping[str, PlanRuntime], path: str) -> Effective:
    """The nearest default and the smallest maximum on ``path``'s way to the root; the default
    is capped at that maximum (a default inherited from above never exceeds a ceiling set
    below it, so a job that asks for nothing is never refused)."""
    default = default_from = None
    for plan in _path(path):
        own = runtimes.get(plan, NONE)[0]
        if own is not None:
            default, default_from = own, plan
            break
    maximum, maximum_from = _maximum(runtimes, path)
    if default is not None and maximum is not None and default > maximum:
        default, default_from = maximum, maximum_from
    return Effective(default, default_from, maximum, maximum_from)


def job_limit(
    runtimes: Mapping[str, PlanRuntime], leaf: str, plan: str, asked: float | None
) -> float | None:
    """The limit a job on ``plan`` (charged to ``leaf``) runs under: what it ``asked`` for, else
    the path's default; None: no limit. Asking for more than the path's maximum is refused
    (SubmissionError: a 400 naming the field, the maximum, the plan it comes from, the fix)."""
    found = effective(runtimes, leaf)
    if asked is None:
        return found.default
    if found.maximum is not None and asked > found.maximum:
        most = format_duration(found.maximum)
        where = found.maximum_from
        via = "" if where == plan else f" (on the path of {plan})"
        raise SubmissionError(
            f"max_runtime {format_duration(asked)} is more than the runtime maximum of {most} "
            f'of plan {where}{via}; ask for at most {most} (e.g. "max_runtime": '
            f'"{most}", or --runtime-limit {most}), or ask a plan admin of {where} to raise '
            "its runtime_max"
        )
    return asked


def check_plans(runtimes: Mapping[str, PlanRuntime]) -> None:
    """Every plan's own default is within the maximum in force at it (its own and those
    above it); PlanError names the plan, both figures and what to change."""
    for plan in sorted(runtimes):
        default, _ = runtimes[plan]
        if default is None:
            continue
        maximum, maximum_from = _maximum(runtimes, plan)
        if maximum is not None and default > maximum:
            most = format_duration(maximum)
            where = "its own runtime_max" if maximum_from == plan else (
                f"the runtime_max of {maximum_from} above it"
            )  # fmt: skip
            raise PlanError(
                f"plan {plan}: runtime_default {format_duration(default)} is more than the "
                f"runtime maximum of {most} in force there ({where}); set runtime_default to "
                f"at most {most}, or raise the maximum"
            )


def plan_fields(body: Mapping[str, Any], old: Any, path: str) -> PlanRuntime:
    """(runtime_default, runtime_max) of a plan body: each as given (seconds, a duration, null
    to clear it), else as the plan had it (``old``, a PlanRecord or None). PlanError (a 400
    on the API and the admin page) names the plan and the field."""
    out = []
    for key in FIELDS:
        if key not in body:
            out.append(getattr(old, key) if old is not None else None)
            continue
        try:
            out.append(parse_optional_duration(body[key], key))
        except DurationError as err:
            raise PlanError(f"{path}: {err}") from None
    return out[0], out[1]


def plan_json(plans: Mapping[str, PlanRuntime], path: str) -> dict:
    """A plan's runtime fields in the API: its own settings (seconds or null) and ``runtime``,
    what a job there gets and the plans it comes from."""
    default, most = plans.get(path, NONE)
    return {
        "runtime_default": default,
        "runtime_max": most,
        "runtime": effective(plans, path).to_dict(),
    }


def job_json(row: Any) -> dict:
    """A job's runtime fields in the API: the limit in force (seconds, null: none) and, while it
    runs, when it is reached."""
    running = row.state == "RUNNING"
    return {
        "max_runtime": row.max_runtime,
        "deadline": deadline(row.started, row.max_runtime) if running else None,
    }


def deadline(started: float | None, max_runtime: float | None) -> float | None:
    """When a job started at ``started`` reaches its limit; None without either."""
    if started is None or max_runtime is None:
        return None
    return started + max_runtime


def timeout_reason(max_runtime: float | None, started: float | None) -> str:
    """``runtime limit of 2h reached (started 12:03:10 UTC)``: the TIMEOUT job's reason."""
    limit = format_duration(max_runtime) if max_runtime is not None else "?"
    if started is None:
        return f"runtime limit of {limit} reached"
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started))
    return f"runtime limit of {limit} reached (started {stamp} UTC)"


# -- the OpenAPI document's fields (openapi.py) -------------------------------------------------
_DURATION = {"oneOf": [{"type": "number", "minimum": 1}, {"type": "string", "example": "2h"}]}
_SECONDS = {"type": "number", "nullable": True}
OPENAPI_PLAN_INPUT = {
    "runtime_default": {
        **_DURATION,
        "nullable": True,
        "description": "the runtime limit of a job here that asks for none: seconds or a "
        "duration ('90m', '2h', '1h30m', '1d'); null: none here (the nearest above holds); at "
        "most the maximum in force here",
    },
    "runtime_max": {
        **_DURATION,
        "nullable": True,
        "description": "the most max_runtime a job here or below may ask for; the smallest "
        "on a plan's path holds; null: none set here",
    },
}
OPENAPI_PLAN = {
    "runtime_default": {**_SECONDS, "description": "seconds: this plan's own (null: none)"},
    "runtime_max": {**_SECONDS, "description": "seconds: this plan's own (null: none)"},
    "runtime": {
        "type": "object",
        "description": "what a job here gets: the nearest default and the smallest maximum "
        "on the path (seconds, null: none), and the plans they come from",
        "properties": {
            "default": _SECONDS,
            "default_from": {"type": "string", "nullable": True},
            "max": _SECONDS,
            "max_from": {"type": "string", "nullable": True},
        },
    },
}
OPENAPI_JOB_INPUT = {
    "max_runtime": {
        **_DURATION,
        "nullable": True,
        "description": "stop the job after this long (it ends TIMEOUT): seconds or a "
        "duration ('2h', '1h30m'); null or absent: the plan's default; more than the plan's "
        "maximum is refused (400)",
    },
}
OPENAPI_JOB = {
    "max_runtime": {**_SECONDS, "description": "the runtime limit in force, seconds (null: none)"},
    "deadline": {
        **_SECONDS,
        "description": "while RUNNING: started + max_runtime (seconds since the epoch); else null",
    },
}
