"""The fair-share API (``wmla shares``, the admin page's chart): ``GET api/v1/shares``,
``GET api/v1/shares/history`` and ``POST api/v1/shares/reset``.

``shares`` gives sshare's columns for every plan: its share, its normalized share among its
siblings, its subtree's decayed usage (raw), its part of its siblings' usage (effective) and its
fair-share factor ``2 ** (-U / S)`` (docs/scheduling.md "Deserved share 2"), with the half-life
and the weights in effect. ``history`` gives the sampled usage and factors of a plan's children
over about one half-life (``extension/metering/shares.py``), then this moment's. ``reset``
forgets all usage (plan admins only).

Who sees what is decided as for ``GET /plans`` (docs/security.md "Who sees what in the API"):
everyone sees every plan's row, but of the user leaves a user who is not a plan admin sees only
their own (``hidden_user_leaves`` counts the others); a plan's usage includes its leaves'.
"""

from __future__ import annotations

import re

from extension.durations import format_duration
from extension.metering.shares import ShareSamples, sample_of
from extension.scheduler.plans import ROOT, Plan
from extension.webapi import ADMIN_SCOPE, APIError, APIHandler, Caller

from .scheduling import Scheduler

UNIT = "weighted resource-seconds"
PLAN_ARG = re.compile(r"(/[A-Za-z0-9._@-]{1,255}){1,32}/?\Z")
OFF = (
    "the usage history is off (c.WmlaService.fair_share_half_life is 0): shares follow this "
    'moment\'s demand only, so every usage is 0 and every factor 1; set it (e.g. to "7d") to '
    "weigh each plan's usage over days"
)


def hidden(plan: Plan, viewer: Caller | None) -> bool:
    """Whether ``viewer`` may not see ``plan``'s row: another user's leaf, to a non-admin."""
    return viewer is not None and not viewer.admin and plan.user_leaf and plan.name != viewer.name


def settings_json(sched: Scheduler) -> dict:
    """The knobs in effect, and a sentence that says what they mean (or that history is off)."""
    settings = sched.fair_share.settings
    w = settings.weights
    on = settings.history_on
    unit = "GPU-seconds" if (w.gpu, w.cpu, w.memory) == (1.0, 0.0, 0.0) else UNIT
    message = (
        f"usage decays by half every {format_duration(settings.half_life)}; usage in {unit}; "
        "a factor of 0.5 is a plan that used exactly its share of its siblings' usage, below "
        "0.5 more than its share"
        if on
        else OFF
    )
    return {
        "history": on,
        "half_life": settings.half_life,
        "reset_period": settings.reset_period,
        "weights": {"gpu": w.gpu, "cpu": w.cpu, "memory": w.memory},
        "unit": unit,
        "message": message,
    }


def shares_json(sched: Scheduler, viewer: Caller | None, now: float, under: str = ROOT) -> dict:
    """Every plan's row under ``under`` (itself included) as ``viewer`` may see it (None: all)."""
    standings = sched.fair_share.standings(sched.plans, now)
    rows, hidden_leaves = [], 0
    for plan in sched.plans:  # sorted by path: parents first
        if under != ROOT and plan.path != under and not plan.path.startswith(under + "/"):
            continue
        if hidden(plan, viewer):
            hidden_leaves += 1
            continue
        s = standings.get(plan.path)
        if s is None:
            continue
        rows.append(
            {
                "plan": plan.path,
                "parent": plan.parent,
                "user_leaf": plan.user_leaf,
                "share": s.share,
                "normalized_share": s.normalized_share,
                "raw_usage": s.raw_usage,
                "effective_usage": s.effective_usage,
                "fair_share_factor": s.factor,
                "usage_over_share": s.usage_over_share,
            }
        )
    return {
        **settings_json(sched),
        "at": now,
        "plan": under,
        "plans": rows,
        "hidden_user_leaves": hidden_leaves,
    }


def history_json(
    sched: Scheduler, samples: ShareSamples | None, viewer: Caller, now: float, parent: str
) -> dict:
    """The sampled usage and factors of ``parent``'s children that ``viewer`` may see."""
    kids = [p.path for p in sched.plans.children(parent) if not hidden(p, viewer)]
    on = sched.fair_share.settings.history_on
    series: dict = {"t": [], "plans": [{"plan": p, "raw_usage": [], "fair_share_factor": []}
                                       for p in kids]}  # fmt: skip
    interval = None
    if on and samples is not None:
        current = sample_of(now, sched.fair_share.standings(sched.plans, now), None)
        series = samples.series(kids, current)
        interval = samples.interval(sched.fair_share.settings.half_life)
    return {**settings_json(sched), "at": now, "plan": parent, "interval": interval, **series}


class SharesBase(APIHandler):
    """The ``plan`` argument, checked as the usage API checks its own."""

    def plan_arg(self, caller: Caller) -> str:
        unknown = sorted(set(self.request.query_arguments) - {"plan"})
        if unknown:
            raise APIError(400, f"unknown parameter {unknown[0]!r}; the parameter is plan")
        values = self.get_query_arguments("plan")
        if len(values) > 1:
            raise APIError(400, f"plan is given {len(values)} times; give it once")
        plan = values[0] if values and values[0] else ROOT
        if plan == ROOT:
            return ROOT
        if not PLAN_ARG.match(plan):
            raise APIError(
                400, f"plan must be a plan path such as /project1/dev-team, got {plan!r}"
            )
        plan = plan.rstrip("/")
        if plan not in self.sched.plans or hidden(self.sched.plans.get(plan), caller):
            raise APIError(404, f"there is no plan {plan!r}")
        return plan


class SharesHandler(SharesBase):
    async def get(self) -> None:
        caller = self.caller()
        plan = self.plan_arg(caller)
        self.reply(shares_json(self.sched, caller, self.sched.clock(), plan))


class SharesHistoryHandler(SharesBase):
    async def get(self) -> None:
        caller = self.caller()
        plan = self.plan_arg(caller)
        meter = self.settings.get("wmla_meter")
        samples = getattr(meter, "shares", None)
        self.reply(history_json(self.sched, samples, caller, self.sched.clock(), plan))


class SharesResetHandler(APIHandler):
    async def post(self) -> None:
        caller = self.caller()
        if not caller.admin:
            raise APIError(
                403,
                f"only plan admins may reset the usage history; {caller.name} needs the "
                f"{ADMIN_SCOPE} scope (or hub admin)",
            )
        sched = self.sched
        if not sched.fair_share.settings.history_on:
            raise APIError(409, f"nothing to reset: {OFF}")
        async with sched.lock:  # between cycles: the next one charges from now
            now = sched.clock()
            sched.fair_share.reset(now)
        sched.log.info("wmla: %s reset the usage history (fair share) at %.0f", caller.name, now)
        self.reply(shares_json(sched, caller, now))


def share_routes(prefix: str) -> list[tuple]:
    """The routes for the service's tornado application (``prefix`` ends with ``/``)."""
    api = prefix + "api/v1/shares"
    return [
        (api + r"/?", SharesHandler),
        (api + r"/history/?", SharesHistoryHandler),
        (api + r"/reset/?", SharesResetHandler),
    ]
