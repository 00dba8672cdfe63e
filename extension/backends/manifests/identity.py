"""Who a user's pods run as: one uid per user name, the same for the notebook pod
(``WmlaKubeSpawner``) and every worker pod (the Kubernetes backend), computed from the name so
that neither needs the other nor a table.

The uid is ``base`` plus the name's SHA-256 modulo the room above ``base``: stable, and clear of
local accounts when ``base`` is above them (200000 in hub_config). Two names can share a uid
(about one chance in 4,000 among 1,000 users with base 200000); they still see nothing of
each other, as each pod mounts only its own user's folder (``subPath``), never another's.

A worker pod's container runtime makes a missing working directory as root; so the job's folder
is made first, by an init container running as the user (``make_workdir_init``).
"""

from __future__ import annotations

import hashlib
from typing import Any

from .names import ManifestError

# runAsUser is an int64, but 2^31 - 1 and above break tools that read uids as signed 32-bit
MAX_UID = 2**31 - 2


def pod_uid(user: str, base: int) -> int:
    """``user``'s uid in pods, in ``[base, MAX_UID]``."""
    if not 0 < base < MAX_UID:
        raise ManifestError(f"the pods' uid base {base} must be between 1 and {MAX_UID - 1}")
    digest = int.from_bytes(hashlib.sha256(user.encode()).digest()[:8], "big")
    return base + digest % (MAX_UID - base + 1)


def run_as(uid: int) -> dict[str, Any]:
    """A container's securityContext: that uid and group, never root, no capabilities, no
    way to gain privileges (setuid files)."""
    return {
        "runAsUser": uid,
        "runAsGroup": uid,
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }


# os.makedirs as the user: the job's folder (and its logs) made before the worker's container,
# whose working directory it is (the runtime would make a missing one as root)
_MAKEDIRS = "import os, sys; os.makedirs(os.path.join(sys.argv[1], 'logs'), exist_ok=True)"


def make_workdir_init(*, image: str, workdir: str, mount: dict, uid: int) -> dict:
    """An init container that makes the job's folder as the user (``uid``), in the mount."""
    return {
        "name": "wmla-workdir",
        "image": image,
        "command": ["python3", "-c", _MAKEDIRS, workdir],
        "workingDir": mount["mountPath"],
        "volumeMounts": [dict(mount)],
        "securityContext": run_as(uid),
        "resources": {
            "requests": {"cpu": "10m", "memory": "32Mi"},
            "limits": {"cpu": "100m", "memory": "64Mi"},
        },
    }
