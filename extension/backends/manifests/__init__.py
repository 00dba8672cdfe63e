"""Kubernetes objects for the Kubernetes backend, built by pure ``make_*`` functions.

In the style of kubespawner's ``objects.py``: every builder takes keyword arguments and returns
a plain dict, exactly what goes to the API server (nothing here talks to it). The tests compare
these dicts with literal ones and validate them against the real CRD schemas (Kubeflow
PyTorchJob v1, Volcano Job/Queue/PodGroup) and the Kubernetes core models.

Units follow ``extension.scheduler.resources``: gpu devices, cpu millicores, memory bytes.

The parts (import every name from here, ``from extension.backends import manifests as m``):
- ``names``       API groups and kinds, labels and annotations, queue and job object names
- ``quantities``  ``Resources`` as ResourceList strings
- ``pods``        a worker's container and pod template, the user's folder mounted into it
- ``jobs``        PyTorchJob, Volcano Job, PodGroup
- ``queues``      the plan tree as Volcano queues
- ``policy``      ResourceQuota and LimitRange (examples and tests)
- ``identity``    the uid a user's pods run as
"""

from __future__ import annotations

from .identity import MAX_UID, make_workdir_init, pod_uid, run_as
from .jobs import make_podgroup, make_pytorchjob, make_volcano_job
from .names import (
    ANNOTATION_JOB_ID,
    ANNOTATION_PLAN,
    DEFAULT_GPU_RESOURCE,
    GROUP,
    LABEL_INSTANCE,
    LABEL_JOB,
    LABEL_KIND,
    LABEL_MANAGED_BY,
    LABEL_QUEUE,
    LABEL_USER,
    MANAGED_BY,
    PODGROUP_API,
    PYTORCH_CONTAINER,
    PYTORCHJOB_API,
    QUEUE_API,
    VOLCANO_JOB_API,
    VOLCANO_ROOT_QUEUE,
    ManifestError,
    job_object_name,
    make_annotations,
    make_labels,
    queue_name,
    validate_username,
)
from .pods import (
    make_container,
    make_pod_template,
    make_user_volume,
    pod_command,
    pod_workdir,
    user_mount_path,
)
from .policy import make_limit_range, make_resource_quota
from .quantities import format_cpu, format_memory, resource_list
from .queues import make_plan_queues, make_queue, share_to_weight

__all__ = [
    "MAX_UID",
    "make_workdir_init",
    "pod_uid",
    "run_as",
    "ANNOTATION_JOB_ID",
    "ANNOTATION_PLAN",
    "DEFAULT_GPU_RESOURCE",
    "GROUP",
    "LABEL_INSTANCE",
    "LABEL_JOB",
    "LABEL_KIND",
    "LABEL_MANAGED_BY",
    "LABEL_QUEUE",
    "LABEL_USER",
    "MANAGED_BY",
    "PODGROUP_API",
    "PYTORCH_CONTAINER",
    "PYTORCHJOB_API",
    "QUEUE_API",
    "VOLCANO_JOB_API",
    "VOLCANO_ROOT_QUEUE",
    "ManifestError",
    "format_cpu",
    "format_memory",
    "job_object_name",
    "make_annotations",
    "make_container",
    "make_labels",
    "make_limit_range",
    "make_plan_queues",
    "make_pod_template",
    "make_podgroup",
    "make_pytorchjob",
    "make_queue",
    "make_resource_quota",
    "make_user_volume",
    "make_volcano_job",
    "pod_command",
    "pod_workdir",
    "queue_name",
    "resource_list",
    "share_to_weight",
    "user_mount_path",
    "validate_username",
]
