"""Re-adoption after a service restart: the workers outlive the service (own session, and
nothing of theirs depends on the service's pipes), and a new backend over the same
``state_dir`` finds them again from their records. A job it cannot find is reported ``lost``."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from extension.backends.base import JobSpec

from .confining import WorkerCgroups
from .records import _check_worker, _Gang, _Worker

log = logging.getLogger("wmla.backends.local")


class _Recovery:
    """``recover`` and the adoption of one gang from its record.

    A part of ``LocalBackend``: ``backend.py`` sets the attributes declared here.
    ``_emit``/``_check_open`` are the backend's, ``_read_records`` records.py's,
    ``_terminate``/``_forget``/``_spawn_task``/``_ensure_monitor`` supervision.py's.
    """

    state_dir: str
    cgroups: WorkerCgroups
    stop_orphans: bool
    failure_grace: float
    _used: dict[str, set[int]]
    _gangs: dict[str, _Gang]
    _workdirs: dict[str, tuple[str, str]]

    async def recover(self, specs: Sequence[JobSpec]) -> None:
        """Re-adopt the workers of ``specs`` from the records in ``state_dir``.

        Per job: all workers alive (pid and start time match) -> adopted silently, watched from
        now on; some ended meanwhile -> the gang is judged as if watched all along (a non-zero
        exit fails it, all zero finishes it); a worker gone without an exit status, or no record
        at all -> ``lost``. Gangs on record that are not in ``specs`` are stopped when
        ``stop_orphans`` (their devices would be counted by nobody).
        """
        self._check_open()
        wanted = {spec.id: spec for spec in specs}
        on_disk = self._read_records()
        for spec in specs:
            self._workdirs.setdefault(spec.id, (spec.workdir, spec.user))
            if spec.id in self._gangs:
                continue
            rec = on_disk.pop(spec.id, None)
            if rec is None:
                self._emit(
                    spec.id,
                    "lost",
                    message=f"no record of job {spec.id}'s workers in {self.state_dir}: "
                    "they were started elsewhere or their record was removed",
                )
                continue
            self._adopt(rec)
        for job_id, rec in on_disk.items():
            if job_id in wanted or job_id in self._gangs:
                continue
            if self.stop_orphans:
                log.warning("job %s has workers on record but is not listed: stopping it", job_id)
                gang = self._adopt(rec, quiet=True)
                if gang is not None:
                    gang.state = "stopping"
                    await self._terminate(gang, self.failure_grace)
                    self._forget(gang, "orphan")
        keep = {w.cgroup for gang in self._gangs.values() for w in gang.workers}
        for name in self.cgroups.sweep(keep):
            log.warning("cgroup %s belonged to no gang on record: removed with its processes", name)
        self._ensure_monitor()

    def _adopt(self, rec: dict[str, Any], quiet: bool = False) -> _Gang | None:
        job_id = str(rec["job_id"])
        try:
            workers = [
                _Worker(
                    rank=int(w["rank"]),
                    node=str(w["node"]),
                    devices=tuple(int(d) for d in w["devices"]),
                    pid=int(w["pid"]),
                    create_time=float(w["create_time"]),
                    exit_file=str(w["exit_file"]),
                    cgroup=str(w.get("cgroup", "")),
                )
                for w in rec["workers"]
            ]
            gang = _Gang(
                job_id=job_id,
                user=str(rec.get("user", "")),
                workdir=str(rec["workdir"]),
                placement=tuple(str(n) for n in rec["placement"]),
                port=int(rec.get("port", 0)),
                launch=str(rec.get("launch", "")),
                started_at=float(rec.get("started_at", 0.0)),
                workers=workers,
            )
        except (KeyError, TypeError, ValueError) as err:
            if not quiet:
                self._emit(job_id, "lost", message=f"its worker record is unreadable ({err})")
            return None
        self._workdirs.setdefault(job_id, (gang.workdir, gang.user))
        for worker in workers:
            _check_worker(worker)
        vanished = [w for w in workers if w.vanished]
        for worker in workers:  # count their devices until we know better
            if worker.node in self._used:
                self._used[worker.node].update(worker.devices)
        self._gangs[job_id] = gang
        if vanished and not quiet:
            gang.state = "stopping"
            names = ", ".join(f"worker {w.rank} (pid {w.pid})" for w in vanished)
            message = (
                f"after the service restarted, {names} could not be found (ended without an exit "
                "status, or the pid now belongs to another process)"
            )

            async def lose() -> None:
                await self._terminate(gang, self.failure_grace)
                self._forget(gang, "lost")
                self._emit(job_id, "lost", placement=gang.placement, message=message)

            self._spawn_task(lose())
            return gang
        if not quiet:
            log.info("job %s: re-adopted %d worker(s)", job_id, len(workers))
        return gang
