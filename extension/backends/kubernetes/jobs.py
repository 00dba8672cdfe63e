"""The decisions carried out on job objects: ``start`` creates one object (the operator and
Volcano make its pods as one gang), ``resize`` patches an elastic job's Worker replicas, ``stop``
deletes it with the grace period (preemption), ``recover`` finds the jobs again after a service
restart by their labels and annotations. A create that meets ``409 AlreadyExists`` adopts the
object when it is ours (the first try may have landed) and waits for it to go when it is still
terminating."""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Sequence

from extension.scheduler import Resources

from .. import manifests as m
from ..base import BackendEvent, EventKind, JobSpec
from .admission import Admission, AdmissionProblem
from .api import PODS, ApiError, WatchEvent
from .calls import ApiCalls
from .errors import AdmissionRefused, BackendError
from .events import EventDeriver
from .job_object import JobBuilder
from .objects import (
    annotations_of,
    is_deleting,
    job_condition,
    job_workers,
    name_of,
    pod_placement,
    pod_ready,
)
from .queues import QueueWriter
from .state import Cache, Phase, TrackedJob, Tracking
from .tasks import Background

log = logging.getLogger("extension.backends.kubernetes")


def refused(spec: JobSpec, problem: AdmissionProblem) -> AdmissionRefused:
    return AdmissionRefused(f"job {spec.id}: {problem.message}", permanent=problem.permanent)


class JobRunner:
    """Carries out the core's decisions on job objects; ``events.changed`` after each, so that
    what it changed is reported as soon as the cache shows it."""

    def __init__(
        self,
        calls: ApiCalls,
        cache: Cache,
        tracking: Tracking,
        builder: JobBuilder,
        admission: Admission,
        queues: QueueWriter,
        events: EventDeriver,
        background: Background,
        closed: Callable[[], bool],
        clock: Callable[[], float],
    ) -> None:
        self.calls = calls
        self.cache = cache
        self.tracking = tracking
        self.builder = builder
        self.admission = admission
        self.queues = queues
        self.events = events
        self.background = background
        self.closed = closed
        self.clock = clock
        options = builder.options
        self.kind = options.job_kind
        self.job_kind = options.job_kind.resource
        self.namespace = options.namespace
        self.prefix = options.prefix

    async def start(self, spec: JobSpec, placement: tuple[str, ...]) -> None:
        """Create the job (one object; the operator and Volcano make its pods as one gang).

        Raises ``AdmissionRefused`` (nothing created) when the quota or a LimitRange would
        refuse a pod, ``ManifestError`` for input that cannot become an object.
        """
        workers = len(placement)
        body = self.builder.build(spec, workers)
        problem = self.admission.problem(spec.per_worker, workers, ceiling=spec.ceiling)
        if problem:
            raise AdmissionRefused(f"job {spec.id}: {problem.message}", permanent=problem.permanent)
        self.tracking.track(
            spec.id, TrackedJob(spec, name_of(body), self.job_kind, workers=workers)
        )
        try:
            await self.queues.ensure_queue_path(spec.leaf)
            await self._create_job(spec, body)
        except BaseException:
            self.tracking.forget(spec.id)
            raise
        self.events.changed()

    async def _create_job(self, spec: JobSpec, body: dict) -> None:
        name = name_of(body)
        backoff = self.calls.backoff
        delay = backoff.initial
        waited = 0.0
        while True:
            try:
                await self.calls.call(
                    f"create {name}",
                    lambda: self.calls.api.create(self.job_kind, self.namespace, body),
                )
                return
            except ApiError as exc:
                if exc.status != 409:
                    raise BackendError(f"creating {name} for job {spec.id} failed: {exc}") from exc
            # 409: ours from an earlier try (adopt it), still terminating (wait), or foreign.
            existing = await self.calls.call(
                f"read {name}", lambda: self.calls.api.get(self.job_kind, self.namespace, name)
            )
            if annotations_of(existing).get(m.ANNOTATION_JOB_ID) != spec.id:
                raise BackendError(
                    f"{self.job_kind} {name} exists and is not job {spec.id}'s; delete it or "
                    "change the name prefix"
                )
            if not is_deleting(existing):
                self.cache.apply(self.job_kind, WatchEvent.ADDED, existing)
                return
            if waited >= backoff.deadline:
                raise BackendError(
                    f"{name} from an earlier run of job {spec.id} is still terminating"
                )
            await backoff.sleep(delay)
            waited += delay
            delay = backoff.next(delay)

    async def resize(self, spec: JobSpec, placement: tuple[str, ...], grace: float) -> None:
        """Elastic PyTorchJobs only: set the Worker replicas; the operator adds or removes pods
        (removed pods get their termination grace), and torchrun re-forms the group."""
        tracked = self.tracking.get(spec.id)
        if tracked is None:
            raise BackendError(f"job {spec.id} is not running here; cannot resize it")
        if not self.kind.resizable or spec.max_workers == spec.min_workers:
            raise BackendError(f"job {spec.id} is not an elastic PyTorchJob; cannot resize it")
        workers = len(placement)
        if not spec.min_workers <= workers <= spec.max_workers:
            raise BackendError(
                f"job {spec.id}: {workers} workers is outside "
                f"{spec.min_workers}..{spec.max_workers}"
            )
        added = workers - tracked.workers
        if added > 0:
            problem = self.admission.problem(
                spec.per_worker, added, new_object=False, ceiling=spec.ceiling
            )
            if problem:
                raise AdmissionRefused(
                    f"job {spec.id}: {problem.message}", permanent=problem.permanent
                )
        patch = {"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": workers}}}}
        await self.calls.call(
            f"resize {tracked.name}",
            lambda: self.calls.api.patch(self.job_kind, self.namespace, tracked.name, patch),
        )
        tracked.workers = workers
        tracked.phase = Phase.RESIZING
        self.events.changed()

    async def stop(self, job_id: str, grace: float, reason: str) -> None:
        """Delete the job and its pods with ``grace`` seconds to checkpoint; ``released`` follows
        once the watch shows every pod gone."""
        tracked = self.tracking.get(job_id)
        name = tracked.name if tracked else m.job_object_name(job_id, self.prefix)
        if tracked is None and self.tracking.has_ended(job_id):
            # It finished or failed just before: that was its one end; nothing to release.
            log.info("stop of %s after it ended: nothing to do", job_id)
            return
        if tracked is None:
            obj = self.cache.get(self.job_kind, name)
            if obj is None or annotations_of(obj).get(m.ANNOTATION_JOB_ID) != job_id:
                if not self.cache.pods_of(name):
                    event = BackendEvent(job_id, EventKind.RELEASED, self.clock(), message=reason)
                    self.events.emit(event)
                    return
            spec = JobSpec(job_id, "unknown", "/", Resources(), (), "/")
            tracked = TrackedJob(spec, name, self.job_kind)
            self.tracking.adopt(job_id, tracked)
        tracked.phase = Phase.STOPPING
        tracked.reason = reason
        seconds = max(0, int(math.ceil(grace)))
        try:
            await self._delete_gang(name, seconds)
        except BackendError as exc:
            # A stop must happen even if the API server is away for long: keep trying in the
            # background; ``released`` still comes only when the pods are gone.
            log.warning("stopping %s: %s; retrying in the background", job_id, exc)
            self.background.spawn(self._keep_deleting(job_id, name, seconds))
        self.events.changed()

    async def _delete_gang(self, name: str, seconds: int) -> None:
        namespace = self.namespace
        with contextlib.suppress(ApiError):  # 404: already gone
            await self.calls.call(
                f"delete {name}",
                lambda: self.calls.api.delete(
                    self.job_kind, namespace, name, seconds, "Foreground"
                ),
            )
        # The pods' own grace is the template's; delete them too so this call's grace holds.
        for pod in self.cache.pods_of(name):
            if is_deleting(pod):
                continue
            with contextlib.suppress(ApiError):
                await self.calls.call(
                    f"delete pod {name_of(pod)}",
                    lambda pod=pod: self.calls.api.delete(PODS, namespace, name_of(pod), seconds),
                )

    async def _keep_deleting(self, job_id: str, name: str, seconds: int) -> None:
        while not self.closed() and job_id in self.tracking:
            try:
                await self._delete_gang(name, seconds)
                return
            except BackendError:
                await self.calls.backoff.sleep(self.calls.backoff.most)

    async def recover(self, specs: Sequence[JobSpec]) -> None:
        """Re-adopt jobs by their labels and job-id annotation; ``lost`` for the missing."""
        by_id = {
            annotations_of(obj).get(m.ANNOTATION_JOB_ID): obj
            for obj in self.cache.all(self.job_kind)
        }
        for spec in specs:
            obj = by_id.get(spec.id)
            if obj is None:
                message = (
                    f"no {self.job_kind} for job {spec.id} in namespace {self.namespace} "
                    "after the restart"
                )
                self.events.emit(
                    BackendEvent(spec.id, EventKind.LOST, self.clock(), message=message)
                )
                continue
            self.tracking.adopt(spec.id, self._found(spec, obj))
        known = {spec.id for spec in specs}
        for job_id, obj in by_id.items():
            if job_id not in known:
                log.warning(
                    "%s %s (job %s) is ours but the service does not know it; left alone",
                    self.job_kind,
                    name_of(obj),
                    job_id,
                )
        self.events.changed()

    def _found(self, spec: JobSpec, obj: dict) -> TrackedJob:
        """The record of a job found again after a restart, in the phase it is in."""
        tracked = TrackedJob(
            spec, name_of(obj), self.job_kind, workers=job_workers(obj, self.job_kind), seen=True
        )
        if is_deleting(obj):
            tracked.phase = Phase.STOPPING
        elif job_condition(obj, self.job_kind).ended:
            tracked.phase = Phase.RUNNING  # ended while we were away: report only the end
        else:
            pods = self.cache.pods_of(tracked.name)
            ready = [p for p in pods if pod_ready(p)]
            if ready and len(ready) == len(pods) >= tracked.workers:
                tracked.phase = Phase.RUNNING  # already reported before the restart
                tracked.placement = pod_placement(ready)
        return tracked
