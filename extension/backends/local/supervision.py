"""Supervising the gangs: the gang lives and dies whole.

A monitor polls every running gang. A worker that exits non-zero makes the backend stop the
others (SIGTERM, ``failure_grace``, SIGKILL) and report ``failed`` with that exit code and the
tail of its log; all workers exiting 0 is ``finished``. ``_end`` stops a running gang for
``stop`` and ``resize``: SIGTERM to every worker's process group, up to ``grace`` seconds to
checkpoint and leave, SIGKILL for what is left."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from typing import Any

import psutil

from extension.backends.accounts import AccountError
from extension.backends.userfs import UserFileError, off_loop

from .confining import WorkerCgroups
from .records import (
    _check_worker,
    _ended_at,
    _exit_record,
    _exit_time,
    _Gang,
    _read_report,
    _report_file,
    _report_identity,
    _rmtree,
    _Worker,
)

log = logging.getLogger("wmla.backends.local")

STOPPED_EXIT_CODE = 143  # what extension.runtime exits with after a SIGTERM checkpoint


class _Supervision:
    """Watching the workers, and ending gangs.

    A part of ``LocalBackend``: ``backend.py`` sets the attributes declared here.
    ``_emit`` is the backend's, ``_free`` allocation.py's, ``_job_dir`` records.py's,
    ``files_for`` users.py's.
    """

    cgroups: WorkerCgroups
    poll_interval: float
    failure_grace: float
    kill_wait: float
    log_tail_lines: int
    _gangs: dict[str, _Gang]
    _monitor: asyncio.Task | None
    _tasks: set[asyncio.Task]
    _closed: bool

    def _ensure_monitor(self) -> None:
        if self._monitor is None or self._monitor.done():
            self._monitor = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while not self._closed:
            try:
                self._poll_once()
            except Exception:  # one bad poll must not stop the watching of every job
                log.exception("local backend: error while watching the workers")
            await asyncio.sleep(self.poll_interval)

    def _poll_once(self) -> None:
        for gang in list(self._gangs.values()):
            if gang.state != "running":
                continue
            self._relay_checkpoint(gang)
            self._refresh(gang)
            failed = [w for w in gang.workers if w.done and (w.exit_code != 0 or w.vanished)]
            if failed:
                gang.state = "stopping"  # now, so that no other poll or stop handles it twice
                self._spawn_task(self._fail(gang, _first_failure(failed)))
            elif all(w.done for w in gang.workers):
                self._finish(gang)

    def _relay_checkpoint(self, gang: _Gang) -> None:
        """Emit ``checkpoint`` when rank 0's launcher relayed a new report (local_launch.py):
        one stat per poll, the file read only when it was replaced. Also for a re-adopted gang,
        whose launcher kept relaying while no service watched (its latest report is emitted
        once more; the service keeps only a newer one)."""
        if not gang.workers:
            return
        path = _report_file(gang.workers[0].exit_file)
        seen = _report_identity(path)
        if seen is None or seen == gang.report_seen:
            return
        gang.report_seen = seen
        report = _read_report(path)
        if report is not None:
            self._emit(gang.job_id, "checkpoint", at=report["at"], progress=report["progress"])

    def _spawn_task(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _refresh(self, gang: _Gang) -> None:
        for worker in gang.workers:
            if not worker.done:
                _check_worker(worker)

    def _finish(self, gang: _Gang) -> None:
        gang.state = "stopping"
        self._sweep(gang)
        ended = _ended_at(gang)  # before _forget removes the exit files
        self._forget(gang, "finished")
        self._emit(gang.job_id, "finished", placement=gang.placement, exit_code=0, at=ended)

    async def _fail(self, gang: _Gang, culprit: _Worker) -> None:
        gang.state = "stopping"
        await self._terminate(gang, self.failure_grace)
        message = await off_loop(self._failure_message, gang, culprit)
        ended = _ended_at(gang)  # before _forget removes the exit files
        self._forget(gang, "failed")
        self._emit(
            gang.job_id,
            "failed",
            placement=gang.placement,
            exit_code=culprit.exit_code,
            message=message,
            at=ended,
        )

    def _failure_message(self, gang: _Gang, worker: _Worker) -> str:
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
        error = _exit_record(worker.exit_file).get("error")
        if error:  # the launcher could not even start it (its log may not exist)
            why = f"{why}: it could not be started: {error}"
        path = os.path.join(gang.workdir, "logs", f"worker-{worker.rank}.log")
        try:  # with the user's rights: a log replaced by a link to a secret is refused
            text = self.files_for(gang.user).tail(path, self.log_tail_lines)[-8000:]
        except (UserFileError, AccountError) as err:
            return f"{why}; its log was not read: {err}"
        return f"{why}; last lines of {path}:\n{text}" if text else f"{why}; its log is empty"

    async def _end(self, gang: _Gang, grace: float, reason: str, emit_released: bool) -> str:
        """Stop a running gang; returns the outcome (``reason``, or ``finished``/``failed``)."""
        self._refresh(gang)
        if all(w.done for w in gang.workers):
            failed = [w for w in gang.workers if w.exit_code != 0 or w.vanished]
            if failed:  # it failed just before we came: that is what it did
                await self._fail(gang, _first_failure(failed))
                return "failed"
            self._finish(gang)
            return "finished"
        gang.state = "stopping"
        await self._terminate(gang, grace)
        if emit_released and all(w.exit_code == 0 and not w.vanished for w in gang.workers):
            # every worker finished its work within the grace: the job is done, not stopped
            # (a worker that SIGTERM stops exits 143 through extension.runtime, or dies of it)
            self._finish(gang)
            return "finished"
        self._forget(gang, reason)
        if emit_released:
            self._emit(gang.job_id, "released", placement=gang.placement, message=reason)
        return reason

    async def _terminate(self, gang: _Gang, grace: float) -> None:
        """SIGTERM to each live worker's group, up to ``grace`` seconds, then SIGKILL."""
        self._refresh(gang)
        for worker in gang.workers:
            if not worker.done:
                _kill_group(worker.pid, signal.SIGTERM)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, grace)
        while loop.time() < deadline and not all(w.done for w in gang.workers):
            await asyncio.sleep(min(0.05, self.poll_interval))
            self._refresh(gang)
        alive = [w for w in gang.workers if not w.done]
        for worker in alive:
            log.info("job %s: worker %d outlived its grace; SIGKILL", gang.job_id, worker.rank)
            _kill_group(worker.pid, signal.SIGKILL)
        deadline = loop.time() + self.kill_wait
        while loop.time() < deadline and not all(w.done for w in gang.workers):
            await asyncio.sleep(0.05)
            self._refresh(gang)
        for worker in gang.workers:
            if not worker.done:  # e.g. stuck in uninterruptible I/O: say so, do not hang
                log.error(
                    "job %s: worker %d (pid %d) still there %.0fs after SIGKILL; its devices "
                    "are released anyway",
                    gang.job_id,
                    worker.rank,
                    worker.pid,
                    self.kill_wait,
                )
        self._sweep(gang)

    def _sweep(self, gang: _Gang) -> None:
        """Kill what is left in the gang's process groups (a worker's own children).

        A process is taken for the gang's only when its group is one of the gang's and its
        environment names the job: a group id recycled by an unrelated process is left alone.
        """
        self.cgroups.kill([w.cgroup for w in gang.workers])
        pgids = {w.pid for w in gang.workers}
        for proc in psutil.process_iter():
            try:
                if os.getpgid(proc.pid) not in pgids:
                    continue
                if proc.environ().get("WMLA_JOB_ID") == gang.job_id:
                    proc.kill()
            except (psutil.Error, ProcessLookupError, PermissionError):
                continue

    def _forget(self, gang: _Gang, outcome: str) -> None:
        # the checkpoint it wrote on SIGTERM is the one a resized or preempted job resumes from
        self._relay_checkpoint(gang)
        gang.state = "done"
        gang.outcome = outcome
        self._free(gang.placement, [w.devices for w in gang.workers])
        self.cgroups.remove([w.cgroup for w in gang.workers])
        if self._gangs.get(gang.job_id) is gang:
            del self._gangs[gang.job_id]
        with contextlib.suppress(OSError):
            _rmtree(self._job_dir(gang.job_id))
        gang.ended.set()


def _first_failure(failed: list[_Worker]) -> _Worker:
    """The worker whose failure came first (the others often fail because it did)."""
    return min(failed, key=lambda w: (w.vanished, _exit_time(w), w.rank))


def _kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"
