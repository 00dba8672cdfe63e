"""Supervising the gangs: the gang lives and dies whole.

A monitor polls every running gang. A worker that exits non-zero makes the backend stop the
others (SIGTERM, ``failure_grace``, SIGKILL) and report ``failed`` with that exit code and the
tail of its log; all workers exiting 0 is ``finished``. ``end`` stops a running gang for
``stop`` and ``resize``: SIGTERM to every worker's process group, up to ``grace`` seconds to
checkpoint and leave, SIGKILL for what is left."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psutil

from extension.backends.base import EventKind
from extension.userfs.accounts import AccountError
from extension.userfs.errors import UserFileError
from extension.userfs.files import off_loop

from .allocation import DeviceTable
from .confining import WorkerCgroups
from .events import Emitter
from .offload import Offload
from .records import (
    Gang,
    GangRecords,
    GangState,
    Worker,
    check_worker,
    ended_at,
    exit_time,
    read_report,
    report_file,
    report_identity,
)
from .users import UserAccounts

log = logging.getLogger("wmla.backends.local")

STOPPED_EXIT_CODE = 143  # what extension.runtime exits with after a SIGTERM checkpoint


@dataclass(frozen=True)
class SupervisionOptions:
    """The ``LocalBackend`` options of the same names that pace the watching and the ends."""

    poll_interval: float
    failure_grace: float
    kill_wait: float
    log_tail_lines: int


class Supervisor:
    """The gangs this backend runs: watches them, and fails, finishes or stops each whole.

    What a gang held is given back to ``devices`` and ``cgroups``, its end reported through
    ``emit``; a failure's log is read with the user's rights (``accounts``). The removal of its
    cgroups and the writing of its outcome into its record run in ``ends``' thread, and its end
    is reported once they are done; the record goes when the service says it stored the end
    (``stored``). A stop's record goes at once."""

    def __init__(
        self,
        options: SupervisionOptions,
        emit: Emitter,
        devices: DeviceTable,
        records: GangRecords,
        accounts: UserAccounts,
        cgroups: WorkerCgroups,
        ends: Offload,
    ) -> None:
        self.options = options
        self.ends = ends
        self.emit = emit
        self.devices = devices
        self.records = records
        self.accounts = accounts
        self.cgroups = cgroups
        self.gangs: dict[str, Gang] = {}
        self.closed = False
        self._monitor: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()

    def gang(self, job_id: str) -> Gang | None:
        return self.gangs.get(job_id)

    def add(self, gang: Gang) -> None:
        """Take ``gang`` in (a start's, or a re-adopted one): watched once the monitor runs."""
        self.gangs[gang.job_id] = gang

    async def close(self) -> None:
        """Stop watching; the gangs are dropped (their workers keep running)."""
        self.closed = True
        tasks = [t for t in [self._monitor, *self._tasks] if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._monitor = None
        # the launchers run on (the node's launcher, their parent, reaps them until it ends)
        self.gangs.clear()

    def ensure_monitor(self) -> None:
        if self._monitor is None or self._monitor.done():
            self._monitor = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while not self.closed:
            try:
                self._poll_once()
            except Exception:  # one bad poll must not stop the watching of every job
                log.exception("local backend: error while watching the workers")
            await asyncio.sleep(self.options.poll_interval)

    def _poll_once(self) -> None:
        for gang in list(self.gangs.values()):
            if gang.state is not GangState.RUNNING:
                continue
            self._relay_checkpoint(gang)
            self.refresh(gang)
            failed = [w for w in gang.workers if w.done and (w.exit_code != 0 or w.vanished)]
            if failed:
                gang.state = GangState.STOPPING  # now: no other poll or stop handles it twice
                self.spawn_task(self._fail(gang, _first_failure(failed)))
            elif all(w.done for w in gang.workers):
                gang.state = GangState.STOPPING
                self.spawn_task(self._finish(gang))

    def _relay_checkpoint(self, gang: Gang) -> None:
        """Emit ``checkpoint`` when rank 0's launcher relayed a new report (worker_launcher.py):
        one stat per poll, the file read only when it was replaced. Also for a re-adopted gang,
        whose launcher kept relaying while no service watched (its latest report is emitted
        once more; the service keeps only a newer one)."""
        if not gang.workers:
            return
        path = report_file(gang.workers[0].exit_file)
        seen = report_identity(path)
        if seen is None or seen == gang.report_seen:
            return
        gang.report_seen = seen
        report = read_report(path)
        if report is not None:
            self.emit(
                gang.job_id, EventKind.CHECKPOINT, at=report["at"], progress=report["progress"]
            )

    def spawn_task(self, coro: Any) -> None:
        """Run ``coro`` as a task of this supervisor (cancelled by ``close``)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def refresh(self, gang: Gang) -> None:
        """Bring the gang's workers' exits up to date without blocking."""
        for worker in gang.workers:
            if not worker.done:
                check_worker(worker)

    async def _finish(self, gang: Gang) -> None:
        gang.state = GangState.STOPPING
        if not (gang.workers and all(gang.cgroups)):
            self._sweep(gang)  # with cgroups, their removal (in forget) kills what is left
        ended = ended_at(gang)  # while the exit files say when
        await self.end_kept(gang, EventKind.FINISHED, exit_code=0, at=ended)

    async def _fail(self, gang: Gang, culprit: Worker) -> None:
        gang.state = GangState.STOPPING
        await self.terminate(gang, self.options.failure_grace)
        message = await off_loop(self._failure_message, gang, culprit)
        ended = ended_at(gang)
        await self.end_kept(
            gang, EventKind.FAILED, exit_code=culprit.exit_code, message=message, at=ended
        )

    async def end_kept(
        self,
        gang: Gang,
        kind: EventKind,
        exit_code: int | None = None,
        message: str = "",
        at: float | None = None,
    ) -> None:
        """Report the gang's end (finished, failed, lost) exactly once: the outcome is written
        into its record before anything of it is given back, and the record stays until the
        service has stored the end (``LocalBackend.ends_stored``). A service that dies in
        between finds the outcome on recovery and reports it again (``Recovery``)."""
        outcome = {
            "kind": kind.value,
            "exit_code": exit_code,
            "message": message,
            "at": time.time() if at is None else at,
            "placement": list(gang.placement),
        }
        await self.forget(gang, outcome)
        self.emit(
            gang.job_id,
            kind,
            placement=gang.placement,
            exit_code=exit_code,
            message=message,
            at=outcome["at"],
        )

    def _failure_message(self, gang: Gang, worker: Worker) -> str:
        if worker.vanished:
            why = f"worker {worker.rank} (pid {worker.pid}) disappeared without an exit status"
        elif worker.exit_code is not None and worker.exit_code < 0:
            name = _signal_name(-worker.exit_code)
            why = f"worker {worker.rank} was killed by {name} (exit code {worker.exit_code})"
        elif worker.exit_code == STOPPED_EXIT_CODE:
            why = (
                f"worker {worker.rank} exited with code {STOPPED_EXIT_CODE}: it got SIGTERM from "
                "outside the service (its checkpoint, if any, was saved)"
            )
        else:
            why = f"worker {worker.rank} exited with code {worker.exit_code}"
        memory = self.cgroups.memory_reason(worker.cgroup, worker.rank)
        if memory:  # the kernel killed it (or one of its processes) at its memory limit
            why = memory if worker.exit_code == -signal.SIGKILL else f"{why}: {memory}"
        storage = self.accounts.storage_reason(gang.user) if worker.exit_code else None
        if storage:  # its folder is at a limit the kernel holds: most likely why it failed
            why = f"{why}: {storage}"
        error = worker.exit_info.get("error")
        if error:  # the launcher could not even start it (its log may not exist)
            why = f"{why}: it could not be started: {error}"
        path = os.path.join(gang.workdir, "logs", f"worker-{worker.rank}.log")
        try:  # with the user's rights: a log replaced by a link to a secret is refused
            files = self.accounts.files_for(gang.user)
            text = files.tail(path, self.options.log_tail_lines)[-8000:]
        except (UserFileError, AccountError) as err:
            return f"{why}; its log was not read: {err}"
        return f"{why}; last lines of {path}:\n{text}" if text else f"{why}; its log is empty"

    async def end(self, gang: Gang, grace: float, reason: str | None) -> EventKind:
        """Stop a running gang; returns how it ended: ``RELEASED`` when it was stopped,
        ``FINISHED`` or ``FAILED`` when it ended by itself first. A stop is reported
        ``released`` with ``reason``; ``reason`` None (a resize, whose ``resized`` follows)
        reports nothing, and a gang that exits 0 within the grace counts as stopped."""
        self.refresh(gang)
        if all(w.done for w in gang.workers):
            failed = [w for w in gang.workers if w.exit_code != 0 or w.vanished]
            if failed:  # it failed just before we came: that is what it did
                await self._fail(gang, _first_failure(failed))
                return EventKind.FAILED
            await self._finish(gang)
            return EventKind.FINISHED
        gang.state = GangState.STOPPING
        await self.terminate(gang, grace)
        if reason is not None and all(w.exit_code == 0 and not w.vanished for w in gang.workers):
            # every worker finished its work within the grace: the job is done, not stopped
            # (a worker that SIGTERM stops exits 143 through extension.runtime, or dies of it)
            await self._finish(gang)
            return EventKind.FINISHED
        await self.forget(gang)
        if reason is not None:
            self.emit(gang.job_id, EventKind.RELEASED, placement=gang.placement, message=reason)
        return EventKind.RELEASED

    async def terminate(self, gang: Gang, grace: float) -> None:
        """SIGTERM to each live worker's group, up to ``grace`` seconds, then SIGKILL."""
        self.refresh(gang)
        for worker in gang.workers:
            if not worker.done:
                kill_group(worker.pid, signal.SIGTERM)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, grace)
        while loop.time() < deadline and not all(w.done for w in gang.workers):
            await asyncio.sleep(min(0.05, self.options.poll_interval))
            self.refresh(gang)
        alive = [w for w in gang.workers if not w.done]
        for worker in alive:
            log.info("job %s: worker %d outlived its grace; SIGKILL", gang.job_id, worker.rank)
            kill_group(worker.pid, signal.SIGKILL)
        deadline = loop.time() + self.options.kill_wait
        while loop.time() < deadline and not all(w.done for w in gang.workers):
            await asyncio.sleep(0.05)
            self.refresh(gang)
        for worker in gang.workers:
            if not worker.done:  # e.g. stuck in uninterruptible I/O: say so, do not hang
                log.error(
                    "job %s: worker %d (pid %d) still there %.0fs after SIGKILL; its devices "
                    "are released anyway",
                    gang.job_id,
                    worker.rank,
                    worker.pid,
                    self.options.kill_wait,
                )
        self._sweep(gang)

    def _sweep(self, gang: Gang) -> None:
        """Kill what is left of the gang (a worker's own children, daemons it forked).

        Where every worker has a cgroup, what is left is exactly what is still in them: killed
        from their ``cgroup.procs``, one read each, even a process that left the worker's
        session. Otherwise (no cgroups on this machine) the gang's process groups are walked:
        a process is taken for the gang's only when its group is one of the gang's and its
        environment names the job (a group id recycled by an unrelated process is left alone);
        that walk reads every process of the machine, 25 ms a gang under load.
        """
        if gang.workers and all(gang.cgroups):
            self.cgroups.kill(gang.cgroups)
            return
        self.cgroups.kill([name for name in gang.cgroups if name])
        pgids = {w.pid for w in gang.workers}
        for proc in psutil.process_iter():
            try:
                if os.getpgid(proc.pid) not in pgids:
                    continue
                if proc.environ().get("WMLA_JOB_ID") == gang.job_id:
                    proc.kill()
            except (psutil.Error, ProcessLookupError, PermissionError):
                continue

    async def forget(self, gang: Gang, outcome: dict[str, Any] | None = None) -> None:
        """Give back what the ended gang held (its devices at once; its cgroups, with whatever
        is left in them, and its record in ``ends``' thread), then wake who waits for it. It
        stays known (DONE) until then: a start of the same job waits for ``ended``, so its new
        record is never in the way of the old one's removal. With ``outcome`` (an end the
        service must store: ``end_kept``) the record is not removed but rewritten with it,
        first, and stays until ``stored``."""
        # the checkpoint it wrote on SIGTERM is the one a resized or preempted job resumes from
        self._relay_checkpoint(gang)
        gang.state = GangState.DONE
        self.devices.free(gang.placement, [w.devices for w in gang.workers])
        try:
            await self.ends.run(self._remove, gang, outcome)
        finally:
            if self.gangs.get(gang.job_id) is gang:
                del self.gangs[gang.job_id]
            gang.ended.set()

    def _remove(self, gang: Gang, outcome: dict[str, Any] | None) -> None:
        """In ``ends``' thread: the gang's cgroups, and its record (kept with its outcome when
        there is one)."""
        if outcome is not None:
            self.records.write(gang, outcome)
        self.cgroups.remove(gang.cgroups)
        self.accounts.drop_job_tmp(gang.user, gang.job_id)
        if outcome is None:
            self.records.remove(gang.job_id)

    def stored(self, job_ids: Iterable[str]) -> None:
        """The service has stored these jobs' ends: their kept records go (in ``ends``'
        thread, after whatever it was doing for them)."""
        if self.closed:
            return
        for job_id in job_ids:
            self.spawn_task(self.ends.run(self.records.remove_ended, job_id))


def _first_failure(failed: list[Worker]) -> Worker:
    """The worker whose failure came first (the others often fail because it did)."""
    return min(failed, key=lambda w: (w.vanished, exit_time(w), w.rank))


def kill_group(pgid: int, sig: int) -> None:
    """Signal a worker's process group; one already gone is no error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"
