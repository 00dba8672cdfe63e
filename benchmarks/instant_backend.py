"""A backend whose jobs finish at once, for load benchmarks of the service (bench_service.py).

Configured like any backend: ``c.WmlaService.backend_class =
"benchmarks.instant_backend.InstantBackend"`` (the repository root on the service's
PYTHONPATH) and ``c.WmlaService.backend_options``:

- ``finish_after``: seconds between ``running`` and ``finished`` (0: both emitted inside
  ``start``, so the next cycle folds in a job that has already ended).
- ``cycle_log``: a file that gets one line per scheduling cycle, ``wall_time seconds decisions
  live_jobs`` (the seconds the loop measured itself, handed to its ``cycle_hooks``).
- ``lag_log`` / ``lag_interval``: a file that gets one line per probe, ``wall_time lag``: how
  late a ``lag_interval`` timer fired on the service's event loop, i.e. for how long something
  held the loop (a cycle, a store commit in a handler, a JSON dump).

It implements the protocol of ``extension/backends/base.py``: no processes, no files in the
job's folder; jobs run as the service's own account (``account_for`` returns None), as the
local backend does with ``run_as_user=False``. Nothing of the service is changed: the cycle
hook is the one metering uses.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from extension.backends.base import BackendEvent, Emit, EventKind, JobSpec
from extension.scheduler import Node

from .loop_observer import LoopObserver


class InstantBackend:
    def __init__(
        self,
        emit: Emit,
        nodes: Sequence[Node],
        state_dir: str,
        *,
        finish_after: float = 0.0,
        cycle_log: str = "",
        lag_log: str = "",
        lag_interval: float = 0.01,
    ) -> None:
        self.emit = emit
        self.nodes = list(nodes)
        self.state_dir = state_dir
        self.finish_after = float(finish_after)
        self.running: dict[str, tuple[str, ...]] = {}
        self.started = 0
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self.observer = LoopObserver(emit, cycle_log, lag_log, lag_interval)

    # -- the protocol ------------------------------------------------------------------------
    def capacity(self) -> list[Node]:
        self.observer.start()  # first called from the running loop, before any cycle
        return list(self.nodes)

    async def start(self, spec: JobSpec, placement: tuple[str, ...]) -> None:
        self.started += 1
        self.running[spec.id] = tuple(placement)
        self.emit(BackendEvent(spec.id, EventKind.RUNNING, time.time(), tuple(placement)))
        if self.finish_after <= 0:
            self._finish(spec.id)
        else:
            loop = asyncio.get_running_loop()
            self._timers[spec.id] = loop.call_later(self.finish_after, self._finish, spec.id)

    def _finish(self, job_id: str) -> None:
        self._timers.pop(job_id, None)
        if self.running.pop(job_id, None) is not None:
            self.emit(BackendEvent(job_id, EventKind.FINISHED, time.time(), exit_code=0))

    async def resize(self, spec: JobSpec, placement: tuple[str, ...], grace: float) -> None:
        self.running[spec.id] = tuple(placement)
        self.emit(BackendEvent(spec.id, EventKind.RESIZED, time.time(), tuple(placement)))

    async def stop(self, job_id: str, grace: float, reason: str) -> None:
        timer = self._timers.pop(job_id, None)
        if timer is not None:
            timer.cancel()
        self.running.pop(job_id, None)
        self.emit(BackendEvent(job_id, EventKind.RELEASED, time.time()))

    async def recover(self, specs: Sequence[JobSpec]) -> None:
        # jobs of this backend end at once, so any that were running have ended meanwhile
        for spec in specs:
            self.emit(BackendEvent(spec.id, EventKind.FINISHED, time.time(), exit_code=0))

    def logs(self, job_id: str, worker: int | None = None, tail: int | None = None) -> str:
        return ""

    def account_for(self, user: str, home: str | None = None) -> None:
        return None  # the service's own account, as LocalBackend(run_as_user=False)

    async def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self.observer.close()
