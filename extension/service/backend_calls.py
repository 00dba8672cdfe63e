"""The backend calls the service makes: queued by a cycle until the store has what the cycle
decided, then run each as a task of its own, one job's calls in order (a stop waits for the
start before it); a call that fails comes back as an event for the next cycle."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from extension.backends.base import AdmissionRefused, Backend, BackendEvent, EventKind, JobSpec
from extension.scheduler import PlanTree

Call = Callable[[], Awaitable[None]]


class BackendCalls:
    """``start``/``resize``/``stop`` queue a call for after the cycle's commit (``run_queued``;
    ``discard_queued`` when the commit failed); ``stop(now=True)`` and ``sync_queues`` run at
    once. ``backend()`` is the backend attached now."""

    def __init__(
        self,
        backend: Callable[[], Backend | None],
        emit: Callable[[BackendEvent], None],
        clock: Callable[[], float],
        log: logging.Logger,
    ) -> None:
        self.backend = backend
        self.emit = emit
        self.clock = clock
        self.log = log
        self._queued: list[tuple[str, Call]] = []
        self._tasks: dict[str, asyncio.Task] = {}

    def _attached(self) -> Backend:
        backend = self.backend()
        assert backend is not None
        return backend

    def start(self, spec: JobSpec, placement: tuple[str, ...]) -> None:
        backend = self._attached()
        self._queued.append((spec.id, lambda: backend.start(spec, placement)))

    def resize(self, spec: JobSpec, placement: tuple[str, ...], grace: float) -> None:
        backend = self._attached()
        self._queued.append((spec.id, lambda: backend.resize(spec, placement, grace)))

    def stop(self, job_id: str, grace: float, reason: str, now: bool = False) -> None:
        """A stop for after the commit, or at once (``now``) for a user's cancel."""
        backend = self._attached()
        call = (job_id, lambda: backend.stop(job_id, grace, reason))
        if now:
            self.run(*call)
        else:
            self._queued.append(call)

    def sync_queues(self, plans: PlanTree) -> None:
        """Give a backend that mirrors the plan tree (Volcano queues) the tree, at once."""
        backend = self._attached()
        self.run("plans", lambda: backend.sync_queues(plans))

    def run_queued(self) -> None:
        """The cycle is stored: carry out what it queued, in order."""
        calls, self._queued = self._queued, []
        for job_id, call in calls:
            self.run(job_id, call)

    def discard_queued(self) -> None:
        """The cycle stored nothing: carry out none of it."""
        self._queued.clear()

    def run(self, job_id: str, call: Call) -> None:
        """Run a backend call as its own task, after the job's earlier calls; the loop goes on
        deciding while a grace period runs."""
        previous = self._tasks.get(job_id)
        task = asyncio.ensure_future(self._after(previous, job_id, call))
        self._tasks[job_id] = task
        task.add_done_callback(lambda t: self._tasks.get(job_id) is t and self._tasks.pop(job_id))

    async def _after(self, previous: asyncio.Task | None, job_id: str, call: Call) -> None:
        if previous is not None:
            with contextlib.suppress(Exception):
                await previous
        try:
            await call()
        except Exception as err:  # the backend could not do it: the job fails, visibly
            if isinstance(err, AdmissionRefused) and not err.permanent:
                # refused for now, before anything was created (a namespace quota that may
                # free up): back to the queue with the platform's words, not a failure
                self.log.warning("backend refused %s for now: %s", job_id, err)
                self.emit(BackendEvent(job_id, EventKind.REFUSED, self.clock(), message=str(err)))
                return
            self.log.exception("backend call for %s failed", job_id)
            message = f"backend error: {err}"
            self.emit(BackendEvent(job_id, EventKind.FAILED, self.clock(), message=message))

    def under_way(self) -> list[asyncio.Task]:
        """The calls under way (one task per job: its latest)."""
        return list(self._tasks.values())

    async def drain(self) -> None:
        """Wait for every backend call under way (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks.values()), return_exceptions=True)
