"""REST handlers under ``<prefix>api/v1/`` (the OpenAPI document in ``openapi.py`` lists them).

API calls authenticate with a hub token (``Authorization: token ...``); browser pages use HubOAuth
cookies. Every error is JSON ``{"error": message, "status": code}``. A user sees and touches only
their own jobs (another user's job answers 404, so its existence is not revealed); plan changes
need the ``custom:wmla:admin`` scope or hub admin.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from typing import Any

from tornado import web

from extension.scheduler import UNLIMITED, JobState, PlanError, QuantityError, Resources
from extension.scheduler.plans import ROOT
from extension.userfs.accounts import AccountError
from extension.userfs.errors import UserFileError
from extension.userfs.files import off_loop
from extension.webapi import APIError, APIHandler, Caller

from . import runtime_limits
from .actions import Forbidden, KeyReused, NotFound
from .cancels import Conflict
from .openapi import openapi_document
from .paging import Cursor, Page, PageError
from .pending_cap import TooManyPending
from .rows import JobRow
from .scheduling import Scheduler
from .store import PlanRecord
from .submission import Rejected, Submission, SubmissionError, parse_submission

PLAN_KEYS = {"path", "share", "limit", "members", "runtime_default", "runtime_max"}
MEMBER = re.compile(r"[A-Za-z0-9._@-]{1,255}\Z")
MAX_MEMBERS = 10_000
IDEMPOTENCY_KEY = re.compile(r"[A-Za-z0-9._:-]{1,128}\Z")


def _errors(fn):
    """Map the scheduler's exceptions to HTTP statuses with their messages."""

    @functools.wraps(fn)
    async def wrapper(self, *args, **kwargs):
        try:
            return await fn(self, *args, **kwargs)
        except NotFound as err:
            raise APIError(404, str(err)) from None
        except Forbidden as err:
            raise APIError(403, str(err)) from None
        except Conflict as err:
            raise APIError(409, str(err)) from None
        except Rejected as err:
            raise APIError(422, str(err)) from None
        except (SubmissionError, PlanError, QuantityError) as err:
            raise APIError(400, str(err)) from None
        except UserFileError as err:  # a job file the user replaced (a link, a FIFO): refused
            raise APIError(403, str(err)) from None
        except AccountError as err:  # no account to act as; never done as root instead
            raise APIError(409, str(err)) from None
        except KeyReused as err:
            raise APIError(422, str(err)) from None
        except TooManyPending as err:
            raise APIError(429, str(err)) from None

    return wrapper


# -- misc --------------------------------------------------------------------------------------
class HealthHandler(web.RequestHandler):
    def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        sched = self.settings["wmla_scheduler"]
        health = {"ok": sched.last_error is None, "cycles": sched.cycles}
        if sched.last_error is not None:  # up, but the scheduling loop fails every cycle
            health.update(status="degraded", error=sched.last_error)
        else:
            health["status"] = "ok"
        self.finish(json.dumps(health))


class OpenAPIHandler(web.RequestHandler):
    def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(openapi_document(self.settings["wmla_prefix"])))


class WhoAmIHandler(APIHandler):
    @_errors
    async def get(self) -> None:
        caller = self.caller()
        user = self.get_argument("user", None)
        if user is not None and user != caller.name:
            caller = self._subject(caller, user)
        self.reply(
            {
                "name": caller.name,
                "groups": sorted(caller.groups),
                "plan_admin": caller.admin,
                "plans": self.sched.usable_plans(caller),
                "storage": str(self.service.user_folder(caller.name)),
                "api": f"{self.settings['wmla_prefix']}api/v1/",
            }
        )

    def _subject(self, caller: Caller, user: str) -> Caller:
        """Another user as a plan admin asks about them (the spawner, for its spawn page):
        what ``user`` in ``groups`` may use, judged as for that user, not as the admin."""
        if not caller.admin:
            raise APIError(403, "only plan admins may ask what another user may use")
        groups = [g for g in (self.get_argument("groups", "") or "").split(",") if g]
        for name in (user, *groups):
            if not MEMBER.match(name):
                raise APIError(400, f"{name!r} is not a hub user or group name")
        return Caller(user, frozenset(groups), admin=False)


# -- plans ---------------------------------------------------------------------------------------
def plan_tree_json(sched: Scheduler, viewer: Caller | None = None) -> dict:
    """The plan tree as the API shows it to ``viewer`` (None: everything, as to an admin).

    A non-admin sees every plan but, of the user leaves, only their own (each plan says how
    many it has in ``user_leaves``), and only their own name among a plan's member users:
    who else uses the instance, and how much, is the admins' to know.
    """
    private = viewer is not None and not viewer.admin
    nodes: dict[str, dict] = {}
    root = _figures(sched, ROOT)
    root.update({"path": ROOT, "user_leaves": 0, "children": []})
    nodes[ROOT] = root
    for plan in sched.plans:  # sorted by path, so parents come first
        parent = nodes.get(plan.parent)
        if parent is None:  # below a leaf hidden from this viewer
            continue
        if plan.user_leaf:
            parent["user_leaves"] += 1
            if private and plan.name != viewer.name:
                continue
        users, groups = sched.members.get(plan.path, ([], []))
        if private:
            users = [u for u in users if u == viewer.name]
        node = {
            "path": plan.path,
            "name": plan.name,
            "share": plan.share,
            "limit": plan.limit.to_dict(),
            "user_leaf": plan.user_leaf,
            "user_leaves": 0,
            "members": {"users": users, "groups": groups},
            **runtime_limits.plan_json(sched.limits.plans, plan.path),
            **_figures(sched, plan.path),
            "children": [],
        }
        nodes[plan.path] = node
        parent["children"].append(node)
    flat = [{k: v for k, v in n.items() if k != "children"} for n in nodes.values()]
    return {"root": root, "plans": flat[1:]}


def _figures(sched: Scheduler, path: str) -> dict:
    fig = sched.figures.get(path)
    if fig is None:
        zero = Resources().to_dict()
        return {"deserved": zero, "allocated": zero, "demand": zero, "pending": 0, "running": 0}
    return {
        "deserved": fig.deserved.to_dict(),
        "allocated": fig.allocated.to_dict(),
        "demand": fig.demand.to_dict(),
        "pending": fig.pending,
        "running": fig.running,
    }


def parse_plan(body: Any, path: str | None, old: PlanRecord | None) -> PlanRecord:
    if not isinstance(body, dict):
        raise APIError(400, 'the body must be a JSON object such as {"path": "/p", "share": 1}')
    unknown = sorted(set(body) - PLAN_KEYS)
    if unknown:
        raise APIError(
            400, f"unknown field {unknown[0]!r}; the fields are {', '.join(sorted(PLAN_KEYS))}"
        )
    if path is None:
        path = body.get("path")
        if not isinstance(path, str):
            raise APIError(400, "path is required, e.g. /project1/dev-team")
    elif "path" in body and body["path"] != path:
        raise APIError(400, "a plan cannot be renamed; create the new path and delete the old")
    share = body.get("share", old.share if old else 1)
    if "limit" in body:
        limit = body["limit"]
        if limit is not None and not isinstance(limit, dict):
            raise APIError(400, 'limit must be an object such as {"gpu": 4, "cpu": "8"}')
        limit = Resources.from_mapping(limit, UNLIMITED, where=f"{path} limit")
    else:
        limit = old.limit if old else Resources(UNLIMITED, UNLIMITED, UNLIMITED)
    users = old.users if old else []
    groups = old.groups if old else []
    runtimes = runtime_limits.plan_fields(body, old, path)  # PlanError: a 400 naming it
    if "members" in body:
        members = body["members"]
        if not isinstance(members, dict) or set(members) - {"users", "groups"}:
            raise APIError(400, 'members must be {"users": [names], "groups": [names]}')
        users = _names(members.get("users", []), "members.users")
        groups = _names(members.get("groups", []), "members.groups")
    return PlanRecord(path, share, limit, False, users, groups, *runtimes)


def _names(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or len(value) > MAX_MEMBERS:
        raise APIError(400, f"{where} must be a list of names")
    for name in value:
        if not isinstance(name, str) or not MEMBER.match(name):
            raise APIError(400, f"{where}: {name!r} is not a hub user or group name")
    return sorted(set(value))


class PlansHandler(APIHandler):
    async def get(self) -> None:
        self.reply(plan_tree_json(self.sched, self.caller()))

    @_errors
    async def post(self) -> None:
        self.admin_caller()
        record = parse_plan(self.body(), None, None)
        if record.path in self.sched.plans:
            raise Conflict(f"plan {record.path} already exists; PATCH it to change it")
        await self.sched.change_plans([record], create=True)
        self.reply(_one_plan(self.sched, record.path), 201)


class PlanHandler(APIHandler):
    def _path(self, path: str) -> str:
        if path not in self.sched.plans:
            raise NotFound(f"there is no plan {path!r}")
        return path

    @_errors
    async def get(self, path: str) -> None:
        self.reply(_one_plan(self.sched, self._path(path), self.caller()))

    @_errors
    async def patch(self, path: str) -> None:
        self.admin_caller()
        old = self.sched.record(self._path(path))
        if old.user_leaf and "members" in (self.body() or {}):
            raise PlanError(f"{path} is a user leaf; members belong on its parent plan")
        record = parse_plan(self.body(), path, old)
        record.user_leaf = old.user_leaf
        await self.sched.change_plans([record], create=False)
        self.reply(_one_plan(self.sched, path))

    @_errors
    async def delete(self, path: str) -> None:
        self.admin_caller()
        self._path(path)
        live = self.sched.live_jobs_under(path)
        if live:
            raise Conflict(
                f"cannot delete {path}: {len(live)} pending or running job(s) are charged to "
                f"it ({', '.join(sorted(j.id for j in live)[:5])}); cancel them first"
            )
        # the plan's own user leaves go with it; real child plans must be deleted first
        leaves = [p.path for p in self.sched.plans.children(path) if p.user_leaf]
        await self.sched.change_plans([], create=False, delete=[*leaves, path])
        self.set_status(204)
        self.finish()


def _one_plan(sched: Scheduler, path: str, viewer: Caller | None = None) -> dict:
    for plan in plan_tree_json(sched, viewer)["plans"]:
        if plan["path"] == path:
            return plan
    raise NotFound(f"there is no plan {path!r}")


# -- jobs ----------------------------------------------------------------------------------------
def job_json(
    row: JobRow, queue: dict | None = None, devices: list[list[int]] | None = None
) -> dict:
    """A job as the API shows it; ``queue``: its place in line, reason and estimated start
    while pending (``WaitingLine.view``, queue.py); ``devices``: a running notebook's GPU
    indexes by worker, where the backend holds them (notebook_devices.py)."""
    placement = list(row.placement or [])
    return {
        "id": row.id,
        "name": row.name,
        "user": row.user,
        "plan": row.plan,
        "leaf": row.leaf,
        "kind": row.kind,
        "state": row.state,
        "reason": row.reason,
        "workers": {"min": row.min_workers, "max": row.max_workers, "running": len(placement)},
        "resources": Resources(row.gpu, row.cpu, row.memory).to_dict(),
        "limits": row.limits,
        "priority": row.priority,
        "preemptible": row.preemptible,
        "command": list(row.command or []),
        "workdir": row.workdir,
        "submitted": row.submitted,
        "started": row.started,
        "ended": row.ended,
        "placement": placement,
        "terminating": row.terminating,
        "cancel_requested": row.cancel_requested,
        "exit_code": row.exit_code,
        "preemptions": row.preemptions,
        "checkpoint": None
        if row.checkpointed is None
        else {"at": row.checkpointed, "progress": row.checkpoint_progress},
        **runtime_limits.job_json(row),  # max_runtime, deadline
        "devices": devices,
        "queue": queue,
    }


class JobsHandler(APIHandler):
    async def get(self) -> None:
        caller = self.caller()
        user = self.get_argument("user", None)
        if not caller.admin:
            if user not in (None, caller.name):
                raise APIError(403, "only plan admins may list other users' jobs")
            user = caller.name
        states = self.get_argument("state", None)
        wanted = [s.strip().upper() for s in states.split(",")] if states else None
        known = {state.value for state in JobState}
        if wanted and not set(wanted) <= known:
            bad = sorted(set(wanted) - known)[0]
            raise APIError(400, f"state {bad!r} is not one of {', '.join(sorted(known))}")
        try:
            page = Page.parse(self.get_argument("limit", None), self.get_argument("after", None))
        except PageError as err:
            raise APIError(400, str(err)) from None
        rows = await self.sched.db.read(
            self.sched.store.jobs, user=user, states=wanted, limit=page.limit + 1, after=page.after
        )
        shown, line = rows[: page.limit], self.sched.queue
        more = len(rows) > page.limit  # one row past the page says whether there is a next
        last = shown[-1] if more else None
        cursor = Cursor(last.submitted, last.id).encode() if last else None
        self.reply({"jobs": [job_json(r, line.view(r)) for r in shown], "next": cursor})

    @_errors
    async def post(self) -> None:
        caller = self.caller()
        body = self.body()
        key = self.request.headers.get("Idempotency-Key")
        if key is not None and not IDEMPOTENCY_KEY.match(key):
            raise APIError(
                400,
                "the Idempotency-Key header must be 1-128 characters of A-Z a-z 0-9 . _ : - "
                "(e.g. a UUID); send the same key again only to retry the same submission",
            )
        on_behalf = body.get("user") if isinstance(body, dict) else None
        if on_behalf is not None and on_behalf != caller.name:
            # a plan admin (e.g. the spawner's service) submits for a user: the job is the
            # user's in every way; the admin vouches for membership
            if not caller.admin:
                raise APIError(403, "only plan admins may submit jobs for another user")
            if not isinstance(on_behalf, str) or not MEMBER.match(on_behalf):
                raise APIError(400, f"user {on_behalf!r} is not a hub user name")
            caller = Caller(on_behalf, frozenset(), admin=True)
        if key is None:
            row, new = await self.sched.submit(caller, await self._parse(body, caller)), True
        else:  # the body is parsed only when the key is new (a retry gets the job it made)
            digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
            parse = functools.partial(self._parse, body, caller)
            row, new = await self.sched.submit_once(caller, parse, key, digest)
        self._created(row, 201 if new else 200)

    async def _parse(self, body: Any, caller: Caller) -> Submission:
        # pure: the submission action resolves the command as the user (Actions.submit)
        return parse_submission(
            body,
            user=caller.name,
            storage_root=self.service.storage_root,
            limit_range=self.service.limit_range_obj,
            max_workers=self.service.max_workers_per_job,
        )

    def _created(self, row: JobRow, status: int) -> None:
        self.set_header("Location", f"{self.settings['wmla_prefix']}api/v1/jobs/{row.id}")
        self.reply(job_json(row, self.sched.queue.view(row)), status)


class JobHandler(APIHandler):
    @_errors
    async def get(self, job_id: str) -> None:
        row = await self.sched.visible_job(self.caller(), job_id)
        devices = self.sched.notebook_devices.of(row.id) if row.kind == "notebook" else None
        self.reply(job_json(row, self.sched.queue.view(row), devices))

    @_errors
    async def delete(self, job_id: str) -> None:
        row = await self.sched.cancel(self.caller(), job_id)
        self.reply(job_json(row, self.sched.queue.view(row)))


class JobLogsHandler(APIHandler):
    @_errors
    async def get(self, job_id: str) -> None:
        row = await self.sched.visible_job(self.caller(), job_id)
        worker = _int_arg(self, "worker", 0, 100_000)
        tail = _int_arg(self, "tail", 1, 1_000_000)
        text = ""
        backend = self.sched.backend
        try:  # the local backend reads with the job's user's rights, in a helper: a thread
            text = await off_loop(backend.logs, job_id, worker, tail) if backend else ""
        except KeyError:  # the backend forgot the job (ended, or a restart): read the files
            text = ""
        if not text:
            files = self.sched.files_for(row.user)
            text = await off_loop(files.read_logs, row.workdir, worker, tail)
        self.reply({"job": job_id, "worker": worker, "logs": text})


class JobMetricsHandler(APIHandler):
    @_errors
    async def get(self, job_id: str) -> None:
        row = await self.sched.visible_job(self.caller(), job_id)
        since = _int_arg(self, "since", 0, 10**9) or 0
        files = self.sched.files_for(row.user)  # read with the job's user's rights
        metrics, next_line = await off_loop(files.read_metrics, row.workdir, since)
        self.reply({"job": job_id, "metrics": metrics, "next": next_line})


class JobHistoryHandler(APIHandler):
    @_errors
    async def get(self, job_id: str) -> None:
        await self.sched.visible_job(self.caller(), job_id)
        rows = await self.sched.db.read(self.sched.store.transitions, job_id)
        self.reply(
            {
                "job": job_id,
                "transitions": [
                    {
                        "at": t.at,
                        "event": t.event,
                        "state": t.state,
                        "leaf": t.leaf,
                        "workers": t.workers,
                        "per_worker": Resources(t.gpu, t.cpu, t.memory).to_dict(),
                        "placement": t.placement,
                        "reason": t.reason,
                    }
                    for t in rows
                ],
            }
        )


def _int_arg(handler: APIHandler, name: str, low: int, high: int) -> int | None:
    value = handler.get_argument(name, None)
    if value is None or value == "":
        return None
    if not re.fullmatch(r"\d{1,10}", value) or not low <= int(value) <= high:
        raise APIError(400, f"{name} must be a whole number from {low} to {high}, got {value!r}")
    return int(value)


# -- instance ------------------------------------------------------------------------------------
class InstanceHandler(APIHandler):
    async def get(self) -> None:
        self.caller()
        sched = self.sched
        inst = sched.instance
        root = _figures(sched, ROOT)
        self.reply(
            {
                "nodes": [{"name": n.name, "capacity": n.capacity.to_dict()} for n in inst.nodes],
                "capacity": inst.capacity.to_dict(),
                "quota": {**inst.quota.to_dict(), "jobs": inst.max_jobs},
                "limit_range": self.service.limit_range_obj.to_dict(),
                "allocated": root["allocated"],
                "demand": root["demand"],
                "running_jobs": root["running"],
                "pending_jobs": root["pending"],
                "backend": self.service.backend_class,
                "scheduler": {
                    "grace": sched.config.grace,
                    "min_runtime": sched.config.min_runtime,
                    "tick": sched.tick,
                },
                "max_workers_per_job": self.service.max_workers_per_job,
                # how well the machine keeps users apart, and what to do about it
                "security": self.service.security_report(),
                "units": {"gpu": "devices", "cpu": "millicores", "memory": "bytes"},
            }
        )


def routes(prefix: str) -> list[tuple]:
    api = prefix + "api/v1"
    return [
        (api + r"/?", WhoAmIHandler),
        (api + r"/health", HealthHandler),
        (api + r"/openapi\.json", OpenAPIHandler),
        (api + r"/plans/?", PlansHandler),
        (api + r"/plans(/.+?)/?", PlanHandler),
        (api + r"/jobs/?", JobsHandler),
        (api + r"/jobs/([^/]+)/?", JobHandler),
        (api + r"/jobs/([^/]+)/logs", JobLogsHandler),
        (api + r"/jobs/([^/]+)/metrics", JobMetricsHandler),
        (api + r"/jobs/([^/]+)/history", JobHistoryHandler),
        (api + r"/instance", InstanceHandler),
    ]
