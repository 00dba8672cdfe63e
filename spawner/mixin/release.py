"""The release: cancelling the notebook job when its server stops, which frees the plan's
resources, and keeping the ids of jobs whose release failed (orphans) to try again at the next
stop or start of this server."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable
from typing import Any

from .common import AdmissionError


class Release:
    """Part of :class:`~spawner.mixin.WmlaSpawnerMixin`. Reads and clears ``wmla_job_id``,
    ``wmla_gpus`` and ``_wmla_orphans``; sets ``_wmla_stopping`` in ``stop``. Uses the service
    call and the GPU group."""

    wmla_job_id: str
    wmla_gpus: int
    _wmla_orphans: list[str]
    _wmla_stopping: bool
    user: Any
    log: logging.Logger
    _log_name: str

    async def wmla_release(self, job_id: str | None = None) -> None:
        """Cancel the notebook job and any job a cleared state left behind; never raises."""
        ids = [job_id or self.wmla_job_id, *self._wmla_orphans]
        self.wmla_job_id = ""
        self._wmla_orphans.clear()
        if self.wmla_gpus:  # whatever the release's outcome, this server holds no GPU any more
            self.wmla_gpus = 0
            self._wmla_gpu_group(join=False)
        for one in dict.fromkeys(i for i in ids if i):
            await self._wmla_release_one(one)

    async def _wmla_release_one(self, job_id: str) -> None:
        from extension.client import WmlaError

        try:
            await self._wmla_call("DELETE", f"jobs/{job_id}", what=f"releasing {job_id}")
            self.log.info("%s: released notebook job %s", self._log_name, job_id)
        except (WmlaError, AdmissionError) as err:
            if getattr(err, "status", 0) in (404, 409):  # already ended or gone: nothing held
                return
            # kept to try again at the next stop or start of this server
            self._wmla_orphans.append(job_id)
            self.log.error(
                "%s: could not release notebook job %s (will retry): %s",
                self._log_name, job_id, err,
            )  # fmt: skip

    async def stop(self, now: bool = False) -> None:
        self._wmla_stopping = True
        job_id = self.wmla_job_id  # LocalProcessSpawner.stop() clears the state
        try:
            await super().stop(now=now)
        finally:
            await self.wmla_release(job_id)

    def run_post_stop_hook(self) -> Awaitable[None]:
        """JupyterHub runs this after every stop, also of a server that died by itself (when it
        does not call stop()): release whatever job is still held, then the configured hook."""
        configured = super().run_post_stop_hook()

        async def release_then_hook() -> None:
            await self.wmla_release()
            if inspect.isawaitable(configured):
                await configured

        return release_then_hook()
