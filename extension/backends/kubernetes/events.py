"""Event derivation: after every cache change, each tracked job's observed state is compared
with what was last reported, and ``running``/``resized``/``finished``/``failed``/``released``
events are emitted once each. This reads the cache only: no decisions, no API calls (but for
the logs fetched, best effort, when a job ends)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

from ..base import BackendEvent, Emit
from .objects import (
    _deleting,
    _ended_pod,
    condition_message,
    job_condition,
    pod_exit,
    pod_rank,
    pod_ready,
)
from .state import Cache, _Tracked

log = logging.getLogger("extension.backends.kubernetes")


class _Events:
    """The reconcile of the tracked jobs against the cache, and the one place events leave.

    A part of ``KubernetesBackend``: ``backend.py`` sets the attributes declared here.
    ``fetch_logs``, ``logs`` and ``_pods_of`` are the backend's.
    """

    emit: Emit
    cache: Cache
    _clock: Callable[[], float]
    _jobs: dict[str, _Tracked]
    _ended: set[str]
    _background: set[asyncio.Task]
    _change: asyncio.Event | None

    def _changed(self) -> None:
        for job_id in list(self._jobs):
            self._derive(job_id)
        waiter, self._change = self._change, None
        if waiter is not None:
            waiter.set()

    async def _next_change(self, timeout: float) -> bool:
        """Wait for the next cache change; False when none came within ``timeout``."""
        if self._change is None:
            self._change = asyncio.Event()
        try:
            await asyncio.wait_for(self._change.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    def _placement(self, pods: Sequence[dict]) -> tuple[str, ...]:
        return tuple((p.get("spec") or {}).get("nodeName", "") for p in sorted(pods, key=pod_rank))

    def _derive(self, job_id: str) -> None:
        tracked = self._jobs[job_id]
        obj = self.cache.get(tracked.kind, tracked.name)
        pods = self._pods_of(tracked.name)
        now = self._clock()
        if tracked.phase == "stopping":
            if obj is None and not pods:
                self._end(job_id)
                self._emit(BackendEvent(job_id, "released", now, message=tracked.reason))
            return
        if obj is None:
            if tracked.seen:
                self._end(job_id)
                self._emit(
                    BackendEvent(
                        job_id,
                        "failed",
                        now,
                        message=f"{tracked.kind} {tracked.name} was deleted outside wmla",
                    )
                )
            return
        tracked.seen = True
        condition = job_condition(obj, tracked.kind)
        if condition == "Succeeded":
            self._end(job_id)
            self._spawn(self._finish(job_id, tracked, obj, pods, failed=False))
            return
        if condition == "Failed":
            self._end(job_id)
            self._spawn(self._finish(job_id, tracked, obj, pods, failed=True))
            return
        live = [p for p in pods if not _deleting(p)]
        ready = [p for p in live if pod_ready(p)]
        if tracked.phase == "starting" and len(ready) >= tracked.workers:
            tracked.phase = "running"
            tracked.placement = self._placement(ready)
            self._emit(BackendEvent(job_id, "running", now, placement=tracked.placement))
        elif tracked.phase == "resizing" and len(ready) == len(pods) == tracked.workers:
            tracked.phase = "running"
            tracked.placement = self._placement(ready)
            self._emit(BackendEvent(job_id, "resized", now, placement=tracked.placement))

    def _end(self, job_id: str) -> None:
        del self._jobs[job_id]
        self._ended.add(job_id)

    def _emit(self, event: BackendEvent) -> None:
        try:
            self.emit(event)
        except Exception:  # the receiver's problem must not stop the watch that reports it
            log.exception("emit(%s) raised", event)

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _finish(
        self, job_id: str, tracked: _Tracked, obj: dict, pods: list[dict], failed: bool
    ) -> None:
        """Fetch the logs (best effort) and report the end of the job."""
        if failed:
            # The failing pod's exit code may arrive on the pod watch after the job's condition:
            # wait a little (at most ~2 s) while some pod has not ended yet.
            for _ in range(8):
                pods = self._pods_of(tracked.name)
                if any(pod_exit(p) for p in pods) or all(_ended_pod(p) for p in pods):
                    break
                if not await self._next_change(timeout=0.25):
                    break
        bound = [p for p in pods if (p.get("spec") or {}).get("nodeName")]
        placement = tracked.placement or self._placement(bound)
        now = self._clock()
        if tracked.phase == "starting" and (bound or not failed):
            # Ended before every pod was seen ready: still report that it ran, and where.
            self._emit(BackendEvent(job_id, "running", now, placement=placement))
        with contextlib.suppress(Exception):
            await self.fetch_logs(job_id, tail=200)
        now = self._clock()
        if not failed:
            self._emit(BackendEvent(job_id, "finished", now, placement=placement))
            return
        ordered = sorted(pods, key=pod_rank)
        bad = next((i for i, p in enumerate(ordered) if pod_exit(p)), None)
        exit_code = pod_exit(ordered[bad]) if bad is not None else None
        tail = self.logs(job_id, worker=bad, tail=20) if bad is not None else ""
        message = condition_message(obj)
        if tail:
            message = f"{message}\n{tail}" if message else tail
        self._emit(
            BackendEvent(
                job_id, "failed", now, placement=placement, exit_code=exit_code, message=message
            )
        )
