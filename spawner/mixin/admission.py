"""The admission: the notebook job's submission, and the wait while it is PENDING, told to the
spawn page's progress bar: the job's place in line, its estimated start and the service's reason,
e.g. "2nd in line in /project1/dev-team (1st for you) — starts in about 12 minutes (estimated) —
dev-team holds 2 of its 2 deserved GPUs", each line once."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from extension.clienterrors import WmlaError
from extension.queue_text import Waiting, spawn_line, waiting

from .errors import AdmissionError
from .gpu_group import GpuGroup
from .progress import SpawnProgress
from .record import JobGrant, SpawnRecord
from .release import Release
from .request import NotebookRequest
from .service_client import ServiceCalls
from .spawn_log import SpawnLog


class Admission:
    """Submits a spawn's notebook job and waits until it runs, noting each change of its line
    to the spawn's progress; gives up (and releases the job) when the spawn is stopped."""

    def __init__(
        self,
        service: ServiceCalls,
        release: Release,
        gpu_group: GpuGroup,
        progress: SpawnProgress,
        log: SpawnLog,
    ) -> None:
        self.service = service
        self.release = release
        self.gpu_group = gpu_group
        self.progress = progress
        self.log = log

    async def submit(
        self, spawn: SpawnRecord, request: NotebookRequest, body: dict[str, Any], interval: float
    ) -> None:
        """Submit ``body`` and wait (``interval`` seconds between looks) until the job runs;
        the spawn then holds the job, its GPUs and its grant. Raises AdmissionError."""
        plan, spawn.leaf = body["plan"], f"{body['plan']}/{body['user']}"
        self.progress.note(spawn, f"asking plan {plan} for room: {request.describe()}", 5)
        try:
            job = await self.service.call("POST", "jobs", body, retry=30.0)
        except WmlaError as err:
            if err.status == 422:
                message = f"{spawn.leaf} can never hold this server: {err}"
                raise AdmissionError(message) from None
            raise AdmissionError(f"the wmla service refused the notebook: {err}") from None
        spawn.job_id = job["id"]
        job = await self._wait(spawn, job, plan, interval)
        self.progress.note(spawn, f"admitted to {spawn.leaf} (job {job['id']})", 20)
        spawn.gpus = request.gpus
        # what the service granted (the limit range filled in what the body left out): the
        # local spawner holds the server to it (spawner/confining.py)
        spawn.granted = JobGrant(
            resources=job.get("resources") or {},
            limits=job.get("limits") or {},
            devices=await self._devices(job) if spawn.gpus else None,
        )
        if spawn.gpus:
            self.gpu_group.join()

    async def _wait(
        self, spawn: SpawnRecord, job: dict[str, Any], plan: str, interval: float
    ) -> dict[str, Any]:
        """The job once RUNNING; a job that ended, or a stop, fails the spawn."""
        shown: set[str] = set()
        while True:
            state = job.get("state")
            if state == "RUNNING":
                return job
            if state != "PENDING":
                spawn.job_id = ""
                reason = job.get("reason") or state
                raise AdmissionError(f"{spawn.leaf}: the notebook job is {state}: {reason}")
            # a new event whenever the line says something not said before (the place moves
            # up, the estimate's words change), never one already in the log: the service's
            # answers may go back and forth between two lines from one look to the next
            message = waiting_message(job, plan)
            if message not in shown:
                self.progress.note(spawn, message, 10)
                shown.add(message)
            if spawn.stopping:
                await self.release.release(spawn)
                raise AdmissionError("the server was stopped while it waited for room")
            await asyncio.sleep(interval)
            try:
                job = await self.service.call("GET", f"jobs/{job['id']}")
            except WmlaError as err:
                self.log.warning("looking at job %s: %s", job["id"], err)

    async def _devices(self, job: Mapping[str, Any]) -> list | None:
        """The GPU indexes the service holds for the server (the answer to the submission may
        predate the hold: asked again once)."""
        if job.get("devices") is None:
            try:
                job = await self.service.call("GET", f"jobs/{job['id']}")
            except WmlaError as err:
                self.log.warning("the server's GPUs: %s", err)
                return None
        return job.get("devices")


def waiting_message(job: Mapping[str, Any], plan: str) -> str:
    """The spawn page's line for a PENDING notebook job: its ``queue`` (place, estimate,
    reason); the job's own reason while it has none (the service has not placed it in line
    yet: the answer to the submission)."""
    reason = job.get("reason")
    fallback = reason if isinstance(reason, str) and reason else f"waiting for room in {plan}"
    found = waiting(job)
    return spawn_line(found if found is not None else Waiting(), fallback)
