"""Grants enforced by the kernel: one cgroup per job worker and per notebook server.

Root makes the cgroup with the grant's limits (CPU quota, memory without swap beyond it, a pids
limit, a device allow-list of the process's own GPUs) and the process enters it between fork and
exec, before it drops to the user's account, so no line of the user's code runs unconfined.
``detect`` picks cgroup v1 or v2 from this machine's mounts; what it cannot enforce is in its
``report`` (said at start and in ``GET /instance``). Standard library only."""

from __future__ import annotations

import os
from typing import Protocol

from . import cgroupfs
from .records import (
    DEFAULT_GPU_TEMPLATE,
    DEFAULT_PIDS,
    USER_OOM_SCORE_ADJ,
    ConfineError,
    Control,
    DeviceNode,
    Enforced,
    Grant,
    Report,
    Usage,
    cfs_quota_us,
    check_template,
    gpu_grant,
    killed_for_memory,
    mib,
)
from .v1 import CgroupV1
from .v2 import CgroupV2

__all__ = [
    "DEFAULT_GPU_TEMPLATE",
    "DEFAULT_PIDS",
    "SERVERS_SCOPE",
    "USER_OOM_SCORE_ADJ",
    "Cgroup",
    "ConfineError",
    "Confinement",
    "Control",
    "DeviceNode",
    "Enforced",
    "Grant",
    "Report",
    "Usage",
    "cfs_quota_us",
    "check_template",
    "detect",
    "enter",
    "gpu_grant",
    "killed_for_memory",
    "mib",
    "users_memory_default",
]

PARENT = "wmla"  # every user's cgroup lives under <mount>/wmla/<scope>/
SERVERS_SCOPE = "notebooks"  # the notebook servers', each named by its notebook job's id


class Cgroup(Protocol):
    """One process tree's cgroup."""

    name: str

    def enter_files(self) -> tuple[str, ...]: ...
    def usage(self) -> Usage: ...
    def pids(self) -> set[int]: ...
    def remove(self, wait: float = 5.0) -> bool: ...


class Confinement(Protocol):
    """Makes and finds the cgroups of one scope (``jobs`` or ``notebooks``)."""

    report: Report

    def create(self, name: str, grant: Grant) -> Cgroup: ...
    def open(self, name: str) -> Cgroup | None: ...
    def names(self) -> list[str]: ...
    def prune(self) -> None: ...


class Unconfined:
    """No cgroup can be made here: every create says why, and the report says it loudly."""

    def __init__(self, why: str) -> None:
        self.why = why
        self.report = Report("none", {c: Enforced(False, why) for c in Control})

    def create(self, name: str, grant: Grant) -> Cgroup:
        raise ConfineError(self.why)

    def open(self, name: str) -> Cgroup | None:
        return None

    def names(self) -> list[str]:
        return []

    def prune(self) -> None:
        pass


def users_memory_default(reserve: int = 1 << 30) -> int:
    """The cap on all users' work together: the machine's memory less ``reserve`` (and at
    least a tenth of it) for the hub, the proxy and the service, which the OOM killer then never
    has to choose among. 0 where the total is unknown."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0
    return max(total // 2, total - max(reserve, total // 10))


def detect(
    scope: str,
    users_memory: int = 0,
    parent: str = PARENT,
    mountinfo: str = cgroupfs.MOUNTINFO,
) -> Confinement:
    """The confinement this machine offers: cgroup v2 where the unified hierarchy has the
    controllers, else v1's hierarchies, else none (with the reason)."""
    if os.geteuid() != 0:
        return Unconfined(
            "the service does not run as root, so it cannot make cgroups (and every job runs "
            "as its own account); run the hub as root"
        )
    found = cgroupfs.mounts(mountinfo)
    for mount in found:
        if mount.version == 2:
            controllers = set(cgroupfs.read(os.path.join(mount.path, "cgroup.controllers")).split())
            if {"cpu", "memory", "pids"} <= controllers:
                return CgroupV2(mount.path, parent, scope, users_memory)
    v1 = {
        name: mount.path
        for mount in found
        if mount.version == 1
        for name in ("cpu", "cpuacct", "memory", "pids", "devices")
        if name in mount.controllers
    }
    if v1:
        return CgroupV1(v1, parent, scope, users_memory)
    return Unconfined("no cgroup filesystem is mounted (/sys/fs/cgroup)")


def enter(
    cgroup_files: tuple[str, ...] | list[str], oom_score_adj: int = USER_OOM_SCORE_ADJ
) -> None:
    """Put the calling process into a cgroup (each ``cgroup.procs`` file) and make it the OOM
    killer's early choice. Called between fork and exec, as root, before dropping privileges."""
    pid = str(os.getpid())
    for path in cgroup_files:
        cgroupfs.write(path, pid)
    cgroupfs.write("/proc/self/oom_score_adj", str(oom_score_adj))
