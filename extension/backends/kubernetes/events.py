"""Event derivation: after every cache change, each tracked job's observed state is compared
with what was last reported, and ``running``/``resized``/``finished``/``failed``/``released``
events are emitted once each. This reads the cache only: no decisions, no API calls (but for
the logs read, best effort, when a job ends)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping

from ..base import BackendEvent, Emit, EventKind
from .logs import WorkerLogs
from .objects import (
    JobCondition,
    condition_message,
    is_deleting,
    job_condition,
    meta_of,
    name_of,
    pod_end_reason,
    pod_ended,
    pod_exit,
    pod_placement,
    pod_rank,
    pod_ready,
)
from .state import Cache, FailedPod, Phase, TrackedJob, Tracking
from .tasks import Background

log = logging.getLogger("extension.backends.kubernetes")


class EventDeriver:
    """The reconcile of the tracked jobs against the cache, and the one place events leave
    (``emit``: a receiver that raises must not stop the watch that reports)."""

    def __init__(
        self,
        sink: Emit,
        cache: Cache,
        tracking: Tracking,
        logs: WorkerLogs,
        background: Background,
        clock: Callable[[], float],
    ) -> None:
        self.sink = sink
        self.cache = cache
        self.tracking = tracking
        self.logs = logs
        self.background = background
        self.clock = clock
        self._change: asyncio.Event | None = None

    def emit(self, event: BackendEvent) -> None:
        """Report one event to the receiver."""
        try:
            self.sink(event)
        except Exception:  # the receiver's problem must not stop the watch that reports it
            log.exception("emit(%s) raised", event)

    def changed(self) -> None:
        """The cache or a tracked job changed: derive every tracked job's events again."""
        for job_id in self.tracking.ids():
            self._derive(job_id)
        waiter, self._change = self._change, None
        if waiter is not None:
            waiter.set()

    async def next_change(self, timeout: float) -> bool:
        """Wait for the next change; False when none came within ``timeout``."""
        if self._change is None:
            self._change = asyncio.Event()
        try:
            await asyncio.wait_for(self._change.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    def _derive(self, job_id: str) -> None:
        tracked = self.tracking.get(job_id)
        if tracked is None:
            return
        obj = self.cache.get(tracked.kind, tracked.name)
        pods = self.cache.pods_of(tracked.name)
        # with the pods deleted since: their deletion carries the last status, which a watch
        # that delivered both changes at once never showed as a pod of the job (only this job
        # object's: an earlier run of the job had pods of the same names)
        uid = meta_of(obj).get("uid") if obj is not None else None
        gone = [p for p in self.cache.gone_pods_of(tracked.name) if uid and _owned_by(p, uid)]
        self._keep_failed(job_id, tracked, pods + gone)
        now = self.clock()
        if tracked.phase is Phase.STOPPING:
            if obj is None and not pods:
                self.tracking.end(job_id)
                self.emit(BackendEvent(job_id, EventKind.RELEASED, now, message=tracked.reason))
            return
        if obj is None:
            if tracked.seen:
                self.tracking.end(job_id)
                message = f"{tracked.kind} {tracked.name} was deleted outside wmla"
                self.emit(BackendEvent(job_id, EventKind.FAILED, now, message=message))
            return
        tracked.seen = True
        condition = job_condition(obj, tracked.kind)
        if condition.ended:
            self.tracking.end(job_id)
            failed = condition is JobCondition.FAILED
            self.background.spawn(self._finish(job_id, tracked, obj, pods, failed=failed))
            return
        ready = [p for p in pods if not is_deleting(p) and pod_ready(p)]
        if tracked.phase is Phase.STARTING and len(ready) >= tracked.workers:
            tracked.phase = Phase.RUNNING
            tracked.placement = pod_placement(ready)
            self.emit(BackendEvent(job_id, EventKind.RUNNING, now, placement=tracked.placement))
        elif tracked.phase is Phase.RESIZING and len(ready) == len(pods) == tracked.workers:
            tracked.phase = Phase.RUNNING
            tracked.placement = pod_placement(ready)
            self.emit(BackendEvent(job_id, EventKind.RESIZED, now, placement=tracked.placement))

    def _keep_failed(self, job_id: str, tracked: TrackedJob, pods: list[dict]) -> None:
        """A pod seen with a failed container is kept (its status) and its log read now,
        before the operator deletes it with its log."""
        ordered = sorted(pods, key=pod_rank)
        new = [FailedPod(rank, p) for rank, p in enumerate(ordered)
               if pod_exit(p) and name_of(p) not in tracked.failed_pods]  # fmt: skip
        for failed in new:
            tracked.failed_pods[name_of(failed.pod)] = failed
        if new:
            self.background.spawn(self._read_logs(job_id))

    async def _read_logs(self, job_id: str) -> None:
        with contextlib.suppress(Exception):
            await self.logs.fetch(job_id, tail=200)

    async def _finish(
        self, job_id: str, tracked: TrackedJob, obj: dict, pods: list[dict], failed: bool
    ) -> None:
        """Read the logs (best effort) and report the end of the job."""
        if failed:
            pods = await self._settled_pods(tracked, pods)
        bound = [p for p in pods if (p.get("spec") or {}).get("nodeName")]
        if not bound:  # deleted already: where the failed ones ran (kept with their status)
            kept = [f.pod for f in tracked.failed_pods.values()]
            bound = [p for p in kept if (p.get("spec") or {}).get("nodeName")]
        placement = tracked.placement or pod_placement(bound)
        now = self.clock()
        if tracked.phase is Phase.STARTING and (bound or not failed):
            # Ended before every pod was seen ready: still report that it ran, and where.
            self.emit(BackendEvent(job_id, EventKind.RUNNING, now, placement=placement))
        with contextlib.suppress(Exception):
            await self.logs.fetch(job_id, tail=200)
        now = self.clock()
        if not failed:
            self.emit(BackendEvent(job_id, EventKind.FINISHED, now, placement=placement))
            return
        first = _first_failure(tracked, pods)
        bad = first.rank if first is not None else None
        exit_code = pod_exit(first.pod) if first is not None else None
        tail = self.logs.text(job_id, worker=bad, tail=20) if bad is not None else ""
        message = condition_message(obj)
        why = pod_end_reason(first.pod) if first is not None else ""
        if why:  # the kubelet's word for it, e.g. OOMKilled
            message = f"worker {bad}: {why} (exit code {exit_code}); {message}".rstrip("; ")
        if tail:
            message = f"{message}\n{tail}" if message else tail
        self.emit(
            BackendEvent(
                job_id,
                EventKind.FAILED,
                now,
                placement=placement,
                exit_code=exit_code,
                message=message,
            )
        )

    async def _settled_pods(self, tracked: TrackedJob, pods: list[dict]) -> list[dict]:
        """The failing pod's exit code may arrive on the pod watch after the job's condition:
        wait a little (at most ~2 s) while some pod has not ended yet."""
        for _ in range(8):
            pods = self.cache.pods_of(tracked.name)
            if any(pod_exit(p) for p in pods) or all(pod_ended(p) for p in pods):
                break
            if not await self.next_change(timeout=0.25):
                break
        return pods


def _first_failure(tracked: TrackedJob, pods: list[dict]) -> FailedPod | None:
    """The failed worker of lowest rank: from the job's pods when they are all still there,
    else from those kept when they failed (the operator may have deleted them since)."""
    ordered = sorted(pods, key=pod_rank)
    current = [FailedPod(rank, p) for rank, p in enumerate(ordered) if pod_exit(p)]
    if current and len(ordered) >= tracked.workers:
        return current[0]
    kept = sorted(tracked.failed_pods.values(), key=lambda f: f.rank)
    if kept:
        return kept[0]
    return current[0] if current else None


def _owned_by(pod: Mapping, uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in meta_of(pod).get("ownerReferences") or [])
