"""Pure overlays for the notebook pod of ``WmlaKubeSpawner``, in kubespawner's ``make_*`` style.

Each function takes keyword arguments and returns plain dicts (what KubeSpawner's traits accept:
``volumes``, ``volume_mounts``, ``extra_labels``, ``extra_annotations``,
``extra_resource_limits``, ``environment``). Names, labels and queues come from
``extension.backends.manifests`` so a notebook pod carries the same labels as the user's
training pods and sits in the same Volcano queue: the leaf's (``<plan>/<user>``), as Volcano's
hierarchical queues take pods only in leaf queues.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from extension.backends import manifests as m

from .kernel import STARTUP_NAME

VOLCANO_QUEUE_ANNOTATION = "scheduling.volcano.sh/queue-name"
DEFAULT_MOUNT_PATH = "/gpfs/myresultfs/{username}"
# KubeSpawner expands {unescaped_username} itself; we validate the name before it does.
KUBESPAWNER_USERNAME = "{unescaped_username}"


def validate_username(user: str) -> str:
    """A hub user name usable as a label value and one ``subPath`` segment (or ManifestError)."""
    return m.validate_username(user)


def mount_path(template: str, user: str) -> str:
    """``/gpfs/myresultfs/{username}`` -> ``/gpfs/myresultfs/alice``."""
    return template.format(username=validate_username(user))


def make_user_storage(
    *, claim_name: str, user: str, mount_path_template: str = DEFAULT_MOUNT_PATH,
    volume_name: str = "wmla-user-folder",
) -> tuple[dict, dict]:  # fmt: skip
    """(volume, volumeMount): only ``<claim>/<user>`` is mounted, at the user's path."""
    volume, mount = m.make_user_volume(
        claim_name=claim_name,
        user=user,
        mount_path=mount_path(mount_path_template, user),
        volume_name=volume_name,
    )
    return volume, mount


def make_plan_labels(
    *, instance: str, user: str, leaf: str, queue_prefix: str = "wmla"
) -> dict[str, str]:
    """Labels of a notebook pod: instance, user, its leaf's queue, kind=notebook.

    Not the backend's managed-by label: KubeSpawner manages the pod (and the backend, which
    re-adopts what it manages by that label, must leave notebook pods alone).
    """
    labels = m.make_labels(
        instance=instance,
        user=user,
        queue=m.queue_name(leaf, queue_prefix),
        kind="notebook",
        prefix=queue_prefix,
    )
    labels.pop(m.LABEL_MANAGED_BY, None)
    return labels


def make_plan_annotations(
    *, plan: str, leaf: str, job_id: str, queue: str | None = None
) -> dict[str, str]:
    """The exact plan, leaf and notebook job id (label values cannot hold '/'), and the
    Volcano queue when the pod is scheduled by Volcano."""
    out = m.make_annotations(job_id=job_id or None, plan=plan)
    out[f"{m.GROUP}/leaf"] = leaf
    if queue:
        out[VOLCANO_QUEUE_ANNOTATION] = queue
    return out


def make_gpu_limits(*, gpus: int, resource: str = m.DEFAULT_GPU_RESOURCE) -> dict[str, str]:
    """``{"nvidia.com/gpu": "1"}`` (GPUs are requested through limits), or {} for none."""
    if gpus < 0:
        raise m.ManifestError(f"a notebook cannot request {gpus} GPUs")
    return {resource: str(gpus)} if gpus else {}


def make_magics_hook(*, ipython_dir: str, script: str) -> dict:
    """A postStart hook writing the kernel startup file that loads the magics into the user's
    IPYTHONDIR (the hub cannot write into the pod's volume). Base64 keeps quoting out of it."""
    encoded = base64.b64encode(script.encode()).decode()
    startup = f"{ipython_dir}/profile_default/startup"
    command = f"mkdir -p '{startup}' && echo {encoded} | base64 -d > '{startup}/{STARTUP_NAME}'"
    return {"postStart": {"exec": {"command": ["sh", "-c", command]}}}


OWN_FOLDER = "wmla-own-folder"
# os.chown of the mount point: a folder runc made in the container, never a link; the kernel
# resolves it to the volume's folder (kubelet opened the subPath without following links)
_CHOWN = "import os, sys; os.chown(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))"


def make_folder_owner(*, image: str, folder: str, mount: dict, uid: int, gid: int) -> dict:
    """An init container that gives the mounted folder's top to ``uid``:``gid`` (no more)."""
    return {
        "name": OWN_FOLDER,
        "image": image,
        "command": ["python3", "-c", _CHOWN, folder, str(int(uid)), str(int(gid))],
        "volumeMounts": [mount],
        "securityContext": {
            "runAsUser": 0,
            "runAsNonRoot": False,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]},
        },
        "resources": {
            "requests": {"cpu": "10m", "memory": "32Mi"},
            "limits": {"cpu": "100m", "memory": "64Mi"},
        },
    }


STARTER = "wmla-getting-started"
# the userfs operation the local spawner's helper runs, here in the pod as the user: files
# that do not exist yet, once (a marker), never over the user's own (O_EXCL, O_NOFOLLOW)
# (base64: KubeSpawner formats every string of the pod with the user's properties, and the
# files are full of braces)
_INSTALL = (
    "import base64, json, sys; from extension.userfs.ops import install_missing; "
    "install_missing(sys.argv[1], json.loads(base64.b64decode(sys.argv[2])), sys.argv[3])"
)


def make_starter(
    *, image: str, folder: str, mount: dict, uid: int, gid: int, files: dict, marker: str
) -> dict:
    """An init container that offers a new user's files in their folder, as the user."""
    return {
        "name": STARTER,
        "image": image,
        "command": [
            "python3",
            "-c",
            _INSTALL,
            folder,
            base64.b64encode(json.dumps(files).encode()).decode(),
            marker,
        ],  # fmt: skip
        "volumeMounts": [mount],
        "securityContext": {
            "runAsUser": int(uid),
            "runAsGroup": int(gid),
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
        "resources": {
            "requests": {"cpu": "10m", "memory": "32Mi"},
            "limits": {"cpu": "200m", "memory": "128Mi"},
        },
    }


def make_pod_overlay(
    *,
    user: str,
    plan: str,
    leaf: str,
    job_id: str,
    gpus: int,
    claim_name: str,
    mount_path_template: str = DEFAULT_MOUNT_PATH,
    instance: str = "wmla",
    queue_prefix: str = "wmla",
    volcano: bool = True,
    gpu_resource: str = m.DEFAULT_GPU_RESOURCE,
    env: Mapping[str, str] | None = None,
    magics_script: str | None = None,
) -> dict[str, Any]:
    """Everything ``WmlaKubeSpawner`` lays over KubeSpawner's pod, as trait values."""
    volume, mount = make_user_storage(
        claim_name=claim_name, user=user, mount_path_template=mount_path_template
    )
    queue = m.queue_name(leaf, queue_prefix)
    folder = mount["mountPath"]
    hooks = (
        make_magics_hook(ipython_dir=f"{folder}/.ipython", script=magics_script)
        if magics_script
        else {}
    )
    return {
        "volumes": [volume],
        "volume_mounts": [mount],
        "extra_labels": make_plan_labels(
            instance=instance, user=user, leaf=leaf, queue_prefix=queue_prefix
        ),
        "extra_annotations": make_plan_annotations(
            plan=plan, leaf=leaf, job_id=job_id, queue=queue if volcano else None
        ),
        "extra_resource_limits": make_gpu_limits(gpus=gpus, resource=gpu_resource),
        "environment": dict(env or {}),
        "working_dir": folder,
        "lifecycle_hooks": hooks,
    }
