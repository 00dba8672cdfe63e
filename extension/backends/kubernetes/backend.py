"""``KubernetesBackend``: its options, the state its parts share, and what it reads of one job
(where it stands, its logs). The parts are mixins, one module each, named in the class."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from extension.confine import Control, Enforced, Report
from extension.scheduler import Node

from .. import manifests as m
from ..base import Emit
from .admission import _Admission
from .api import (
    PODS,
    PYTORCHJOBS,
    VOLCANO_JOBS,
    ApiError,
    ApiFactory,
    KubeApi,
    default_api_factory,
)
from .errors import BackendError
from .events import _Events
from .jobs import _Jobs
from .objects import _labels, _name, pod_rank, pod_ready, pod_wait_reason
from .queues import _Queues
from .state import Cache, _Tracked
from .watch import _Watching

log = logging.getLogger("extension.backends.kubernetes")

# Every worker pod gets limits equal to its requests (admission.pod_ask), which the kubelet
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


class KubernetesBackend(_Watching, _Admission, _Jobs, _Queues, _Events):
    """Runs jobs as PyTorchJobs (or Volcano Jobs) in one namespace; see the package docstring.

    Its parts: ``_Watching`` (watch.py: open/close, the list+watch loops, retried calls),
    ``_Admission`` (admission.py: capacity, quota, admission_problem), ``_Jobs`` (jobs.py:
    build_job, start/resize/stop/recover), ``_Queues`` (queues.py: sync_queues), ``_Events``
    (events.py: the events derived from the cache).
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
        self.job_kind = _job_kind(job_kind)
        self.prefix = _option("name_prefix", name_prefix, "wmla")
        m.queue_name("/", self.prefix)  # validates the prefix now, not at the first job
        self.emit = emit
        self.namespace = _option("namespace", namespace, _current_namespace())
        self.api_factory = api_factory or default_api_factory
        self.instance_name = _option("instance", instance, "wmla")
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
        self._start_empty()

    def _start_empty(self) -> None:
        """The state the parts share, as it is before ``open``: an empty cache, no job tracked,
        no loop running. Apart from the options so that one screen shows all of it."""
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


def _option(name: str, given: Any, default: Any) -> Any:
    if given is not None:
        return given
    return os.environ.get(f"WMLA_K8S_{name.upper()}", default) or default


def _job_kind(given: str | None) -> str:
    """The kind a job becomes (the ``job_kind`` option: ``pytorchjob`` or ``volcanojob``)."""
    job_kind = _option("job_kind", given, "pytorchjob")
    if job_kind not in ("pytorchjob", "volcanojob"):
        raise ValueError(f"job_kind {job_kind!r} must be 'pytorchjob' or 'volcanojob'")
    return PYTORCHJOBS if job_kind == "pytorchjob" else VOLCANO_JOBS


def _current_namespace() -> str:
    """The pod's own namespace in a cluster, else ``default``."""
    path = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
    with contextlib.suppress(OSError):
        with open(path, encoding="utf-8") as f:
            return f.read().strip() or "default"
    return "default"
