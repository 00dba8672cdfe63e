"""A job as a PyTorchJob (or Volcano Job): the object a ``JobSpec`` becomes, and the decisions
carried out on it. ``start`` creates one object (the operator and Volcano make its pods as one
gang), ``resize`` patches an elastic job's Worker replicas, ``stop`` deletes it with the grace
period (preemption), ``recover`` finds the jobs again after a service restart by their labels
and annotations. A create that meets ``409 AlreadyExists`` adopts the object when it is ours
(the first try may have landed) and waits for it to go when it is still terminating."""

from __future__ import annotations

import contextlib
import logging
import math
import posixpath
from collections.abc import Awaitable, Callable, Sequence

from extension.scheduler import Resources

from .. import manifests as m
from ..base import BackendEvent, JobSpec
from .api import PODS, PYTORCHJOBS, VOLCANO_JOBS, ApiError, KubeApi
from .errors import AdmissionRefused, BackendError
from .objects import _annotations, _deleting, _name, job_condition, job_workers, pod_ready
from .state import Cache, _Tracked

log = logging.getLogger("extension.backends.kubernetes")


class _Jobs:
    """Building job objects and carrying out decisions on them.

    A part of ``KubernetesBackend``: ``backend.py`` sets the attributes declared here.
    ``open``/``api``/``_call`` are watch.py's, ``admission_problem`` admission.py's,
    ``_ensure_queue_path`` queues.py's, ``_changed``/``_emit``/``_spawn``/``_placement``
    events.py's, ``_pods_of`` the backend's.
    """

    namespace: str
    prefix: str
    instance_name: str
    job_kind: str
    image: str
    image_pull_policy: str | None
    storage_claim: str
    storage_root: str
    mount_path: str
    gpu_resource: str
    priority_class: str | None
    grace: float
    elastic_launcher: list[str]
    service_account: str | None
    node_selector: dict[str, str]
    tolerations: list[dict]
    ttl: int | None
    backoff_initial: float
    backoff_max: float
    retry_deadline: float
    cache: Cache
    api: KubeApi
    _sleep: Callable[[float], Awaitable[None]]
    _clock: Callable[[], float]
    _jobs: dict[str, _Tracked]
    _ended: set[str]
    _closed: bool

    def build_job(self, spec: JobSpec, workers: int) -> dict:
        """The job object for ``spec`` at ``workers`` workers (pure; errors before any call)."""
        user = m.validate_username(spec.user)
        name = m.job_object_name(spec.id, self.prefix)
        queue = m.queue_name(spec.leaf, self.prefix)
        template, labels, annotations = self._pod_template(spec, user, queue)
        common = dict(
            name=name,
            namespace=self.namespace,
            template=template,
            workers=workers,
            queue=queue,
            labels=labels,
            annotations=annotations,
            priority_class=self.priority_class,
            ttl_seconds_after_finished=self.ttl,
        )
        elastic = spec.max_workers > spec.min_workers
        if self.job_kind == VOLCANO_JOBS:
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
        mount = m.user_mount_path(self.mount_path, user)
        volume, volume_mount = m.make_user_volume(
            claim_name=self.storage_claim, user=user, mount_path=mount
        )
        workdir = m.pod_workdir(
            workdir=spec.workdir, storage_root=self.storage_root, user=user, mount_path=mount
        )
        labels = m.make_labels(
            instance=self.instance_name,
            job_id=spec.id,
            user=user,
            queue=queue,
            kind=spec.kind,
            prefix=self.prefix,
        )
        annotations = m.make_annotations(job_id=spec.id, plan=spec.leaf)
        env = {"WMLA_JOB_ID": spec.id, "WMLA_PLAN": spec.leaf, **spec.env}
        container = m.make_container(
            name=m.PYTORCH_CONTAINER,
            image=self.image,
            command=self._worker_command(spec, user, mount),
            per_worker=spec.per_worker,
            workdir=workdir,
            env=env,
            volume_mounts=[volume_mount],
            gpu_resource=self.gpu_resource,
            image_pull_policy=self.image_pull_policy,
        )
        template = m.make_pod_template(
            containers=[container],
            labels=labels,
            annotations=annotations,
            volumes=[volume],
            priority_class=self.priority_class,
            termination_grace=self.grace,
            service_account=self.service_account,
            node_selector=self.node_selector,
            tolerations=self.tolerations,
        )
        return template, labels, annotations

    def _worker_command(self, spec: JobSpec, user: str, mount: str) -> list[str]:
        command = m.pod_command(
            command=spec.command, storage_root=self.storage_root, user=user, mount_path=mount
        )
        elastic = spec.max_workers > spec.min_workers
        if (
            elastic
            and self.job_kind == PYTORCHJOBS
            and self.elastic_launcher
            and command
            and posixpath.basename(command[0]).startswith("python")
        ):
            # The operator gives elastic workers torchrun's settings (PET_NNODES=min:max, the
            # c10d rendezvous endpoint); torchrun re-forms the group when the size changes.
            return [*self.elastic_launcher, *command[1:]]
        return command

    # -- decisions ------------------------------------------------------------------------------
    async def start(self, spec: JobSpec, placement: tuple[str, ...]) -> None:
        """Create the job (one object; the operator and Volcano make its pods as one gang).

        Volcano chooses the nodes; the ``running`` event reports where the pods landed.
        Raises ``AdmissionRefused`` (nothing created) when the quota or a LimitRange would
        refuse a pod, ``ManifestError`` for input that cannot become an object.
        """
        await self.open()
        workers = len(placement)
        body = self.build_job(spec, workers)
        problem = self.admission_problem(spec.per_worker, workers)
        if problem:
            raise AdmissionRefused(f"job {spec.id}: {problem[0]}", permanent=problem[1])
        name = _name(body)
        self._ended.discard(spec.id)  # a preempted job starting again
        self._jobs[spec.id] = _Tracked(spec, name, self.job_kind, workers=workers)
        try:
            await self._ensure_queue_path(spec.leaf)
            await self._create_job(spec, body)
        except BaseException:
            self._jobs.pop(spec.id, None)
            raise
        self._changed()

    async def _create_job(self, spec: JobSpec, body: dict) -> None:
        name = _name(body)
        delay = self.backoff_initial
        waited = 0.0
        while True:
            try:
                await self._call(
                    f"create {name}", lambda: self.api.create(self.job_kind, self.namespace, body)
                )
                return
            except ApiError as exc:
                if exc.status != 409:
                    raise BackendError(f"creating {name} for job {spec.id} failed: {exc}") from exc
            # 409: ours from an earlier try (adopt it), still terminating (wait), or foreign.
            existing = await self._call(
                f"read {name}", lambda: self.api.get(self.job_kind, self.namespace, name)
            )
            if _annotations(existing).get(m.ANNOTATION_JOB_ID) != spec.id:
                raise BackendError(
                    f"{self.job_kind} {name} exists and is not job {spec.id}'s; delete it or "
                    "change the name prefix"
                )
            if not _deleting(existing):
                self.cache.apply(self.job_kind, "ADDED", existing)
                return
            if waited >= self.retry_deadline:
                raise BackendError(
                    f"{name} from an earlier run of job {spec.id} is still terminating"
                )
            await self._sleep(delay)
            waited += delay
            delay = min(self.backoff_max, delay * 2)

    async def resize(self, spec: JobSpec, placement: tuple[str, ...], grace: float) -> None:
        """Elastic PyTorchJobs only: set the Worker replicas; the operator adds or removes pods
        (removed pods get their termination grace), and torchrun re-forms the group."""
        await self.open()
        tracked = self._jobs.get(spec.id)
        if tracked is None:
            raise BackendError(f"job {spec.id} is not running here; cannot resize it")
        if self.job_kind != PYTORCHJOBS or spec.max_workers == spec.min_workers:
            raise BackendError(f"job {spec.id} is not an elastic PyTorchJob; cannot resize it")
        workers = len(placement)
        if not spec.min_workers <= workers <= spec.max_workers:
            raise BackendError(
                f"job {spec.id}: {workers} workers is outside "
                f"{spec.min_workers}..{spec.max_workers}"
            )
        added = workers - tracked.workers
        if added > 0:
            problem = self.admission_problem(spec.per_worker, added, new_object=False)
            if problem:
                raise AdmissionRefused(f"job {spec.id}: {problem[0]}", permanent=problem[1])
        patch = {"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": workers}}}}
        await self._call(
            f"resize {tracked.name}",
            lambda: self.api.patch(self.job_kind, self.namespace, tracked.name, patch),
        )
        tracked.workers = workers
        tracked.phase = "resizing"
        self._changed()

    async def stop(self, job_id: str, grace: float, reason: str) -> None:
        """Delete the job and its pods with ``grace`` seconds to checkpoint; ``released`` follows
        once the watch shows every pod gone."""
        await self.open()
        tracked = self._jobs.get(job_id)
        name = tracked.name if tracked else m.job_object_name(job_id, self.prefix)
        if tracked is None and job_id in self._ended:
            # It finished or failed just before: that was its one end; nothing to release.
            log.info("stop of %s after it ended: nothing to do", job_id)
            return
        if tracked is None:
            obj = self.cache.get(self.job_kind, name)
            if obj is None or _annotations(obj).get(m.ANNOTATION_JOB_ID) != job_id:
                if not self._pods_of(name):
                    self._emit(BackendEvent(job_id, "released", self._clock(), message=reason))
                    return
            spec = JobSpec(job_id, "unknown", "/", Resources(), (), "/")
            tracked = self._jobs[job_id] = _Tracked(spec, name, self.job_kind)
        tracked.phase = "stopping"
        tracked.reason = reason
        seconds = max(0, int(math.ceil(grace)))
        try:
            await self._delete_gang(name, seconds)
        except BackendError as exc:
            # A stop must happen even if the API server is away for long: keep trying in the
            # background; ``released`` still comes only when the pods are gone.
            log.warning("stopping %s: %s; retrying in the background", job_id, exc)
            self._spawn(self._keep_deleting(job_id, name, seconds))
        self._changed()

    async def _delete_gang(self, name: str, seconds: int) -> None:
        with contextlib.suppress(ApiError):  # 404: already gone
            await self._call(
                f"delete {name}",
                lambda: self.api.delete(self.job_kind, self.namespace, name, seconds, "Foreground"),
            )
        # The pods' own grace is the template's; delete them too so this call's grace holds.
        for pod in self._pods_of(name):
            if _deleting(pod):
                continue
            with contextlib.suppress(ApiError):
                await self._call(
                    f"delete pod {_name(pod)}",
                    lambda pod=pod: self.api.delete(PODS, self.namespace, _name(pod), seconds),
                )

    async def _keep_deleting(self, job_id: str, name: str, seconds: int) -> None:
        while not self._closed and job_id in self._jobs:
            try:
                await self._delete_gang(name, seconds)
                return
            except BackendError:
                await self._sleep(self.backoff_max)

    async def recover(self, specs: Sequence[JobSpec]) -> None:
        """Re-adopt jobs by their labels and job-id annotation; ``lost`` for the missing."""
        await self.open()
        by_id = {
            _annotations(obj).get(m.ANNOTATION_JOB_ID): obj for obj in self.cache.all(self.job_kind)
        }
        known = set()
        for spec in specs:
            known.add(spec.id)
            obj = by_id.get(spec.id)
            if obj is None:
                self._emit(
                    BackendEvent(
                        spec.id,
                        "lost",
                        self._clock(),
                        message=f"no {self.job_kind} for job {spec.id} in namespace "
                        f"{self.namespace} after the restart",
                    )
                )
                continue
            tracked = _Tracked(
                spec, _name(obj), self.job_kind, workers=job_workers(obj, self.job_kind), seen=True
            )
            if _deleting(obj):
                tracked.phase = "stopping"
            elif job_condition(obj, self.job_kind) in ("Succeeded", "Failed"):
                tracked.phase = "running"  # ended while we were away: report only the end
            else:
                pods = self._pods_of(tracked.name)
                ready = [p for p in pods if pod_ready(p)]
                if ready and len(ready) == len(pods) >= tracked.workers:
                    tracked.phase = "running"  # already reported before the restart
                    tracked.placement = self._placement(ready)
            self._jobs[spec.id] = tracked
        for job_id, obj in by_id.items():
            if job_id not in known:
                log.warning(
                    "%s %s (job %s) is ours but the service does not know it; left alone",
                    self.job_kind,
                    _name(obj),
                    job_id,
                )
        self._changed()
