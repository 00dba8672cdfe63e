"""Tornado handlers of the plan admin page under ``<prefix>admin``.

Browser pages behind HubOAuth (``HubOAuthenticated`` + ``@web.authenticated``): a visitor who is
not logged in goes through the hub's login; a logged-in user who is not a plan admin (hub admin or
``custom:wmla:admin``) gets 403. Forms post back to ``admin/plans`` with the ``_xsrf`` field and
are carried out here, server-side, with the same parsing (``handlers.parse_plan``), the same core
validation (``Scheduler.change_plans`` on a copy of the tree) and the same messages as the REST
API; a refused form is shown again with the message next to it and nothing written. Success
redirects (post/redirect/get) so a reload never posts twice.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
from tornado import web

from extension.scheduler import PlanError, QuantityError
from extension.scheduler.plans import ROOT
from extension.storage.limits import LimitError
from extension.storage.warning import quota_warning
from extension.userfs.files import off_loop
from extension.webapi import ADMIN_SCOPE, APIError, BaseHandler, Caller, Throttled

from ..handlers import parse_plan
from ..scheduling import Scheduler
from ..shares import shares_json
from . import views
from .preview import Previews
from .queues import queue_tables

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"
DRAIN_TIMEOUT = 600.0  # seconds a drained plan waits for its jobs to stop before giving up

_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(TEMPLATES)),
    autoescape=jinja2.select_autoescape(["html"]),
    undefined=jinja2.StrictUndefined,
)


def plotly_dir() -> Path:
    """The installed plotly package's ``package_data`` (plotly.min.js): never a CDN."""
    import plotly

    return Path(plotly.__file__).resolve().parent / "package_data"


class FormError(Exception):
    """A refused form: the status, the message, and which form it belongs to."""

    def __init__(self, status: int, message: str, form: str, extra: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.form, self.extra = status, message, form, extra or {}


class AdminBase(BaseHandler):
    @property
    def prefix(self) -> str:
        return self.settings["wmla_prefix"]

    def set_default_headers(self) -> None:
        self.set_header("Cache-Control", "no-store")
        # the page loads its own scripts and styles only (plotly is served from here)
        self.set_header(
            "Content-Security-Policy",
            "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
            "img-src 'self' data:; frame-ancestors 'self'",
        )
        self.set_header("X-Content-Type-Options", "nosniff")

    def check_xsrf_cookie(self) -> None:
        # every form must carry _xsrf, whatever the hub's check would skip (e.g. a token)
        if not (self.get_body_argument("_xsrf", None) or self.request.headers.get("X-XSRFToken")):
            raise web.HTTPError(403, "the form has no _xsrf field; reload the page and retry")
        super().check_xsrf_cookie()

    async def prepare(self) -> None:
        await super().prepare()  # who asks, and their request rate
        if self.request.method not in ("GET", "HEAD"):  # the pages' forms (plans, storage)
            self.check_xsrf_cookie()

    def admin(self) -> Caller:
        """The caller if a plan admin; 403 (an HTML page saying why) for everyone else."""
        model = self.current_user
        scopes = model.get("scopes") or []
        if not (
            model.get("admin")
            or any(s == ADMIN_SCOPE or s.startswith(ADMIN_SCOPE + "!") for s in scopes)
        ):
            raise web.HTTPError(
                403,
                f"only plan admins may use this page; {model['name']} needs the {ADMIN_SCOPE} "
                f"scope (or hub admin)",
            )
        return Caller(model["name"], frozenset(model.get("groups") or ()), True)

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = ""
        if isinstance(exc, Throttled):
            status_code = exc.status
            self.set_status(status_code)
            self.set_header("Retry-After", str(exc.retry_seconds))
            message = str(exc)
        elif isinstance(exc, web.HTTPError):
            message = exc.log_message or exc.reason or ""
        if not message:
            message = self._reason if status_code < 500 else "internal error; see the service log"
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(
            _env.get_template("error.html").render(
                prefix=self.prefix, status=status_code, message=message, page="error",
                user=None,
            )
        )  # fmt: skip

    def render_page(self, name: str, status: int = 200, **ns: Any) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "text/html; charset=utf-8")
        ns.setdefault("user", self.current_user["name"])
        ns.setdefault("degraded", self.sched.last_error)
        self.finish(
            _env.get_template(name).render(
                prefix=self.prefix,
                xsrf=self.xsrf_token.decode("ascii"),
                hub_home=self.hub_auth.hub_prefix + "home",
                **ns,
            )
        )


class HomePage(AdminBase):
    """``GET /services/wmla/``: the signed-in user's latest jobs, their folder and its quota,
    the plans they may use, and the API's links (a page, not raw JSON)."""

    @web.authenticated
    async def get(self) -> None:
        model = self.current_user
        caller = Caller(model["name"], frozenset(model.get("groups") or ()), False)
        rows = await self.sched.db.read(self.sched.store.jobs, user=caller.name, limit=20)
        service = self.settings["wmla_service"]
        storage = getattr(service, "storage", None)
        report = await off_loop(storage.report, caller.name) if storage is not None else None
        row = report.to_dict(storage.clock()) if report is not None else {}
        self.render_page(
            "home.html",
            page="home",
            jobs=[views.home_job(r) for r in rows],
            folder=str(service.user_folder(caller.name)),
            quota=views.quota_line(row),
            warning=quota_warning(row) if row else None,
            plans=self.sched.usable_plans(caller),
            is_admin=bool(model.get("admin")) or ADMIN_SCOPE in (model.get("scopes") or []),
        )


class PlansPage(AdminBase):
    """``GET admin``: the tree, the create form, and (``?edit=<path>``) the edit panel."""

    @web.authenticated
    def get(self) -> None:
        self.admin()
        edit = self.get_argument("edit", "")
        values = None
        if edit and edit in self.sched.plans:
            values = views.form_values(self.sched, edit)
        self.render_plans(
            edit_values=values,
            done=self.get_argument("done", ""),
            missing=edit if edit and values is None else "",
        )

    def render_plans(self, status: int = 200, **ns: Any) -> None:
        sched = self.sched
        ns.setdefault("edit_values", None)
        ns.setdefault("create_values", {"parent": "", "share": "1"})
        ns.setdefault("error", None)
        ns.setdefault("preview", None)
        ns.setdefault("done", "")
        ns.setdefault("missing", "")
        ns.setdefault("live", [])
        draining = self.settings.setdefault("wmla_admin_draining", {})
        churn = getattr(self.settings.get("wmla_meter"), "churn", None)
        self.render_page(
            "plans.html",
            status,
            page="plans",
            rows=views.plan_rows(sched, churn),
            churn_total=views.churn_cells(churn, ROOT),
            queues=queue_tables(sched),
            top=views.root_bar(sched),
            parents=[ROOT] + [p.path for p in sched.plans if not p.user_leaf],
            draining=dict(draining),
            **ns,
        )


class PlanFormHandler(PlansPage):
    """``POST admin/plans``: one form action (create, update, move, delete, drain), or its
    preview (``preview=1``): the deserved shares before and after, nothing written."""

    @web.authenticated
    async def post(self) -> None:
        caller = self.admin()
        form = {k: self.get_body_argument(k, "") for k in self.request.body_arguments}
        action = form.get("action", "")
        if action not in (*views.ACTIONS, "drain"):
            raise web.HTTPError(400, f"unknown action {action!r}")
        want_preview = bool(form.get("preview"))
        try:
            if want_preview:
                await self._preview(action, form)
                return
            done, edit = await self._apply(caller, action, form)
        except FormError as err:
            self._refused(err, form)
            return
        query = {"done": done}
        if edit:
            query["edit"] = edit
        self.redirect(f"{self.prefix}admin?{urlencode(query)}", status=303)

    # -- the actions ------------------------------------------------------------------------
    def _records(self, action: str, form: dict) -> tuple[list, bool, list[str]]:
        """(records, create, delete) of the form, validated like the REST API's body."""
        sched = self.sched
        try:
            if action == "create":
                parent = (form.get("parent") or ROOT).strip() or ROOT
                name = (form.get("name") or "").strip()
                path = (parent.rstrip("/") if parent != ROOT else "") + "/" + name
                if not name:
                    raise APIError(400, "a name is required, e.g. dev-team")
                body = views.plan_body({**form, "path": path}, with_path=True)
                record = parse_plan(body, None, None)
                if record.path in sched.plans:
                    raise FormError(  # the page's words, not the API's (PATCH)
                        409,
                        f"plan {record.path} already exists; change it with its edit link in "
                        "the table above",
                        action,
                    )
                return [record], True, []
            path = form.get("path", "")
            if path not in sched.plans:
                raise FormError(404, f"there is no plan {path!r}", action)
            old = sched.record(path)
            if action == "update":
                body = views.plan_body(form, with_path=False)
                if old.user_leaf:
                    body.pop("members")  # a user leaf has no members of its own
                record = parse_plan(body, path, old)
                record.user_leaf = old.user_leaf
                return [record], False, []
            if action == "move":
                self._refuse_live(path, "move")
                records, delete = views.move_plan(sched, path, form.get("parent", ""))
                return records, True, delete
            # delete: the plan's own user leaves go with it, as with the API's DELETE
            leaves = [p.path for p in sched.plans.children(path) if p.user_leaf]
            return [], False, [*leaves, path]
        except APIError as err:
            raise FormError(err.status_code, err.message, action) from None
        except (PlanError, QuantityError) as err:
            raise FormError(400, str(err), action) from None

    def _refuse_live(self, path: str, what: str) -> None:
        live = self.sched.live_jobs_under(path)
        if live:
            verb = "delete" if what == "delete" else "move"
            raise FormError(
                409,
                f"cannot {verb} {path}: {len(live)} pending or running job(s) are charged to "
                f"it ({', '.join(sorted(j.id for j in live)[:5])}); cancel them first",
                what,
                {"live": self._live_rows(path)},
            )

    def _live_rows(self, path: str) -> list[dict]:
        return [
            {"id": j.id, "user": j.user, "plan": j.plan, "state": j.state.value,
             "workers": len(j.placement)}
            for j in sorted(self.sched.live_jobs_under(path), key=lambda j: j.id)
        ]  # fmt: skip

    async def _apply(self, caller: Caller, action: str, form: dict) -> tuple[str, str]:
        sched = self.sched
        if action == "drain":
            return await self._drain(caller, form.get("path", ""))
        if action == "delete":
            path = form.get("path", "")
            if path in sched.plans:
                self._refuse_live(path, "delete")
        records, create, delete = self._records(action, form)
        try:
            # the same call the REST handlers make: validated on a copy, then stored
            await sched.change_plans(records, create=create, delete=delete)
        except (PlanError, QuantityError) as err:
            raise FormError(400, str(err), action) from None
        if action == "create":
            return f"created {records[0].path}", records[0].path
        if action == "update":
            return f"saved {records[0].path}", records[0].path
        if action == "move":
            return f"moved {form['path']} to {records[0].path}", records[0].path
        return f"deleted {delete[-1]}", ""

    async def _drain(self, caller: Caller, path: str) -> tuple[str, str]:
        """Cancel every live job under the plan, then delete it once they have ended."""
        sched = self.sched
        if path not in sched.plans:
            raise FormError(404, f"there is no plan {path!r}", "delete")
        # what the API would refuse anyway (child plans) is refused before any job is touched
        real_children = [p.path for p in sched.plans.children(path) if not p.user_leaf]
        if real_children:
            raise FormError(
                400,
                f"cannot delete {path}: it has child plans ({', '.join(real_children)}); "
                "delete them first",
                "delete",
            )
        for job in sorted(sched.live_jobs_under(path), key=lambda j: j.id):
            try:
                await sched.cancel(caller, job.id)
            except Exception:  # it ended meanwhile: nothing to cancel
                pass
        draining = self.settings.setdefault("wmla_admin_draining", {})
        if not sched.live_jobs_under(path):
            leaves = [p.path for p in sched.plans.children(path) if p.user_leaf]
            await sched.change_plans([], create=False, delete=[*leaves, path])
            return f"drained and deleted {path}", ""
        if path not in draining:
            draining[path] = time.time()
            task = asyncio.ensure_future(_delete_when_drained(sched, path, draining))
            self.settings.setdefault("wmla_admin_tasks", set()).add(task)
            task.add_done_callback(self.settings["wmla_admin_tasks"].discard)
        n = len(sched.live_jobs_under(path))
        return f"draining {path}: {n} job(s) stopping; the plan is deleted when they end", ""

    async def _preview(self, action: str, form: dict) -> None:
        if action == "drain":
            action = "delete"
        records, create, delete = self._records(action, form)
        try:
            previews = self.settings.setdefault("wmla_previews", Previews())
            rows = await previews.rows(self.sched, records, create, delete, self.sched.clock())
        except (PlanError, QuantityError) as err:
            raise FormError(400, str(err), action) from None
        self._show(200, form, action, preview=rows)

    def _refused(self, err: FormError, form: dict) -> None:
        self._show(err.status, form, err.form, error={"form": err.form, "message": err.message},
                   **err.extra)  # fmt: skip

    def _show(self, status: int, form: dict, action: str, **ns: Any) -> None:
        """The page again with the form as it was sent (and an error or preview next to it)."""
        edit_values = None
        path = form.get("path", "")
        if action in ("update", "move", "delete", "drain") and path in self.sched.plans:
            edit_values = {**views.form_values(self.sched, path), **form}
        create_values = form if action == "create" else {"parent": "", "share": "1"}
        self.render_plans(
            status, edit_values=edit_values, create_values=create_values, action=action, **ns
        )


async def _delete_when_drained(sched: Scheduler, path: str, draining: dict) -> None:
    """Delete ``path`` once no live job is charged to it (a drained plan's jobs stop in their
    grace period); give up after DRAIN_TIMEOUT, leaving the plan (and the page says so)."""
    deadline = time.monotonic() + DRAIN_TIMEOUT
    try:
        while time.monotonic() < deadline:
            if path not in sched.plans:
                return
            if not sched.live_jobs_under(path):
                leaves = [p.path for p in sched.plans.children(path) if p.user_leaf]
                try:
                    await sched.change_plans([], create=False, delete=[*leaves, path])
                except PlanError as err:  # a child plan appeared meanwhile
                    sched.log.warning("drained %s but cannot delete it: %s", path, err)
                return
            await asyncio.sleep(0.5)
        sched.log.warning("drain of %s: jobs still live after %.0fs", path, DRAIN_TIMEOUT)
    finally:
        draining.pop(path, None)


class InstancePage(AdminBase):
    """``GET admin/instance``: capacity, quota, limit-range defaults, nodes and free devices."""

    @web.authenticated
    async def get(self) -> None:
        self.admin()
        service = self.settings["wmla_service"]
        storage = getattr(service, "storage", None)  # None: a service not started (tests)
        reports = await off_loop(storage.reports) if storage is not None else []
        self.render_page(
            "instance.html",
            page="instance",
            inst=views.instance_view(self.sched, service.limit_range_obj.to_dict()),
            backend=service.backend_class,
            storage=storage,
            quotas=[views.quota_row(r, storage.clock()) for r in reports],
            plan_limits=service.plan_limits.rows() if storage is not None else [],
            plans=[p.path for p in self.sched.plans if not p.user_leaf],
            done=self.get_argument("done", ""),
        )


class StorageFormHandler(AdminBase):
    """``POST admin/storage``: set (or, with ``remove``, drop) a plan's storage limits, as
    ``PUT api/v1/storage/plans/<path>``; then back to the Instance page, which says what
    happened (or, refused, why: nothing is changed then)."""

    @web.authenticated
    async def post(self) -> None:
        self.admin()
        form = {k: self.get_body_argument(k, "").strip() for k in self.request.body_arguments}
        plan = form.get("plan", "")
        plans = self.sched.plans
        spec = None if form.get("remove") else views.storage_spec(form)
        if plan not in plans or plans.get(plan).user_leaf:
            done = f"refused: {plan!r} is not a plan (a user leaf takes its plan's limits)"
        else:
            try:
                await self.settings["wmla_service"].plan_limits.put(plan, spec)
                done = f"{plan}: storage limits {'removed' if spec is None else 'set'}"
            except LimitError as err:
                done = f"refused: {err}"
        self.redirect(f"{self.prefix}admin/instance?{urlencode({'done': done})}", status=303)


class UsagePage(AdminBase):
    """``GET admin/usage?plan=``: requested vs used GPU and CPU over time, drawn with plotly.js
    in the browser from the metering API (``api/v1/usage``) or, when metering is not loaded,
    from the plans API's current figures."""

    @web.authenticated
    def get(self) -> None:
        self.admin()
        plan = self.get_argument("plan", "") or ROOT
        if plan != ROOT and plan not in self.sched.plans:
            raise web.HTTPError(404, f"there is no plan {plan!r}")
        window = self.get_argument("window", "1h")
        if window not in ("1h", "6h", "1d", "7d"):
            window = "1h"
        self.render_page(
            "usage.html",
            page="usage",
            plan=plan,
            window=window,
            plans=[ROOT] + [p.path for p in self.sched.plans if not p.user_leaf],
            metering="wmla_meter" in self.settings,
        )


class SharesPage(AdminBase):
    """``GET admin/shares?plan=``: the children of a plan with their fair-share rows (as ``GET
    api/v1/shares``) and, drawn with plotly.js from ``api/v1/shares/history``, each child's
    factor and decayed usage over about one half-life."""

    @web.authenticated
    def get(self) -> None:
        self.admin()
        sched = self.sched
        plan = self.get_argument("plan", "") or ROOT
        if plan != ROOT and plan not in sched.plans:
            raise web.HTTPError(404, f"there is no plan {plan!r}")
        answer = shares_json(sched, None, sched.clock(), plan)
        parents = [ROOT] + [p.path for p in sched.plans if sched.plans.children(p.path)]
        self.render_page(
            "shares.html",
            page="shares",
            plan=plan,
            answer=answer,
            rows=[r for r in answer["plans"] if r["parent"] == plan],
            plans=parents,
            parents=set(parents),
        )


def admin_routes(prefix: str) -> list[tuple]:
    """The page's routes, for the service's route table (``app.py``)."""
    admin = prefix + "admin"
    return [
        (admin + r"/?", PlansPage),
        (admin + r"/plans", PlanFormHandler),
        (admin + r"/instance", InstancePage),
        (admin + r"/storage", StorageFormHandler),
        (admin + r"/usage", UsagePage),
        (admin + r"/shares", SharesPage),
        (admin + r"/static/plotly/(plotly\.min\.js)", web.StaticFileHandler,
         {"path": str(plotly_dir())}),
        (admin + r"/static/(admin\.(?:css|js)|shares\.js|charts\.js)", web.StaticFileHandler,
         {"path": str(STATIC)}),
    ]  # fmt: skip
