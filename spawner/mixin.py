"""What both wmla spawners share: hub user -> plan leaf, admission, folder, kernel environment.

A notebook server is a job like any other (SCHEDULING.md "Words"): a rigid, non-preemptible gang
of one worker, charged to ``<plan>/<user>``. The spawner submits it through the service as a plan
admin on the user's behalf (``"user"`` in the body), waits while it is PENDING (the spawn page's
progress shows the service's reason, e.g. "/project1/dev-team at its gpu limit: 2 of 2 in use"),
fails at once when the service answers 422 (it can never fit), and cancels the job when the
server stops, which releases the plan's resources. A server whose job the service ended (an
admin cancelled it) is stopped at the hub's next poll.

The service is reached over HTTP through ``extension.client`` (blocking, so in a thread: the
hub's event loop never waits on a socket).
"""

from __future__ import annotations

import asyncio
import html
import inspect
import os
from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import Any
from urllib.parse import urlencode

from traitlets import Any as AnyTrait
from traitlets import Bool, Dict, Float, Integer, List, Unicode, default
from traitlets.config import LoggingConfigurable

from . import profiles as profile_shapes

NOTEBOOK_KIND = "notebook"
ENDED_STATES = ("FINISHED", "FAILED", "CANCELLED", "REJECTED")
DEFAULT_PLAN = "/sample-project/notebooks"
SPAWNER_SERVICE = "wmla-spawner"
GPU_GROUP = "wmla-gpu-notebooks"  # hub_config.culler.GPU_GROUP: the GPU culler's scope filter


class AdmissionError(RuntimeError):
    """The notebook cannot be admitted; the message is what the spawn page shows."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.jupyterhub_message = message


class WmlaSpawnerMixin(LoggingConfigurable):
    """Mix in before a JupyterHub spawner class (``class S(WmlaSpawnerMixin, BaseSpawner)``)."""

    # -- where the service is, and who the spawner is to it -----------------------------------
    service_name = Unicode(
        "wmla",
        help="""The wmla service's name in c.JupyterHub.services.

        c.WmlaLocalSpawner.service_name = "wmla"
        """,
    ).tag(config=True)

    service_url = Unicode(
        "",
        help="""Where the spawner (in the hub) reaches the wmla service: its own address, the hub's
        ``/services/wmla/`` or its API. Default: the url and prefix of the hub service named
        ``service_name``.

        c.WmlaLocalSpawner.service_url = "http://127.0.0.1:10101/services/wmla/"
        """,
    ).tag(config=True)

    kernel_service_url = Unicode(
        "",
        help="""``$WMLA_URL`` in the notebook: where the kernel reaches the service (on Kubernetes
        usually the hub's proxy service inside the cluster). Default: ``service_url``.

        c.WmlaKubeSpawner.kernel_service_url = "http://proxy-public/services/wmla/"
        """,
    ).tag(config=True)

    service_token = Unicode(
        "",
        help="""A hub API token with the ``custom:wmla:admin`` and ``access:services!service=wmla``
        scopes: the spawner submits notebook jobs on users' behalf. Default:
        ``$WMLA_SPAWNER_TOKEN``, else the api_token of the hub service named ``token_service``
        (``spawner.hubconfig.spawner_service()`` builds that service and its role).

        c.WmlaLocalSpawner.service_token = os.environ["WMLA_SPAWNER_TOKEN"]
        """,
    ).tag(config=True)

    token_service = Unicode(
        SPAWNER_SERVICE,
        help="""The hub service whose api_token the spawner uses when service_token is unset.

        c.WmlaLocalSpawner.token_service = "wmla-spawner"
        """,
    ).tag(config=True)

    # -- which plan ---------------------------------------------------------------------------
    default_plan = Unicode(
        DEFAULT_PLAN,
        help="""The plan of users with no override, no mapped group and no profile plan.

        c.WmlaLocalSpawner.default_plan = "/sample-project/notebooks"
        """,
    ).tag(config=True)

    group_plans = Dict(
        key_trait=Unicode(),
        value_trait=Unicode(),
        help="""Hub group -> plan path. A user in several mapped groups gets the first in this
        mapping's order.

        c.WmlaLocalSpawner.group_plans = {"dev": "/project1/dev-team", "qa": "/project1/qa-team"}
        """,
    ).tag(config=True)

    user_plans = Dict(
        key_trait=Unicode(),
        value_trait=Unicode(),
        help="""Hub user -> plan path; wins over group_plans.

        c.WmlaLocalSpawner.user_plans = {"alice": "/project1/dev-team"}
        """,
    ).tag(config=True)

    wmla_plan = Unicode(
        "",
        help="""Force one plan (wins over user_plans and group_plans; a picked profile's plan wins
        over it). Meant for KubeSpawner profile_list overrides:
        ``"kubespawner_override": {"wmla_plan": "/project1/dev-team", "gpus": 1}``.

        c.WmlaKubeSpawner.wmla_plan = "/project1/dev-team"
        """,
    ).tag(config=True)

    profiles = List(
        Dict(),
        help="""Deprecated: use ``profile_list``, KubeSpawner's shape (spawner/profiles.py), which
        both spawners read. Each entry here (``slug``, ``display_name``, ``description``,
        ``default``, ``plan``, ``gpu``, ``cpu``, ``memory``) is read as a profile_list entry
        whose ``kubespawner_override`` sets ``wmla_plan``, ``gpus``, ``notebook_cpu``,
        ``notebook_memory``; used only while ``profile_list`` is not set.

        c.WmlaLocalSpawner.profiles = [{"slug": "gpu", "display_name": "1 GPU", "gpu": 1}]
        """,
    ).tag(config=True)

    plan_choice = Bool(
        True,
        help="""Offer the plans the user may use on the spawn page (when there is more than
        one): the service says which (plan members and groups, as for the user's own
        submissions), and a pick outside them is refused at spawn. A picked profile that sets
        ``wmla_plan`` (its ``kubespawner_override`` or a choice's) wins over the pick. The
        pick arrives as ``user_options = {"plan": path}``.

        c.WmlaLocalSpawner.plan_choice = False
        """,
    ).tag(config=True)

    # -- what a notebook asks for --------------------------------------------------------------
    gpus = Integer(
        0,
        min=0,
        help="""GPUs a notebook server requests (a profile's ``kubespawner_override`` may set it).

        c.WmlaLocalSpawner.gpus = 1
        """,
    ).tag(config=True)

    notebook_cpu = Unicode(
        "",
        help="""The notebook's cpu request sent to the service ("500m", "2"); default:
        cpu_guarantee when set, else the instance limit range's default request.

        c.WmlaLocalSpawner.notebook_cpu = "500m"
        """,
    ).tag(config=True)

    notebook_memory = Unicode(
        "",
        help="""The notebook's memory request sent to the service ("2Gi"); default: mem_guarantee
        when set, else the instance limit range's default request.

        c.WmlaLocalSpawner.notebook_memory = "2Gi"
        """,
    ).tag(config=True)

    admission_poll_interval = Float(
        1.0,
        min=0.05,
        help="""Seconds between looks at a waiting notebook job. A wait for room counts against
        c.Spawner.start_timeout: raise it where notebooks may queue.

        c.WmlaLocalSpawner.admission_poll_interval = 1.0
        """,
    ).tag(config=True)

    gpu_group = Unicode(
        GPU_GROUP,
        help="""The hub group a user is in while one of their servers holds GPUs (the spawner adds
        them once the notebook job is admitted and removes them when its last GPU server stops).
        The GPU idle culler's scopes are filtered to it (hub_config.culler_services): idle GPU
        servers are stopped sooner. "": keep no group. Leave it out of an authenticator's
        manage_groups (it would drop the membership at the next login).

        c.WmlaLocalSpawner.gpu_group = "wmla-gpu-notebooks"
        """,
    ).tag(config=True)

    # -- storage --------------------------------------------------------------------------------
    storage_root = Unicode(
        help="""The shared root of users' private folders ``<storage_root>/<user>`` (the same
        as c.WmlaService.storage_root). Default: ``$WMLA_STORAGE_ROOT`` or ``./var/storage``.

        c.WmlaLocalSpawner.storage_root = "/gpfs/myresultfs"
        """,
    ).tag(config=True)

    @default("storage_root")
    def _storage_root_default(self) -> str:
        return os.environ.get("WMLA_STORAGE_ROOT") or os.path.abspath("var/storage")

    # state of one spawn (not config)
    wmla_job_id = Unicode("")
    wmla_leaf = Unicode("")
    wmla_gpus = Integer(0)  # GPUs the admitted notebook job holds
    _wmla_events = List()
    _wmla_changed = AnyTrait(None, allow_none=True)
    _wmla_waiting = AnyTrait(False)
    _wmla_stopping = AnyTrait(False)
    _wmla_orphans = List()  # job ids whose server is gone but whose release is still due
    _wmla_profile_plan = Unicode("")  # the plan the picked profile forces (wmla_plan override)

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

    def wmla_request(self) -> tuple[int, dict, dict]:
        """(gpus, per-worker request, limits) for the notebook job, in the service's units."""
        gpus = int(self.gpus or 0)  # profile overrides are applied to the traits already
        request: dict[str, Any] = {"gpu": gpus}
        cpu = self.notebook_cpu or _cpu(getattr(self, "cpu_guarantee", None))
        mem = self.notebook_memory or getattr(self, "mem_guarantee", None)
        if cpu:
            request["cpu"] = cpu
        if mem:
            request["memory"] = mem
        limits: dict[str, Any] = {}
        if getattr(self, "cpu_limit", None):
            limits["cpu"] = _cpu(self.cpu_limit)
        if getattr(self, "mem_limit", None):
            limits["memory"] = self.mem_limit
        return gpus, request, limits

    def wmla_job_body(self, plan: str) -> dict:
        gpus, request, limits = self.wmla_request()
        body: dict[str, Any] = {
            "plan": plan,
            "kind": NOTEBOOK_KIND,
            "user": self.user.name,
            "name": f"notebook {self.name}" if self.name else "notebook",
            "workers": 1,
            "preemptible": False,
            "resources": request,
        }
        if limits:
            body["limits"] = limits
        return body

    # -- the service ---------------------------------------------------------------------------
    def _hub_service(self, name: str) -> Any:
        settings = getattr(self.user, "settings", None) or {}
        return (settings.get("services") or {}).get(name)

    def wmla_service_url(self) -> str:
        if self.service_url:
            return self.service_url
        service = self._hub_service(self.service_name)
        if service is not None and getattr(service, "url", None):
            return service.url.rstrip("/") + service.prefix.rstrip("/") + "/"
        raise AdmissionError(
            f"where is the wmla service? No hub service {self.service_name!r} with a url; set "
            f"c.{type(self).__name__}.service_url"
        )

    def wmla_token(self) -> str:
        token = self.service_token or os.environ.get("WMLA_SPAWNER_TOKEN", "")
        if not token:
            service = self._hub_service(self.token_service)
            token = getattr(service, "api_token", "") or ""
        if not token:
            raise AdmissionError(
                "the spawner has no token for the wmla service: add the hub service from "
                "spawner.hubconfig.spawner_service() or set "
                f"c.{type(self).__name__}.service_token"
            )
        return token

    async def _wmla_call(
        self, method: str, path: str, body: Any = None, what: str = "", retry: float = 5.0
    ) -> Any:
        """``retry``: seconds the client keeps trying while the service restarts (502/503, no
        connection). Short by default: the hub's polls and the spawn page must not hang on
        it; the submission, sent with an Idempotency-Key, waits longer."""
        from extension.client import WmlaClient

        def call() -> Any:
            client = WmlaClient(
                self.wmla_service_url(), self.wmla_token(), env={}, retry_seconds=retry
            )
            try:
                return client.request(method, path, body=body, what=what or "notebook")
            finally:
                client.session.close()

        return await asyncio.to_thread(call)

    # -- progress ------------------------------------------------------------------------------
    def _wmla_note(self, message: str, progress: int | None = None) -> None:
        event: dict[str, Any] = {"message": message}
        if progress is not None:
            event["progress"] = progress
        self._wmla_events.append(event)
        if self._wmla_changed is not None:
            self._wmla_changed.set()
        self.log.info("%s: %s", self._log_name, message)

    async def progress(self) -> AsyncIterator[dict]:
        """The admission's events while it waits, then the base spawner's own."""
        sent = 0
        while True:
            while sent < len(self._wmla_events):
                yield self._wmla_events[sent]
                sent += 1
            if not self._wmla_waiting:
                break
            changed = self._wmla_changed
            if changed is None:
                break
            changed.clear()
            try:
                await asyncio.wait_for(changed.wait(), timeout=1)
            except asyncio.TimeoutError:
                pass
        async for event in super().progress():
            yield event

    # -- admission and release ------------------------------------------------------------------
    async def wmla_admit(self) -> str:
        """Submit the notebook job and wait until it holds its resources; returns the plan."""
        if self._wmla_orphans:  # a previous server's job that was never released
            await self.wmla_release("")
        self._wmla_events = []
        self._wmla_changed = asyncio.Event()
        self._wmla_stopping = False
        self._wmla_waiting = True
        try:
            return await self._wmla_admit()
        finally:
            self._wmla_waiting = False
            self._wmla_changed.set()

    async def _wmla_admit(self) -> str:
        from extension.client import WmlaError

        await self._wmla_check_picked_plan()
        plan = self.wmla_plan_path()
        body = self.wmla_job_body(plan)
        self.wmla_leaf = f"{plan}/{self.user.name}"
        self._wmla_note(f"asking plan {plan} for room: {_describe(body['resources'])}", 5)
        try:
            job = await self._wmla_call("POST", "jobs", body, retry=30.0)
        except WmlaError as err:
            if err.status == 422:
                message = f"{self.wmla_leaf} can never hold this server: {err}"
                raise AdmissionError(message) from None
            raise AdmissionError(f"the wmla service refused the notebook: {err}") from None
        self.wmla_job_id = job["id"]
        last = None
        while True:
            state = job.get("state")
            if state == "RUNNING":
                self._wmla_note(f"admitted to {self.wmla_leaf} (job {job['id']})", 20)
                self.wmla_gpus = int(body["resources"].get("gpu") or 0)
                if self.wmla_gpus:
                    self._wmla_gpu_group(join=True)
                return plan
            if state != "PENDING":
                self.wmla_job_id = ""
                reason = job.get("reason") or state
                raise AdmissionError(f"{self.wmla_leaf}: the notebook job is {state}: {reason}")
            reason = job.get("reason") or f"waiting for room in {plan}"
            if reason != last:
                self._wmla_note(reason, 10)
                last = reason
            if self._wmla_stopping:
                await self.wmla_release()
                raise AdmissionError("the server was stopped while it waited for room")
            await asyncio.sleep(self.admission_poll_interval)
            try:
                job = await self._wmla_call("GET", f"jobs/{job['id']}")
            except WmlaError as err:
                self.log.warning("%s: looking at job %s: %s", self._log_name, job["id"], err)

    async def wmla_release(self, job_id: str | None = None) -> None:
        """Cancel the notebook job and any job a cleared state left behind; never raises."""
        ids = [job_id or self.wmla_job_id, *self._wmla_orphans]
        self.wmla_job_id = ""
        self._wmla_orphans.clear()
        if self.wmla_gpus:  # whatever the release's outcome, this server holds no GPU any more
            self.wmla_gpus = 0
            self._wmla_gpu_group(join=False)
        for one in dict.fromkeys(i for i in ids if i):
            await self._wmla_release_one(one)

    async def _wmla_release_one(self, job_id: str) -> None:
        from extension.client import WmlaError

        try:
            await self._wmla_call("DELETE", f"jobs/{job_id}", what=f"releasing {job_id}")
            self.log.info("%s: released notebook job %s", self._log_name, job_id)
        except (WmlaError, AdmissionError) as err:
            if getattr(err, "status", 0) in (404, 409):  # already ended or gone: nothing held
                return
            # kept to try again at the next stop or start of this server
            self._wmla_orphans.append(job_id)
            self.log.error(
                "%s: could not release notebook job %s (will retry): %s",
                self._log_name, job_id, err,
            )  # fmt: skip

    def _wmla_gpu_group(self, join: bool) -> None:
        """Put the user in gpu_group (join) or take them out when none of their other servers
        holds GPUs; in the hub's own database. Never raises: the group only speeds culling."""
        orm_user = getattr(self.user, "orm_user", None)
        db = getattr(self.user, "db", None)
        if not self.gpu_group or orm_user is None or db is None:
            return
        try:
            from jupyterhub import orm

            group = orm.Group.find(db, self.gpu_group)
            if join:
                if group is None:
                    group = orm.Group(name=self.gpu_group)
                    db.add(group)
                if group not in orm_user.groups:
                    orm_user.groups.append(group)
                    db.commit()
                    self.log.info("%s: in hub group %s while it holds GPUs", self._log_name,
                                  self.gpu_group)  # fmt: skip
                return
            spawners = getattr(self.user, "spawners", {}) or {}
            others = [
                s for s in spawners.values()
                if s is not self and getattr(s, "wmla_gpus", 0) and getattr(s, "active", False)
            ]  # fmt: skip
            if group is not None and group in orm_user.groups and not others:
                orm_user.groups.remove(group)
                db.commit()
                self.log.info("%s: out of hub group %s", self._log_name, self.gpu_group)
        except Exception as err:  # a database hiccup must not fail a spawn or a stop
            db.rollback()
            self.log.warning("%s: hub group %s: %s", self._log_name, self.gpu_group, err)

    async def poll(self) -> int | None:
        """The base spawner's answer; and a running server whose notebook job the service ended
        (an admin cancelled it) is stopped here, since it no longer holds its plan's resources.
        Only a job the service says has ended counts: an unreachable service changes nothing."""
        status = await super().poll()
        if status is not None or not self.wmla_job_id or self._wmla_waiting or self._wmla_stopping:
            return status
        state = await self._wmla_job_state(self.wmla_job_id)
        if state not in ENDED_STATES:
            return status
        self.log.warning(
            "%s: notebook job %s is %s in the wmla service: stopping the server",
            self._log_name, self.wmla_job_id, state,
        )  # fmt: skip
        await self.stop(now=True)
        return 0

    async def _wmla_job_state(self, job_id: str) -> str | None:
        from extension.client import WmlaError

        try:
            job = await self._wmla_call("GET", f"jobs/{job_id}", what=f"looking at {job_id}")
        except (WmlaError, AdmissionError) as err:
            self.log.debug("%s: looking at job %s: %s", self._log_name, job_id, err)
            return None
        return job.get("state") if isinstance(job, dict) else None

    async def stop(self, now: bool = False) -> None:
        self._wmla_stopping = True
        job_id = self.wmla_job_id  # LocalProcessSpawner.stop() clears the state
        try:
            await super().stop(now=now)
        finally:
            await self.wmla_release(job_id)

    # -- environment for the client and the magics ------------------------------------------------
    def wmla_env(self, folder: str, ipython_dir: str | None) -> dict[str, str]:
        """What the kernel needs; the token is JUPYTERHUB_API_TOKEN (server_token_scopes)."""
        env = {
            "WMLA_URL": self.kernel_service_url or self.wmla_service_url(),
            "WMLA_SERVICE_NAME": self.service_name,
            "WMLA_USER": self.user.name,
            "WMLA_PLAN": self.wmla_leaf.rsplit("/", 1)[0] if self.wmla_leaf else "",
            "WMLA_LEAF": self.wmla_leaf,
            "WMLA_USER_DIR": folder,
            "WMLA_STORAGE_ROOT": self.storage_root,
            "WMLA_NOTEBOOK_JOB": self.wmla_job_id,
        }
        if ipython_dir:
            env["IPYTHONDIR"] = ipython_dir
        return env

    # -- state across hub restarts -------------------------------------------------------------
    def get_state(self) -> dict:
        state = super().get_state()
        if self.wmla_job_id:
            state["wmla_job_id"] = self.wmla_job_id
            state["wmla_leaf"] = self.wmla_leaf
        if self.wmla_gpus:
            state["wmla_gpus"] = self.wmla_gpus
        if self._wmla_orphans:  # a release still due survives the spawner object and the hub
            state["wmla_orphans"] = list(dict.fromkeys(self._wmla_orphans))
        return state

    def load_state(self, state: Mapping[str, Any]) -> None:
        super().load_state(state)
        self.wmla_job_id = state.get("wmla_job_id", "")
        self.wmla_leaf = state.get("wmla_leaf", "")
        self.wmla_gpus = int(state.get("wmla_gpus") or 0)
        orphans = [i for i in state.get("wmla_orphans") or [] if isinstance(i, str) and i]
        self._wmla_orphans = list(dict.fromkeys([*self._wmla_orphans, *orphans]))

    def clear_state(self) -> None:
        # LocalProcessSpawner.poll() clears the state of a server that died by itself before
        # JupyterHub's stop, which then skips stop(): keep the job id to release it
        if self.wmla_job_id:
            self._wmla_orphans.append(self.wmla_job_id)
        super().clear_state()
        self.wmla_job_id = ""

    def run_post_stop_hook(self) -> Awaitable[None]:
        """JupyterHub runs this after every stop, also of a server that died by itself (when it
        does not call stop()): release whatever job is still held, then the configured hook."""
        configured = super().run_post_stop_hook()

        async def release_then_hook() -> None:
            await self.wmla_release()
            if inspect.isawaitable(configured):
                await configured

        return release_then_hook()

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


def _cpu(cores: float | None) -> str | None:
    """JupyterHub's cpu_guarantee/cpu_limit (cores, float) -> millicores text."""
    if not cores:
        return None
    return f"{round(float(cores) * 1000)}m"


def _describe(request: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in request.items())
