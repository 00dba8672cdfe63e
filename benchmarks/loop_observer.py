"""What the load benchmarks watch inside the service, as a backend sees it: every scheduling
cycle's own duration (the loop's ``cycle_hooks``, the one metering uses) and how late a short
timer fires on the service's event loop (what held the loop). Written to two files the
benchmark reads back: ``cycle_log`` gets ``wall_time seconds decisions live_jobs`` per cycle,
``lag_log`` gets ``wall_time lag`` per probe. Used by the benchmark backends
(instant_backend.py, observed_local_backend.py); nothing of the service is changed."""

from __future__ import annotations

import asyncio
import time
from typing import Any


class LoopObserver:
    """Hooks into the scheduler behind ``emit`` (the loop's bound ``Scheduler.emit``)."""

    def __init__(
        self, emit: Any, cycle_log: str = "", lag_log: str = "", lag_interval: float = 0.01
    ):
        self.scheduler = getattr(emit, "__self__", None)
        self.cycle_file = open(cycle_log, "a", buffering=1 << 16) if cycle_log else None  # noqa: SIM115
        self.lag_file = open(lag_log, "a", buffering=1 << 16) if lag_log else None  # noqa: SIM115
        self.lag_interval = float(lag_interval)
        self.tasks: list[asyncio.Task] = []
        hooks = getattr(self.scheduler, "cycle_hooks", None)
        if self.cycle_file is not None and hooks is not None:
            hooks.append(self.on_cycle)

    def on_cycle(self, result: Any, now: float, seconds: float) -> None:
        live = len(getattr(self.scheduler, "jobs", ()) or ())
        decisions = len(getattr(result, "decisions", ()) or ())
        if self.cycle_file is not None:
            self.cycle_file.write(f"{time.time():.6f} {seconds:.6f} {decisions} {live}\n")

    def start(self) -> None:
        """Start the lag probe and the flusher; called from the running loop, once."""
        if self.tasks or not (self.cycle_file or self.lag_file):
            return
        self.tasks.append(asyncio.ensure_future(self._flush()))
        if self.lag_file is not None:
            self.tasks.append(asyncio.ensure_future(self._probe_lag()))

    async def _probe_lag(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(self.lag_interval)
            lag = loop.time() - before - self.lag_interval
            if self.lag_file is not None:
                self.lag_file.write(f"{time.time():.6f} {max(0.0, lag):.6f}\n")

    async def _flush(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            self.flush()

    def flush(self) -> None:
        for f in (self.cycle_file, self.lag_file):
            if f is not None:
                f.flush()

    def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        self.flush()
        for f in (self.cycle_file, self.lag_file):
            if f is not None:
                f.close()
