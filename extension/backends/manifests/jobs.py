"""The gang objects: a Kubeflow PyTorchJob or a plain Volcano Job around a pod template, and a
Volcano PodGroup for plain pods (a notebook)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from extension.scheduler import Resources

from .names import (
    DEFAULT_GPU_RESOURCE,
    PODGROUP_API,
    PYTORCHJOB_API,
    VOLCANO_JOB_API,
    ManifestError,
    _object,
)
from .quantities import resource_list


def make_pytorchjob(
    *,
    name: str,
    namespace: str,
    template: dict,
    workers: int,
    queue: str,
    labels: Mapping[str, str],
    annotations: Mapping[str, str] | None = None,
    min_workers: int | None = None,
    max_workers: int | None = None,
    priority_class: str | None = None,
    elastic_max_restarts: int = 3,
    ttl_seconds_after_finished: int | None = 3600,
    schedule_timeout: int | None = None,
) -> dict:
    """A Kubeflow PyTorchJob (kubeflow.org/v1) gang-scheduled by Volcano.

    Rigid (``min_workers`` None or equal to ``max_workers``): one Master and ``workers - 1``
    Workers, ``minAvailable = workers``. Elastic: Workers only, ``replicas = workers`` (the size
    the scheduler placed), ``elasticPolicy`` min..max with the c10d rendezvous, and
    ``minAvailable = min_workers`` so the gang is the minimum. A worker failure fails the job
    (``restartPolicy: Never``, ``backoffLimit: 0``); running pods are cleaned, finished ones kept
    for their logs until the TTL.
    """
    if workers < 1:
        raise ManifestError(f"a job needs at least 1 worker, got {workers}")
    low = workers if min_workers is None else min_workers
    high = workers if max_workers is None else max_workers
    if not 1 <= low <= workers <= high:
        raise ManifestError(
            f"workers must satisfy 1 <= min <= workers <= max, got {low} <= {workers} <= {high}"
        )
    elastic = high > low
    replicas = _pytorch_replicas(template, workers, elastic)
    run_policy = _run_policy(
        gang=low,
        queue=queue,
        priority_class=priority_class,
        schedule_timeout=schedule_timeout,
        ttl_seconds_after_finished=ttl_seconds_after_finished,
    )
    spec: dict[str, Any] = {"pytorchReplicaSpecs": replicas, "runPolicy": run_policy}
    if elastic:
        spec["elasticPolicy"] = {
            "minReplicas": low,
            "maxReplicas": high,
            "rdzvBackend": "c10d",
            "maxRestarts": int(elastic_max_restarts),
        }
    obj = _object(PYTORCHJOB_API, name, namespace, labels, annotations)
    obj["spec"] = spec
    return obj


def _pytorch_replicas(template: dict, workers: int, elastic: bool) -> dict[str, Any]:
    """The replica specs. Elastic: Workers only, so any of them can leave or join when the size
    changes; rigid: rank 0 is the operator's Master, the rest Workers."""
    replica = {"restartPolicy": "Never"}
    if elastic:
        return {"Worker": {"replicas": workers, **replica, "template": template}}
    replicas = {"Master": {"replicas": 1, **replica, "template": template}}
    if workers > 1:
        replicas["Worker"] = {"replicas": workers - 1, **replica, "template": template}
    return replicas


def _run_policy(
    *,
    gang: int,
    queue: str,
    priority_class: str | None,
    schedule_timeout: int | None,
    ttl_seconds_after_finished: int | None,
) -> dict[str, Any]:
    """The runPolicy: Volcano gangs ``gang`` pods in ``queue``; one worker failure fails the
    job (no retry: the service decides what happens next), running pods are cleaned up and
    finished ones kept for their logs until the TTL."""
    scheduling: dict[str, Any] = {"minAvailable": gang, "queue": queue}
    if priority_class:
        scheduling["priorityClass"] = priority_class
    if schedule_timeout is not None:
        scheduling["scheduleTimeoutSeconds"] = int(schedule_timeout)
    run_policy: dict[str, Any] = {
        "backoffLimit": 0,
        "cleanPodPolicy": "Running",
        "schedulingPolicy": scheduling,
    }
    if ttl_seconds_after_finished is not None:
        run_policy["ttlSecondsAfterFinished"] = int(ttl_seconds_after_finished)
    return run_policy


def make_volcano_job(
    *,
    name: str,
    namespace: str,
    template: dict,
    workers: int,
    queue: str,
    labels: Mapping[str, str],
    annotations: Mapping[str, str] | None = None,
    min_workers: int | None = None,
    priority_class: str | None = None,
    ttl_seconds_after_finished: int | None = 3600,
) -> dict:
    """A plain Volcano Job (batch.volcano.sh/v1alpha1) with the ``pytorch`` plugin.

    The plugin sets MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK from tasks named ``master``
    and ``worker``; ``minAvailable`` is the gang (``min_workers`` for an elastic job).
    """
    if workers < 1:
        raise ManifestError(f"a job needs at least 1 worker, got {workers}")
    low = workers if min_workers is None else min_workers
    if not 1 <= low <= workers:
        raise ManifestError(f"min workers must be 1..{workers}, got {low}")
    tasks = [{"name": "master", "replicas": 1, "template": template}]
    if workers > 1:
        tasks.append({"name": "worker", "replicas": workers - 1, "template": template})
    spec: dict[str, Any] = {
        "schedulerName": "volcano",
        "minAvailable": low,
        "queue": queue,
        "maxRetry": 0,
        "plugins": {"pytorch": ["--master=master", "--worker=worker", "--port=23456"]},
        "policies": [{"event": "PodFailed", "action": "AbortJob"}],
        "tasks": tasks,
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    if ttl_seconds_after_finished is not None:
        spec["ttlSecondsAfterFinished"] = int(ttl_seconds_after_finished)
    obj = _object(VOLCANO_JOB_API, name, namespace, labels, annotations)
    obj["spec"] = spec
    return obj


def make_podgroup(
    *,
    name: str,
    namespace: str,
    min_member: int,
    queue: str,
    labels: Mapping[str, str],
    annotations: Mapping[str, str] | None = None,
    priority_class: str | None = None,
    min_resources: Resources | None = None,
    gpu_resource: str = DEFAULT_GPU_RESOURCE,
) -> dict:
    """A Volcano PodGroup for plain pods (a notebook): pods join it with the annotation
    ``scheduling.k8s.io/group-name: <name>`` and ``schedulerName: volcano``."""
    spec: dict[str, Any] = {"minMember": int(min_member), "queue": queue}
    if priority_class:
        spec["priorityClassName"] = priority_class
    if min_resources is not None:
        spec["minResources"] = resource_list(min_resources, gpu_resource)
    obj = _object(PODGROUP_API, name, namespace, labels, annotations)
    obj["spec"] = spec
    return obj
