"""What outlives the service: for every gang, ``<state_dir>/jobs/<job>/record.json`` with each
worker's pid and start time, and the exit file the launcher writes when its worker ends (its
exit code and when). A new backend over the same ``state_dir`` re-adopts the workers from the
records (the start time tells a recycled pid from the worker) and learns from the exit files
how those that ended meanwhile ended.

The state directory holds the job specs with their env: it is the backend's own, 0700."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol
from urllib.parse import quote

import psutil

log = logging.getLogger("wmla.backends.local")


class GangState(Enum):
    """Where a gang is in its life: watched, being ended (by one task only), gone."""

    RUNNING = "running"
    STOPPING = "stopping"
    DONE = "done"


class Launched(Protocol):
    """A worker's launcher as the backend that started it sees it (``node_launcher.Forked``)."""

    pid: int

    @property
    def watched(self) -> bool:
        """Whether its end will be told by ``poll`` (else: look at it like an adopted one)."""

    def poll(self) -> int | None:
        """Its exit code once it ended, None before."""

    def wait(self, timeout: float) -> int | None:
        """Its exit code, waiting up to ``timeout`` seconds."""


@dataclass
class Worker:
    """One worker of a gang: its launcher's pid, what it holds, how it ended."""

    rank: int
    node: str
    devices: tuple[int, ...]
    pid: int
    create_time: float
    exit_file: str
    proc: Launched | None = None  # None: adopted from an earlier service
    exit_code: int | None = None
    exited_at: float | None = None
    exit_info: dict[str, Any] = field(default_factory=dict)  # its exit file, read when it ended
    done: bool = False
    vanished: bool = False  # gone without an exit status (SIGKILL, reboot)
    cgroup: str = ""  # the name of its cgroup (confining.py); "" where none is made

    def record(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "node": self.node,
            "devices": list(self.devices),
            "pid": self.pid,
            "create_time": self.create_time,
            "exit_file": self.exit_file,
            "cgroup": self.cgroup,
        }

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> Worker:
        """Raises KeyError, TypeError or ValueError when ``rec`` is not a worker's record."""
        return cls(
            rank=int(rec["rank"]),
            node=str(rec["node"]),
            devices=tuple(int(d) for d in rec["devices"]),
            pid=int(rec["pid"]),
            create_time=float(rec["create_time"]),
            exit_file=str(rec["exit_file"]),
            cgroup=str(rec.get("cgroup", "")),
        )


@dataclass
class Gang:
    """One start of a job's workers, from its launch until it is forgotten."""

    job_id: str
    user: str
    workdir: str
    placement: tuple[str, ...]
    port: int
    launch: str
    started_at: float
    workers: list[Worker]
    state: GangState = GangState.RUNNING
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    report_seen: tuple | None = None  # (inode, mtime) of the last checkpoint report relayed

    def record(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "user": self.user,
            "workdir": self.workdir,
            "placement": list(self.placement),
            "port": self.port,
            "launch": self.launch,
            "started_at": self.started_at,
            "workers": [w.record() for w in self.workers],
        }

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> Gang:
        """Raises KeyError, TypeError or ValueError when ``rec`` is not a gang's record."""
        workers = [Worker.from_record(w) for w in rec["workers"]]
        return cls(
            job_id=str(rec["job_id"]),
            user=str(rec.get("user", "")),
            workdir=str(rec["workdir"]),
            placement=tuple(str(n) for n in rec["placement"]),
            port=int(rec.get("port", 0)),
            launch=str(rec.get("launch", "")),
            started_at=float(rec.get("started_at", 0.0)),
            workers=workers,
        )

    @property
    def cgroups(self) -> list[str]:
        return [w.cgroup for w in self.workers]


class GangRecords:
    """The gangs' records in ``<state_dir>/jobs``, made 0700 here."""

    def __init__(self, state_dir: str) -> None:
        self.jobs_dir = os.path.join(state_dir, "jobs")
        private_dirs(self.jobs_dir)

    def job_dir(self, job_id: str) -> str:
        return os.path.join(self.jobs_dir, quote(job_id, safe=""))

    def write(self, gang: Gang, outcome: dict[str, Any] | None = None) -> None:
        """The gang's record, replaced whole (a reader sees the old one or the new one); with
        ``outcome`` once it ended (how, kept until the service stored it: ``remove_ended``). Not
        fsynced: it is read by a service that restarted, while the workers it names still run,
        so the machine did not go down meanwhile and the page cache has it; after a crash of
        the machine its workers are gone whatever it says (an fsync was 4 ms of every start)."""
        path = os.path.join(self.job_dir(gang.job_id), "record.json")
        private_dirs(os.path.dirname(path))
        tmp = f"{path}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            record = gang.record()
            if outcome is not None:
                record["outcome"] = outcome
            json.dump(record, out, indent=1)
        os.replace(tmp, path)

    def read(self) -> dict[str, dict[str, Any]]:
        """Every readable record by job id; an unreadable one is logged and left alone."""
        out: dict[str, dict[str, Any]] = {}
        try:
            entries = sorted(os.listdir(self.jobs_dir))
        except FileNotFoundError:
            return out
        for entry in entries:
            path = os.path.join(self.jobs_dir, entry, "record.json")
            try:
                with open(path, encoding="utf-8") as src:
                    rec = json.load(src)
                out[str(rec["job_id"])] = rec
            except FileNotFoundError:
                continue
            except (OSError, ValueError, KeyError, TypeError) as err:
                log.error("unreadable worker record %s (%s): left alone", path, err)
        return out

    def remove_ended(self, job_id: str) -> None:
        """The job's folder gone if its record holds an outcome (its end, now stored by the
        service); a record without one (a new start of the job) is left alone."""
        path = os.path.join(self.job_dir(job_id), "record.json")
        try:
            with open(path, encoding="utf-8") as src:
                ended = "outcome" in json.load(src)
        except FileNotFoundError:
            return
        except (OSError, ValueError, TypeError) as err:
            log.error("unreadable worker record %s (%s): left alone", path, err)
            return
        if ended:
            self.remove(job_id)

    def remove(self, job_id: str) -> None:
        """The job's folder (its record, its launchers' exit and report files) gone, if it can
        be: one folder of files, removed in a call per file (a launch's subfolder, as an older
        service made them, goes whole)."""
        folder = self.job_dir(job_id)
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path)
                    else:
                        os.unlink(entry.path)
            os.rmdir(folder)
        except FileNotFoundError:
            pass
        except OSError:
            with contextlib.suppress(OSError):
                shutil.rmtree(folder)


def check_worker(worker: Worker) -> None:
    """Bring ``worker.done`` / ``exit_code`` up to date without blocking: from its launcher's
    parent where that still watches it, else (re-adopted, or its parent ended) from its pid and
    start time, then its exit file."""
    code = worker.proc.poll() if worker.proc is not None else None
    if code is None and worker.proc is not None and worker.proc.watched:
        return
    if code is not None:
        recorded = _read_exit(worker)
        worker.exit_code = recorded if recorded is not None else code
        worker.vanished = False
        worker.done = True
        worker.exited_at = time.time()
        return
    if alive(worker.pid, worker.create_time):
        return
    recorded = _read_exit(worker)
    worker.done = True
    worker.exited_at = time.time()
    if recorded is None:
        worker.vanished = True
        worker.exit_code = None
    else:
        worker.exit_code = recorded


def alive(pid: int, create_time: float) -> bool:
    """The process ``pid`` exists, is the one started at ``create_time``, and is not a zombie."""
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - create_time) > 0.05:
            return False  # the pid was recycled: not our worker
        if proc.status() == psutil.STATUS_ZOMBIE:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)  # reap it if it is ours (same process, old backend)
            return False
        return True
    except psutil.Error:
        return False


def exit_record(path: str) -> dict[str, Any]:
    """What the launcher wrote when its worker ended (in our state directory), or {}."""
    try:
        with open(path, encoding="utf-8") as src:
            record = json.load(src)
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _read_exit(worker: Worker) -> int | None:
    """The code in the worker's exit file (kept whole in ``exit_info``: read once), or None."""
    worker.exit_info = exit_record(worker.exit_file)
    try:
        return int(worker.exit_info["code"])
    except (KeyError, TypeError, ValueError):
        return None


def report_file(exit_file: str) -> str:
    """Where rank 0's launcher relays the worker's latest checkpoint report, next to its exit
    file (so a re-adopted gang's is known from its record)."""
    return exit_file.removesuffix(".exit") + ".checkpoint"


def report_identity(path: str) -> tuple | None:
    """(inode, mtime) of the report file: the launcher replaces it whole, so a new report is a
    new identity; None when there is none yet."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return (info.st_ino, info.st_mtime_ns)


def read_report(path: str) -> dict | None:
    """``{"at", "progress"}`` of the launcher's report file, or None when there is none or it
    is not what the launcher writes. The file is the launcher's, in our private state
    directory; still opened O_NOFOLLOW and read capped."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        data = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        record = json.loads(data)
        at = float(record["at"])
        progress = record.get("progress")
        progress = None if progress is None else float(progress)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    return {"at": at, "progress": progress}


def exit_time(worker: Worker) -> float:
    try:
        return float(worker.exit_info["at"])
    except (KeyError, TypeError, ValueError):
        return worker.exited_at or float("inf")


def ended_at(gang: Gang) -> float:
    """When the gang's last worker ended: the launchers' exit files say so, also for a gang
    that ended while no service watched it (re-adopted: metering charges until then, not until
    the restart noticed). A worker without a file ended when it was seen gone."""
    now = time.time()
    ends = [exit_time(w) for w in gang.workers]
    last = max(ends, default=now)
    return now if last == float("inf") else min(last, now)


def private_dirs(path: str) -> None:
    """``path`` and any missing parent created 0700 whatever the umask: the state directory
    holds the job specs with their env (os.makedirs gives the parents the umask's mode)."""
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o700)
        os.chmod(folder, 0o700)
