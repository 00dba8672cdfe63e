"""Kubernetes objects for the Kubernetes backend, built by pure ``make_*`` functions.

In the style of kubespawner's ``objects.py``: every builder takes keyword arguments and returns
a plain dict, exactly what goes to the API server (nothing here talks to it). The tests compare
these dicts with literal ones and validate them against the real CRD schemas (Kubeflow
PyTorchJob v1, Volcano Job/Queue/PodGroup) and the Kubernetes core models.

Names. Plans and job ids are free text to the rest of the project; Kubernetes wants DNS-1123
names. ``queue_name`` and ``job_object_name`` derive them deterministically: a readable part
(lower case, runs of other characters turned into ``-``) plus 8 hex digits of the SHA-256 of the
exact input, so two different plans never share a queue even when their readable parts agree
(``/a/b-c`` and ``/a-b/c``, ``/Dev`` and ``/dev``).

Units follow ``extension.scheduler.resources``: gpu devices, cpu millicores, memory bytes.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from collections.abc import Mapping, Sequence
from typing import Any

from extension.scheduler import UNLIMITED, Resources

GROUP = "wmla.jupyter.org"
MANAGED_BY = "jupyterhub-wmla"

# Labels (values must be label-valid) and annotations (free text) on every object we create.
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_INSTANCE = f"{GROUP}/instance"
LABEL_JOB = f"{GROUP}/job"  # job_object_name(job id): label-valid
LABEL_USER = f"{GROUP}/user"
LABEL_QUEUE = f"{GROUP}/queue"
LABEL_KIND = f"{GROUP}/kind"  # train or notebook
ANNOTATION_JOB_ID = f"{GROUP}/job-id"  # the exact job id
ANNOTATION_PLAN = f"{GROUP}/plan"  # the exact plan path (label values cannot hold '/')

PYTORCHJOB_API = ("kubeflow.org", "v1", "pytorchjobs", "PyTorchJob")
VOLCANO_JOB_API = ("batch.volcano.sh", "v1alpha1", "jobs", "Job")
QUEUE_API = ("scheduling.volcano.sh", "v1beta1", "queues", "Queue")
PODGROUP_API = ("scheduling.volcano.sh", "v1beta1", "podgroups", "PodGroup")

DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"
# The training operator finds the training container by this name (PyTorchJob requirement).
PYTORCH_CONTAINER = "pytorch"
VOLCANO_ROOT_QUEUE = "root"

_USERNAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_NOT_NAME = re.compile(r"[^a-z0-9]+")


class ManifestError(ValueError):
    """An input that cannot become a valid Kubernetes object; the message says how to fix it."""


# -- names -------------------------------------------------------------------------------------
def validate_username(user: str) -> str:
    """A hub user name usable as a label value and as one ``subPath`` segment, or an error.

    Label values allow 63 characters of ``[A-Za-z0-9._-]`` that start and end with a letter or
    digit; that also rules out ``..``, ``/`` and empty names, so ``subPath`` cannot escape the
    user's folder.
    """
    if not isinstance(user, str) or not _USERNAME.match(user):
        raise ManifestError(
            f"user name {user!r} cannot be used on Kubernetes: use 1-63 letters, digits, "
            "'.', '_' or '-', starting and ending with a letter or digit"
        )
    return user


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]


def _readable(text: str) -> str:
    return _NOT_NAME.sub("-", text.lower()).strip("-")


def queue_name(plan_path: str, prefix: str = "wmla") -> str:
    """The Volcano queue of a plan: ``<prefix>-<readable path>-<hash>``, at most 63 characters.

    ``queue_name("/", prefix)`` is the instance's own queue, named ``prefix``.
    """
    _check_prefix(prefix)
    if plan_path == "/":
        return prefix
    if not isinstance(plan_path, str) or not plan_path.startswith("/"):
        raise ManifestError(f"plan path {plan_path!r} must start with '/', e.g. /project1")
    readable = _readable(plan_path)
    room = 63 - len(prefix) - 10  # two dashes and 8 hex digits
    readable = readable[:room].strip("-")
    return (
        f"{prefix}-{readable}-{_digest(plan_path)}"
        if readable
        else f"{prefix}-{_digest(plan_path)}"
    )


def job_object_name(job_id: str, prefix: str = "wmla") -> str:
    """The name of a job's PyTorchJob / Volcano Job, at most 40 characters.

    Short, because the operators derive pod and service names from it (``<name>-worker-12``,
    a DNS-1035 label that must start with a letter); ``prefix`` starts with a letter.
    """
    _check_prefix(prefix)
    if not isinstance(job_id, str) or not job_id:
        raise ManifestError(f"job id {job_id!r} must be a non-empty string")
    room = 40 - len(prefix) - 10
    if room < 1:
        raise ManifestError(
            f"prefix {prefix!r} is too long for job names; use 29 characters or less"
        )
    readable = _readable(job_id)[:room].strip("-")
    return f"{prefix}-{readable}-{_digest(job_id)}" if readable else f"{prefix}-{_digest(job_id)}"


def _check_prefix(prefix: str) -> None:
    if not isinstance(prefix, str) or not _DNS_LABEL.match(prefix) or not prefix[0].isalpha():
        raise ManifestError(
            f"name prefix {prefix!r} must be lower-case letters, digits and '-', "
            "starting with a letter, e.g. wmla"
        )
    if len(prefix) > 40:
        raise ManifestError(f"name prefix {prefix!r} is longer than 40 characters")


# -- quantities --------------------------------------------------------------------------------
def format_cpu(millicores: float) -> str:
    """2000 -> ``"2"``, 500 -> ``"500m"``."""
    m = int(round(millicores))
    return str(m // 1000) if m % 1000 == 0 else f"{m}m"


def format_memory(num_bytes: float) -> str:
    """4 GiB -> ``"4Gi"``; amounts that are not whole binary units stay plain bytes."""
    b = int(round(num_bytes))
    for suffix, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if b and b % size == 0:
            return f"{b // size}{suffix}"
    return str(b)


def resource_list(
    amounts: Resources,
    gpu_resource: str = DEFAULT_GPU_RESOURCE,
    prefix: str = "",
    skip_zero: bool = True,
) -> dict[str, str]:
    """``Resources`` as a Kubernetes ResourceList; unlimited entries are left out.

    ``prefix="requests."`` gives ResourceQuota keys (``requests.cpu``, ``requests.nvidia.com/gpu``).
    """
    out: dict[str, str] = {}
    gpu, cpu, memory = amounts
    if cpu != UNLIMITED and not (skip_zero and cpu == 0):
        out[f"{prefix}cpu"] = format_cpu(cpu)
    if memory != UNLIMITED and not (skip_zero and memory == 0):
        out[f"{prefix}memory"] = format_memory(memory)
    if gpu != UNLIMITED and not (skip_zero and gpu == 0):
        if gpu != int(gpu):
            raise ManifestError(f"gpu must be whole devices, got {gpu}")
        out[f"{prefix}{gpu_resource}"] = str(int(gpu))
    return out


# -- metadata ----------------------------------------------------------------------------------
def make_labels(
    *,
    instance: str,
    job_id: str | None = None,
    user: str | None = None,
    queue: str | None = None,
    kind: str | None = None,
    prefix: str = "wmla",
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The labels the backend selects its objects by (re-adoption after a restart uses them)."""
    labels = {LABEL_MANAGED_BY: MANAGED_BY, LABEL_INSTANCE: instance}
    if job_id is not None:
        labels[LABEL_JOB] = job_object_name(job_id, prefix)
    if user is not None:
        labels[LABEL_USER] = validate_username(user)
    if queue is not None:
        labels[LABEL_QUEUE] = queue
    if kind is not None:
        labels[LABEL_KIND] = kind
    labels.update(extra or {})
    return labels


def make_annotations(
    *, job_id: str | None = None, plan: str | None = None, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    out: dict[str, str] = {}
    if job_id is not None:
        out[ANNOTATION_JOB_ID] = job_id
    if plan is not None:
        out[ANNOTATION_PLAN] = plan
    out.update(extra or {})
    return out


# -- pods --------------------------------------------------------------------------------------
def user_mount_path(template: str, user: str) -> str:
    """``/gpfs/myresultfs/{user}`` -> ``/gpfs/myresultfs/alice`` (user validated first)."""
    return template.format(user=validate_username(user))


def pod_workdir(*, workdir: str, storage_root: str, user: str, mount_path: str) -> str:
    """Map the job's working directory on the service side into the pod's mount of the folder.

    ``<storage_root>/<user>/jobs/7`` -> ``<mount_path>/jobs/7``; anything outside the user's
    own folder is refused (the pod only ever sees that folder).
    """
    validate_username(user)
    home = posixpath.join(posixpath.normpath(storage_root), user)
    path = posixpath.normpath(workdir)
    if path != home and not path.startswith(home + "/"):
        raise ManifestError(
            f"working directory {workdir!r} is outside {user}'s folder {home}; "
            f"jobs run under {home}/jobs/<job-id>"
        )
    rest = path[len(home) :].lstrip("/")
    return posixpath.join(mount_path, rest) if rest else mount_path


def pod_command(
    *, command: Sequence[str], storage_root: str, user: str, mount_path: str
) -> list[str]:
    """The worker's argv with paths inside the user's folder (as the service sees them) moved
    to where the pod mounts that folder; every other argument is left as it is."""
    validate_username(user)
    home = posixpath.join(posixpath.normpath(storage_root), user)
    out = []
    for arg in command:
        if arg == home or arg.startswith(home + "/"):
            rest = arg[len(home) :].lstrip("/")
            arg = posixpath.join(mount_path, rest) if rest else mount_path
        out.append(arg)
    return out


def make_user_volume(
    *, claim_name: str, user: str, mount_path: str, volume_name: str = "user-data"
) -> tuple[dict, dict]:
    """The (volume, volumeMount) pair that mounts only ``<claim>/<user>`` at ``mount_path``."""
    validate_username(user)
    volume = {"name": volume_name, "persistentVolumeClaim": {"claimName": claim_name}}
    mount = {"name": volume_name, "mountPath": mount_path, "subPath": user}
    return volume, mount


def make_container(
    *,
    name: str,
    image: str,
    command: Sequence[str],
    per_worker: Resources,
    workdir: str | None = None,
    env: Mapping[str, str] | None = None,
    volume_mounts: Sequence[dict] = (),
    gpu_resource: str = DEFAULT_GPU_RESOURCE,
    image_pull_policy: str | None = None,
) -> dict:
    """One container; limits equal requests (so LimitRange ratios hold and QoS is Guaranteed)."""
    if not command:
        raise ManifestError("a worker needs a command, e.g. ['python', 'main.py']")
    requests = resource_list(per_worker, gpu_resource)
    container: dict[str, Any] = {"name": name, "image": image, "command": list(command)}
    if workdir:
        container["workingDir"] = workdir
    if env:
        container["env"] = [{"name": k, "value": str(v)} for k, v in sorted(env.items())]
    if requests:
        container["resources"] = {"requests": dict(requests), "limits": dict(requests)}
    if volume_mounts:
        container["volumeMounts"] = [dict(m) for m in volume_mounts]
    if image_pull_policy:
        container["imagePullPolicy"] = image_pull_policy
    return container


def make_pod_template(
    *,
    containers: Sequence[dict],
    labels: Mapping[str, str],
    annotations: Mapping[str, str] | None = None,
    volumes: Sequence[dict] = (),
    scheduler_name: str | None = "volcano",
    priority_class: str | None = None,
    restart_policy: str = "Never",
    termination_grace: float | None = None,
    service_account: str | None = None,
    node_selector: Mapping[str, str] | None = None,
    tolerations: Sequence[dict] = (),
) -> dict:
    """A PodTemplateSpec dict."""
    spec: dict[str, Any] = {"containers": [dict(c) for c in containers]}
    spec["restartPolicy"] = restart_policy
    if scheduler_name:
        spec["schedulerName"] = scheduler_name
    if priority_class:
        spec["priorityClassName"] = priority_class
    if termination_grace is not None:
        spec["terminationGracePeriodSeconds"] = int(round(termination_grace))
    if service_account:
        spec["serviceAccountName"] = service_account
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if tolerations:
        spec["tolerations"] = [dict(t) for t in tolerations]
    if volumes:
        spec["volumes"] = [dict(v) for v in volumes]
    metadata: dict[str, Any] = {"labels": dict(labels)}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {"metadata": metadata, "spec": spec}


# -- jobs --------------------------------------------------------------------------------------
def _object(api: tuple[str, str, str, str], name: str, namespace: str | None, labels, annotations):
    group, version, _, kind = api
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    metadata["labels"] = dict(labels)
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {"apiVersion": f"{group}/{version}", "kind": kind, "metadata": metadata}


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
    replica = {"restartPolicy": "Never"}
    if elastic:
        replicas = {"Worker": {"replicas": workers, **replica, "template": template}}
    else:
        replicas = {"Master": {"replicas": 1, **replica, "template": template}}
        if workers > 1:
            replicas["Worker"] = {"replicas": workers - 1, **replica, "template": template}
    scheduling: dict[str, Any] = {"minAvailable": low, "queue": queue}
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


# -- queues ------------------------------------------------------------------------------------
def share_to_weight(share: float) -> int:
    """Volcano weights are integers 1..65535: a share becomes ``round(share * 100)``, so 4:2:2
    stays 400:200:200 and shares down to 0.01 keep their ratio."""
    if not share > 0:
        raise ManifestError(f"share must be positive, got {share}")
    return max(1, min(65535, int(round(share * 100))))


def make_queue(
    *,
    name: str,
    parent: str | None,
    weight: int,
    labels: Mapping[str, str],
    annotations: Mapping[str, str] | None = None,
    capability: Resources | None = None,
    gpu_resource: str = DEFAULT_GPU_RESOURCE,
    reclaimable: bool = True,
) -> dict:
    """A Volcano Queue (cluster scoped): ``weight`` = the plan's share, ``capability`` = its
    limit (finite entries only), ``parent`` = the parent plan's queue (hierarchical queues)."""
    spec: dict[str, Any] = {"weight": int(weight), "reclaimable": reclaimable}
    if parent:
        spec["parent"] = parent
    if capability is not None:
        caps = resource_list(capability, gpu_resource, skip_zero=False)
        if caps:
            spec["capability"] = caps
    obj = _object(QUEUE_API, name, None, labels, annotations)
    obj["spec"] = spec
    return obj


def make_plan_queues(
    plans: Sequence[Any],
    *,
    instance: str,
    prefix: str = "wmla",
    instance_capability: Resources | None = None,
    gpu_resource: str = DEFAULT_GPU_RESOURCE,
) -> list[dict]:
    """The whole plan tree as queues, parents first: the instance's queue under Volcano's
    ``root``, then one per plan (``plans`` are ``Plan``-like: ``path``, ``share``, ``limit``)."""
    queues = [
        make_queue(
            name=queue_name("/", prefix),
            parent=VOLCANO_ROOT_QUEUE,
            weight=1,
            labels=make_labels(instance=instance),
            annotations=make_annotations(plan="/"),
            capability=instance_capability,
            gpu_resource=gpu_resource,
        )
    ]
    for plan in sorted(plans, key=lambda p: (p.path.count("/"), p.path)):
        parent = posixpath.dirname(plan.path) or "/"
        queues.append(
            make_queue(
                name=queue_name(plan.path, prefix),
                parent=queue_name(parent, prefix),
                weight=share_to_weight(plan.share),
                labels=make_labels(instance=instance),
                annotations=make_annotations(plan=plan.path),
                # no plan can hold more than the instance; Volcano also refuses a child queue
                # whose capability is above its parent's
                capability=(
                    plan.limit
                    if instance_capability is None
                    else plan.limit.cap(instance_capability)
                ),
                gpu_resource=gpu_resource,
            )
        )
    return queues


# -- namespace policy (examples and tests) -----------------------------------------------------
def make_resource_quota(*, name: str, namespace: str, hard: Mapping[str, Any]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"hard": {k: str(v) for k, v in hard.items()}},
    }


def make_limit_range(*, name: str, namespace: str, limits: Sequence[Mapping[str, Any]]) -> dict:
    def strs(item: Mapping[str, Any]) -> dict:
        return {
            k: ({r: str(q) for r, q in v.items()} if isinstance(v, Mapping) else v)
            for k, v in item.items()
        }

    return {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"limits": [strs(item) for item in limits]},
    }
