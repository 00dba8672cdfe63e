"""Pure helpers over Kubernetes objects (plain dicts): their metadata, quantities in the
scheduler's units, a node's capacity, a job's condition and size, a pod's readiness, rank and
exit code. Nothing here calls the API or keeps state."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any

from extension.scheduler import Node, Resources, parse_quantity

from .. import manifests as m
from .api import VOLCANO_JOBS

# PyTorchJob pods carry these labels (training-operator v1).
_OP_REPLICA_TYPE = "training.kubeflow.org/replica-type"
_OP_REPLICA_INDEX = "training.kubeflow.org/replica-index"
_VC_TASK = "volcano.sh/task-spec"
_VC_TASK_INDEX = "volcano.sh/task-index"


class JobCondition(str, Enum):
    """Where a job object stands by its status (a str: ``JobCondition.FAILED == "Failed"``)."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def ended(self) -> bool:
        return self in (JobCondition.SUCCEEDED, JobCondition.FAILED)


def meta_of(obj: Mapping) -> Mapping:
    """An object's metadata (empty when it has none)."""
    return obj.get("metadata") or {}


def name_of(obj: Mapping) -> str:
    return meta_of(obj).get("name", "")


def labels_of(obj: Mapping) -> Mapping[str, str]:
    return meta_of(obj).get("labels") or {}


def annotations_of(obj: Mapping) -> Mapping[str, str]:
    return meta_of(obj).get("annotations") or {}


def is_deleting(obj: Mapping) -> bool:
    return bool(meta_of(obj).get("deletionTimestamp"))


def quantity(key: str, value: Any, gpu_resource: str) -> float:
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
        name_of(node),
        Resources(
            quantity(gpu_resource, alloc.get(gpu_resource, 0), gpu_resource),
            quantity("cpu", alloc.get("cpu", 0), gpu_resource),
            quantity("memory", alloc.get("memory", 0), gpu_resource),
        ),
    )


def job_condition(obj: Mapping, kind: str) -> JobCondition:
    """Where a job object stands, from its status (a Volcano Job's phase or a PyTorchJob's
    conditions)."""
    status = obj.get("status") or {}
    if kind == VOLCANO_JOBS:
        phase = (status.get("state") or {}).get("phase", "")
        if phase == "Completed":
            return JobCondition.SUCCEEDED
        if phase in ("Failed", "Aborted", "Aborting", "Terminated", "Terminating"):
            return JobCondition.FAILED
        return JobCondition.RUNNING if phase == "Running" else JobCondition.PENDING
    last = JobCondition.PENDING
    for cond in status.get("conditions") or []:
        if cond.get("status") != "True":
            continue
        if cond.get("type") in ("Succeeded", "Failed"):
            return JobCondition(cond["type"])
        if cond.get("type") == "Running":
            last = JobCondition.RUNNING
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
    if is_deleting(pod):
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
    labels = labels_of(pod)
    role = (labels.get(_OP_REPLICA_TYPE) or labels.get(_VC_TASK) or "").lower()
    index = labels.get(_OP_REPLICA_INDEX) or annotations_of(pod).get(_VC_TASK_INDEX)
    if index is None:
        tail = name_of(pod).rsplit("-", 1)[-1]
        index = tail if tail.isdigit() else "0"
    return (0 if role == "master" else 1, int(index), name_of(pod))


def pod_placement(pods: Sequence[Mapping]) -> tuple[str, ...]:
    """The node of each pod, by rank (empty for a pod not bound yet)."""
    return tuple((p.get("spec") or {}).get("nodeName", "") for p in sorted(pods, key=pod_rank))


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


def pod_ended(pod: Mapping) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def pod_end_reason(pod: Mapping) -> str:
    """The terminated container's reason (``OOMKilled``, ``Error``), or ""."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (cs.get("state") or {}).get("terminated")
        if terminated and terminated.get("exitCode"):
            return str(terminated.get("reason") or "")
    return ""


def pod_exit(pod: Mapping) -> int | None:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (cs.get("state") or {}).get("terminated")
        if terminated and terminated.get("exitCode"):
            return int(terminated["exitCode"])
    return None
