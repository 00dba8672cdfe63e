"""Which plan a notebook is charged to, and the spawn page that lets the user choose: the
profiles (KubeSpawner's ``profile_list`` shape, spawner/profiles.py) and the plans the user may
use."""

from __future__ import annotations

import html
import inspect
import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from .. import profiles as profile_shapes
from .common import AdmissionError


class PlanChoice:
    """Part of :class:`~spawner.mixin.WmlaSpawnerMixin`. Reads the traits ``profiles``,
    ``plan_choice``, ``wmla_plan``, ``user_plans``, ``group_plans`` and ``default_plan``; the
    base spawner's ``user``, ``user_options`` and ``profile_list`` (KubeSpawner's, or the local
    spawner's own); writes ``_wmla_profile_plan``. Asks the service through ``_wmla_call``."""

    profiles: list[dict]
    plan_choice: bool
    wmla_plan: str
    user_plans: dict[str, str]
    group_plans: dict[str, str]
    default_plan: str
    _wmla_profile_plan: str
    user: Any
    user_options: dict
    log: logging.Logger
    _log_name: str

    # -- profiles (KubeSpawner's profile_list shape, spawner/profiles.py) ------------------------
    async def wmla_profile_list(self) -> list[dict]:
        """The initialized profile list: ``profile_list`` (a list, a dict, or a callable of the
        spawner, maybe async), else the deprecated ``profiles``; checked, with slugs and
        defaults filled in as KubeSpawner does."""
        source = getattr(self, "profile_list", None)
        if callable(source):
            source = source(self)
            if inspect.isawaitable(source):
                source = await source
        if not source and self.profiles:
            source = profile_shapes.from_legacy(self.profiles)
        try:
            return profile_shapes.initialize(source, f"c.{type(self).__name__}.profile_list")
        except profile_shapes.ProfileError as err:
            raise AdmissionError(str(err)) from None

    def wmla_pick_profile(self, profiles: list[dict]) -> tuple[dict | None, list[dict]]:
        """(the profile in user_options or the default, its overrides in order), for an
        initialized list; remembers the plan it forces. A pick not in the list is refused."""
        self._wmla_profile_plan = ""
        if not profiles:
            return None, []
        try:
            profile, overrides = profile_shapes.select(profiles, self.user_options)
        except profile_shapes.ProfileError as err:
            raise AdmissionError(str(err)) from None
        self._wmla_profile_plan = profile_shapes.plan_of(overrides)
        return profile, overrides

    # -- plan mapping ----------------------------------------------------------------------------
    def wmla_plan_path(self) -> str:
        """The plan: the picked profile's ``wmla_plan`` > the plan picked on the spawn page >
        wmla_plan > user_plans > group_plans > default (a picked plan is checked by
        wmla_admit)."""
        picked = (self.user_options or {}).get("plan") if self.plan_choice else None
        plan = self._wmla_profile_plan or picked or self.wmla_mapped_plan()
        if not isinstance(plan, str) or not plan.startswith("/") or plan.endswith("/"):
            raise AdmissionError(
                f"the plan {plan!r} for {self.user.name} is not a plan path such as "
                f"/project1/dev-team; fix c.{type(self).__name__}.user_plans / group_plans / "
                "the profile's wmla_plan"
            )
        return plan

    def wmla_mapped_plan(self) -> str:
        """The plan the configuration maps the user to: wmla_plan > user_plans > group_plans >
        default_plan."""
        name = self.user.name
        groups = {g.name for g in getattr(self.user, "groups", []) or []}
        plan = self.wmla_plan or self.user_plans.get(name)
        if not plan:
            plan = next((p for g, p in self.group_plans.items() if g in groups), None)
        return plan or self.default_plan

    async def wmla_usable_plans(self) -> list[str]:
        """The plans the service lets this user submit to (its membership rules)."""
        groups = ",".join(sorted(g.name for g in getattr(self.user, "groups", []) or []))
        query = urlencode({"user": self.user.name, "groups": groups})
        me = await self._wmla_call("GET", f"?{query}", what="the plans this user may use")
        return [str(p) for p in me.get("plans", [])]

    async def _wmla_check_picked_plan(self) -> None:
        """A plan picked on the spawn page (or sent as user_options) must be one the user may
        use: the spawner submits as a plan admin, so this is where membership is enforced."""
        picked = (self.user_options or {}).get("plan")
        if not self.plan_choice or picked is None or self._wmla_profile_plan:
            return
        usable = await self.wmla_usable_plans()
        if picked not in usable:
            raise AdmissionError(
                f"{self.user.name} may not start a server in plan {picked!r}; pick one of "
                f"{', '.join(usable) or 'none (ask an admin to add you to a plan)'}"
            )

    # -- the spawn page ------------------------------------------------------------------------
    async def wmla_spawn_form(self) -> str:
        """The spawn page: the profiles, and the plans the user may use when more than one
        (a service that cannot be asked leaves the plan choice out, never the spawn)."""
        plans: list[str] = []
        if self.plan_choice:
            from extension.client import WmlaError

            try:
                plans = await self.wmla_usable_plans()
            except (WmlaError, AdmissionError) as err:
                self.log.warning("%s: no plan choice on the spawn page: %s", self._log_name, err)
        return self.wmla_options_form(plans, await self.wmla_profile_list())

    def wmla_options_form(
        self, plans: list[str] | None = None, profiles: list[dict] | None = None
    ) -> str:
        """The form's HTML: the profiles as KubeSpawner's form names them (a radio group
        ``profile``, a select ``profile-option-<slug>--<option>`` per option), and a radio
        group of ``plans`` when there are two or more (the mapped plan checked)."""
        form = profile_shapes.form_html(profiles or [], self.user_options)
        if plans and len(plans) > 1:
            mapped = self.wmla_mapped_plan()
            chosen = mapped if mapped in plans else plans[0]
            rows = [
                f'<label class="form-check"><input class="form-check-input" type="radio" '
                f'name="plan" value="{html.escape(p, quote=True)}"'
                f"{' checked' if p == chosen else ''}> {html.escape(p)}</label>"
                for p in plans
            ]
            form += "<fieldset><legend>Plan</legend>" + "\n".join(rows) + "</fieldset>"
        return form

    def wmla_options_from_form(self, formdata: Mapping[str, list]) -> dict:
        """KubeSpawner's user_options from the form (``profile`` and its options) and the
        picked ``plan``."""
        return profile_shapes.options_from_form(formdata, extra=("plan",))
