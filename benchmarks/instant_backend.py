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
from typing import Any

from extension.backends.base import BackendEvent, Emit, JobSpec
from extension.scheduler import Node


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
        self._cycle_file = open(cycle_log, "a", buffering=1 << 16) if cycle_log else None  # noqa: SIM115
        self._lag_file = open(lag_log, "a", buffering=1 << 16) if lag_log else None  # noqa: SIM115
        self._lag_interval = float(lag_interval)
        self._lag_task: asyncio.Task | None = None
        self._flusher: asyncio.Task | None = None
        scheduler = getattr(emit, "__self__", None)  # emit is the loop's bound Scheduler.emit
        hooks = getattr(scheduler, "cycle_hooks", None)
        if self._cycle_file is not None and hooks is not None:
            hooks.append(self._on_cycle)

    # -- observation ---------------------------------------------------------------------------
    def _on_cycle(self, result: Any, now: float, seconds: float) -> None:
        if self._cycle_file is None:
            return
        live = len(getattr(getattr(self.emit, "__self__", None), "jobs", ()) or ())
        decisions = len(getattr(result, "decisions", ()) or ())
        self._cycle_file.write(f"{time.time():.6f} {seconds:.6f} {decisions} {live}\n")

    async def _probe_lag(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self._lag_interval
        while True:
            before = loop.time()
            await asyncio.sleep(interval)
            lag = loop.time() - before - interval
            if self._lag_file is not None:
                self._lag_file.write(f"{time.time():.6f} {max(0.0, lag):.6f}\n")

    async def _flush(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            for f in (self._cycle_file, self._lag_file):
                if f is not None:
                    f.flush()

    def _ensure_tasks(self) -> None:
        if self._flusher is None and (self._cycle_file or self._lag_file):
            self._flusher = asyncio.ensure_future(self._flush())
        if self._lag_task is None and self._lag_file is not None:
            self._lag_task = asyncio.ensure_future(self._probe_lag())

    # -- the protocol ------------------------------------------------------------------------
    def capacity(self) -> list[Node]:
        self._ensure_tasks()  # first called from the running loop, before any cycle
        return list(self.nodes)

    async def start(self, spec: JobSpec, placement: tuple[str, ...]) -> None:
        self.started += 1
        self.running[spec.id] = tuple(placement)
        self.emit(BackendEvent(spec.id, "running", time.time(), tuple(placement)))
        if self.finish_after <= 0:
            self._finish(spec.id)
        else:
            loop = asyncio.get_running_loop()
            self._timers[spec.id] = loop.call_later(self.finish_after, self._finish, spec.id)

    def _finish(self, job_id: str) -> None:
        self._timers.pop(job_id, None)
        if self.running.pop(job_id, None) is not None:
            self.emit(BackendEvent(job_id, "finished", time.time(), exit_code=0))

    async def resize(self, spec: JobSpec, placement: tuple[str, ...], grace: float) -> None:
        self.running[spec.id] = tuple(placement)
        self.emit(BackendEvent(spec.id, "resized", time.time(), tuple(placement)))

    async def stop(self, job_id: str, grace: float, reason: str) -> None:
        timer = self._timers.pop(job_id, None)
        if timer is not None:
            timer.cancel()
        self.running.pop(job_id, None)
        self.emit(BackendEvent(job_id, "released", time.time()))

    async def recover(self, specs: Sequence[JobSpec]) -> None:
        # jobs of this backend end at once, so any that were running have ended meanwhile
        for spec in specs:
            self.emit(BackendEvent(spec.id, "finished", time.time(), exit_code=0))

    def logs(self, job_id: str, worker: int | None = None, tail: int | None = None) -> str:
        return ""

    def account_for(self, user: str, home: str | None = None) -> None:
        return None  # the service's own account, as LocalBackend(run_as_user=False)

    async def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for task in (self._lag_task, self._flusher):
            if task is not None:
                task.cancel()
        for f in (self._cycle_file, self._lag_file):
            if f is not None:
                f.close()
        self._cycle_file = self._lag_file = None
