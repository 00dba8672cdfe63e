"""A worker pod: its container, its template, and the user's folder mounted into it (a pod only
ever sees its user's own folder, mounted by ``subPath``)."""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from typing import Any

from extension.scheduler import Resources

from .names import DEFAULT_GPU_RESOURCE, ManifestError, validate_username
from .quantities import resource_list


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
    limits: Resources | None = None,
) -> dict:
    """One container: its requests, and its limits (the requests where none are given: then
    LimitRange ratios hold and QoS is Guaranteed)."""
    if not command:
        raise ManifestError("a worker needs a command, e.g. ['python', 'main.py']")
    requests = resource_list(per_worker, gpu_resource)
    ceiling = resource_list(limits, gpu_resource) if limits is not None else requests
    container: dict[str, Any] = {"name": name, "image": image, "command": list(command)}
    if workdir:
        container["workingDir"] = workdir
    if env:
        container["env"] = [{"name": k, "value": str(v)} for k, v in sorted(env.items())]
    if requests:
        container["resources"] = {"requests": dict(requests), "limits": dict(ceiling)}
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
    init_containers: Sequence[dict] = (),
) -> dict:
    """A PodTemplateSpec dict."""
    spec: dict[str, Any] = {"containers": [dict(c) for c in containers]}
    if init_containers:
        spec["initContainers"] = [dict(c) for c in init_containers]
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
