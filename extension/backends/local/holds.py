"""Devices held for jobs whose processes the backend does not start (notebook servers): one
record per job, ``<state_dir>/holds/<job>.json`` (the placement and the device indexes by
worker), so a restarted service still counts them and the spawner keeps its fence."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from urllib.parse import quote

from .records import _private_dirs

log = logging.getLogger("wmla.backends.local")


@dataclass(frozen=True)
class Hold:
    job_id: str
    placement: tuple[str, ...]
    devices: tuple[tuple[int, ...], ...]


class HoldRecords:
    """The holds' records in the backend's private state directory."""

    def __init__(self, state_dir: str) -> None:
        self.folder = os.path.join(state_dir, "holds")
        _private_dirs(self.folder)

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
