"""The wmla service: a JupyterHub-managed tornado application.

JupyterHub starts it (``c.JupyterHub.services``, see ``hub_config.services()``) with its token and
URL in the environment and proxies it at ``/services/wmla/``. Every knob is a trait of
``WmlaService``; set them in a config file given with ``--config`` (``c.WmlaService.x = ...``)
or on the command line (``--WmlaService.x=...``).
"""

from __future__ import annotations

import asyncio
import copy
import gc
import json
import logging
import math
import os
import signal
from pathlib import Path
from typing import Any

from traitlets import Bool, Dict, Float, Int, TraitError, Unicode, Union, default, validate
from traitlets.config import Application, Config

from extension.backends.local import LocalBackend
from extension.scheduler import SchedulerConfig
from extension.storage.settings import (
    StorageSettings,
    build_quotas,
    check_forever,
    load_plan_limits,
    storage_security,
    wire_local_accounts,
)
from extension.storage.web import StorageCollector
from extension.userfs.files import off_loop
from extension.userfs.pool import close_helpers

from .backend_setup import build_backend
from .fair_share import FairShareSettings, seconds_or_off, usage_weights
from .heap import HeapTrim
from .lease import Lease, LeaseHeld, watch
from .privacy import (
    PRIVATE_DIR,
    TRAVERSABLE_DIR,
    make_dir,
    privatize_tree,
    restrict_umask,
    security_report,
)
from .reconcile import hub_api_from_env, hub_fetch, reconcile_forever
from .records import InstanceBounds
from .scheduling import Scheduler
from .store import Store, sqlite_url
from .submission import LimitRange, user_root
from .web import serve

# the plans of a first start (an empty store): /sample-project with training, inference and
# notebooks, open to every hub user
DEFAULT_PLANS: dict[str, dict] = {
    "/sample-project": {},
    "/sample-project/training": {},
    "/sample-project/inference": {},
    "/sample-project/notebooks": {},
}


class WmlaService(Application, StorageSettings):
    name = "wmla-service"
    description = "Resource plans, gang scheduling and metering for JupyterHub (hub service)."

    @default("log_level")
    def _log_level(self) -> int:
        return logging.INFO

    config_file = Unicode(
        "",
        config=True,
        help="""Python config file to load (c.WmlaService.x = ...).

        c.WmlaService.config_file = "/etc/wmla/wmla_service_config.py"
        """,
    )
    aliases = {"config": "WmlaService.config_file", "log-level": "Application.log_level"}

    state_dir = Unicode(
        config=True,
        help="""Where the service keeps its database (SQLite default) and the backend's pid files.

        c.WmlaService.state_dir = "/var/lib/wmla"
        """,
    )

    @default("state_dir")
    def _state_dir(self) -> str:
        return os.environ.get("WMLA_STATE_DIR") or str(Path("var/wmla").resolve())

    db_url = Unicode(
        "",
        config=True,
        help="""SQLAlchemy URL of the store; empty: a SQLite file wmla.sqlite in state_dir.

        c.WmlaService.db_url = "postgresql+psycopg://wmla:secret@db/wmla"
        """,
    )
    storage_root = Unicode(
        config=True,
        help="""The shared storage root; each user's folder is <storage_root>/<user> and every
        job runs in <storage_root>/<user>/jobs/<job-id>.

        c.WmlaService.storage_root = "/gpfs/myresultfs"
        """,
    )

    @default("storage_root")
    def _storage_root(self) -> str:
        return os.environ.get("WMLA_STORAGE_ROOT") or str(Path("var/storage").resolve())

    backend_class = Unicode(
        "extension.backends.local.LocalBackend",
        config=True,
        help="""Import string of the execution backend, constructed as
        Backend(emit, nodes, state_dir) and used through extension.backends.base.Backend.

        c.WmlaService.backend_class = "extension.backends.local.LocalBackend"
        """,
    )
    backend_options = Dict(
        config=True,
        help="""Keyword arguments for the backend class after (emit, nodes, state_dir), e.g. the
        local backend's run_as_user, python or poll_interval.

        c.WmlaService.backend_options = {"run_as_user": False}
        """,
    )
    device_layout = Unicode(
        "",
        config=True,
        help="""Local devices as NODESxDEVICES; empty: the real GPUs (NVML or nvidia-smi) as one
        node, or 1x4 virtual devices on a machine without GPUs.

        c.WmlaService.device_layout = "4x8"
        """,
    )
    cpu_oversubscription = Float(
        1.0,
        config=True,
        help="""Factor on the machine's cores offered to jobs (cpu requests are reservations,
        not pinning): on a small laptop, 2.0 lets twice as many workers start.

        c.WmlaService.cpu_oversubscription = 2.0
        """,
    )
    max_pending_per_user = Int(
        1000,
        config=True,
        help="""Most jobs one user may have pending at once (Slurm's MaxSubmitJobs): one more
        is answered 429 with the figure, and nothing is stored. 0: no cap.

        c.WmlaService.max_pending_per_user = 200
        """,
    )

    @validate("max_pending_per_user")
    def _check_max_pending(self, proposal: dict) -> int:
        if proposal["value"] < 0:
            raise TraitError("c.WmlaService.max_pending_per_user must be 0 (no cap) or more")
        return proposal["value"]

    quota = Dict(
        config=True,
        help="""Instance quota capping the root plan, as a ResourceQuota: gpu, cpu, memory and
        jobs (most jobs running at once). Unset entries are unlimited.

        c.WmlaService.quota = {"gpu": 4, "cpu": "8", "memory": "32Gi", "jobs": 3}
        """,
    )
    limit_range = Dict(
        config=True,
        help="""Per-worker limit range, as a LimitRange of type Container: min, max, default
        (limits), default_request, max_limit_request_ratio. The default asks for 1 GPU, 250m
        cpu and 512Mi memory per worker, so a 2-core laptop still runs several workers.

        c.WmlaService.limit_range = {"min": {"cpu": "100m"}, "max": {"cpu": "1", "memory": "1Gi"},
            "default": {"cpu": "900m", "memory": "800Mi"},
            "default_request": {"cpu": "200m", "memory": "200Mi"},
            "max_limit_request_ratio": {"cpu": 2, "memory": 1.5}}
        """,
    )

    @default("limit_range")
    def _limit_range(self) -> dict:
        return {
            "min": {"cpu": "10m", "memory": "16Mi"},
            "default_request": {"gpu": 1, "cpu": "250m", "memory": "512Mi"},
        }

    max_workers_per_job = Int(
        256,
        config=True,
        help="""Most workers one job may ask for.

        c.WmlaService.max_workers_per_job = 64
        """,
    )
    grace = Float(
        30.0,
        config=True,
        help="""Seconds between SIGTERM and SIGKILL when a job is preempted, shrunk or cancelled.

        c.WmlaService.grace = 30
        """,
    )
    min_runtime = Float(
        60.0,
        config=True,
        help="""A job started less than this many seconds ago is never a reclaim victim: without
        it a borrowing gang can be stopped again and again as jobs come and go (trace replays
        of Philly showed a 12-day job preempted 256 times with 0). 0 reclaims at once.

        c.WmlaService.min_runtime = 120
        """,
    )
    fair_share_half_life = Union(
        [Float(), Unicode()],
        default_value=0.0,
        config=True,
        help="""Weigh each plan's share by its usage over days: usage decays by half every this
        many seconds (or a duration: "7d", "12h"), and a plan that used more than its share
        deserves less while others contend, as Slurm's PriorityDecayHalfLife (docs/scheduling.md
        "Deserved share 2"). 0: shares follow this moment's demand only.

        c.WmlaService.fair_share_half_life = "7d"
        """,
    )
    fair_share_weights = Dict(
        config=True,
        help="""What one second of each resource counts as usage: per GPU, per CPU core, per
        GiB of memory (Kueue's resourceWeights). Default: GPUs only.

        c.WmlaService.fair_share_weights = {"gpu": 1, "cpu": 0.05}
        """,
    )
    usage_reset_period = Union(
        [Float(), Unicode()],
        default_value=0.0,
        config=True,
        help="""Forget all usage at every multiple of this period since the epoch (Slurm's
        PriorityUsageResetPeriod), e.g. "30d". 0: never.

        c.WmlaService.usage_reset_period = "30d"
        """,
    )
    max_gang_wait = Union(
        [Float(), Unicode()],
        default_value=0.0,
        config=True,
        help="""A gang that smaller jobs keep overtaking and that has waited this long holds the
        reservation first whatever the fair order says, and once started is never preempted
        (docs/scheduling.md "Admission 6"). 0: no such rule.

        c.WmlaService.max_gang_wait = "4h"
        """,
    )

    @validate("fair_share_half_life", "usage_reset_period", "max_gang_wait")
    def _fair_share_durations(self, proposal: Any) -> float:
        return seconds_or_off(proposal["value"], f"c.WmlaService.{proposal['trait'].name}")

    @validate("fair_share_weights")
    def _fair_share_weights(self, proposal: Any) -> dict:
        usage_weights(proposal["value"], "c.WmlaService.fair_share_weights")
        return proposal["value"]

    notebook_runtime_limit = Bool(
        False,
        config=True,
        help="""Notebook servers get their plans' runtime limits too (as training jobs): at the
        limit the service ends the job TIMEOUT and the spawner's next poll stops the server.

        c.WmlaService.notebook_runtime_limit = True
        """,
    )
    lease_seconds = Float(
        15.0,
        config=True,
        help="""Seconds the service's lease on its database lasts unless renewed (every third of
        it). One service per database: a second one waits this long for the lease, then exits
        naming the holder; a crashed holder's lease runs out in this time.

        c.WmlaService.lease_seconds = 15
        """,
    )

    @validate("lease_seconds")
    def _lease_seconds(self, proposal: Any) -> float:
        value = proposal["value"]
        if not 3 <= value <= 3600:
            raise TraitError(
                f"c.WmlaService.lease_seconds must be between 3 and 3600 seconds, not {value}"
            )
        return value

    reconcile_seconds = Float(
        60.0,
        config=True,
        help="""Seconds between looks at the hub's servers: a live notebook job that no server of
        its user holds any more (the hub was killed, a release was lost) is ended and its
        resources freed. 0 turns it off. Needs the hub API (a hub-managed service).

        c.WmlaService.reconcile_seconds = 60
        """,
    )
    reconcile_grace = Float(
        90.0,
        config=True,
        help="""Seconds a notebook job is left alone after it started, before the hub is asked
        whether a server holds it (a server still spawning may not be listed yet).

        c.WmlaService.reconcile_grace = 90
        """,
    )

    tick = Float(
        5.0,
        config=True,
        help="""Seconds between scheduling cycles when nothing happens (cycles also run on every
        submission, cancel, plan change and backend event).

        c.WmlaService.tick = 5
        """,
    )
    estimate_interval = Float(
        2.0,
        config=True,
        help="""Seconds at least between two estimates of the waiting line (the core run
        forward in a child process: docs/service.md, "Why a job waits"). 0: no estimates.

        c.WmlaService.estimate_interval = 2
        """,
    )
    estimate_budget = Float(
        0.15,
        config=True,
        help="""Seconds of work one estimate of the waiting line may take; beyond it events
        are grouped, then the jobs not reached get a rough start (docs/simulate.md).

        c.WmlaService.estimate_budget = 0.15
        """,
    )
    default_runtime = Float(
        3600.0,
        config=True,
        help="""Seconds a job without a limit is assumed to run, lacking any history (estimates).

        c.WmlaService.default_runtime = 3600
        """,
    )

    @validate("estimate_interval", "estimate_budget", "default_runtime")
    def _estimate_knobs(self, proposal: Any) -> float:
        value, name = proposal["value"], proposal["trait"].name
        low = 0.0 if name == "estimate_interval" else 0.01
        if not math.isfinite(value) or value < low:
            raise TraitError(
                f"c.WmlaService.{name} must be a number of seconds of at least {low:g}, not {value}"
            )
        return value

    default_plans = Dict(
        config=True,
        help="""Plans created on the first start (an empty store), as {path: {share, limit,
        members}}.

        c.WmlaService.default_plans = {"/sample-project": {}, "/sample-project/training": {}}
        """,
    )

    @default("default_plans")
    def _default_plans(self) -> dict:
        return copy.deepcopy(DEFAULT_PLANS)

    python = Unicode(
        "python",
        config=True,
        help="""Python interpreter that runs training scripts, as a job's command names it.
        "python" (default) leaves the choice to the backend, so the job shows what really runs
        it: the local backend's own interpreter (the service's, or for an account that cannot
        run that one the system Python of the same version over the service's packages), the
        image's on Kubernetes.

        c.WmlaService.python = "/opt/conda/bin/python"
        """,
    )
    ip = Unicode(
        "",
        config=True,
        help="""Interface to listen on; empty: the host of JUPYTERHUB_SERVICE_URL.

        c.WmlaService.ip = "127.0.0.1"
        """,
    )
    port = Int(
        0,
        config=True,
        help="""Port to listen on; 0: the port of JUPYTERHUB_SERVICE_URL (or 10101).

        c.WmlaService.port = 10101
        """,
    )
    prefix = Unicode(
        config=True,
        help="""URL prefix; default JUPYTERHUB_SERVICE_PREFIX (/services/wmla/).

        c.WmlaService.prefix = "/services/wmla/"
        """,
    )

    @default("prefix")
    def _prefix(self) -> str:
        return os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/wmla/")

    # -- derived ---------------------------------------------------------------------------------
    @property
    def limit_range_obj(self) -> LimitRange:
        return self._limit_range_obj

    def user_folder(self, user: str) -> Path:
        return user_root(self.storage_root, user)

    def initialize(self, argv: Any = None) -> None:
        super().initialize(argv)
        # lowest first: $WMLA_SERVICE_CONFIG (from hub_config.services), the file, the command line
        env_config = os.environ.get("WMLA_SERVICE_CONFIG")
        if env_config:
            try:
                self.update_config(Config(json.loads(env_config)))
            except ValueError as err:
                raise SystemExit(f"wmla: $WMLA_SERVICE_CONFIG is not JSON config: {err}") from None
        if self.config_file:
            self.load_config_file(self.config_file)
        self.update_config(self.cli_config)
        logging.getLogger("alembic").setLevel(logging.WARNING)
        try:
            self._limit_range_obj = LimitRange.from_config(self.limit_range)
        except ValueError as err:
            raise SystemExit(f"wmla: c.WmlaService.limit_range: {err}") from None
        try:
            self._bounds = InstanceBounds.from_config(self.quota)
        except ValueError as err:
            raise SystemExit(f"wmla: c.WmlaService.{err}") from None
        self._quota_policy = self.quota_policy()
        self.prepare_folders()

    def prepare_folders(self) -> None:
        """The storage root (traversable) and the state directory (private, fixed if looser)."""
        # storage first: missing parents it shares with the state dir (var/) become 0711, so
        # every account still reaches its own folder; never walked: users own what is inside
        if make_dir(self.storage_root, TRAVERSABLE_DIR):
            self.log.info("created the storage root %s (mode 0711)", self.storage_root)
        make_dir(self.state_dir, PRIVATE_DIR)
        # the store holds every job's environment: other accounts must not read a byte of it,
        # whatever mode an older version or an admin's cp left behind
        # the storage images' mounts hold users' files: never walked either
        quota_mounts = self.quota_dir(self.state_dir) / "mnt"
        fix = privatize_tree(self.state_dir, keep_out=[self.storage_root, quota_mounts])
        for warning in fix.warnings(self.state_dir):
            self.log.warning(warning)

    def security_report(self) -> dict[str, Any]:
        """How well this machine keeps users apart (privacy.security_report)."""
        backend = getattr(getattr(self, "scheduler", None), "backend", None)
        report = security_report(self.state_dir, self.storage_root, backend)
        return storage_security(getattr(self, "storage", None), report)

    async def start_storage(self) -> None:
        """The users' storage quotas (extension/storage): images mounted again, seen by the
        scheduler's submissions and by /metrics."""
        sched = self.scheduler  # its plan tree is replaced at each change: read it each time
        quota_dir = self.quota_dir(self.state_dir)
        self.storage = build_quotas(
            self._quota_policy, quota_dir, self.storage_root, lambda: sched.plans, self.log
        )
        self.plan_limits = await load_plan_limits(self.storage, sched.db, self.store)
        await off_loop(self.storage.start)
        sched.storage = self.storage
        self.meter.registry.register(StorageCollector(self.storage))

    def make_backend(self, emit: Any) -> Any:
        return build_backend(
            self.backend_class,
            emit,
            device_layout=self.device_layout,
            cpu_oversubscription=self.cpu_oversubscription,
            state_dir=self.state_dir,
            options=self.backend_options,
        )

    async def start_service(self) -> None:
        url = self.db_url or sqlite_url(Path(self.state_dir) / "wmla.sqlite")
        self.store = Store.open(url)
        self.scheduler = Scheduler(
            self.store,
            self._bounds,
            SchedulerConfig(
                grace=self.grace,
                min_runtime=self.min_runtime,
                fair_share_half_life=float(self.fair_share_half_life),
                max_gang_wait=float(self.max_gang_wait),
            ),
            storage_root=self.storage_root,
            python=self.python,
            tick=self.tick,
            log=self.log,
            max_pending_per_user=self.max_pending_per_user,
            fair_share=FairShareSettings(
                float(self.fair_share_half_life),
                usage_weights(self.fair_share_weights, "c.WmlaService.fair_share_weights"),
                float(self.usage_reset_period),
                float(self.max_gang_wait),
            ),
        )
        self.scheduler.limits.notebooks = self.notebook_runtime_limit
        # before anything is read or recovered: a second service on this database waits, then
        # leaves (docs/service.md, "When the database fails, and restarts")
        self.lease = Lease(self.store, self.scheduler.db, ttl=self.lease_seconds)
        try:
            await self.lease.take()
        except LeaseHeld as err:
            self.scheduler.db.close()
            self.store.close()
            raise SystemExit(f"wmla: {err}") from None
        self.scheduler.load(self.default_plans)
        line = self.scheduler.queue
        line.interval, line.budget = self.estimate_interval, self.estimate_budget
        line.default_runtime = self.default_runtime
        from extension.metering.meter import Metering  # metering: ledger, Prometheus

        self.meter = Metering(parent=self, store=self.store)
        self.meter.attach(self.scheduler)
        # the C heap's free pages back to the system now and then (heap.py; issue 31)
        self.scheduler.cycle_hooks.append(HeapTrim(self.log).after_cycle)
        await self.start_storage()
        backend = self.make_backend(self.scheduler.emit)
        if isinstance(backend, LocalBackend):  # a failed job's quota, a job's private /tmp
            wire_local_accounts(self.storage, backend.accounts)
        await self.scheduler.start(backend)
        for warning in self.security_report()["warnings"]:
            self.log.warning("\n!!! wmla: %s", warning)
        self.http = await serve(self, self.ip, self.port, self.prefix)
        self.log.info("store %s", url)
        inst = self.scheduler.instance
        self.log.info("capacity: %s on %i node(s)", inst.capacity.describe(), len(inst.nodes))

    async def run(self) -> None:
        parent = os.getppid()  # the hub, for a managed service: it must not outlive the hub
        await self.start_service()
        # what starting made lives as long as the service: kept out of the collector's full
        # passes, which walked it all (55,000 objects: 75 ms each, every 1.5 s under load)
        gc.collect()
        gc.freeze()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            # restore SIGINT: a process started with & from a script inherits it ignored, and
            # JupyterHub stops services with SIGINT first
            loop.add_signal_handler(sig, stop.set)
        watcher = asyncio.ensure_future(watch(self.lease, stop, parent if parent > 1 else None))
        hub = hub_api_from_env()
        if hub is not None and self.reconcile_seconds > 0:
            reconciler = reconcile_forever(
                self.scheduler, hub_fetch(*hub), self.reconcile_seconds, self.reconcile_grace, stop
            )
            asyncio.ensure_future(reconciler)
        checks = asyncio.ensure_future(
            check_forever(self.storage, stop, self.storage_check_seconds, self.log)
        )
        await stop.wait()
        checks.cancel()
        self.log.info("wmla service stopping")
        self.http.stop()
        await self.scheduler.stop()
        close_helpers()  # the users' pooled file helpers (atexit would too, but later)
        watcher.cancel()
        self.lease.release()
        self.store.close()

    def start(self) -> None:
        asyncio.run(self.run())


def main(argv: list[str] | None = None) -> None:
    # here, not in initialize(): the umask is the whole process's (tests and embedders that
    # initialize a WmlaService in their own process keep theirs); every file the service and
    # its workers create without an explicit mode is then private to their account
    restrict_umask()
    service = WmlaService()
    service.initialize(argv)
    service.start()
