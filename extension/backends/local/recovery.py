"""Re-adoption after a service restart: the workers outlive the service (own session, and
nothing of theirs depends on the service's pipes), and a new backend over the same
``state_dir`` finds them again from their records. A job it cannot find is reported ``lost``."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from extension.backends.base import EventKind, JobSpec

from .allocation import DeviceTable
from .confining import WorkerCgroups
from .events import Emitter
from .records import Gang, GangRecords, GangState, check_worker
from .supervision import Supervisor
from .users import JobOwner, UserAccounts

log = logging.getLogger("wmla.backends.local")


class Recovery:
    """``recover``: the gangs on record in ``records`` adopted into ``supervisor``, their
    devices counted in ``devices``, the cgroups of no gang swept from ``cgroups``."""

    def __init__(
        self,
        emit: Emitter,
        records: GangRecords,
        supervisor: Supervisor,
        devices: DeviceTable,
        accounts: UserAccounts,
        cgroups: WorkerCgroups,
        stop_orphans: bool,
    ) -> None:
        self.emit = emit
        self.records = records
        self.supervisor = supervisor
        self.devices = devices
        self.accounts = accounts
        self.cgroups = cgroups
        self.stop_orphans = stop_orphans

    async def recover(self, specs: Sequence[JobSpec], state_dir: str) -> None:
        """Re-adopt the workers of ``specs`` from the records in ``state_dir``.

        Per job: a record with an outcome (the gang ended, the service died before it stored
        the end) -> that end is reported again, and the record stays until it is stored; all
        workers alive (pid and start time match) -> adopted silently, watched from now on; some
        ended meanwhile -> the gang is judged as if watched all along (a non-zero exit fails it,
        all zero finishes it); a worker gone without an exit status, or no record at all ->
        ``lost``. Gangs on record that are not in ``specs`` are stopped when ``stop_orphans``
        (their devices would be counted by nobody); a record with an outcome that is not in
        ``specs`` is an end already stored: removed.
        """
        wanted = {spec.id: spec for spec in specs}
        on_disk = self.records.read()
        for spec in specs:
            self.accounts.note(spec.id, JobOwner(spec.workdir, spec.user), replace=False)
            if self.supervisor.gang(spec.id) is not None:
                continue
            rec = on_disk.pop(spec.id, None)
            if rec is None:
                self.emit(
                    spec.id,
                    EventKind.LOST,
                    message=f"no record of job {spec.id}'s workers in {state_dir}: "
                    "they were started elsewhere or their record was removed",
                )
                continue
            if "outcome" in rec:
                self._report_again(spec.id, rec["outcome"])
                continue
            self._adopt(rec)
        for job_id, rec in on_disk.items():
            if job_id in wanted or self.supervisor.gang(job_id) is not None:
                continue
            if "outcome" in rec:  # stored before the last service went: nothing runs
                await self.supervisor.ends.run(self.records.remove_ended, job_id)
            elif self.stop_orphans:
                await self._stop_orphan(job_id, rec)
        keep = {c for gang in self.supervisor.gangs.values() for c in gang.cgroups}
        for name in self.cgroups.sweep(keep):
            log.warning("cgroup %s belonged to no gang on record: removed with its processes", name)
        self.supervisor.ensure_monitor()

    def _report_again(self, job_id: str, outcome: Any) -> None:
        """The end the last service reported but did not store, as it was reported."""
        try:
            kind = EventKind(outcome["kind"])
            code = outcome.get("exit_code")
            self.emit(
                job_id,
                kind,
                placement=tuple(str(n) for n in outcome.get("placement") or ()),
                exit_code=None if code is None else int(code),
                message=str(outcome.get("message") or ""),
                at=float(outcome["at"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            self.emit(job_id, EventKind.LOST, message=f"its recorded end is unreadable ({err})")
        else:
            log.info("job %s: its end (%s) was not stored before the restart", job_id, kind.value)

    async def _stop_orphan(self, job_id: str, rec: dict[str, Any]) -> None:
        log.warning("job %s has workers on record but is not listed: stopping it", job_id)
        gang = self._adopt(rec, quiet=True)
        if gang is not None:
            gang.state = GangState.STOPPING
            await self.supervisor.terminate(gang, self.supervisor.options.failure_grace)
            await self.supervisor.forget(gang)

    def _adopt(self, rec: dict[str, Any], quiet: bool = False) -> Gang | None:
        job_id = str(rec["job_id"])
        try:
            gang = Gang.from_record(rec)
        except (KeyError, TypeError, ValueError) as err:
            if not quiet:
                self.emit(
                    job_id, EventKind.LOST, message=f"its worker record is unreadable ({err})"
                )
            return None
        self.accounts.note(job_id, JobOwner(gang.workdir, gang.user), replace=False)
        for worker in gang.workers:
            check_worker(worker)
        vanished = [w for w in gang.workers if w.vanished]
        # count their devices until we know better
        self.devices.take([w.node for w in gang.workers], [w.devices for w in gang.workers])
        self.supervisor.add(gang)
        if vanished and not quiet:
            gang.state = GangState.STOPPING
            names = ", ".join(f"worker {w.rank} (pid {w.pid})" for w in vanished)
            message = (
                f"after the service restarted, {names} could not be found (ended without an exit "
                "status, or the pid now belongs to another process)"
            )
            self.supervisor.spawn_task(self._lose(gang, message))
            return gang
        if not quiet:
            log.info("job %s: re-adopted %d worker(s)", job_id, len(gang.workers))
        return gang

    async def _lose(self, gang: Gang, message: str) -> None:
        await self.supervisor.terminate(gang, self.supervisor.options.failure_grace)
        await self.supervisor.end_kept(gang, EventKind.LOST, message=message)
