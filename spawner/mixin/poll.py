"""The poll: a running server whose notebook job the service ended (an admin cancelled it, it
reached its runtime limit) must be stopped, since it no longer holds its plan's resources."""

from __future__ import annotations

from extension.clienterrors import WmlaError
from extension.scheduler import FINAL_STATES

from .errors import AdmissionError
from .record import SpawnRecord
from .service_client import ServiceCalls
from .spawn_log import SpawnLog


class JobPoll:
    """Asks the service whether a running server's notebook job has ended."""

    def __init__(self, service: ServiceCalls, log: SpawnLog) -> None:
        self.service = service
        self.log = log

    async def ended(self, spawn: SpawnRecord) -> str | None:
        """The final state of the spawn's job, or None: no job, a spawn or a stop under way
        (left alone), or a job that has not ended. Only a job the service says has ended
        counts: an unreachable service changes nothing."""
        if not spawn.job_id or spawn.waiting or spawn.stopping:
            return None
        state = await self._job_state(spawn.job_id)
        if state not in FINAL_STATES:
            return None
        self.log.warning(
            "notebook job %s is %s in the wmla service: stopping the server", spawn.job_id, state
        )
        return state

    async def _job_state(self, job_id: str) -> str | None:
        try:
            job = await self.service.call("GET", f"jobs/{job_id}", what=f"looking at {job_id}")
        except (WmlaError, AdmissionError) as err:
            self.log.debug("looking at job %s: %s", job_id, err)
            return None
        return job.get("state") if isinstance(job, dict) else None
