"""``WmlaKubeSpawner``: KubeSpawner whose pods are admitted by the user's plan.

The pod mounts only the user's folder of a shared PVC (``subPath`` = the user name) at
``/gpfs/myresultfs/<user>``, carries the plan's labels and annotations, is scheduled by Volcano
(``schedulerName``, its leaf's queue) and limits ``nvidia.com/gpu`` to what the plan admitted.
The overlays are pure (``spawner/objects.py``); here they become KubeSpawner trait values in
``load_user_options`` (after profile_list overrides, before KubeSpawner builds the pod).
"""

from __future__ import annotations

import inspect
from typing import Any

from kubespawner import KubeSpawner
from traitlets import Bool, Unicode, default

from extension.scheduler.resources import parse_quantity

from . import profiles as profile_shapes
from .getting_started import MARKER, starter_files
from .kernel import STARTUP_SCRIPT
from .mixin import WmlaSpawnerMixin
from .objects import (
    DEFAULT_MOUNT_PATH,
    OWN_FOLDER,
    STARTER,
    make_folder_owner,
    make_pod_overlay,
    make_starter,
    mount_path,
    validate_username,
)


class WmlaKubeSpawner(WmlaSpawnerMixin, KubeSpawner):
    """Notebook pods charged to a plan, each mounting only the user's folder."""

    storage_claim_name = Unicode(
        "wmla-storage",
        help="""The PVC holding every user's folder (``<claim>/<user>``; the wmla service mounts
        the same claim at its storage_root).

        c.WmlaKubeSpawner.storage_claim_name = "gpfs-myresultfs"
        """,
    ).tag(config=True)

    user_mount_path = Unicode(
        DEFAULT_MOUNT_PATH,
        help="""Where the pod sees the user's folder; ``{username}`` is the (validated) hub name.

        c.WmlaKubeSpawner.user_mount_path = "/gpfs/myresultfs/{username}"
        """,
    ).tag(config=True)

    instance_label = Unicode(
        "wmla",
        help="""The instance label value (the Kubernetes backend's ``instance``).

        c.WmlaKubeSpawner.instance_label = "wmla"
        """,
    ).tag(config=True)

    queue_prefix = Unicode(
        "wmla",
        help="""Prefix of Volcano queue names (the Kubernetes backend's ``prefix``).

        c.WmlaKubeSpawner.queue_prefix = "wmla"
        """,
    ).tag(config=True)

    volcano_queue = Bool(
        True,
        help="""Annotate the pod with its plan's Volcano queue (needs schedulerName volcano).

        c.WmlaKubeSpawner.volcano_queue = True
        """,
    ).tag(config=True)

    gpu_resource_name = Unicode(
        "nvidia.com/gpu",
        help="""The extended resource that counts GPUs.

        c.WmlaKubeSpawner.gpu_resource_name = "nvidia.com/gpu"
        """,
    ).tag(config=True)

    autoload_magics = Bool(
        True,
        help="""Load the %wmla_* magics in every kernel: IPYTHONDIR is the user's
        ``<folder>/.ipython`` and a postStart hook writes the startup file there (the image needs
        sh, mkdir and base64). Off when a postStart hook is configured already.

        c.WmlaKubeSpawner.autoload_magics = True
        """,
    ).tag(config=True)

    own_folder = Bool(
        True,
        help="""When the pod runs as a uid (``c.KubeSpawner.uid``), an init container (root,
        only CAP_CHOWN) gives the user's folder (the mount's top, never what is inside) to that
        uid and gid first: a claim's new folder is root's, and hostPath or NFS volumes take no
        ``fsGroup``. Off when the storage sets owners itself.

        c.WmlaKubeSpawner.own_folder = True
        """,
    ).tag(config=True)

    getting_started = Bool(
        True,
        help="""On a user's first spawn, put a getting-started notebook and the example's code
        (models/pytorch_mnist) in their folder: an init container running as the pod's uid
        writes them once (a marker remembers it), never over a file that exists. Needs
        ``c.KubeSpawner.uid`` and the project's ``extension`` package in the image.

        c.WmlaKubeSpawner.getting_started = True
        """,
    ).tag(config=True)

    @default("scheduler_name")
    def _wmla_scheduler_default(self) -> str:
        return "volcano"

    @default("storage_root")
    def _wmla_storage_root_default(self) -> str:
        # in the pod the folder's parent is the mount path's parent
        return self.user_mount_path.replace("/{username}", "") or "/"

    _wmla_admitted = False

    @default("profile_list")
    def _wmla_profile_list_default(self) -> list[dict]:
        return profile_shapes.from_legacy(self.profiles)  # the deprecated shape, if set

    async def load_user_options(self) -> None:
        # The pick, checked first: a choice that is not in the list is a sentence on the spawn
        # page (KubeSpawner's own answer is a KeyError); and the plan the picked profile forces
        # (a wmla_plan override) wins over a plan picked on the page, as for the local spawner.
        await self.wmla_check_pick()
        await super().load_user_options()  # the picked profile's overrides, KubeSpawner's way
        validate_username(self.user.name)
        if not self._wmla_admitted:
            plan = await self.wmla_admit()
            self._wmla_admitted = True
        else:
            plan = self.wmla_spawn.plan
        self.apply_wmla_overlay(plan)

    async def wmla_check_pick(self) -> None:
        # KubeSpawner's own list, unchecked beyond what KubeSpawner checks: keys it knows and
        # the local spawner does not are the site's business here.
        source = self.profile_list
        if callable(source):
            source = source(self)
            if inspect.isawaitable(source):
                source = await source
        self.wmla_pick_profile(profile_shapes.initialize(source, check=False))

    def apply_wmla_overlay(self, plan: str) -> None:
        """Set KubeSpawner's traits from the pure overlay (kept: what config already had)."""
        folder = mount_path(self.user_mount_path, self.user.name)
        request = self.wmla_request()
        self._hold_to_grant(request.resources)
        overlay = make_pod_overlay(
            user=self.user.name,
            plan=plan,
            leaf=self.wmla_leaf or f"{plan}/{self.user.name}",
            job_id=self.wmla_job_id,
            gpus=request.gpus,
            claim_name=self.storage_claim_name,
            mount_path_template=self.user_mount_path,
            instance=self.instance_label,
            queue_prefix=self.queue_prefix,
            volcano=self.volcano_queue and self.scheduler_name == "volcano",
            gpu_resource=self.gpu_resource_name,
            env=self.wmla_env(folder, f"{folder}/.ipython" if self.autoload_magics else None),
            magics_script=STARTUP_SCRIPT if self.autoload_magics else None,
        )
        names = {v["name"] for v in overlay["volumes"]}
        self.volumes = [v for v in _as_list(self.volumes) if v.get("name") not in names] + overlay[
            "volumes"
        ]
        self.volume_mounts = [
            v for v in _as_list(self.volume_mounts) if v.get("name") not in names
        ] + overlay["volume_mounts"]
        self.extra_labels = {**self.extra_labels, **overlay["extra_labels"]}
        self.extra_annotations = {**self.extra_annotations, **overlay["extra_annotations"]}
        self.extra_resource_limits = {
            **self.extra_resource_limits,
            **overlay["extra_resource_limits"],
        }
        self.environment = {**self.environment, **overlay["environment"]}
        if not self.working_dir:
            self.working_dir = overlay["working_dir"]
        if overlay["lifecycle_hooks"] and "postStart" not in (self.lifecycle_hooks or {}):
            self.lifecycle_hooks = {**(self.lifecycle_hooks or {}), **overlay["lifecycle_hooks"]}
        if self.uid is not None:
            self._as_user_first(folder, overlay["volume_mounts"][0])

    def _hold_to_grant(self, requested: dict) -> None:
        """The pod asks the cluster for what the service granted (the request as its limit
        range filled it in; what was asked when no answer is known) and is held to it: the
        grant's limit, else a configured one (a profile's), else the grant itself, as the
        local spawner's cgroup holds it."""
        granted, limits = self.wmla_granted.resources or {}, self.wmla_granted.limits or {}
        cpu = granted.get("cpu") or (
            parse_quantity("cpu", requested["cpu"]) if "cpu" in requested else None
        )
        memory = granted.get("memory") or (
            parse_quantity("memory", requested["memory"]) if "memory" in requested else None
        )
        if cpu:
            self.cpu_guarantee = cpu / 1000
            self.cpu_limit = (limits.get("cpu") or 0) / 1000 or self.cpu_limit or cpu / 1000
        if memory:
            self.mem_guarantee = memory
            self.mem_limit = limits.get("memory") or self.mem_limit or memory

    def _as_user_first(self, folder: str, mount: dict) -> None:
        """Init containers before the server (the site's own kept): the folder's top given
        to the pod's uid, then the getting-started files offered as that uid."""
        uid = self.uid(self) if callable(self.uid) else self.uid
        gid = self.gid(self) if callable(self.gid) else self.gid
        gid = uid if gid is None else gid
        ours = []
        if self.own_folder:
            ours.append(
                make_folder_owner(image=self.image, folder=folder, mount=mount, uid=uid, gid=gid)
            )
        if self.getting_started:
            ours.append(
                make_starter(
                    image=self.image,
                    folder=folder,
                    mount=mount,
                    uid=uid,
                    gid=gid,
                    files=starter_files(),
                    marker=MARKER,
                )  # fmt: skip
            )
        names = {OWN_FOLDER, STARTER}
        kept = [c for c in _as_list(self.init_containers) if c.get("name") not in names]
        self.init_containers = kept + ours


def _as_list(value: Any) -> list[dict]:
    if isinstance(value, dict):  # KubeSpawner accepts a dict of volumes keyed by anything
        return list(value.values())
    return list(value or [])
