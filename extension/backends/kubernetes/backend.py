"""``KubernetesBackend``: the ``Backend`` protocol (and its Kubernetes capabilities) over the
collaborators it builds from its options, and what it reads of one job (where it stands)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from extension.confine import Control, Enforced, Report
from extension.scheduler import Instance, Node, Resources
from extension.userfs.accounts import Account

from .. import manifests as m
from ..base import BackendEvent, Emit, JobSpec
from .admission import Admission, AdmissionProblem
from .api import ApiFactory, KubeApi, default_api_factory
from .calls import ApiCalls, Backoff
from .events import EventDeriver
from .job_object import JobBuilder
from .jobs import JobRunner
from .logs import WorkerLogs
from .objects import name_of, pod_rank, pod_ready, pod_wait_reason
from .options import Options, resolve
from .queues import QueueSync, QueueWriter
from .state import Cache, Phase, Tracking
from .tasks import Background
from .watch import Watcher

# Every worker pod gets limits equal to its requests (manifests.make_container), which the kubelet
# turns into the container's cgroup; GPUs come through the device plugin, one device per unit.
ENFORCEMENT = Report(
    "kubernetes",
    {
        Control.CPU: Enforced(True, "container limits.cpu (the kubelet's CFS quota)"),
        Control.MEMORY: Enforced(True, "container limits.memory (the kubelet's memory cgroup)"),
        Control.PIDS: Enforced(True, "the kubelet's podPidsLimit (set by the cluster admin)"),
        Control.DEVICES: Enforced(True, "the GPU device plugin mounts only the pod's devices"),
    },
)


class KubernetesBackend:
    """Runs jobs as PyTorchJobs (or Volcano Jobs) in one namespace; see the package docstring.

    Its collaborators, each built here with what it needs: ``watcher`` (watch.py: open/close,
    the list+watch loops) over ``calls`` (calls.py: the connection, retried calls),
    ``admission`` (admission.py: capacity, quota, admission problems), ``jobs`` (jobs.py:
    start/resize/stop/recover) with ``builder`` (job_object.py: the job object), ``queues``
    (queues.py: sync_queues), ``events`` (events.py: the events derived from the cache) and
    ``worker_logs`` (logs.py).
    """

    enforcement = ENFORCEMENT

    def __init__(
        self,
        emit: Emit,
        nodes: Sequence[Node] | None = None,
        state_dir: str | None = None,
        *,
        namespace: str | None = None,
        api_factory: ApiFactory | None = None,
        instance: str | None = None,
        name_prefix: str | None = None,
        job_kind: str | None = None,
        image: str | None = None,
        image_pull_policy: str | None = None,
        storage_claim: str | None = None,
        storage_root: str | None = None,
        mount_path: str | None = None,
        gpu_resource: str | None = None,
        priority_class: str | None = None,
        grace: float = 30.0,
        elastic_launcher: Sequence[str] | None = ("torchrun", "--nproc-per-node=1"),
        service_account: str | None = None,
        node_selector: Mapping[str, str] | None = None,
        tolerations: Sequence[dict] = (),
        ttl_seconds_after_finished: int | None = 3600,
        run_as_uid_base: int | None = None,
        backoff_initial: float = 0.5,
        backoff_max: float = 30.0,
        retry_deadline: float = 120.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``nodes`` and ``state_dir`` are accepted for the service's ``Backend(emit, nodes,
        state_dir)`` call and ignored: the cluster is the source of truth for both. Options left
        at None come from ``WMLA_K8S_<OPTION>`` environment variables (set them in the Helm
        values), then from the defaults documented in docs/kubernetes.md."""
        self.emit = emit
        self.options: Options = resolve(
            namespace=namespace,
            instance=instance,
            name_prefix=name_prefix,
            job_kind=job_kind,
            image=image,
            image_pull_policy=image_pull_policy,
            storage_claim=storage_claim,
            storage_root=storage_root,
            mount_path=mount_path,
            gpu_resource=gpu_resource,
            priority_class=priority_class,
            grace=grace,
            elastic_launcher=elastic_launcher,
            service_account=service_account,
            node_selector=node_selector,
            tolerations=tolerations,
            ttl_seconds_after_finished=ttl_seconds_after_finished,
            run_as_uid_base=run_as_uid_base,
        )
        backoff = Backoff(backoff_initial, backoff_max, retry_deadline, sleep)
        self._assemble(ApiCalls(api_factory or default_api_factory, backoff), clock)

    def _assemble(self, calls: ApiCalls, clock: Callable[[], float]) -> None:
        """Build the collaborators, each given what it needs: what they share is the cache
        (the watcher writes it), the jobs tracked, and the background tasks."""
        o = self.options
        self.calls = calls
        self.cache = Cache()
        self.tracking = Tracking()
        background = Background()
        self.worker_logs = WorkerLogs(
            calls, self.cache, self.tracking, namespace=o.namespace, prefix=o.prefix
        )
        self.events = EventDeriver(
            self._report, self.cache, self.tracking, self.worker_logs, background, clock
        )
        self.watcher = Watcher(
            calls,
            self.cache,
            background,
            self.events.changed,
            namespace=o.namespace,
            instance_name=o.instance_name,
            job_kind=o.job_kind.resource,
        )
        self.admission = Admission(
            self.cache,
            self.tracking,
            self.watcher.has_listed,
            gpu_resource=o.gpu_resource,
            job_kind=o.job_kind,
            node_selector=o.node_selector,
        )
        self.queues = QueueWriter(
            calls,
            self.cache,
            self.admission.quota,
            prefix=o.prefix,
            instance_name=o.instance_name,
            gpu_resource=o.gpu_resource,
            job_kind=o.job_kind.resource,
        )
        self.builder = JobBuilder(o)
        self.jobs = JobRunner(
            calls,
            self.cache,
            self.tracking,
            self.builder,
            self.admission,
            self.queues,
            self.events,
            background,
            closed=lambda: self.watcher.closed,
            clock=clock,
        )

    def _report(self, event: BackendEvent) -> None:
        # Through the attribute at each event: the receiver may be replaced after construction.
        self.emit(event)

    # -- the options read most, as attributes ---------------------------------------------------
    @property
    def namespace(self) -> str:
        return self.options.namespace

    @property
    def instance_name(self) -> str:
        return self.options.instance_name

    @property
    def prefix(self) -> str:
        return self.options.prefix

    @property
    def job_kind(self) -> str:
        return self.options.job_kind.resource

    @property
    def image(self) -> str:
        return self.options.image

    @property
    def storage_root(self) -> str:
        return self.options.storage_root

    @property
    def mount_path(self) -> str:
        return self.options.mount_path

    @property
    def gpu_resource(self) -> str:
        return self.options.gpu_resource

    @property
    def api(self) -> KubeApi:
        """The API client; a BackendError before ``open``."""
        return self.calls.api

    @property
    def api_failures(self) -> int:
        """Calls and watches that met an unreachable or failing server."""
        return self.calls.failures

    # -- the connection ----------------------------------------------------------------------------
    async def open(self, timeout: float | None = None) -> None:
        """Start the list+watch loops and wait until every kind has been listed once."""
        await self.watcher.open(timeout)

    async def close(self) -> None:
        """Stop watching; running jobs are left running (they outlive the service)."""
        await self.watcher.close()

    # -- capacity and admission --------------------------------------------------------------------
    def capacity(self) -> list[Node]:
        """Schedulable, Ready nodes (matching ``node_selector``) with their allocatable."""
        return self.admission.capacity()

    def quota(self) -> Resources:
        """The namespace ResourceQuota's bound on requests (UNLIMITED where none is set)."""
        return self.admission.quota()

    def instance(self) -> Instance:
        """The instance the core schedules: the nodes, cut down by the namespace quota."""
        return self.admission.instance()

    def limit_ranges(self) -> list[dict]:
        return self.admission.limit_ranges()

    def admission_problem(
        self, per_worker: Resources, workers: int, new_object: bool = True
    ) -> AdmissionProblem | None:
        """Would the quota or a LimitRange refuse a pod of this gang? (message, permanent).

        ``new_object`` false for a grow: the job object exists, only pods are added."""
        return self.admission.problem(per_worker, workers, new_object)

    # -- decisions ---------------------------------------------------------------------------------
    def account_for(self, user: str, home: str | None = None) -> Account | None:
        """The identity ``user``'s pods run as (``run_as_uid_base``), for the service to own the
        user's folder with and to touch their files as; None when pods run as their image's
        user. No local account: its name (``k8s:<user>``) is none a machine can have, so no
        group of a local user of the same name comes with it."""
        base = self.options.run_as_uid_base
        if base is None:
            return None
        uid = m.pod_uid(m.validate_username(user), base)
        return Account(f"k8s:{user}", uid, uid, home or "")

    def build_job(self, spec: JobSpec, workers: int) -> dict:
        """The job object for ``spec`` at ``workers`` workers (pure; errors before any call)."""
        return self.builder.build(spec, workers)

    async def start(self, spec: JobSpec, placement: tuple[str, ...]) -> None:
        """Create the job; Volcano chooses the nodes, the ``running`` event reports where the
        pods landed. ``AdmissionRefused`` (nothing created) when the namespace would refuse."""
        await self.open()
        await self.jobs.start(spec, placement)

    async def resize(self, spec: JobSpec, placement: tuple[str, ...], grace: float) -> None:
        """Elastic PyTorchJobs only: set the Worker replicas."""
        await self.open()
        await self.jobs.resize(spec, placement, grace)

    async def stop(self, job_id: str, grace: float, reason: str) -> None:
        """Delete the job and its pods with ``grace`` seconds to checkpoint; ``released``
        follows once the watch shows every pod gone."""
        await self.open()
        await self.jobs.stop(job_id, grace, reason)

    async def recover(self, specs: Sequence[JobSpec]) -> None:
        """Re-adopt jobs by their labels and job-id annotation; ``lost`` for the missing."""
        await self.open()
        await self.jobs.recover(specs)

    def desired_queues(self, plans: Iterable[Any]) -> list[dict]:
        return self.queues.desired_queues(plans)

    async def sync_queues(self, plans: Iterable[Any]) -> QueueSync:
        """Make the Volcano queues mirror the plan tree (create, update, delete)."""
        await self.open()
        return await self.queues.sync_queues(plans)

    # -- one job, read -----------------------------------------------------------------------------
    def describe(self, job_id: str) -> str:
        """Where a job stands, in the cluster's words (why it is not running yet, if it is not)."""
        tracked = self.tracking.get(job_id)
        if tracked is None:
            return f"job {job_id} is not tracked by this backend"
        if tracked.phase in (Phase.RUNNING, Phase.STOPPING):
            return tracked.phase.value
        pods = self.cache.pods_of(tracked.name)
        if self.cache.get(self.job_kind, tracked.name) is None:
            return "waiting for the job object to appear"
        waiting = [p for p in sorted(pods, key=pod_rank) if not pod_ready(p)]
        if waiting:
            return f"pod {name_of(waiting[0])} not ready: {pod_wait_reason(waiting[0])}"
        if len(pods) < tracked.workers:
            return (
                f"{len(pods)} of {tracked.workers} pods created so far by the "
                f"{self.options.job_kind.controller} "
                f"(queue {m.queue_name(tracked.spec.leaf, self.prefix)})"
            )
        return "starting"

    def logs(self, job_id: str, worker: int | None = None, tail: int | None = None) -> str:
        """The logs fetched so far (at finish or failure, or by ``fetch_logs``)."""
        return self.worker_logs.text(job_id, worker, tail)

    async def fetch_logs(self, job_id: str, tail: int | None = 1000) -> dict[int, str]:
        """Read each worker pod's log from the API into what ``logs`` reads."""
        return await self.worker_logs.fetch(job_id, tail)
