"""The release: cancelling the notebook job when its server stops, which frees the plan's
resources, and keeping the ids of jobs whose release failed (orphans) to try again at the next
stop or start of this server."""

from __future__ import annotations

from extension.clienterrors import WmlaError

from .errors import AdmissionError
from .gpu_group import GpuGroup
from .record import SpawnRecord
from .service_client import ServiceCalls
from .spawn_log import SpawnLog


class Release:
    """Cancels a spawn's notebook job and its orphans through the service."""

    def __init__(self, service: ServiceCalls, gpu_group: GpuGroup, log: SpawnLog) -> None:
        self.service = service
        self.gpu_group = gpu_group
        self.log = log

    async def release(self, spawn: SpawnRecord, job_id: str = "") -> None:
        """Cancel ``job_id`` (default: the spawn's job) and every orphan; never raises. The
        spawn holds no job and no GPU afterwards, whatever the service answered."""
        ids = [job_id or spawn.job_id, *spawn.orphans]
        spawn.job_id = ""
        spawn.orphans.clear()
        if spawn.gpus:
            spawn.gpus = 0
            self.gpu_group.leave()
        for one in dict.fromkeys(i for i in ids if i):
            await self._release_one(spawn, one)

    async def _release_one(self, spawn: SpawnRecord, job_id: str) -> None:
        try:
            await self.service.call("DELETE", f"jobs/{job_id}", what=f"releasing {job_id}")
            self.log.info("released notebook job %s", job_id)
        except (WmlaError, AdmissionError) as err:
            if getattr(err, "status", 0) in (404, 409):  # already ended or gone: nothing held
                return
            # kept to try again at the next stop or start of this server
            spawn.orphans.append(job_id)
            self.log.error("could not release notebook job %s (will retry): %s", job_id, err)
