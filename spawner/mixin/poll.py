"""The poll: a running server whose notebook job the service ended (an admin cancelled it) is
stopped at the hub's next poll, since it no longer holds its plan's resources."""

from __future__ import annotations

import logging

from extension.scheduler import FINAL_STATES

from .common import AdmissionError


class JobPoll:
    """Part of :class:`~spawner.mixin.WmlaSpawnerMixin`. Reads ``wmla_job_id``,
    ``_wmla_waiting`` and ``_wmla_stopping`` (a spawn or a stop in progress is left alone).
    Uses the service call and ``stop``."""

    wmla_job_id: str
    _wmla_waiting: bool
    _wmla_stopping: bool
    log: logging.Logger
    _log_name: str

    async def poll(self) -> int | None:
        """The base spawner's answer; and a running server whose notebook job the service ended
        (an admin cancelled it, it reached its runtime limit: TIMEOUT) is stopped here, since it
        no longer holds its plan's resources. Only a job the service says has ended counts: an
        unreachable service changes nothing. While the hub still waits for the server to come
        up (``pending``) it is left alone: the hub polls then too, but only a poll after the
        spawn has finished tells the hub that the server stopped (before, its spawn would wait
        ``http_timeout`` for a server that is gone); the next poll after it stops the server."""
        status = await super().poll()
        if status is not None or not self.wmla_job_id or self._wmla_waiting or self._wmla_stopping:
            return status
        if getattr(self, "pending", None):  # the hub's spawn (or stop) is still under way
            return status
        state = await self._wmla_job_state(self.wmla_job_id)
        if state not in FINAL_STATES:
            return status
        self.log.warning(
            "%s: notebook job %s is %s in the wmla service: stopping the server",
            self._log_name, self.wmla_job_id, state,
        )  # fmt: skip
        await self.stop(now=True)
        return 0

    async def _wmla_job_state(self, job_id: str) -> str | None:
        from extension.client import WmlaError

        try:
            job = await self._wmla_call("GET", f"jobs/{job_id}", what=f"looking at {job_id}")
        except (WmlaError, AdmissionError) as err:
            self.log.debug("%s: looking at job %s: %s", self._log_name, job_id, err)
            return None
        return job.get("state") if isinstance(job, dict) else None
