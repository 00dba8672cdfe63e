"""What both wmla spawners share: hub user -> plan leaf, admission, release, kernel environment.

A notebook server is a job like any other (docs/scheduling.md "Words"): a rigid, non-preemptible
gang of one worker, charged to ``<plan>/<user>``. The spawner submits it through the service as a
plan admin on the user's behalf (``"user"`` in the body), waits while it is PENDING (the spawn
page's progress shows the service's reason, e.g. "/project1/dev-team at its gpu limit: 2 of 2 in
use"), fails at once when the service answers 422 (it can never fit), and cancels the job when
the server stops, which releases the plan's resources. A server whose job the service ended (an
admin cancelled it) is stopped at the hub's next poll.

The service is reached over HTTP through ``extension.client`` (blocking, so in a thread: the
hub's event loop never waits on a socket).

:class:`WmlaSpawnerMixin` is the one mixin JupyterHub's spawner classes force: it holds every
trait (the configuration) and the spawn's record (:class:`~spawner.mixin.record.SpawnRecord`),
answers JupyterHub's hooks, and hands the work to collaborators it builds from its current
traits, one module each:

- ``service_client``: the service's address, the spawner's token, one request;
- ``plan_chooser``: the profile and the plan a notebook is charged to, and the spawn page;
- ``request``: what the notebook asks for, and its job's body;
- ``admission``: the submission and the wait while the job is PENDING;
- ``progress``: the spawn page's progress events;
- ``release``: cancelling the job when the server stops, and the orphans a failed release leaves;
- ``poll``: whether the job of a running server has ended;
- ``gpu_group``: the hub group of users whose servers hold GPUs;
- ``state``: the state kept across hub restarts; ``environment``: the kernel's.
"""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from traitlets import Bool, Dict, Float, Instance, Integer, List, Unicode, default
from traitlets.config import LoggingConfigurable

from .admission import Admission
from .defaults import DEFAULT_PLAN, GPU_GROUP, NOTEBOOK_KIND, SPAWNER_SERVICE
from .environment import KernelEnvironment
from .errors import AdmissionError
from .gpu_group import GpuGroup
from .plan_chooser import PlanChooser, PlanSettings
from .poll import JobPoll
from .progress import SpawnProgress
from .record import JobGrant, SpawnRecord
from .release import Release
from .request import NotebookRequest
from .service_client import ServiceCalls, ServiceClient, ServiceLocation
from .spawn_log import SpawnLog
from .state import forget_job, load_state, save_state
from .storage_note import storage_note
from .user_options import check_user_options

__all__ = [
    "DEFAULT_PLAN",
    "GPU_GROUP",
    "NOTEBOOK_KIND",
    "SPAWNER_SERVICE",
    "AdmissionError",
    "WmlaSpawnerMixin",
]


@dataclass(frozen=True)
class Collaborators:
    """The spawner's collaborators, wired together from its traits as they are now (a profile
    picked at start may have changed them)."""

    plans: PlanChooser
    progress: SpawnProgress
    admission: Admission
    release: Release
    poll: JobPoll


# The traits stay on this one class, so the configuration reads c.WmlaSpawnerMixin /
# c.WmlaLocalSpawner / c.WmlaKubeSpawner and no collaborator becomes a config section. It comes
# before the base spawner, whose hooks (progress, poll, stop, the state) its super() calls reach.
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

    plan_descriptions = Dict(
        key_trait=Unicode(),
        value_trait=Unicode(),
        help="""A line shown beside each plan on the spawn page's plan choice, by plan path (as a
        profile's ``description`` is beside its profile): what the plan is for, who pays, what
        it holds. A plan without one shows its path alone.

        c.WmlaLocalSpawner.plan_descriptions = {
            "/project1/dev-team": "dev team: 2 GPUs, stopped after 15 idle minutes",
        }
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

    wmla_spawn = Instance(
        SpawnRecord, args=(), help="The record of this server's spawn (not configuration)."
    )

    # -- the spawn's record, as the hub and the spawner classes read it ---------------------------
    @property
    def wmla_job_id(self) -> str:
        return self.wmla_spawn.job_id

    @wmla_job_id.setter
    def wmla_job_id(self, value: str) -> None:
        self.wmla_spawn.job_id = value

    @property
    def wmla_leaf(self) -> str:
        return self.wmla_spawn.leaf

    @wmla_leaf.setter
    def wmla_leaf(self, value: str) -> None:
        self.wmla_spawn.leaf = value

    @property
    def wmla_gpus(self) -> int:
        """GPUs the admitted notebook job holds (the GPU group counts the user's servers')."""
        return self.wmla_spawn.gpus

    @property
    def wmla_granted(self) -> JobGrant:
        """What the service admitted the notebook job with."""
        return self.wmla_spawn.granted

    # -- the collaborators ---------------------------------------------------------------------
    def wmla_log(self) -> SpawnLog:
        return SpawnLog(self.log, self._log_name)

    def wmla_service_location(self) -> ServiceLocation:
        settings = getattr(self.user, "settings", None) or {}
        return ServiceLocation(
            url=self.service_url,
            name=self.service_name,
            token=self.service_token,
            token_service=self.token_service,
            hub_services=settings.get("services") or {},
            config_class=type(self).__name__,
        )

    def wmla_service_client(self) -> ServiceCalls:
        """How the collaborators reach the service (a test puts a scripted service here)."""
        return ServiceClient(self.wmla_service_location())

    def wmla_collaborators(self) -> Collaborators:
        log = self.wmla_log()
        service = self.wmla_service_client()
        group = GpuGroup(self.gpu_group, self.user, self, log)
        release = Release(service, group, log)
        progress = SpawnProgress(log)
        settings = PlanSettings(
            plan_choice=self.plan_choice,
            wmla_plan=self.wmla_plan,
            user_plans=self.user_plans,
            group_plans=self.group_plans,
            default_plan=self.default_plan,
            profiles=self.profiles,
            config_class=type(self).__name__,
            descriptions=self.plan_descriptions,
        )
        return Collaborators(
            plans=PlanChooser(settings, self.user, self.user_options, service, log),
            progress=progress,
            admission=Admission(service, release, group, progress, log),
            release=release,
            poll=JobPoll(service, log),
        )

    # -- which plan, and the spawn page ----------------------------------------------------------
    async def wmla_profile_list(self) -> list[dict]:
        """The initialized profile list: ``profile_list`` (a list, a dict, or a callable of the
        spawner, maybe async), else the deprecated ``profiles``."""
        source = getattr(self, "profile_list", None)
        if callable(source):
            source = source(self)
            if inspect.isawaitable(source):
                source = await source
        return self.wmla_collaborators().plans.profile_list(source)

    async def wmla_check_pick(self) -> None:
        """Refuse (AdmissionError) a profile or option choice in user_options that is not in
        the list; JupyterHub's apply_user_options hook calls it."""
        self.wmla_pick_profile(await self.wmla_profile_list())

    @default("apply_user_options")
    def _wmla_apply_user_options_default(self) -> Any:
        return check_user_options

    def wmla_pick_profile(self, profiles: list[dict]) -> tuple[dict | None, list[dict]]:
        """(the profile in user_options or the default, its overrides in order); the spawn
        remembers the plan it forces."""
        return self.wmla_collaborators().plans.pick_profile(self.wmla_spawn, profiles)

    def wmla_plan_path(self) -> str:
        """The plan this server is charged to (docs/spawner.md "Which plan")."""
        return self.wmla_collaborators().plans.plan_path(self.wmla_spawn)

    def wmla_mapped_plan(self) -> str:
        return self.wmla_collaborators().plans.mapped_plan()

    async def wmla_usable_plans(self) -> list[str]:
        return await self.wmla_collaborators().plans.usable_plans()

    # the spawn page: the profiles as KubeSpawner's form names them, and the plans this user
    # may use; the same on both spawners (each base class has a default of its own)
    @default("options_form")
    def _wmla_options_form_default(self) -> Callable[[Any], Awaitable[str]]:
        return lambda spawner: spawner.wmla_spawn_form()

    @default("options_from_form")
    def _wmla_options_from_form_default(self) -> Callable[[Mapping[str, list]], dict]:
        return self.wmla_options_from_form

    async def wmla_spawn_form(self) -> str:
        profiles = await self.wmla_profile_list()
        return await self.wmla_collaborators().plans.spawn_form(profiles)

    def wmla_options_form(
        self,
        plans: list[str] | None = None,
        profiles: list[dict] | None = None,
        usage: Mapping[str, str] | None = None,
    ) -> str:
        return self.wmla_collaborators().plans.options_form(plans, profiles, usage)

    def wmla_options_from_form(self, formdata: Mapping[str, list]) -> dict:
        return PlanChooser.options_from_form(formdata)

    # -- what a notebook asks for ------------------------------------------------------------------
    def wmla_request(self) -> NotebookRequest:
        """The notebook job's worker, from the traits (a profile's overrides applied)."""
        return NotebookRequest.of(
            gpus=self.gpus,
            notebook_cpu=self.notebook_cpu,
            notebook_memory=self.notebook_memory,
            cpu_guarantee=getattr(self, "cpu_guarantee", None),
            mem_guarantee=getattr(self, "mem_guarantee", None),
            cpu_limit=getattr(self, "cpu_limit", None),
            mem_limit=getattr(self, "mem_limit", None),
        )

    def wmla_job_body(self, plan: str) -> dict:
        return self.wmla_request().job_body(plan=plan, user=self.user.name, server=self.name)

    # -- admission, progress and release -------------------------------------------------------
    async def wmla_admit(self) -> str:
        """Submit the notebook job and wait until it holds its resources; returns the plan."""
        spawn = self.wmla_spawn
        parts = self.wmla_collaborators()
        if spawn.orphans:  # a previous server's job that was never released
            await parts.release.release(spawn)
        spawn.events = []
        spawn.changed = asyncio.Event()
        spawn.stopping = False
        spawn.waiting = True
        try:
            await parts.plans.check_picked_plan(spawn)
            plan = parts.plans.plan_path(spawn)
            request = self.wmla_request()
            body = request.job_body(plan=plan, user=self.user.name, server=self.name)
            await parts.admission.submit(spawn, request, body, self.admission_poll_interval)
            # the folder is there now (made for the notebook job): warn from 90 % of its quota
            note = await storage_note(self.wmla_service_client(), self.user.name, self.wmla_log())
            if note:
                self.wmla_note(note)
            return plan
        finally:
            spawn.waiting = False
            spawn.changed.set()

    def wmla_note(self, message: str, progress: int | None = None) -> None:
        """One more line on the spawn page's progress."""
        SpawnProgress(self.wmla_log()).note(self.wmla_spawn, message, progress)

    async def progress(self) -> AsyncIterator[dict]:
        """The admission's events while it waits, then the base spawner's own."""
        async for event in SpawnProgress.stream(self.wmla_spawn):
            yield event
        async for event in super().progress():
            yield event

    async def wmla_release(self, job_id: str = "") -> None:
        """Cancel the notebook job and any job a cleared state left behind; never raises."""
        await self.wmla_collaborators().release.release(self.wmla_spawn, job_id)

    async def stop(self, now: bool = False) -> None:
        self.wmla_spawn.stopping = True
        job_id = self.wmla_spawn.job_id  # LocalProcessSpawner.stop() clears the state
        try:
            await super().stop(now=now)
        finally:
            await self.wmla_release(job_id)

    def run_post_stop_hook(self) -> Awaitable[None]:
        """JupyterHub runs this after every stop, also of a server that died by itself (when it
        does not call stop()): release whatever job is still held, then the configured hook."""
        configured = super().run_post_stop_hook()

        async def release_then_hook() -> None:
            await self.wmla_release()
            if inspect.isawaitable(configured):
                await configured

        return release_then_hook()

    async def poll(self) -> int | None:
        """The base spawner's answer; and a running server whose notebook job the service ended
        (an admin cancelled it, it reached its runtime limit: TIMEOUT) is stopped here. While
        the hub still waits for the server to come up (``pending``) it is left alone: only a
        poll after the spawn has finished tells the hub that the server stopped (before, its
        spawn would wait ``http_timeout`` for a server that is gone)."""
        status = await super().poll()
        if status is not None or getattr(self, "pending", None):
            return status
        if await self.wmla_collaborators().poll.ended(self.wmla_spawn) is None:
            return status
        await self.stop(now=True)
        return 0

    # -- the kernel's environment, and the state across hub restarts ---------------------------
    def wmla_env(self, folder: str, ipython_dir: str | None) -> dict[str, str]:
        """What the kernel needs; the token is JUPYTERHUB_API_TOKEN (server_token_scopes)."""
        return KernelEnvironment(
            service_url=self.kernel_service_url or self.wmla_service_location().service_url(),
            service_name=self.service_name,
            user=self.user.name,
            leaf=self.wmla_spawn.leaf,
            folder=folder,
            storage_root=self.storage_root,
            job_id=self.wmla_spawn.job_id,
            ipython_dir=ipython_dir,
        ).variables()

    def get_state(self) -> dict:
        return {**super().get_state(), **save_state(self.wmla_spawn)}

    def load_state(self, state: Mapping[str, Any]) -> None:
        super().load_state(state)
        load_state(self.wmla_spawn, state)

    def clear_state(self) -> None:
        # LocalProcessSpawner.poll() clears the state of a server that died by itself before
        # JupyterHub's stop, which then skips stop(): keep the job id to release it
        forget_job(self.wmla_spawn)
        super().clear_state()
