"""Reading and writing a cgroup filesystem: the mounts, one value files, the kill of what a
cgroup holds, its removal. Every path here is under a cgroup mount, made by root: no user can
name or plant one."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import signal
import time
from dataclasses import dataclass

MOUNTINFO = "/proc/self/mountinfo"
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Mount:
    """One cgroup mount: ``version`` 1 with its ``controllers``, or 2."""

    path: str
    version: int
    controllers: frozenset[str]


def mounts(mountinfo: str = MOUNTINFO) -> list[Mount]:
    """The cgroup mounts of this mount namespace."""
    found = []
    try:
        with open(mountinfo, encoding="utf-8") as src:
            lines = src.read().splitlines()
    except OSError:
        return []
    for line in lines:
        head, _, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if len(fields) < 5 or len(rest) < 3:
            continue
        path = fields[4].replace("\\040", " ")
        if rest[0] == "cgroup2":
            found.append(Mount(path, 2, frozenset()))
        elif rest[0] == "cgroup":
            options = set(rest[2].split(",")) | set(fields[5].split(","))
            found.append(Mount(path, 1, frozenset(options)))
    return found


def safe_name(name: str) -> str:
    """A cgroup folder name from a job id or server name: nothing but [A-Za-z0-9_.-]."""
    cleaned = _SAFE.sub("_", name)[:200].strip(".") or "_"
    return cleaned


def write_weight(path: str, value: int) -> None:
    """The users' parent's CPU weight (v1.USERS_CPU_SHARES says why). A hierarchy that refuses
    it still holds every grant to its quota: the refusal is logged, and jobs still start."""
    try:
        write(path, str(value))
    except OSError as err:
        log.warning(
            "cannot give users' work its lower CPU weight (%s: %s): the hub and the service "
            "then compete with the jobs at equal weight",
            path,
            err,
        )


def write(path: str, value: str) -> None:
    """Write one value to a cgroup file (no O_CREAT: these files are the kernel's; O_TRUNC, which
    the kernel ignores there, so a value written over a longer one reads alone anywhere)."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as src:
            return src.read()
    except OSError:
        return ""


def read_int(path: str) -> int:
    text = read(path).strip()
    try:
        return int(text)
    except ValueError:
        return 0


def keyed(path: str, key: str) -> int:
    """The value of ``key`` in a flat keyed file (``memory.events``, ``cpu.stat``)."""
    for line in read(path).splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == key:
            with contextlib.suppress(ValueError):
                return int(parts[1])
    return 0


def procs(folder: str) -> set[int]:
    out = set()
    for line in read(os.path.join(folder, "cgroup.procs")).split():
        with contextlib.suppress(ValueError):
            out.add(int(line))
    return out


def make(folder: str) -> bool:
    """Make a cgroup folder; True when it was made now."""
    try:
        os.mkdir(folder, 0o755)
    except FileExistsError:
        return False
    return True


def remove(folders: list[str], wait: float) -> bool:
    """Kill every process left in ``folders`` and remove them, deepest first; True when all
    are gone within ``wait`` seconds. A fork racing the kill is caught by the next round."""
    deadline = time.monotonic() + wait
    left = [f for f in folders if os.path.isdir(f)]
    while left:
        kill_file = os.path.join(left[0], "cgroup.kill")
        if os.path.exists(kill_file):
            with contextlib.suppress(OSError):
                write(kill_file, "1")
        for pid in set().union(*(procs(f) for f in left)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        still = []
        for folder in left:
            try:
                os.rmdir(folder)
            except FileNotFoundError:
                continue
            except OSError as err:
                if err.errno not in (errno.EBUSY, errno.ENOTEMPTY):
                    raise
                still.append(folder)
        left = still
        if left:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
    return True


def children(folder: str) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(folder) if e.is_dir(follow_symlinks=False))
    except OSError:
        return []
