"""The Kubernetes backend: Kubeflow PyTorchJobs (or Volcano Jobs), gang-scheduled by Volcano.

Only this module talks to the Kubernetes API; every object it sends is built by
``manifests.py``. It has three parts:

1. A **read-only cache** of what the cluster holds (nodes, our pods, our jobs, our queues, the
   namespace's ResourceQuotas and LimitRanges), filled by one list+watch loop per kind. A watch
   that breaks (API server briefly unreachable, ``410 Gone``) backs off and lists again, so the
   cache converges to the server's state and nothing seen while away is lost.
2. **Event derivation**: after every cache change, each tracked job's observed state is compared
   with what was last reported, and ``running``/``resized``/``finished``/``failed``/``released``
   events are emitted once each. This reads the cache only: no decisions, no API calls.
3. **Applying decisions**: ``start``/``resize``/``stop``/``sync_queues`` turn the core's decisions
   into creates, patches and deletes (preemption = delete with the grace period). Each call is
   retried with exponential backoff while the API server is unreachable; a create that meets
   ``409 AlreadyExists`` adopts the object when it is ours (the first try may have landed) and
   waits for it to go when it is still terminating.

Before anything is created, ``admission_problem`` checks the whole gang against the namespace's
ResourceQuotas and LimitRanges, as the API server's admission would, so a gang is never half
created because its third pod was refused. ``capacity()`` is the nodes' allocatable resources;
``quota()`` the namespace quota that cuts the instance down (SCHEDULING.md "Instance").

After a service restart, ``recover`` finds the jobs again by their labels and annotations and
reports ``lost`` for those that are gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import posixpath
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from extension.scheduler import UNLIMITED, Instance, Node, Resources, parse_quantity

from . import base
from . import manifests as m
from .base import BackendEvent, Emit, JobSpec

log = logging.getLogger(__name__)

# The kinds the backend lists and watches, and where they live.
NODES = "nodes"
PODS = "pods"
QUOTAS = "resourcequotas"
LIMIT_RANGES = "limitranges"
PYTORCHJOBS = "pytorchjobs"
VOLCANO_JOBS = "volcanojobs"
QUEUES = "queues"
CLUSTER_SCOPED = (NODES, QUEUES)

# PyTorchJob pods carry these labels (training-operator v1).
_OP_REPLICA_TYPE = "training.kubeflow.org/replica-type"
_OP_REPLICA_INDEX = "training.kubeflow.org/replica-index"
_VC_TASK = "volcano.sh/task-spec"
_VC_TASK_INDEX = "volcano.sh/task-index"

_RETRIABLE = (0, 408, 429, 500, 502, 503, 504)


class ApiError(Exception):
    """An answer from the API server (``status``) or none at all (``status == 0``)."""

    def __init__(self, status: int, reason: str = "", message: str = "") -> None:
        super().__init__(f"{status} {reason}: {message}".strip())
        self.status = status
        self.reason = reason
        self.message = message


class BackendError(RuntimeError):
    """A decision that could not be carried out; the message says why."""


class AdmissionRefused(BackendError, base.AdmissionRefused):
    """The namespace's ResourceQuota or LimitRange would refuse a pod of this gang.

    Raised by ``start``/``resize`` before anything is created. ``permanent`` is true when the
    gang can never fit (its request alone exceeds a hard limit), false when it may fit later.
    """


class KubeApi(Protocol):
    """The narrow slice of the Kubernetes API the backend uses; objects are plain dicts.

    ``KubernetesAsyncioApi`` is the real one; tests inject an in-memory fake.
    """

    async def list(
        self, kind: str, namespace: str | None, label_selector: str | None
    ) -> tuple[list[dict], str]: ...

    def watch(
        self, kind: str, namespace: str | None, label_selector: str | None, resource_version: str
    ) -> AsyncIterator[tuple[str, dict]]: ...

    async def get(self, kind: str, namespace: str | None, name: str) -> dict: ...

    async def create(self, kind: str, namespace: str | None, body: dict) -> dict: ...

    async def replace(self, kind: str, namespace: str | None, name: str, body: dict) -> dict: ...

    async def patch(self, kind: str, namespace: str | None, name: str, body: dict) -> dict: ...

    async def delete(
        self,
        kind: str,
        namespace: str | None,
        name: str,
        grace_seconds: int | None = None,
        propagation: str | None = None,
    ) -> None: ...

    async def read_log(
        self, namespace: str, pod: str, container: str | None, tail: int | None
    ) -> str: ...

    async def close(self) -> None: ...


ApiFactory = Callable[[], "KubeApi | Awaitable[KubeApi]"]


# -- pure helpers over Kubernetes objects --------------------------------------------------------
def _meta(obj: Mapping) -> Mapping:
    return obj.get("metadata") or {}


def _name(obj: Mapping) -> str:
    return _meta(obj).get("name", "")


def _labels(obj: Mapping) -> Mapping[str, str]:
    return _meta(obj).get("labels") or {}


def _annotations(obj: Mapping) -> Mapping[str, str]:
    return _meta(obj).get("annotations") or {}


def _deleting(obj: Mapping) -> bool:
    return bool(_meta(obj).get("deletionTimestamp"))


def _quantity(key: str, value: Any, gpu_resource: str) -> float:
    """A ResourceList entry in the scheduler's units (cpu millicores, memory bytes, devices)."""
    base = key.split(".", 1)[1] if key.startswith(("requests.", "limits.")) else key
    if base == "cpu":
        return parse_quantity("cpu", value, where=key)
    if base == "memory":
        return parse_quantity("memory", value, where=key)
    if base == gpu_resource:
        return parse_quantity("gpu", value, where=key)
    return float(parse_quantity("memory", value, where=key))  # plain counts (pods, count/...)


def node_capacity(node: Mapping, gpu_resource: str = m.DEFAULT_GPU_RESOURCE) -> Node | None:
    """A schedulable, Ready node as a scheduler ``Node`` (its allocatable), else None."""
    if (node.get("spec") or {}).get("unschedulable"):
        return None
    conditions = (node.get("status") or {}).get("conditions") or []
    if any(c.get("type") == "Ready" and c.get("status") != "True" for c in conditions):
        return None
    alloc = (node.get("status") or {}).get("allocatable") or {}
    return Node(
        _name(node),
        Resources(
            _quantity(gpu_resource, alloc.get(gpu_resource, 0), gpu_resource),
            _quantity("cpu", alloc.get("cpu", 0), gpu_resource),
            _quantity("memory", alloc.get("memory", 0), gpu_resource),
        ),
    )


def quota_cut(quotas: Iterable[Mapping], gpu_resource: str = m.DEFAULT_GPU_RESOURCE) -> Resources:
    """The tightest request bound the namespace's ResourceQuotas put on (gpu, cpu, memory)."""
    cut = [UNLIMITED, UNLIMITED, UNLIMITED]
    keys = (
        (0, (f"requests.{gpu_resource}",)),
        (1, ("requests.cpu", "cpu")),
        (2, ("requests.memory", "memory")),
    )
    for quota in quotas:
        hard = (quota.get("spec") or {}).get("hard") or {}
        for index, names in keys:
            for key in names:
                if key in hard:
                    cut[index] = min(cut[index], _quantity(key, hard[key], gpu_resource))
    return Resources(*cut)


@dataclass(frozen=True)
class PodAsk:
    """What one pod of a gang will be charged: effective requests and limits after defaults."""

    requests: dict[str, float]
    limits: dict[str, float]


def effective_pod(
    per_worker: Resources,
    limit_ranges: Iterable[Mapping],
    gpu_resource: str = m.DEFAULT_GPU_RESOURCE,
) -> PodAsk:
    """Requests and limits of one worker pod as the API server will see them.

    The backend sets limits equal to requests for what the job asks; a resource the job leaves
    at 0 is not written, so a LimitRange ``defaultRequest``/``default`` fills it in, and that is
    what the quota charges.
    """
    requests: dict[str, float] = {}
    limits: dict[str, float] = {}
    for name, amount in (("cpu", per_worker.cpu), ("memory", per_worker.memory)):
        if amount:
            requests[name] = limits[name] = float(amount)
    if per_worker.gpu:
        requests[gpu_resource] = limits[gpu_resource] = float(per_worker.gpu)
    for lr in limit_ranges:
        for item in (lr.get("spec") or {}).get("limits") or []:
            if item.get("type") != "Container":
                continue
            default = item.get("default") or {}
            default_request = item.get("defaultRequest") or {}
            for name in ("cpu", "memory"):
                if name in requests:
                    continue
                if name in default_request:
                    requests[name] = _quantity(name, default_request[name], gpu_resource)
                elif name in default:
                    requests[name] = _quantity(name, default[name], gpu_resource)
                if name in default and name not in limits:
                    limits[name] = _quantity(name, default[name], gpu_resource)
    return PodAsk(requests, limits)


def limit_range_problem(
    ask: PodAsk, limit_ranges: Iterable[Mapping], gpu_resource: str = m.DEFAULT_GPU_RESOURCE
) -> str | None:
    """Why a LimitRange would refuse a one-container worker pod, or None."""
    for lr in limit_ranges:
        where = f"LimitRange {_name(lr)}"
        for item in (lr.get("spec") or {}).get("limits") or []:
            kind = item.get("type")
            if kind not in ("Container", "Pod"):
                continue
            for name, bound in (item.get("min") or {}).items():
                low = _quantity(name, bound, gpu_resource)
                for what, values in (("request", ask.requests), ("limit", ask.limits)):
                    if values.get(name, 0) < low:
                        return (
                            f"{where} refuses the worker pod: {kind} {name} {what} "
                            f"{_show(name, values.get(name, 0))} is below the minimum {bound}"
                        )
            for name, bound in (item.get("max") or {}).items():
                high = _quantity(name, bound, gpu_resource)
                if name not in ask.limits:
                    return (
                        f"{where} refuses the worker pod: {kind} {name} has a maximum of {bound} "
                        f"but the pod sets no {name} limit; ask for {name} explicitly"
                    )
                for what, values in (("request", ask.requests), ("limit", ask.limits)):
                    if values.get(name, 0) > high:
                        return (
                            f"{where} refuses the worker pod: {kind} {name} {what} "
                            f"{_show(name, values[name])} is above the maximum {bound}; ask for "
                            f"at most {bound} per worker"
                        )
            for name, ratio in (item.get("maxLimitRequestRatio") or {}).items():
                req, lim = ask.requests.get(name, 0), ask.limits.get(name, 0)
                if req and lim / req > float(ratio) + 1e-9:
                    return (
                        f"{where} refuses the worker pod: {name} limit/request ratio "
                        f"{lim / req:g} is above {ratio}"
                    )
    return None


def quota_problem(
    ask: PodAsk,
    pods: int,
    quotas: Iterable[Mapping],
    in_flight: Mapping[str, float] | None = None,
    gpu_resource: str = m.DEFAULT_GPU_RESOURCE,
    objects: Mapping[str, float] | None = None,
) -> tuple[str, bool] | None:
    """Why a ResourceQuota would refuse one of ``pods`` such pods, and whether for ever.

    ``in_flight`` is what our already-created jobs will still charge (pods the operator has not
    created yet), keyed like quota entries; the quota's ``status.used`` does not show it yet.
    ``objects`` are object counts the job adds, e.g. ``{"count/pytorchjobs.kubeflow.org": 1}``.
    """
    need: dict[str, float] = {"pods": float(pods), **(objects or {})}
    for name, value in ask.requests.items():
        need[f"requests.{name}"] = value * pods
    for name, value in ask.limits.items():
        need[f"limits.{name}"] = value * pods
    need["cpu"] = need.get("requests.cpu", 0.0)
    need["memory"] = need.get("requests.memory", 0.0)
    for quota in quotas:
        hard = (quota.get("spec") or {}).get("hard") or {}
        used = (quota.get("status") or {}).get("used") or {}
        for key, bound in sorted(hard.items()):
            if key not in need or not need[key]:
                continue
            limit = _quantity(key, bound, gpu_resource)
            in_use = _quantity(key, used.get(key, 0), gpu_resource) + (in_flight or {}).get(key, 0)
            if need[key] > limit:
                return (
                    f"ResourceQuota {_name(quota)} refuses the job: {pods} worker(s) need "
                    f"{key} {_show(key, need[key])}, more than the hard limit {bound}; "
                    "ask for fewer workers or less per worker",
                    True,
                )
            if in_use + need[key] > limit:
                return (
                    f"ResourceQuota {_name(quota)} has no room: {key} {_show(key, in_use)} in use "
                    f"+ {_show(key, need[key])} asked > hard {bound}",
                    False,
                )
    return None


def _show(key: str, value: float) -> str:
    base = key.split(".", 1)[1] if key.startswith(("requests.", "limits.")) else key
    if base == "cpu":
        return m.format_cpu(value)
    if base == "memory":
        return m.format_memory(value)
    return f"{value:g}"


def job_condition(obj: Mapping, kind: str) -> str:
    """``Succeeded``, ``Failed``, ``Running`` or ``Pending`` from a job object's status."""
    status = obj.get("status") or {}
    if kind == VOLCANO_JOBS:
        phase = (status.get("state") or {}).get("phase", "")
        if phase == "Completed":
            return "Succeeded"
        if phase in ("Failed", "Aborted", "Aborting", "Terminated", "Terminating"):
            return "Failed"
        return "Running" if phase == "Running" else "Pending"
    last = "Pending"
    for cond in status.get("conditions") or []:
        if cond.get("status") != "True":
            continue
        if cond.get("type") in ("Succeeded", "Failed"):
            return str(cond["type"])
        if cond.get("type") == "Running":
            last = "Running"
    return last


def condition_message(obj: Mapping) -> str:
    status = obj.get("status") or {}
    for cond in reversed(status.get("conditions") or []):
        if cond.get("status") == "True" and cond.get("message"):
            return str(cond["message"])
    return str((status.get("state") or {}).get("message", ""))


def job_workers(obj: Mapping, kind: str) -> int:
    spec = obj.get("spec") or {}
    if kind == VOLCANO_JOBS:
        return sum(int(t.get("replicas", 0)) for t in spec.get("tasks") or [])
    return sum(int(r.get("replicas", 0)) for r in (spec.get("pytorchReplicaSpecs") or {}).values())


def pod_ready(pod: Mapping) -> bool:
    if _deleting(pod):
        return False
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def pod_rank(pod: Mapping) -> tuple[int, int, str]:
    """Sort key giving ranks: the master first, then workers by index (name as tie-break)."""
    labels = _labels(pod)
    role = (labels.get(_OP_REPLICA_TYPE) or labels.get(_VC_TASK) or "").lower()
    index = labels.get(_OP_REPLICA_INDEX) or _annotations(pod).get(_VC_TASK_INDEX)
    if index is None:
        tail = _name(pod).rsplit("-", 1)[-1]
        index = tail if tail.isdigit() else "0"
    return (0 if role == "master" else 1, int(index), _name(pod))


def pod_wait_reason(pod: Mapping) -> str:
    """Why a pod is not ready yet, in the words the cluster used."""
    status = pod.get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return f"{cond.get('reason', 'Unschedulable')}: {cond.get('message', '')}".strip()
    for cs in status.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting")
        if waiting:
            return f"{waiting.get('reason', 'Waiting')}: {waiting.get('message', '')}".strip(": ")
    return f"phase {status.get('phase', 'Pending')}"


def _ended_pod(pod: Mapping) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def pod_exit(pod: Mapping) -> int | None:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (cs.get("state") or {}).get("terminated")
        if terminated and terminated.get("exitCode"):
            return int(terminated["exitCode"])
    return None


# -- the cache -----------------------------------------------------------------------------------
class Cache:
    """What the watches have seen, by kind and name. Read it; only the watch loop writes it."""

    def __init__(self) -> None:
        self._objects: dict[str, dict[str, dict]] = {}
        self.resource_version: dict[str, str] = {}

    def replace(self, kind: str, items: Iterable[dict], resource_version: str) -> None:
        self._objects[kind] = {self._key(o): o for o in items}
        self.resource_version[kind] = resource_version

    def apply(self, kind: str, event: str, obj: dict) -> None:
        objects = self._objects.setdefault(kind, {})
        if event == "DELETED":
            objects.pop(self._key(obj), None)
        elif event in ("ADDED", "MODIFIED"):
            objects[self._key(obj)] = obj
        version = _meta(obj).get("resourceVersion")
        if version:
            self.resource_version[kind] = version

    def get(self, kind: str, name: str) -> dict | None:
        return self._objects.get(kind, {}).get(name)

    def all(self, kind: str) -> list[dict]:
        return [self._objects[kind][k] for k in sorted(self._objects.get(kind, {}))]

    @staticmethod
    def _key(obj: Mapping) -> str:
        return _name(obj)


@dataclass
class _Tracked:
    spec: JobSpec
    name: str
    kind: str
    phase: str = "starting"  # starting, running, resizing, stopping
    workers: int = 0  # the size asked for (the target during a resize)
    seen: bool = False  # the job object has been in the cache
    reason: str = ""
    placement: tuple[str, ...] = ()


@dataclass
class QueueSync:
    """What ``sync_queues`` changed, by queue name."""

    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # not in the plans but still holding jobs
    failed: list[str] = field(default_factory=list)  # "<queue>: <why>", left as they were


# -- the backend ---------------------------------------------------------------------------------
class KubernetesBackend:
    """Runs jobs as PyTorchJobs (or Volcano Jobs) in one namespace; see the module docstring."""

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
        job_kind = _option("job_kind", job_kind, "pytorchjob")
        if job_kind not in ("pytorchjob", "volcanojob"):
            raise ValueError(f"job_kind {job_kind!r} must be 'pytorchjob' or 'volcanojob'")
        self.prefix = _option("name_prefix", name_prefix, "wmla")
        m.queue_name("/", self.prefix)  # validates the prefix now, not at the first job
        self.emit = emit
        self.namespace = _option("namespace", namespace, _current_namespace())
        self.api_factory = api_factory or default_api_factory
        self.instance_name = _option("instance", instance, "wmla")
        self.job_kind = PYTORCHJOBS if job_kind == "pytorchjob" else VOLCANO_JOBS
        self.image = _option("image", image, "pytorch/pytorch:2.3.1-cuda12.1-cudnn8-runtime")
        self.image_pull_policy = _option("image_pull_policy", image_pull_policy, None)
        self.storage_claim = _option("storage_claim", storage_claim, "wmla-user-data")
        self.storage_root = _option("storage_root", storage_root, "/gpfs/myresultfs")
        self.mount_path = _option("mount_path", mount_path, "/gpfs/myresultfs/{user}")
        self.gpu_resource = _option("gpu_resource", gpu_resource, m.DEFAULT_GPU_RESOURCE)
        self.priority_class = _option("priority_class", priority_class, None)
        self.grace = grace
        self.elastic_launcher = list(elastic_launcher or ())
        self.service_account = _option("service_account", service_account, None)
        self.node_selector = dict(node_selector or {})
        self.tolerations = list(tolerations)
        self.ttl = ttl_seconds_after_finished
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.retry_deadline = retry_deadline
        self._sleep = sleep
        self._clock = clock

        self.cache = Cache()
        self._api: KubeApi | None = None
        self._tasks: list[asyncio.Task] = []
        self._listed: dict[str, asyncio.Event] = {}
        self._jobs: dict[str, _Tracked] = {}
        self._ended: set[str] = set()  # jobs whose end was (or is being) reported
        self._logs: dict[str, dict[int, str]] = {}
        self._background: set[asyncio.Task] = set()
        self._closed = False
        self._opening: asyncio.Lock | None = None
        self._change: asyncio.Event | None = None
        self.api_failures = 0  # calls and watches that met an unreachable or failing server

    # -- lifecycle ------------------------------------------------------------------------------
    @property
    def _selector(self) -> str:
        return f"{m.LABEL_MANAGED_BY}={m.MANAGED_BY},{m.LABEL_INSTANCE}={self.instance_name}"

    def _watched(self) -> list[tuple[str, str | None]]:
        return [
            (NODES, None),
            (QUOTAS, None),
            (LIMIT_RANGES, None),
            (PODS, self._selector),
            (self.job_kind, self._selector),
            (QUEUES, self._selector),
        ]

    async def open(self, timeout: float | None = None) -> None:
        """Start the list+watch loops and wait until every kind has been listed once.

        With ``timeout``, a BackendError says which kinds could not be listed in time (the
        loops keep trying); without it, this waits for the API server as long as it takes.
        """
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._api is None:
                try:
                    api = self.api_factory()
                    if asyncio.iscoroutine(api):
                        api = await api
                except Exception as exc:
                    raise BackendError(
                        f"cannot reach Kubernetes: {exc}; run the service in a pod with a "
                        "service account (see hub_config/k8s/rbac.yaml) or set KUBECONFIG"
                    ) from exc
                self._api = api  # type: ignore[assignment]
                self._closed = False
                for kind, selector in self._watched():
                    self._listed[kind] = asyncio.Event()
                    task = asyncio.ensure_future(self._watch_loop(kind, selector))
                    self._tasks.append(task)
        waiting = asyncio.gather(*(e.wait() for e in self._listed.values()))
        try:
            await asyncio.wait_for(waiting, timeout)
        except asyncio.TimeoutError:
            missing = sorted(k for k, e in self._listed.items() if not e.is_set())
            raise BackendError(
                f"the Kubernetes API server did not list {', '.join(missing)} within "
                f"{timeout:g}s; check the API server, the RBAC rules and the CRDs "
                "(Volcano, the training operator)"
            ) from None

    async def close(self) -> None:
        """Stop watching; running jobs are left running (they outlive the service)."""
        self._closed = True
        for task in self._tasks + list(self._background):
            task.cancel()
        for task in self._tasks + list(self._background):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        if self._api is not None:
            await self._api.close()
            self._api = None

    @property
    def api(self) -> KubeApi:
        if self._api is None:
            raise BackendError("the Kubernetes backend is not open; await backend.open() first")
        return self._api

    async def _watch_loop(self, kind: str, selector: str | None) -> None:
        namespace = None if kind in CLUSTER_SCOPED else self.namespace
        delay = self.backoff_initial
        must_list = True
        while not self._closed:
            try:
                if must_list:
                    items, version = await self.api.list(kind, namespace, selector)
                    self.cache.replace(kind, items, version)
                    self._listed[kind].set()
                    self._changed()
                    must_list = False
                    delay = self.backoff_initial
                version = self.cache.resource_version.get(kind, "")
                async for event, obj in self.api.watch(kind, namespace, selector, version):
                    if event == "ERROR":
                        # An expired resourceVersion (410) or any other watch error: list again.
                        must_list = True
                        break
                    if event == "BOOKMARK":
                        self.cache.resource_version[kind] = _meta(obj).get(
                            "resourceVersion", version
                        )
                        continue
                    self.cache.apply(kind, event, obj)
                    self._changed()
                    delay = self.backoff_initial
            except asyncio.CancelledError:
                raise
            except ApiError as exc:
                must_list = True
                if exc.status == 410:
                    continue
                self.api_failures += 1
                log.warning("watch of %s failed (%s); retrying in %.1fs", kind, exc, delay)
                await self._sleep(delay)
                delay = min(self.backoff_max, delay * 2)
            except (OSError, asyncio.TimeoutError) as exc:
                must_list = True
                self.api_failures += 1
                log.warning(
                    "watch of %s lost the API server (%s); retrying in %.1fs", kind, exc, delay
                )
                await self._sleep(delay)
                delay = min(self.backoff_max, delay * 2)
            except Exception:  # a malformed answer must not stop the cache for good
                must_list = True
                self.api_failures += 1
                log.exception("watch of %s broke; listing again in %.1fs", kind, delay)
                await self._sleep(delay)
                delay = min(self.backoff_max, delay * 2)

    async def _call(self, what: str, call: Callable[[], Awaitable[Any]]) -> Any:
        """One API call, retried with exponential backoff while the server is unreachable or
        overloaded, up to ``retry_deadline`` seconds; other errors go to the caller."""
        delay = self.backoff_initial
        waited = 0.0
        while True:
            try:
                return await call()
            except ApiError as exc:
                if exc.status not in _RETRIABLE:
                    raise
                error: Exception = exc
            except (OSError, asyncio.TimeoutError) as exc:
                error = exc
            self.api_failures += 1
            if waited >= self.retry_deadline:
                raise BackendError(
                    f"{what}: the Kubernetes API server did not answer for {waited:.0f}s "
                    f"({error}); nothing more was changed"
                ) from error
            log.warning("%s failed (%s); retrying in %.1fs", what, error, delay)
            await self._sleep(delay)
            waited += delay
            delay = min(self.backoff_max, delay * 2)

    # -- reading (cache only) -------------------------------------------------------------------
    def capacity(self) -> list[Node]:
        """Schedulable, Ready nodes (matching ``node_selector``) with their allocatable.

        Read from the cache: ``await open()`` first, or this is empty.
        """
        if NODES not in self._listed or not self._listed[NODES].is_set():
            log.warning("capacity() before the nodes were listed: await backend.open() first")
        nodes = []
        for obj in self.cache.all(NODES):
            if any(_labels(obj).get(k) != v for k, v in self.node_selector.items()):
                continue
            node = node_capacity(obj, self.gpu_resource)
            if node is not None:
                nodes.append(node)
        return nodes

    def quota(self) -> Resources:
        """The namespace ResourceQuota's bound on requests (UNLIMITED where none is set)."""
        return quota_cut(self.cache.all(QUOTAS), self.gpu_resource)

    def instance(self) -> Instance:
        """The instance the core schedules: the nodes, cut down by the namespace quota."""
        return Instance(nodes=tuple(self.capacity()), quota=self.quota())

    def limit_ranges(self) -> list[dict]:
        return self.cache.all(LIMIT_RANGES)

    def admission_problem(
        self, per_worker: Resources, workers: int, new_object: bool = True
    ) -> tuple[str, bool] | None:
        """Would the quota or a LimitRange refuse a pod of this gang? (message, permanent).

        ``new_object`` false for a grow: the job object exists, only pods are added."""
        ask = effective_pod(per_worker, self.cache.all(LIMIT_RANGES), self.gpu_resource)
        problem = limit_range_problem(ask, self.cache.all(LIMIT_RANGES), self.gpu_resource)
        if problem:
            return problem, True
        counted = (
            "pytorchjobs.kubeflow.org" if self.job_kind == PYTORCHJOBS else "jobs.batch.volcano.sh"
        )
        return quota_problem(
            ask,
            workers,
            self.cache.all(QUOTAS),
            self._in_flight(),
            self.gpu_resource,
            objects={f"count/{counted}": 1} if new_object else None,
        )

    def _in_flight(self) -> dict[str, float]:
        """Quota our created jobs will still take: pods the operator has not made yet."""
        out: dict[str, float] = {}
        for tracked in self._jobs.values():
            if tracked.phase == "stopping":
                continue
            missing = tracked.workers - len(self._pods_of(tracked.name))
            if missing <= 0:
                continue
            ask = effective_pod(
                tracked.spec.per_worker, self.cache.all(LIMIT_RANGES), self.gpu_resource
            )
            out["pods"] = out.get("pods", 0) + missing
            for name, value in ask.requests.items():
                out[f"requests.{name}"] = out.get(f"requests.{name}", 0) + value * missing
            for name, value in ask.limits.items():
                out[f"limits.{name}"] = out.get(f"limits.{name}", 0) + value * missing
        out["cpu"] = out.get("requests.cpu", 0)
        out["memory"] = out.get("requests.memory", 0)
        return out

    def _pods_of(self, name: str) -> list[dict]:
        return [p for p in self.cache.all(PODS) if _labels(p).get(m.LABEL_JOB) == name]

    def describe(self, job_id: str) -> str:
        """Where a job stands, in the cluster's words (why it is not running yet, if it is not)."""
        tracked = self._jobs.get(job_id)
        if tracked is None:
            return f"job {job_id} is not tracked by this backend"
        if tracked.phase in ("running", "stopping"):
            return tracked.phase
        pods = self._pods_of(tracked.name)
        if self.cache.get(self.job_kind, tracked.name) is None:
            return "waiting for the job object to appear"
        waiting = [p for p in sorted(pods, key=pod_rank) if not pod_ready(p)]
        if waiting:
            return f"pod {_name(waiting[0])} not ready: {pod_wait_reason(waiting[0])}"
        if len(pods) < tracked.workers:
            return (
                f"{len(pods)} of {tracked.workers} pods created so far by the "
                f"{'training operator' if self.job_kind == PYTORCHJOBS else 'Volcano controller'}"
                f" (queue {m.queue_name(tracked.spec.leaf, self.prefix)})"
            )
        return "starting"

    def logs(self, job_id: str, worker: int | None = None, tail: int | None = None) -> str:
        """The logs fetched so far (at finish or failure, or by ``fetch_logs``)."""
        by_worker = self._logs.get(job_id)
        if not by_worker:
            return ""
        ranks = [worker] if worker is not None else sorted(by_worker)
        lines: list[str] = []
        for rank in ranks:
            text = by_worker.get(rank, "")
            prefix = "" if worker is not None else f"[worker {rank}] "
            lines.extend(prefix + line for line in text.splitlines())
        return "\n".join(lines[-tail:] if tail else lines)

    async def fetch_logs(self, job_id: str, tail: int | None = 1000) -> dict[int, str]:
        """Read each worker pod's log from the API into the cache ``logs`` reads."""
        tracked = self._jobs.get(job_id)
        name = tracked.name if tracked else m.job_object_name(job_id, self.prefix)
        pods = sorted(self._pods_of(name), key=pod_rank)
        out: dict[int, str] = {}
        for rank, pod in enumerate(pods):
            with contextlib.suppress(ApiError, BackendError, OSError):
                out[rank] = await self._call(
                    f"read log of {_name(pod)}",
                    lambda pod=pod: self.api.read_log(self.namespace, _name(pod), None, tail),
                )
        self._logs[job_id] = out
        return out

    # -- building -------------------------------------------------------------------------------
    def build_job(self, spec: JobSpec, workers: int) -> dict:
        """The job object for ``spec`` at ``workers`` workers (pure; errors before any call)."""
        user = m.validate_username(spec.user)
        name = m.job_object_name(spec.id, self.prefix)
        queue = m.queue_name(spec.leaf, self.prefix)
        mount = m.user_mount_path(self.mount_path, user)
        volume, volume_mount = m.make_user_volume(
            claim_name=self.storage_claim, user=user, mount_path=mount
        )
        workdir = m.pod_workdir(
            workdir=spec.workdir, storage_root=self.storage_root, user=user, mount_path=mount
        )
        labels = m.make_labels(
            instance=self.instance_name,
            job_id=spec.id,
            user=user,
            queue=queue,
            kind=spec.kind,
            prefix=self.prefix,
        )
        annotations = m.make_annotations(job_id=spec.id, plan=spec.leaf)
        env = {"WMLA_JOB_ID": spec.id, "WMLA_PLAN": spec.leaf, **spec.env}
        container = m.make_container(
            name=m.PYTORCH_CONTAINER,
            image=self.image,
            command=self._worker_command(spec, user, mount),
            per_worker=spec.per_worker,
            workdir=workdir,
            env=env,
            volume_mounts=[volume_mount],
            gpu_resource=self.gpu_resource,
            image_pull_policy=self.image_pull_policy,
        )
        template = m.make_pod_template(
            containers=[container],
            labels=labels,
            annotations=annotations,
            volumes=[volume],
            priority_class=self.priority_class,
            termination_grace=self.grace,
            service_account=self.service_account,
            node_selector=self.node_selector,
            tolerations=self.tolerations,
        )
        common = dict(
            name=name,
            namespace=self.namespace,
            template=template,
            workers=workers,
            queue=queue,
            labels=labels,
            annotations=annotations,
            priority_class=self.priority_class,
            ttl_seconds_after_finished=self.ttl,
        )
        elastic = spec.max_workers > spec.min_workers
        if self.job_kind == VOLCANO_JOBS:
            gang = min(spec.min_workers, workers) if elastic else workers
            return m.make_volcano_job(min_workers=gang, **common)
        if elastic:
            return m.make_pytorchjob(
                min_workers=spec.min_workers, max_workers=spec.max_workers, **common
            )
        return m.make_pytorchjob(**common)

    def _worker_command(self, spec: JobSpec, user: str, mount: str) -> list[str]:
        command = m.pod_command(
            command=spec.command, storage_root=self.storage_root, user=user, mount_path=mount
        )
        elastic = spec.max_workers > spec.min_workers
        if (
            elastic
            and self.job_kind == PYTORCHJOBS
            and self.elastic_launcher
            and command
            and posixpath.basename(command[0]).startswith("python")
        ):
            # The operator gives elastic workers torchrun's settings (PET_NNODES=min:max, the
            # c10d rendezvous endpoint); torchrun re-forms the group when the size changes.
            return [*self.elastic_launcher, *command[1:]]
        return command

    # -- decisions ------------------------------------------------------------------------------
    async def start(self, spec: JobSpec, placement: tuple[str, ...]) -> None:
        """Create the job (one object; the operator and Volcano make its pods as one gang).

        Volcano chooses the nodes; the ``running`` event reports where the pods landed.
        Raises ``AdmissionRefused`` (nothing created) when the quota or a LimitRange would
        refuse a pod, ``ManifestError`` for input that cannot become an object.
        """
        await self.open()
        workers = len(placement)
        body = self.build_job(spec, workers)
        problem = self.admission_problem(spec.per_worker, workers)
        if problem:
            raise AdmissionRefused(f"job {spec.id}: {problem[0]}", permanent=problem[1])
        name = _name(body)
        self._ended.discard(spec.id)  # a preempted job starting again
        self._jobs[spec.id] = _Tracked(spec, name, self.job_kind, workers=workers)
        try:
            await self._ensure_queue_path(spec.leaf)
            await self._create_job(spec, body)
        except BaseException:
            self._jobs.pop(spec.id, None)
            raise
        self._changed()

    async def _create_job(self, spec: JobSpec, body: dict) -> None:
        name = _name(body)
        delay = self.backoff_initial
        waited = 0.0
        while True:
            try:
                await self._call(
                    f"create {name}", lambda: self.api.create(self.job_kind, self.namespace, body)
                )
                return
            except ApiError as exc:
                if exc.status != 409:
                    raise BackendError(f"creating {name} for job {spec.id} failed: {exc}") from exc
            # 409: ours from an earlier try (adopt it), still terminating (wait), or foreign.
            existing = await self._call(
                f"read {name}", lambda: self.api.get(self.job_kind, self.namespace, name)
            )
            if _annotations(existing).get(m.ANNOTATION_JOB_ID) != spec.id:
                raise BackendError(
                    f"{self.job_kind} {name} exists and is not job {spec.id}'s; delete it or "
                    "change the name prefix"
                )
            if not _deleting(existing):
                self.cache.apply(self.job_kind, "ADDED", existing)
                return
            if waited >= self.retry_deadline:
                raise BackendError(
                    f"{name} from an earlier run of job {spec.id} is still terminating"
                )
            await self._sleep(delay)
            waited += delay
            delay = min(self.backoff_max, delay * 2)

    async def resize(self, spec: JobSpec, placement: tuple[str, ...], grace: float) -> None:
        """Elastic PyTorchJobs only: set the Worker replicas; the operator adds or removes pods
        (removed pods get their termination grace), and torchrun re-forms the group."""
        await self.open()
        tracked = self._jobs.get(spec.id)
        if tracked is None:
            raise BackendError(f"job {spec.id} is not running here; cannot resize it")
        if self.job_kind != PYTORCHJOBS or spec.max_workers == spec.min_workers:
            raise BackendError(f"job {spec.id} is not an elastic PyTorchJob; cannot resize it")
        workers = len(placement)
        if not spec.min_workers <= workers <= spec.max_workers:
            raise BackendError(
                f"job {spec.id}: {workers} workers is outside "
                f"{spec.min_workers}..{spec.max_workers}"
            )
        added = workers - tracked.workers
        if added > 0:
            problem = self.admission_problem(spec.per_worker, added, new_object=False)
            if problem:
                raise AdmissionRefused(f"job {spec.id}: {problem[0]}", permanent=problem[1])
        patch = {"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": workers}}}}
        await self._call(
            f"resize {tracked.name}",
            lambda: self.api.patch(self.job_kind, self.namespace, tracked.name, patch),
        )
        tracked.workers = workers
        tracked.phase = "resizing"
        self._changed()

    async def stop(self, job_id: str, grace: float, reason: str) -> None:
        """Delete the job and its pods with ``grace`` seconds to checkpoint; ``released`` follows
        once the watch shows every pod gone."""
        await self.open()
        tracked = self._jobs.get(job_id)
        name = tracked.name if tracked else m.job_object_name(job_id, self.prefix)
        if tracked is None and job_id in self._ended:
            # It finished or failed just before: that was its one end; nothing to release.
            log.info("stop of %s after it ended: nothing to do", job_id)
            return
        if tracked is None:
            obj = self.cache.get(self.job_kind, name)
            if obj is None or _annotations(obj).get(m.ANNOTATION_JOB_ID) != job_id:
                if not self._pods_of(name):
                    self._emit(BackendEvent(job_id, "released", self._clock(), message=reason))
                    return
            spec = JobSpec(job_id, "unknown", "/", Resources(), (), "/")
            tracked = self._jobs[job_id] = _Tracked(spec, name, self.job_kind)
        tracked.phase = "stopping"
        tracked.reason = reason
        seconds = max(0, int(math.ceil(grace)))
        try:
            await self._delete_gang(name, seconds)
        except BackendError as exc:
            # A stop must happen even if the API server is away for long: keep trying in the
            # background; ``released`` still comes only when the pods are gone.
            log.warning("stopping %s: %s; retrying in the background", job_id, exc)
            self._spawn(self._keep_deleting(job_id, name, seconds))
        self._changed()

    async def _delete_gang(self, name: str, seconds: int) -> None:
        with contextlib.suppress(ApiError):  # 404: already gone
            await self._call(
                f"delete {name}",
                lambda: self.api.delete(self.job_kind, self.namespace, name, seconds, "Foreground"),
            )
        # The pods' own grace is the template's; delete them too so this call's grace holds.
        for pod in self._pods_of(name):
            if _deleting(pod):
                continue
            with contextlib.suppress(ApiError):
                await self._call(
                    f"delete pod {_name(pod)}",
                    lambda pod=pod: self.api.delete(PODS, self.namespace, _name(pod), seconds),
                )

    async def _keep_deleting(self, job_id: str, name: str, seconds: int) -> None:
        while not self._closed and job_id in self._jobs:
            try:
                await self._delete_gang(name, seconds)
                return
            except BackendError:
                await self._sleep(self.backoff_max)

    async def recover(self, specs: Sequence[JobSpec]) -> None:
        """Re-adopt jobs by their labels and job-id annotation; ``lost`` for the missing."""
        await self.open()
        by_id = {
            _annotations(obj).get(m.ANNOTATION_JOB_ID): obj for obj in self.cache.all(self.job_kind)
        }
        known = set()
        for spec in specs:
            known.add(spec.id)
            obj = by_id.get(spec.id)
            if obj is None:
                self._emit(
                    BackendEvent(
                        spec.id,
                        "lost",
                        self._clock(),
                        message=f"no {self.job_kind} for job {spec.id} in namespace "
                        f"{self.namespace} after the restart",
                    )
                )
                continue
            tracked = _Tracked(
                spec, _name(obj), self.job_kind, workers=job_workers(obj, self.job_kind), seen=True
            )
            if _deleting(obj):
                tracked.phase = "stopping"
            elif job_condition(obj, self.job_kind) in ("Succeeded", "Failed"):
                tracked.phase = "running"  # ended while we were away: report only the end
            else:
                pods = self._pods_of(tracked.name)
                ready = [p for p in pods if pod_ready(p)]
                if ready and len(ready) == len(pods) >= tracked.workers:
                    tracked.phase = "running"  # already reported before the restart
                    tracked.placement = self._placement(ready)
            self._jobs[spec.id] = tracked
        for job_id, obj in by_id.items():
            if job_id not in known:
                log.warning(
                    "%s %s (job %s) is ours but the service does not know it; left alone",
                    self.job_kind,
                    _name(obj),
                    job_id,
                )
        self._changed()

    # -- queues ---------------------------------------------------------------------------------
    def desired_queues(self, plans: Iterable[Any]) -> list[dict]:
        return m.make_plan_queues(
            list(plans),
            instance=self.instance_name,
            prefix=self.prefix,
            instance_capability=self.quota() if self.cache.all(QUOTAS) else None,
            gpu_resource=self.gpu_resource,
        )

    async def sync_queues(self, plans: Iterable[Any]) -> QueueSync:
        """Make the Volcano queues mirror the plan tree: create, update (replace with the
        resourceVersion; a conflict re-reads and retries), delete those no plan has, except
        queues our live jobs still use (user leaves created on first use)."""
        await self.open()
        desired = {_name(q): q for q in self.desired_queues(plans)}
        result = QueueSync()
        in_use = {
            _labels(obj).get(m.LABEL_QUEUE)
            for obj in self.cache.all(self.job_kind)
            if not _deleting(obj)
        }
        for name, body in desired.items():
            live = self.cache.get(QUEUES, name)
            parent = (body.get("spec") or {}).get("parent")
            if parent in {f.split(":", 1)[0] for f in result.failed}:
                result.failed.append(f"{name}: its parent queue {parent} could not be written")
                continue
            try:
                if live is None:
                    if await self._create_queue(body):
                        result.created.append(name)
                elif _queue_differs(live, body):
                    await self._replace_queue(name, body)
                    result.updated.append(name)
            except BackendError as exc:
                # One refused queue (e.g. by Volcano's webhook) must not stop the others.
                log.warning("Volcano queue %s: %s", name, exc)
                result.failed.append(f"{name}: {exc}")
        # Keep what live jobs use and every queue above those (a queue's parent must exist).
        protected = {(q.get("spec") or {}).get("parent") for q in desired.values()}
        todo = [q for q in in_use if q]
        while todo:
            name = todo.pop()
            if name in protected:
                continue
            protected.add(name)
            live = self.cache.get(QUEUES, name)
            if live is not None:
                todo.append((live.get("spec") or {}).get("parent"))

        # Children before parents: Volcano refuses to delete a queue that has child queues.
        def depth(queue: Mapping) -> int:
            return -_annotations(queue).get(m.ANNOTATION_PLAN, "/").rstrip("/").count("/")

        for live in sorted(self.cache.all(QUEUES), key=lambda q: (depth(q), _name(q))):
            name = _name(live)
            if name in desired:
                continue
            if name in protected:
                result.kept.append(name)
                continue
            try:
                await self._call(
                    f"delete queue {name}", lambda n=name: self.api.delete(QUEUES, None, n)
                )
                result.deleted.append(name)
            except ApiError as exc:
                if exc.status != 404:
                    log.warning("could not delete queue %s: %s", name, exc)
                    result.kept.append(name)
        return result

    async def _create_queue(self, body: dict) -> bool:
        try:
            created = await self._call(
                f"create queue {_name(body)}", lambda: self.api.create(QUEUES, None, body)
            )
        except ApiError as exc:
            if exc.status == 409:
                return False  # someone made it meanwhile; the next sync compares it
            raise BackendError(f"creating Volcano queue {_name(body)} failed: {exc}") from exc
        self.cache.apply(QUEUES, "ADDED", created)
        return True

    async def _replace_queue(self, name: str, body: dict, attempts: int = 5) -> None:
        live = self.cache.get(QUEUES, name)
        for _ in range(attempts):
            new = dict(live or body)
            new["metadata"] = {
                **_meta(live or {}),
                "labels": {**_labels(live or {}), **_labels(body)},
                "annotations": {**_annotations(live or {}), **_annotations(body)},
            }
            spec = dict((live or {}).get("spec") or {})
            for key in ("weight", "parent", "reclaimable", "capability"):
                spec.pop(key, None)
            spec.update(body["spec"])
            new["spec"] = spec
            try:
                replaced = await self._call(
                    f"update queue {name}",
                    lambda new=new: self.api.replace(QUEUES, None, name, new),
                )
                self.cache.apply(QUEUES, "MODIFIED", replaced)
                return
            except ApiError as exc:
                if exc.status != 409:
                    raise BackendError(f"updating Volcano queue {name} failed: {exc}") from exc
                live = await self._call(
                    f"read queue {name}", lambda: self.api.get(QUEUES, None, name)
                )
        raise BackendError(
            f"updating Volcano queue {name}: still conflicting after {attempts} tries"
        )

    async def _ensure_queue_path(self, leaf: str) -> None:
        """Make sure the leaf's queue and its ancestors exist before a job names it (a user leaf
        is created on first use; ``sync_queues`` later gives plans their shares and limits)."""
        parts = leaf.strip("/").split("/")
        paths = ["/"] + ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]
        for path in paths:
            name = m.queue_name(path, self.prefix)
            if self.cache.get(QUEUES, name) is not None:
                continue
            parent = (
                m.VOLCANO_ROOT_QUEUE
                if path == "/"
                else m.queue_name(path.rsplit("/", 1)[0] or "/", self.prefix)
            )
            body = m.make_queue(
                name=name,
                parent=parent,
                weight=m.share_to_weight(1.0) if path != "/" else 1,
                labels=m.make_labels(instance=self.instance_name),
                annotations=m.make_annotations(plan=path),
                gpu_resource=self.gpu_resource,
            )
            await self._create_queue(body)

    # -- event derivation (cache only, no API calls, no decisions) ------------------------------
    def _changed(self) -> None:
        for job_id in list(self._jobs):
            self._derive(job_id)
        waiter, self._change = self._change, None
        if waiter is not None:
            waiter.set()

    async def _next_change(self, timeout: float) -> bool:
        """Wait for the next cache change; False when none came within ``timeout``."""
        if self._change is None:
            self._change = asyncio.Event()
        try:
            await asyncio.wait_for(self._change.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    def _placement(self, pods: Sequence[dict]) -> tuple[str, ...]:
        return tuple((p.get("spec") or {}).get("nodeName", "") for p in sorted(pods, key=pod_rank))

    def _derive(self, job_id: str) -> None:
        tracked = self._jobs[job_id]
        obj = self.cache.get(tracked.kind, tracked.name)
        pods = self._pods_of(tracked.name)
        now = self._clock()
        if tracked.phase == "stopping":
            if obj is None and not pods:
                self._end(job_id)
                self._emit(BackendEvent(job_id, "released", now, message=tracked.reason))
            return
        if obj is None:
            if tracked.seen:
                self._end(job_id)
                self._emit(
                    BackendEvent(
                        job_id,
                        "failed",
                        now,
                        message=f"{tracked.kind} {tracked.name} was deleted outside wmla",
                    )
                )
            return
        tracked.seen = True
        condition = job_condition(obj, tracked.kind)
        if condition == "Succeeded":
            self._end(job_id)
            self._spawn(self._finish(job_id, tracked, obj, pods, failed=False))
            return
        if condition == "Failed":
            self._end(job_id)
            self._spawn(self._finish(job_id, tracked, obj, pods, failed=True))
            return
        live = [p for p in pods if not _deleting(p)]
        ready = [p for p in live if pod_ready(p)]
        if tracked.phase == "starting" and len(ready) >= tracked.workers:
            tracked.phase = "running"
            tracked.placement = self._placement(ready)
            self._emit(BackendEvent(job_id, "running", now, placement=tracked.placement))
        elif tracked.phase == "resizing" and len(ready) == len(pods) == tracked.workers:
            tracked.phase = "running"
            tracked.placement = self._placement(ready)
            self._emit(BackendEvent(job_id, "resized", now, placement=tracked.placement))

    def _end(self, job_id: str) -> None:
        del self._jobs[job_id]
        self._ended.add(job_id)

    def _emit(self, event: BackendEvent) -> None:
        try:
            self.emit(event)
        except Exception:  # the receiver's problem must not stop the watch that reports it
            log.exception("emit(%s) raised", event)

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _finish(
        self, job_id: str, tracked: _Tracked, obj: dict, pods: list[dict], failed: bool
    ) -> None:
        """Fetch the logs (best effort) and report the end of the job."""
        if failed:
            # The failing pod's exit code may arrive on the pod watch after the job's condition:
            # wait a little (at most ~2 s) while some pod has not ended yet.
            for _ in range(8):
                pods = self._pods_of(tracked.name)
                if any(pod_exit(p) for p in pods) or all(_ended_pod(p) for p in pods):
                    break
                if not await self._next_change(timeout=0.25):
                    break
        bound = [p for p in pods if (p.get("spec") or {}).get("nodeName")]
        placement = tracked.placement or self._placement(bound)
        now = self._clock()
        if tracked.phase == "starting" and (bound or not failed):
            # Ended before every pod was seen ready: still report that it ran, and where.
            self._emit(BackendEvent(job_id, "running", now, placement=placement))
        with contextlib.suppress(Exception):
            await self.fetch_logs(job_id, tail=200)
        now = self._clock()
        if not failed:
            self._emit(BackendEvent(job_id, "finished", now, placement=placement))
            return
        ordered = sorted(pods, key=pod_rank)
        bad = next((i for i, p in enumerate(ordered) if pod_exit(p)), None)
        exit_code = pod_exit(ordered[bad]) if bad is not None else None
        tail = self.logs(job_id, worker=bad, tail=20) if bad is not None else ""
        message = condition_message(obj)
        if tail:
            message = f"{message}\n{tail}" if message else tail
        self._emit(
            BackendEvent(
                job_id, "failed", now, placement=placement, exit_code=exit_code, message=message
            )
        )


def _queue_differs(live: Mapping, body: Mapping) -> bool:
    spec = live.get("spec") or {}
    want = body.get("spec") or {}
    for key in ("weight", "parent", "reclaimable"):
        if spec.get(key) != want.get(key):
            return True
    if _normal_list(spec.get("capability")) != _normal_list(want.get("capability")):
        return True
    return any(_annotations(live).get(k) != v for k, v in _annotations(body).items())


def _normal_list(resources: Mapping | None) -> dict[str, float]:
    out = {}
    for key, value in (resources or {}).items():
        try:
            out[key] = float(_quantity(key, value, key))  # cpu, memory, else whole devices
        except ValueError:
            out[key] = math.nan
    return out


def _option(name: str, given: Any, default: Any) -> Any:
    if given is not None:
        return given
    return os.environ.get(f"WMLA_K8S_{name.upper()}", default) or default


def _current_namespace() -> str:
    """The pod's own namespace in a cluster, else ``default``."""
    path = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
    with contextlib.suppress(OSError):
        with open(path, encoding="utf-8") as f:
            return f.read().strip() or "default"
    return "default"


# -- the real API, through kubernetes_asyncio -----------------------------------------------------
class KubernetesAsyncioApi:
    """``KubeApi`` over kubernetes_asyncio; raw JSON dicts in and out."""

    _CUSTOM = {
        PYTORCHJOBS: m.PYTORCHJOB_API,
        VOLCANO_JOBS: m.VOLCANO_JOB_API,
        QUEUES: m.QUEUE_API,
    }

    def __init__(self, api_client: Any) -> None:
        from kubernetes_asyncio import client

        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)

    def _list_call(self, kind: str, namespace: str | None) -> tuple[Callable, tuple]:
        if kind == NODES:
            return self.core.list_node, ()
        if kind == PODS:
            return self.core.list_namespaced_pod, (namespace,)
        if kind == QUOTAS:
            return self.core.list_namespaced_resource_quota, (namespace,)
        if kind == LIMIT_RANGES:
            return self.core.list_namespaced_limit_range, (namespace,)
        group, version, plural, _ = self._CUSTOM[kind]
        if kind in CLUSTER_SCOPED:
            return self.custom.list_cluster_custom_object, (group, version, plural)
        return self.custom.list_namespaced_custom_object, (group, version, namespace, plural)

    async def _wrap(self, coro: Awaitable[Any]) -> Any:
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            return await coro
        except ApiException as exc:
            raise ApiError(exc.status or 0, exc.reason or "", str(exc.body or "")) from exc
        except asyncio.TimeoutError as exc:
            raise ApiError(0, "Timeout", str(exc)) from exc
        except OSError as exc:
            raise ApiError(0, "Unreachable", str(exc)) from exc
        except Exception as exc:  # aiohttp.ClientError and kin: the server did not answer
            if type(exc).__module__.startswith("aiohttp"):
                raise ApiError(0, "Unreachable", str(exc)) from exc
            raise

    async def list(self, kind, namespace, label_selector):
        func, args = self._list_call(kind, namespace)
        kwargs = {"_preload_content": False}
        if label_selector:
            kwargs["label_selector"] = label_selector
        response = await self._wrap(func(*args, **kwargs))
        data = await response.json()
        return data.get("items") or [], (data.get("metadata") or {}).get("resourceVersion", "")

    async def watch(self, kind, namespace, label_selector, resource_version):
        from kubernetes_asyncio import watch

        func, args = self._list_call(kind, namespace)
        kwargs: dict[str, Any] = {"timeout_seconds": 300, "allow_watch_bookmarks": True}
        if label_selector:
            kwargs["label_selector"] = label_selector
        if resource_version:
            kwargs["resource_version"] = resource_version
        stream = watch.Watch().stream(func, *args, **kwargs)
        iterator = stream.__aiter__()
        while True:
            try:
                event = await self._wrap(iterator.__anext__())
            except StopAsyncIteration:
                return
            yield event["type"], event.get("raw_object") or {}

    def _custom_args(self, kind: str, namespace: str | None) -> tuple:
        group, version, plural, _ = self._CUSTOM[kind]
        if kind in CLUSTER_SCOPED:
            return (group, version, plural)
        return (group, version, namespace, plural)

    async def get(self, kind, namespace, name):
        if kind in self._CUSTOM:
            fn = (
                self.custom.get_cluster_custom_object
                if kind in CLUSTER_SCOPED
                else self.custom.get_namespaced_custom_object
            )
            return await self._wrap(fn(*self._custom_args(kind, namespace), name))
        raise ValueError(f"get of {kind} is not used")

    async def create(self, kind, namespace, body):
        fn = (
            self.custom.create_cluster_custom_object
            if kind in CLUSTER_SCOPED
            else self.custom.create_namespaced_custom_object
        )
        return await self._wrap(fn(*self._custom_args(kind, namespace), body))

    async def replace(self, kind, namespace, name, body):
        fn = (
            self.custom.replace_cluster_custom_object
            if kind in CLUSTER_SCOPED
            else self.custom.replace_namespaced_custom_object
        )
        return await self._wrap(fn(*self._custom_args(kind, namespace), name, body))

    async def patch(self, kind, namespace, name, body):
        fn = (
            self.custom.patch_cluster_custom_object
            if kind in CLUSTER_SCOPED
            else self.custom.patch_namespaced_custom_object
        )
        # A dict body would otherwise go out as application/json-patch+json (the client's
        # first choice), which the API server refuses: this is a JSON merge patch.
        return await self._wrap(
            fn(
                *self._custom_args(kind, namespace),
                name,
                body,
                _content_type="application/merge-patch+json",
            )
        )

    async def delete(self, kind, namespace, name, grace_seconds=None, propagation=None):
        kwargs: dict[str, Any] = {}
        if grace_seconds is not None:
            kwargs["grace_period_seconds"] = grace_seconds
        if propagation:
            kwargs["propagation_policy"] = propagation
        if kind == PODS:
            await self._wrap(self.core.delete_namespaced_pod(name, namespace, **kwargs))
            return
        fn = (
            self.custom.delete_cluster_custom_object
            if kind in CLUSTER_SCOPED
            else self.custom.delete_namespaced_custom_object
        )
        await self._wrap(fn(*self._custom_args(kind, namespace), name, **kwargs))

    async def read_log(self, namespace, pod, container, tail):
        kwargs: dict[str, Any] = {}
        if container:
            kwargs["container"] = container
        if tail:
            kwargs["tail_lines"] = tail
        return await self._wrap(self.core.read_namespaced_pod_log(pod, namespace, **kwargs))

    async def close(self) -> None:
        await self.api_client.close()


async def default_api_factory() -> KubeApi:
    """In-cluster configuration when running in a pod, else the kubeconfig (``KUBECONFIG``)."""
    from kubernetes_asyncio import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        await config.load_kube_config()
    return KubernetesAsyncioApi(client.ApiClient())
