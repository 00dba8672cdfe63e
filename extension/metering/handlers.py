"""REST handlers: ``<prefix>api/v1/usage``, ``<prefix>api/v1/churn`` and ``<prefix>metrics``
(Prometheus exposition).

They reuse the service's ``APIHandler`` (hub token auth, JSON errors). ``usage`` answers with
series and totals per child of a plan; a user who is not a plan admin sees only their own user
leaves (``user`` defaults to them and may not name anyone else); plan admins see everything.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timezone
from typing import Any

from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from extension.scheduler.names import is_user_name
from extension.webapi import ADMIN_SCOPE, APIError, APIHandler

from .accounting import ROOT
from .meter import Metering
from .usage import usage, usage_csv

PARAMS = {"plan", "user", "start", "end", "step", "format"}
PLAN = re.compile(r"(/[A-Za-z0-9._@-]{1,255}){1,32}/?\Z")
DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\Z")
UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, None: 1}
NICE_STEPS = (60, 300, 900, 3600, 6 * 3600, 86400, 7 * 86400)
DEFAULT_RANGE = 86400.0
MAX_RANGE = 400 * 86400.0


def parse_duration(value: str, name: str) -> float:
    match = DURATION.fullmatch(value.strip())
    if not match:
        raise APIError(
            400, f"{name} must be a duration such as 300, 90s, 5m, 1h or 1d, got {value!r}"
        )
    seconds = float(match.group(1)) * UNITS[match.group(2)]
    if not seconds > 0:
        raise APIError(400, f"{name} must be more than 0 seconds, got {value!r}")
    return seconds


def parse_time(value: str, name: str, now: float) -> float:
    """Seconds since the epoch, ISO 8601 (``2026-11-01T00:00:00Z``), ``now`` or ``now-7d``."""
    text = value.strip()
    if text == "now":
        return now
    if text.startswith("now-"):
        return now - parse_duration(text[4:], name)
    try:
        seconds = float(text)
        if math.isfinite(seconds):
            return seconds
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise APIError(
            400,
            f"{name} must be seconds since the epoch, ISO 8601 (2026-11-01T00:00:00Z), 'now' or "
            f"'now-7d', got {value!r}",
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


class UsageHandler(APIHandler):
    @property
    def meter(self) -> Metering:
        return self.settings["wmla_meter"]

    def query(self) -> dict[str, Any]:
        """The validated parameters; every problem is a 400 that says how to fix it."""
        args = {k: self.get_query_arguments(k) for k in self.request.query_arguments}
        unknown = sorted(set(args) - PARAMS)
        if unknown:
            raise APIError(
                400,
                f"unknown parameter {unknown[0]!r}; the parameters are {', '.join(sorted(PARAMS))}",
            )
        for key, values in args.items():
            if len(values) > 1:
                raise APIError(400, f"{key} is given {len(values)} times; give it once")
        one = {k: v[0] for k, v in args.items()}
        now = self.meter.clock()
        plan = one.get("plan") or ROOT
        if plan != ROOT:
            if not PLAN.match(plan):
                raise APIError(
                    400, f"plan must be a plan path such as /project1/dev-team, got {plan!r}"
                )
            plan = plan.rstrip("/")
        end = parse_time(one["end"], "end", now) if one.get("end") else now
        start = parse_time(one["start"], "start", now) if one.get("start") else end - DEFAULT_RANGE
        if not start < end:
            raise APIError(400, f"start ({start:.0f}) must be before end ({end:.0f})")
        if end - start > MAX_RANGE:
            raise APIError(400, f"the range may span at most {MAX_RANGE / 86400:.0f} days")
        max_points = self.meter.max_points
        if one.get("step"):
            step = parse_duration(one["step"], "step")
            if step < 1:
                raise APIError(400, f"step must be at least 1 second, got {one['step']!r}")
        else:  # the finest nice step that keeps the answer to a few hundred points
            step = next((s for s in NICE_STEPS if (end - start) / s <= 500), NICE_STEPS[-1])
        points = math.ceil((end - start) / step)
        if points > max_points:
            raise APIError(
                400,
                f"step {step:g}s gives {points} points over this range; the most is {max_points}: "
                f"ask for step >= {math.ceil((end - start) / max_points)}s",
            )
        fmt = one.get("format", "json")
        if fmt not in ("json", "csv"):
            raise APIError(400, f"format must be json or csv, got {fmt!r}")
        user = one.get("user") or None
        if user is not None and not is_user_name(user):
            raise APIError(400, f"user {user!r} is not a hub user name")
        return {
            "plan": plan,
            "start": start,
            "end": end,
            "step": step,
            "now": now,
            "format": fmt,
            "user": user,
        }

    async def get(self) -> None:
        caller = self.caller()
        q = self.query()
        user = q["user"]
        if not caller.admin:
            if user not in (None, caller.name):
                raise APIError(
                    403,
                    f"you may see only your own usage (user={caller.name}); plan admins "
                    f"({ADMIN_SCOPE}) see everyone's",
                )
            user = caller.name
        meter = self.meter
        await meter.refresh_off_loop()
        ledger = meter.ledger
        plan = q["plan"]
        known = plan == ROOT or plan in ledger.nodes
        sched = meter.scheduler
        if not known and sched is not None and plan in sched.plans:
            known = True  # a plan with no jobs yet: zeros
        if not known:
            raise APIError(404, f"there is no plan {plan!r} (and no usage recorded under it)")
        args = (ledger, plan, q["start"], q["end"], q["step"], q["now"], user)
        if q["format"] == "csv":
            self.set_header("Content-Type", "text/csv; charset=utf-8")
            name = f"wmla-usage{plan.replace('/', '_') if plan != ROOT else ''}.csv"
            self.set_header("Content-Disposition", f'attachment; filename="{name}"')
            self.finish(usage_csv(*args))
            return
        self.reply(usage(*args))


class MeasuredHandler(APIHandler):
    """The sampled, measured utilization of one running job (its owner or a plan admin)."""

    async def get(self, job_id: str) -> None:
        caller = self.caller()
        meter: Metering = self.settings["wmla_meter"]
        sched = meter.scheduler
        try:
            await sched.visible_job(caller, job_id)
        except LookupError as err:  # the service's NotFound: no such job of yours
            raise APIError(404, str(err)) from None
        sampler = meter.sampler
        samples = list(sampler.series.get(job_id, ())) if sampler else []
        self.reply(
            {
                "job": job_id,
                "sampling": sampler is not None,
                "interval": meter.sample_interval,
                "gpu_available": bool(sampler and sampler.gpu_available),
                "samples": [
                    {
                        "at": s.at,
                        "cpu_cores": s.cpu_cores,
                        "memory_bytes": s.memory_bytes,
                        "gpu_utilization": s.gpu_utilization,
                        "gpu_memory_bytes": s.gpu_memory_bytes,
                    }
                    for s in samples
                ],
            }
        )


class ChurnHandler(APIHandler):
    """``GET api/v1/churn``: the churn counters per plan (churn.py); plan admins see every plan,
    a user only their own user leaves."""

    async def get(self) -> None:
        caller = self.caller()
        meter: Metering = self.settings["wmla_meter"]
        paths = None
        if not caller.admin:
            await meter.refresh_off_loop()  # the leaves' owners come from the ledger
            owners = meter.ledger.owners
            paths = [p for p in meter.churn.plans if owners.get(p) == caller.name]
        self.reply(meter.churn.answer(paths))


class MetricsHandler(APIHandler):
    async def get(self) -> None:
        meter: Metering = self.settings["wmla_meter"]
        if meter.metrics_require_auth:
            caller = self.caller()
            if not caller.admin:
                raise APIError(
                    403, f"metrics are for plan admins: the token needs the {ADMIN_SCOPE} scope"
                )
        await meter.refresh_off_loop()
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(generate_latest(meter.registry))


def metering_routes(prefix: str) -> list[tuple]:
    """Routes for the service's tornado application (``prefix`` ends with ``/``)."""
    return [
        (prefix + r"api/v1/usage/?", UsageHandler),
        (prefix + r"api/v1/usage/jobs/([^/]+)/?", MeasuredHandler),
        (prefix + r"api/v1/churn/?", ChurnHandler),
        (prefix + r"metrics/?", MetricsHandler),
    ]
