"""The GPUs of running notebook servers: the spawner runs the server, so the backend starts no
process for its job, but where it hands out device indexes (the local backend) it holds some for
the server, and the spawner fences the server to them (its cgroup's device allow-list, its
CUDA_VISIBLE_DEVICES). Held when the job starts, given back when it ends."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from extension.backends.base import HoldsDevices, JobSpec


class NotebookDevices:
    """Holds and releases notebook jobs' devices through the backend, where it can."""

    def __init__(self, backend: Callable[[], Any], log: logging.Logger) -> None:
        self._backend = backend
        self.log = log

    def _holder(self) -> HoldsDevices | None:
        backend = self._backend()
        return backend if isinstance(backend, HoldsDevices) else None

    def hold(self, spec: JobSpec, placement: tuple[str, ...]) -> None:
        holder = self._holder()
        if holder is None or not spec.per_worker.gpu:
            return
        try:
            holder.hold_devices(spec, placement)
        except Exception as err:  # the server then opens no GPU: said, never silent
            self.log.error("notebook job %s: no devices held for its server: %s", spec.id, err)

    def release(self, job_id: str) -> None:
        holder = self._holder()
        if holder is not None:
            holder.release_devices(job_id)

    def of(self, job_id: str) -> list[list[int]] | None:
        """The indexes the job's server may use, by worker; None where the backend holds none."""
        holder = self._holder()
        held = holder.held_devices(job_id) if holder is not None else None
        return [list(d) for d in held] if held is not None else None

    def keep(self, job_ids: set[str]) -> None:
        holder = self._holder()
        if holder is not None:
            holder.keep_holds(job_ids)
