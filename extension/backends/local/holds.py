"""Devices held for jobs whose processes the backend does not start (notebook servers): one
record per job, ``<state_dir>/holds/<job>.json`` (the placement and the device indexes by
worker), so a restarted service still counts them and the spawner keeps its fence."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from urllib.parse import quote

from extension.backends.base import JobSpec

from .allocation import DeviceTable
from .records import private_dirs

log = logging.getLogger("wmla.backends.local")


@dataclass(frozen=True)
class Hold:
    """The devices of one job whose processes the backend does not start, by worker."""

    job_id: str
    placement: tuple[str, ...]
    devices: tuple[tuple[int, ...], ...]


class HoldRecords:
    """The holds' records in the backend's private state directory."""

    def __init__(self, state_dir: str) -> None:
        self.folder = os.path.join(state_dir, "holds")
        private_dirs(self.folder)

    def _path(self, job_id: str) -> str:
        return os.path.join(self.folder, quote(job_id, safe="") + ".json")

    def write(self, hold: Hold) -> None:
        path = self._path(hold.job_id)
        tmp = f"{path}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            record = {"job_id": hold.job_id, "placement": list(hold.placement),
                      "devices": [list(d) for d in hold.devices]}  # fmt: skip
            json.dump(record, out)
        os.replace(tmp, path)

    def remove(self, job_id: str) -> None:
        try:
            os.unlink(self._path(job_id))
        except FileNotFoundError:
            pass

    def read(self) -> list[Hold]:
        holds = []
        for entry in sorted(os.listdir(self.folder)):
            if not entry.endswith(".json"):
                continue
            path = os.path.join(self.folder, entry)
            try:
                with open(path, encoding="utf-8") as src:
                    rec = json.load(src)
                holds.append(
                    Hold(
                        str(rec["job_id"]),
                        tuple(str(n) for n in rec["placement"]),
                        tuple(tuple(int(i) for i in d) for d in rec["devices"]),
                    )
                )
            except (OSError, ValueError, KeyError, TypeError) as err:
                log.error("unreadable device hold %s (%s): removed", path, err)
                os.unlink(path)
        return holds


class DeviceHolds:
    """The holds this backend keeps, their devices counted in ``devices`` as a gang's are;
    those on record when it begins are taken again."""

    def __init__(self, records: HoldRecords, devices: DeviceTable) -> None:
        self.records = records
        self.devices = devices
        self.holds: dict[str, Hold] = {}
        for hold in records.read():
            self.holds[hold.job_id] = hold
            devices.take(hold.placement, hold.devices)

    def hold(self, spec: JobSpec, placement: tuple[str, ...]) -> list[tuple[int, ...]]:
        """Take devices for a notebook server the spawner runs: as a gang's, the lowest free
        indexes of each node, so no job is given the same GPU; kept on record."""
        held = self.holds.get(spec.id)
        if held is not None:
            return list(held.devices)
        self.devices.check_placement(spec, tuple(placement))
        devices = self.devices.allocate(spec, tuple(placement))
        hold = Hold(spec.id, tuple(placement), tuple(tuple(d) for d in devices))
        self.holds[spec.id] = hold
        self.records.write(hold)
        return list(hold.devices)

    def release(self, job_id: str) -> None:
        hold = self.holds.pop(job_id, None)
        if hold is not None:
            self.devices.free(hold.placement, hold.devices)
            self.records.remove(job_id)

    def held(self, job_id: str) -> list[tuple[int, ...]] | None:
        hold = self.holds.get(job_id)
        return list(hold.devices) if hold is not None else None

    def keep(self, job_ids: set[str]) -> None:
        """Release the holds of jobs not in ``job_ids`` (no longer running)."""
        for job_id in [j for j in self.holds if j not in job_ids]:
            log.warning("device hold of job %s, which is no longer running: released", job_id)
            self.release(job_id)
