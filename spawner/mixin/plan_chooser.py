"""Which plan a notebook is charged to, and the spawn page that lets the user choose: the
profiles (KubeSpawner's ``profile_list`` shape, spawner/profiles.py) and the plans the user may
use."""

from __future__ import annotations

import html
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from extension.clienterrors import WmlaError

from .. import profiles as profile_shapes
from .errors import AdmissionError
from .record import SpawnRecord
from .service_client import ServiceCalls
from .spawn_log import SpawnLog


@dataclass(frozen=True)
class PlanSettings:
    """The spawner's plan traits: ``plan_choice``, ``wmla_plan``, ``user_plans``,
    ``group_plans``, ``default_plan``, the deprecated ``profiles``, the class the messages
    name (``c.<class>.user_plans``) and ``plan_descriptions`` (the spawn page's line beside
    each plan)."""

    plan_choice: bool
    wmla_plan: str
    user_plans: Mapping[str, str]
    group_plans: Mapping[str, str]
    default_plan: str
    profiles: list[dict] = field(default_factory=list)
    config_class: str = "WmlaLocalSpawner"
    descriptions: Mapping[str, str] = field(default_factory=dict)


class PlanChooser:
    """The plan of one user's server: from the picked profile, the spawn page's pick (checked
    with the service) or the configuration's mapping; and the spawn page's form."""

    def __init__(
        self,
        settings: PlanSettings,
        user: Any,
        user_options: Mapping[str, Any] | None,
        service: ServiceCalls,
        log: SpawnLog,
    ) -> None:
        self.settings = settings
        self.user = user
        self.user_options = user_options or {}
        self.service = service
        self.log = log

    # -- profiles (KubeSpawner's profile_list shape, spawner/profiles.py) ------------------------
    def profile_list(self, source: Any) -> list[dict]:
        """The initialized profile list from ``profile_list``'s value (a callable's already
        called), else the deprecated ``profiles``; checked, with slugs and defaults filled in
        as KubeSpawner does."""
        if not source and self.settings.profiles:
            source = profile_shapes.from_legacy(self.settings.profiles)
        try:
            where = f"c.{self.settings.config_class}.profile_list"
            return profile_shapes.initialize(source, where)
        except profile_shapes.ProfileError as err:
            raise AdmissionError(str(err)) from None

    def pick_profile(
        self, spawn: SpawnRecord, profiles: list[dict]
    ) -> tuple[dict | None, list[dict]]:
        """(the profile in user_options or the default, its overrides in order), for an
        initialized list; the spawn remembers the plan it forces. A pick not in the list is
        refused."""
        spawn.profile_plan = ""
        if not profiles:
            return None, []
        try:
            profile, overrides = profile_shapes.select(profiles, self.user_options)
        except profile_shapes.ProfileError as err:
            raise AdmissionError(str(err)) from None
        spawn.profile_plan = profile_shapes.plan_of(overrides)
        return profile, overrides

    # -- plan mapping ----------------------------------------------------------------------------
    def plan_path(self, spawn: SpawnRecord) -> str:
        """The plan: the picked profile's ``wmla_plan`` > the plan picked on the spawn page >
        wmla_plan > user_plans > group_plans > default (a picked plan is checked by
        check_picked_plan)."""
        picked = self.user_options.get("plan") if self.settings.plan_choice else None
        plan = spawn.profile_plan or picked or self.mapped_plan()
        if not isinstance(plan, str) or not plan.startswith("/") or plan.endswith("/"):
            raise AdmissionError(
                f"the plan {plan!r} for {self.user.name} is not a plan path such as "
                f"/project1/dev-team; fix c.{self.settings.config_class}.user_plans / "
                "group_plans / the profile's wmla_plan"
            )
        return plan

    def mapped_plan(self) -> str:
        """The plan the configuration maps the user to: wmla_plan > user_plans > group_plans >
        default_plan."""
        settings = self.settings
        groups = {g.name for g in getattr(self.user, "groups", []) or []}
        plan = settings.wmla_plan or settings.user_plans.get(self.user.name)
        if not plan:
            plan = next((p for g, p in settings.group_plans.items() if g in groups), None)
        return plan or settings.default_plan

    async def usable_plans(self) -> list[str]:
        """The plans the service lets this user submit to (its membership rules)."""
        groups = ",".join(sorted(g.name for g in getattr(self.user, "groups", []) or []))
        query = urlencode({"user": self.user.name, "groups": groups})
        me = await self.service.call("GET", f"?{query}", what="the plans this user may use")
        return [str(p) for p in me.get("plans", [])]

    async def check_picked_plan(self, spawn: SpawnRecord) -> None:
        """A plan picked on the spawn page (or sent as user_options) must be one the user may
        use: the spawner submits as a plan admin, so this is where membership is enforced."""
        picked = self.user_options.get("plan")
        if not self.settings.plan_choice or picked is None or spawn.profile_plan:
            return
        usable = await self.usable_plans()
        if picked not in usable:
            raise AdmissionError(
                f"{self.user.name} may not start a server in plan {picked!r}; pick one of "
                f"{', '.join(usable) or 'none (ask an admin to add you to a plan)'}"
            )

    # -- the spawn page ------------------------------------------------------------------------
    async def spawn_form(self, profiles: list[dict]) -> str:
        """The spawn page: the profiles, and the plans the user may use when more than one
        (a service that cannot be asked leaves the plan choice out, never the spawn)."""
        plans: list[str] = []
        usage: dict[str, str] = {}
        if self.settings.plan_choice:
            try:
                plans = await self.usable_plans()
            except (WmlaError, AdmissionError) as err:
                self.log.warning("no plan choice on the spawn page: %s", err)
        if len(plans) > 1:
            usage = await self.plans_in_use()
        return self.options_form(plans, profiles, usage)

    async def plans_in_use(self) -> dict[str, str]:
        """``plan path -> "1 of 2 GPUs in use, 3 jobs waiting"`` from the service's plan tree
        (empty when it cannot be asked: the choice is shown without it)."""
        try:
            tree = await self.service.call("GET", "plans", what="the plans' figures")
        except (WmlaError, AdmissionError) as err:
            self.log.warning("the spawn page's plans without their figures: %s", err)
            return {}
        nodes = tree.get("plans") if isinstance(tree, Mapping) else None
        return {
            n["path"]: usage_line(n)
            for n in nodes or []
            if isinstance(n, Mapping) and isinstance(n.get("path"), str)
        }

    def options_form(
        self,
        plans: list[str] | None,
        profiles: list[dict] | None,
        usage: Mapping[str, str] | None = None,
    ) -> str:
        """The form's HTML: the profiles as KubeSpawner's form names them (a radio group
        ``profile``, a select ``profile-option-<slug>--<option>`` per option), and a radio
        group of ``plans`` when there are two or more (the mapped plan checked), each with its
        configured description and ``usage`` line beside it."""
        form = profile_shapes.form_html(profiles or [], self.user_options)
        if plans and len(plans) > 1:
            mapped = self.mapped_plan()
            chosen = mapped if mapped in plans else plans[0]
            rows = [
                f'<label class="form-check"><input class="form-check-input" type="radio" '
                f'name="plan" value="{html.escape(p, quote=True)}"'
                f"{' checked' if p == chosen else ''}> {html.escape(p)}"
                f"{self._description(p, (usage or {}).get(p, ''))}</label>"
                for p in plans
            ]
            form += "<fieldset><legend>Plan</legend>" + "\n".join(rows) + "</fieldset>"
        return form

    def _description(self, plan: str, usage: str) -> str:
        """The configured line beside ``plan`` and what it holds now, marked up as a
        profile's description is."""
        text = " — ".join(t for t in (self.settings.descriptions.get(plan, ""), usage) if t)
        return f' <span class="text-muted">{html.escape(text)}</span>' if text else ""

    @staticmethod
    def options_from_form(formdata: Mapping[str, list]) -> dict:
        """KubeSpawner's user_options from the form (``profile`` and its options) and the
        picked ``plan``."""
        return profile_shapes.options_from_form(formdata, extra=("plan",))


def usage_line(node: Mapping[str, Any]) -> str:
    """``1 of 2 GPUs in use, 3 jobs waiting`` (``1 GPU in use`` without a GPU limit) from a
    plan of the service's tree (``GET plans``: ``allocated``, ``limit``, ``pending``); a field
    missing or of the wrong type reads as none."""
    used = _number(_field(node, "allocated").get("gpu")) or 0.0
    limit = _number(_field(node, "limit").get("gpu"))  # absent: no GPU limit
    if limit is not None:
        text = f"{used:g} of {limit:g} GPU{'' if limit == 1 else 's'} in use"
    else:
        text = f"{used:g} GPU{'' if used == 1 else 's'} in use"
    waiting = node.get("pending")
    if isinstance(waiting, int) and not isinstance(waiting, bool) and waiting > 0:
        text += f", {waiting} job{'' if waiting == 1 else 's'} waiting"
    return text


def _field(node: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = node.get(key)
    return value if isinstance(value, Mapping) else {}


def _number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok else None
