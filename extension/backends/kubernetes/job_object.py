"""The job object a ``JobSpec`` becomes: a PyTorchJob (or Volcano Job) whose worker pods mount
only their user's folder, labelled and annotated so that the watches and ``recover`` find it.
Pure: nothing here calls the API."""

from __future__ import annotations

import posixpath

from .. import manifests as m
from ..base import JobSpec
from .api import PYTORCHJOB, VOLCANO_JOB
from .options import Options


class JobBuilder:
    """Builds job objects with the backend's options."""

    def __init__(self, options: Options) -> None:
        self.options = options

    def build(self, spec: JobSpec, workers: int) -> dict:
        """The job object for ``spec`` at ``workers`` workers (errors before any call)."""
        o = self.options
        user = m.validate_username(spec.user)
        name = m.job_object_name(spec.id, o.prefix)
        queue = m.queue_name(spec.leaf, o.prefix)
        template, labels, annotations = self._pod_template(spec, user, queue)
        common = dict(
            name=name,
            namespace=o.namespace,
            template=template,
            workers=workers,
            queue=queue,
            labels=labels,
            annotations=annotations,
            priority_class=o.priority_class,
            ttl_seconds_after_finished=o.ttl,
        )
        elastic = spec.max_workers > spec.min_workers
        if o.job_kind is VOLCANO_JOB:
            gang = min(spec.min_workers, workers) if elastic else workers
            return m.make_volcano_job(min_workers=gang, **common)
        if elastic:
            return m.make_pytorchjob(
                min_workers=spec.min_workers, max_workers=spec.max_workers, **common
            )
        return m.make_pytorchjob(**common)

    def _pod_template(
        self, spec: JobSpec, user: str, queue: str
    ) -> tuple[dict, dict[str, str], dict[str, str]]:
        """Every worker's pod template, and its labels and annotations, which the job object
        carries too (the watches and ``recover`` find both by them). The pod mounts only the
        user's own folder, and its paths are moved into that mount."""
        o = self.options
        mount = m.user_mount_path(o.mount_path, user)
        volume, volume_mount = m.make_user_volume(
            claim_name=o.storage_claim, user=user, mount_path=mount
        )
        workdir = m.pod_workdir(
            workdir=spec.workdir, storage_root=o.storage_root, user=user, mount_path=mount
        )
        labels = m.make_labels(
            instance=o.instance_name,
            job_id=spec.id,
            user=user,
            queue=queue,
            kind=spec.kind,
            prefix=o.prefix,
        )
        annotations = m.make_annotations(job_id=spec.id, plan=spec.leaf)
        env = {"WMLA_JOB_ID": spec.id, "WMLA_PLAN": spec.leaf, **spec.env}
        if o.run_as_uid_base is not None:  # no passwd entry for the uid: HOME is the folder,
            env.setdefault("HOME", mount)  # and getpass.getuser() reads the name from USER
            env.setdefault("USER", user)
            env.setdefault("LOGNAME", user)
        container = m.make_container(
            name=m.PYTORCH_CONTAINER,
            image=o.image,
            command=self._worker_command(spec, user, mount),
            per_worker=spec.per_worker,
            limits=spec.ceiling,
            workdir=workdir,
            env=env,
            volume_mounts=[volume_mount],
            gpu_resource=o.gpu_resource,
            image_pull_policy=o.image_pull_policy,
        )
        init: list[dict] = []
        if o.run_as_uid_base is not None:
            uid = m.pod_uid(user, o.run_as_uid_base)
            container["securityContext"] = m.run_as(uid)
            init.append(
                m.make_workdir_init(image=o.image, workdir=workdir, mount=volume_mount, uid=uid)
            )
        template = m.make_pod_template(
            containers=[container],
            labels=labels,
            annotations=annotations,
            volumes=[volume],
            priority_class=o.priority_class,
            termination_grace=o.grace,
            service_account=o.service_account,
            node_selector=o.node_selector,
            tolerations=o.tolerations,
            init_containers=init,
        )
        return template, labels, annotations

    def _worker_command(self, spec: JobSpec, user: str, mount: str) -> list[str]:
        o = self.options
        command = m.pod_command(
            command=spec.command, storage_root=o.storage_root, user=user, mount_path=mount
        )
        elastic = spec.max_workers > spec.min_workers
        if (
            elastic
            and o.job_kind is PYTORCHJOB
            and o.elastic_launcher
            and command
            and posixpath.basename(command[0]).startswith("python")
        ):
            # The operator gives elastic workers torchrun's settings (PET_NNODES=min:max, the
            # c10d rendezvous endpoint); torchrun re-forms the group when the size changes.
            return [*o.elastic_launcher, *command[1:]]
        return command
