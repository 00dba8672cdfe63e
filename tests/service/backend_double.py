"""Test double: a deterministic in-process backend that runs no processes.

It implements the protocol of ``extension/backends/base.py`` for the service's tests where the
point is the service (API, store, loop), not real workers. A job's ``env`` steers it:
``DOUBLE_RUN_SECONDS`` (default: runs until stopped) and ``DOUBLE_EXIT_CODE`` (0: finished, else
failed). It writes one log file per worker like the real backend (``logs/worker-<rank>.log``).
Every call is recorded in ``calls`` so tests can check what the loop asked for and in what order.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

from extension.backends.base import BackendEvent, Emit, JobSpec
from extension.scheduler import Node


class InProcessBackend:
    def __init__(self, emit: Emit, nodes: list[Node], state_dir: str) -> None:
        self.emit = emit
        self.nodes = list(nodes)
        self.state_dir = state_dir
        self.calls: list[tuple] = []
        self.running: dict[str, tuple[str, ...]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def capacity(self) -> list[Node]:
        return list(self.nodes)

    async def start(self, spec: JobSpec, placement: tuple[str, ...]) -> None:
        self.calls.append(("start", spec.id, tuple(placement)))
        logs = Path(spec.workdir) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for rank, node in enumerate(placement):
            (logs / f"worker-{rank}.log").write_text(f"hello from rank {rank} on {node}\n")
        self.running[spec.id] = tuple(placement)
        self.emit(BackendEvent(spec.id, "running", time.time(), tuple(placement)))
        self._arm(spec)

    def _arm(self, spec: JobSpec) -> None:
        seconds = spec.env.get("DOUBLE_RUN_SECONDS")
        if seconds is None:
            return
        code = int(spec.env.get("DOUBLE_EXIT_CODE", "0"))
        loop = asyncio.get_running_loop()
        self._timers[spec.id] = loop.call_later(float(seconds), self._exit, spec.id, code)

    def _exit(self, job_id: str, code: int) -> None:
        if self.running.pop(job_id, None) is None:
            return
        self._timers.pop(job_id, None)
        if code == 0:
            self.emit(BackendEvent(job_id, "finished", time.time(), exit_code=0))
        else:
            msg = f"worker 0 exited with code {code}"
            self.emit(BackendEvent(job_id, "failed", time.time(), exit_code=code, message=msg))

    async def resize(self, spec: JobSpec, placement: tuple[str, ...], grace: float) -> None:
        self.calls.append(("resize", spec.id, tuple(placement), grace))
        self.running[spec.id] = tuple(placement)
        self.emit(BackendEvent(spec.id, "resized", time.time(), tuple(placement)))

    async def stop(self, job_id: str, grace: float, reason: str) -> None:
        self.calls.append(("stop", job_id, grace, reason))
        self.running.pop(job_id, None)
        timer = self._timers.pop(job_id, None)
        if timer is not None:
            timer.cancel()
        self.emit(BackendEvent(job_id, "released", time.time()))

    async def recover(self, specs: Sequence[JobSpec]) -> None:
        self.calls.append(("recover", tuple(s.id for s in specs)))
        for spec in specs:  # pretend the workers outlived the service
            self.running[spec.id] = ()
            self._arm(spec)

    def logs(self, job_id: str, worker: int | None = None, tail: int | None = None) -> str:
        raise KeyError(job_id)  # like a backend that forgot the job: the service reads files

    async def close(self) -> None:
        self.calls.append(("close",))
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
