"""The Kubernetes backend: Kubeflow PyTorchJobs (or Volcano Jobs), gang-scheduled by Volcano.

Only this package talks to the Kubernetes API; every object it sends is built by
``manifests``. It has three parts:

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
``quota()`` the namespace quota that cuts the instance down (docs/scheduling.md "Words": instance).

After a service restart, ``recover`` finds the jobs again by their labels and annotations and
reports ``lost`` for those that are gone.

The modules (import every name from here, ``extension.backends.kubernetes``):
- ``api``         the slice of the Kubernetes API used (``KubeApi``) and the real one
- ``objects``     pure helpers over Kubernetes objects (metadata, quantities, pods, job status)
- ``state``       the cache, and the record of each tracked job (``Tracking``)
- ``options``     the backend's options, from the constructor, the environment or defaults
- ``calls``       ``ApiCalls``: the connection, calls retried with backoff
- ``watch``       ``Watcher``: open/close, the list+watch loops                       (part 1)
- ``events``      ``EventDeriver``: the events derived from the cache                 (part 2)
- ``logs``        ``WorkerLogs``: the workers' logs, read when a job ends
- ``job_object``  ``JobBuilder``: the job object a spec becomes
- ``jobs``        ``JobRunner``: start, resize, stop, recover                         (part 3)
- ``queues``      ``QueueWriter``: the plan tree as Volcano queues (``sync_queues``)  (part 3)
- ``admission``   ``Admission``: capacity, the namespace quota, what its quota and LimitRanges
                  refuse
- ``tasks``       ``Background``: the tasks started beside the calls, cancelled on close
- ``errors``      ``BackendError``, ``AdmissionRefused``
- ``backend``     ``KubernetesBackend``: builds the collaborators from its options and
                  implements the ``Backend`` protocol by delegating to them
"""

from __future__ import annotations

from .admission import (
    AdmissionProblem,
    PodAsk,
    effective_pod,
    limit_range_problem,
    quota_cut,
    quota_problem,
)
from .api import (
    CLUSTER_SCOPED,
    JOB_KINDS,
    LIMIT_RANGES,
    NODES,
    PODS,
    PYTORCHJOB,
    PYTORCHJOBS,
    QUEUES,
    QUOTAS,
    VOLCANO_JOB,
    VOLCANO_JOBS,
    ApiError,
    ApiFactory,
    JobKind,
    KubeApi,
    KubernetesAsyncioApi,
    WatchEvent,
    default_api_factory,
    kubeconfig_api_factory,
)
from .backend import KubernetesBackend
from .errors import AdmissionRefused, BackendError
from .objects import (
    JobCondition,
    condition_message,
    job_condition,
    job_workers,
    node_capacity,
    pod_exit,
    pod_rank,
    pod_ready,
    pod_wait_reason,
    quantity,
)
from .options import Options
from .queues import QueueSync
from .state import Cache, Phase, TrackedJob

__all__ = [
    "CLUSTER_SCOPED",
    "JOB_KINDS",
    "LIMIT_RANGES",
    "NODES",
    "PODS",
    "PYTORCHJOB",
    "PYTORCHJOBS",
    "QUEUES",
    "QUOTAS",
    "VOLCANO_JOB",
    "VOLCANO_JOBS",
    "AdmissionProblem",
    "AdmissionRefused",
    "ApiError",
    "ApiFactory",
    "BackendError",
    "Cache",
    "JobCondition",
    "JobKind",
    "KubeApi",
    "KubernetesAsyncioApi",
    "KubernetesBackend",
    "Options",
    "Phase",
    "PodAsk",
    "QueueSync",
    "TrackedJob",
    "WatchEvent",
    "condition_message",
    "default_api_factory",
    "kubeconfig_api_factory",
    "effective_pod",
    "job_condition",
    "job_workers",
    "limit_range_problem",
    "node_capacity",
    "pod_exit",
    "pod_rank",
    "pod_ready",
    "pod_wait_reason",
    "quantity",
    "quota_cut",
    "quota_problem",
]
