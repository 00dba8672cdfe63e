"""The admission: the notebook job's body, its submission, and the wait while it is PENDING,
told to the spawn page's progress bar: the job's place in line, its estimated start and the
service's reason, e.g. "2nd in line in /project1/dev-team (1st for you) — starts in about 12
minutes (estimate: assumes ...) — dev-team holds 2 of its 2 deserved GPUs; /project1/dev-team at
its gpu limit: 2 of 2 in use"."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

from extension.queue_text import spawn_line, waiting

from .common import NOTEBOOK_KIND, AdmissionError


class Admission:
    """Part of :class:`~spawner.mixin.WmlaSpawnerMixin`. Reads the traits ``gpus``,
    ``notebook_cpu``, ``notebook_memory`` and ``admission_poll_interval``; the base spawner's
    ``user``, ``name``, ``cpu_guarantee``/``cpu_limit``, ``mem_guarantee``/``mem_limit`` where it
    has them; the spawn's ``_wmla_orphans`` and ``_wmla_stopping``. Writes ``wmla_job_id``,
    ``wmla_leaf``, ``wmla_gpus`` and the progress events (``_wmla_events``, ``_wmla_changed``,
    ``_wmla_waiting``). Uses the plan choice, the service call, the release and the GPU group."""

    gpus: int
    notebook_cpu: str
    notebook_memory: str
    admission_poll_interval: float
    wmla_job_id: str
    wmla_leaf: str
    wmla_gpus: int
    wmla_granted: dict
    _wmla_events: list[dict]
    _wmla_changed: asyncio.Event | None
    _wmla_waiting: bool
    _wmla_stopping: bool
    _wmla_orphans: list[str]
    user: Any
    name: str
    log: logging.Logger
    _log_name: str

    def wmla_request(self) -> tuple[int, dict, dict]:
        """(gpus, per-worker request, limits) for the notebook job, in the service's units."""
        gpus = int(self.gpus or 0)  # profile overrides are applied to the traits already
        request: dict[str, Any] = {"gpu": gpus}
        cpu = self.notebook_cpu or _cpu(getattr(self, "cpu_guarantee", None))
        mem = self.notebook_memory or getattr(self, "mem_guarantee", None)
        if cpu:
            request["cpu"] = cpu
        if mem:
            request["memory"] = mem
        limits: dict[str, Any] = {}
        if getattr(self, "cpu_limit", None):
            limits["cpu"] = _cpu(self.cpu_limit)
        if getattr(self, "mem_limit", None):
            limits["memory"] = self.mem_limit
        return gpus, request, limits

    def wmla_job_body(self, plan: str) -> dict:
        gpus, request, limits = self.wmla_request()
        body: dict[str, Any] = {
            "plan": plan,
            "kind": NOTEBOOK_KIND,
            "user": self.user.name,
            "name": f"notebook {self.name}" if self.name else "notebook",
            "workers": 1,
            "preemptible": False,
            "resources": request,
        }
        if limits:
            body["limits"] = limits
        return body

    # -- progress ------------------------------------------------------------------------------
    def _wmla_note(self, message: str, progress: int | None = None) -> None:
        event: dict[str, Any] = {"message": message}
        if progress is not None:
            event["progress"] = progress
        self._wmla_events.append(event)
        if self._wmla_changed is not None:
            self._wmla_changed.set()
        self.log.info("%s: %s", self._log_name, message)

    async def progress(self) -> AsyncIterator[dict]:
        """The admission's events while it waits, then the base spawner's own."""
        sent = 0
        while True:
            while sent < len(self._wmla_events):
                yield self._wmla_events[sent]
                sent += 1
            if not self._wmla_waiting:
                break
            changed = self._wmla_changed
            if changed is None:
                break
            changed.clear()
            try:
                await asyncio.wait_for(changed.wait(), timeout=1)
            except asyncio.TimeoutError:
                pass
        async for event in super().progress():
            yield event

    # -- admission and release ------------------------------------------------------------------
    async def wmla_admit(self) -> str:
        """Submit the notebook job and wait until it holds its resources; returns the plan."""
        if self._wmla_orphans:  # a previous server's job that was never released
            await self.wmla_release("")
        self._wmla_events = []
        self._wmla_changed = asyncio.Event()
        self._wmla_stopping = False
        self._wmla_waiting = True
        try:
            return await self._wmla_admit()
        finally:
            self._wmla_waiting = False
            self._wmla_changed.set()

    async def _wmla_admit(self) -> str:
        from extension.client import WmlaError

        await self._wmla_check_picked_plan()
        plan = self.wmla_plan_path()
        body = self.wmla_job_body(plan)
        self.wmla_leaf = f"{plan}/{self.user.name}"
        self._wmla_note(f"asking plan {plan} for room: {_describe(body['resources'])}", 5)
        try:
            job = await self._wmla_call("POST", "jobs", body, retry=30.0)
        except WmlaError as err:
            if err.status == 422:
                message = f"{self.wmla_leaf} can never hold this server: {err}"
                raise AdmissionError(message) from None
            raise AdmissionError(f"the wmla service refused the notebook: {err}") from None
        self.wmla_job_id = job["id"]
        last = None
        while True:
            state = job.get("state")
            if state == "RUNNING":
                self._wmla_note(f"admitted to {self.wmla_leaf} (job {job['id']})", 20)
                self.wmla_gpus = int(body["resources"].get("gpu") or 0)
                # what the service granted (the limit range filled in what the body left out):
                # the local spawner holds the server to it (spawner/confining.py)
                self.wmla_granted = {
                    "resources": job.get("resources") or {},
                    "limits": job.get("limits") or {},
                    "devices": await self._wmla_devices(job) if self.wmla_gpus else None,
                }
                if self.wmla_gpus:
                    self._wmla_gpu_group(join=True)
                return plan
            if state != "PENDING":
                self.wmla_job_id = ""
                reason = job.get("reason") or state
                raise AdmissionError(f"{self.wmla_leaf}: the notebook job is {state}: {reason}")
            # a new event whenever any part of the line changes (the place moves up, the
            # estimate's words change), not only the reason: that is what the user waits on
            message = waiting_message(job, plan)
            if message != last:
                self._wmla_note(message, 10)
                last = message
            if self._wmla_stopping:
                await self.wmla_release()
                raise AdmissionError("the server was stopped while it waited for room")
            await asyncio.sleep(self.admission_poll_interval)
            try:
                job = await self._wmla_call("GET", f"jobs/{job['id']}")
            except WmlaError as err:
                self.log.warning("%s: looking at job %s: %s", self._log_name, job["id"], err)

    async def _wmla_devices(self, job: Mapping[str, Any]) -> list | None:
        """The GPU indexes the service holds for the server (the answer to the submission may
        predate the hold: asked again once)."""
        from extension.client import WmlaError

        if job.get("devices") is None:
            try:
                job = await self._wmla_call("GET", f"jobs/{job['id']}")
            except WmlaError as err:
                self.log.warning("%s: the server's GPUs: %s", self._log_name, err)
                return None
        return job.get("devices")


def waiting_message(job: Mapping[str, Any], plan: str) -> str:
    """The spawn page's line for a PENDING notebook job: its ``queue`` (place, estimate,
    reason) when the service sends one, else the job's reason (an older service)."""
    reason = job.get("reason")
    fallback = reason if isinstance(reason, str) and reason else f"waiting for room in {plan}"
    found = waiting(job)
    return spawn_line(found, fallback) if found is not None else fallback


def _cpu(cores: float | None) -> str | None:
    """JupyterHub's cpu_guarantee/cpu_limit (cores, float) -> millicores text."""
    if not cores:
        return None
    return f"{round(float(cores) * 1000)}m"


def _describe(request: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in request.items())
