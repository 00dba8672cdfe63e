"""cgroup v1: one folder per controller hierarchy (cpu, cpuacct, memory, pids, devices), each
``<mount>/<parent>/<scope>/<name>``; every limit is a file write, the devices fence an
allow-list after ``a`` was denied."""

from __future__ import annotations

import contextlib
import errno
import os

from . import cgroupfs as fs
from .records import (
    CFS_PERIOD_US,
    ConfineError,
    Control,
    Enforced,
    Grant,
    Report,
    Usage,
    cfs_quota_us,
)

# What any process needs besides its GPUs, as runc's default list: null, zero, full, random,
# urandom, tty, console, ptmx, the ptys, tun; and mknod (not the opening) of any node.
BASE_DEVICES = (
    "c *:* m",
    "b *:* m",
    "c 1:3 rwm",
    "c 1:5 rwm",
    "c 1:7 rwm",
    "c 1:8 rwm",
    "c 1:9 rwm",
    "c 5:0 rwm",
    "c 5:1 rwm",
    "c 5:2 rwm",
    "c 136:* rwm",
    "c 10:200 rwm",
)
# hierarchy -> the control it serves; cpuacct only reads (the CPU seconds used)
HIERARCHIES = {"cpu": Control.CPU, "cpuacct": Control.CPU, "memory": Control.MEMORY,
               "pids": Control.PIDS, "devices": Control.DEVICES}  # fmt: skip


# All users' work together (the parent folder): an eighth of a default weight, so that under
# contention the hub, the proxy, the service and its helpers run first, as a kubelet keeps CPU
# for the system daemons (a busy thread of theirs gets about 90% of a CPU the jobs also want).
# Not the smallest (2): that starved notebooks and jobs for as long as anything outside them
# kept a CPU busy. The grants stay ceilings (quotas) and split the rest by their own weights.
# At the default weight one tenant's busy jobs take CPU from every tenant's answers
# (bench_service --as-root: the service had 60% of a core, the jobs the rest).
USERS_CPU_SHARES = 128


def cpu_shares(millicores: int) -> int:
    """cpu.shares for a grant: 1024 a core, as Kubernetes maps requests (2 at least)."""
    return max(2, millicores * 1024 // 1000)


class V1Cgroup:
    """One worker's or server's cgroup in every hierarchy."""

    def __init__(self, name: str, folders: dict[str, str]) -> None:
        self.name = name
        self.folders = folders  # hierarchy -> folder (cpu and cpuacct may share one)

    def enter_files(self) -> tuple[str, ...]:
        unique = dict.fromkeys(self.folders.values())
        return tuple(os.path.join(f, "cgroup.procs") for f in unique)

    def usage(self) -> Usage:
        acct = self.folders.get("cpuacct")
        memory = self.folders.get("memory")
        cpu = fs.read_int(os.path.join(acct, "cpuacct.usage")) / 1e9 if acct else 0.0
        if memory is None:
            return Usage(cpu)
        return Usage(
            cpu,
            fs.read_int(os.path.join(memory, "memory.usage_in_bytes")),
            fs.read_int(os.path.join(memory, "memory.max_usage_in_bytes")),
            fs.keyed(os.path.join(memory, "memory.oom_control"), "oom_kill"),
            _own_limit(fs.read_int(os.path.join(memory, "memory.limit_in_bytes"))),
        )

    def pids(self) -> set[int]:
        return set().union(*(fs.procs(f) for f in dict.fromkeys(self.folders.values())))

    def remove(self, wait: float = 5.0) -> bool:
        return fs.remove(list(dict.fromkeys(self.folders.values())), wait)


class CgroupV1:
    """Confinement over the v1 hierarchies mounted here (``mounts``: hierarchy -> path)."""

    version = 1

    def __init__(self, mounts: dict[str, str], parent: str, scope: str, users_memory: int) -> None:
        self.mounts = mounts
        self.parent = parent
        self.scope = scope
        self.users_memory = users_memory
        self.report = self._report()
        self._parents_ready = False

    def _report(self) -> Report:
        how = {
            Control.CPU: ("cpu", "cgroup v1 cpu.cfs_quota_us over cpu.cfs_period_us"),
            Control.MEMORY: ("memory", "cgroup v1 memory.limit_in_bytes (+ memsw: no swap)"),
            Control.PIDS: ("pids", "cgroup v1 pids.max"),
            Control.DEVICES: ("devices", "cgroup v1 devices.deny a + devices.allow list"),
        }
        controls = {
            control: Enforced(True, text)
            if hierarchy in self.mounts
            else Enforced(False, f"no cgroup v1 {hierarchy} hierarchy is mounted")
            for control, (hierarchy, text) in how.items()
        }
        return Report("cgroup v1", controls)

    def _base(self, hierarchy: str) -> str:
        return os.path.join(self.mounts[hierarchy], self.parent, self.scope)

    def _ensure_parents(self) -> None:
        """The parent and the scope, every time (``prune`` may have removed the scope); the
        users' CPU weight and memory cap once."""
        for hierarchy, mount in self.mounts.items():
            fs.make(os.path.join(mount, self.parent))
            fs.make(self._base(hierarchy))
        if not self._parents_ready and "cpu" in self.mounts:
            top = os.path.join(self.mounts["cpu"], self.parent)
            fs.write_weight(os.path.join(top, "cpu.shares"), USERS_CPU_SHARES)
        if not self._parents_ready and "memory" in self.mounts and self.users_memory > 0:
            top = os.path.join(self.mounts["memory"], self.parent)
            _memory_limit(top, self.users_memory)
        self._parents_ready = True

    def prune(self) -> None:
        """Remove the scope's folders when no cgroup is left in them."""
        for hierarchy in self.mounts:
            with contextlib.suppress(OSError):
                os.rmdir(self._base(hierarchy))

    def folder(self, hierarchy: str, name: str) -> str:
        return os.path.join(self._base(hierarchy), fs.safe_name(name))

    def create(self, name: str, grant: Grant) -> V1Cgroup:
        """Make the cgroup with ``grant``'s limits; on any failure nothing is left."""
        try:
            self._ensure_parents()
        except OSError as err:
            raise ConfineError(f"cannot make the users' cgroups ({err})") from err
        group = V1Cgroup(name, {h: self.folder(h, name) for h in self.mounts})
        try:
            for folder in dict.fromkeys(group.folders.values()):
                if not fs.make(folder):  # a leftover of the same name: start it afresh
                    fs.remove([folder], 2.0)
                    fs.make(folder)
            self._limit(group, grant)
        except OSError as err:
            group.remove(2.0)
            raise ConfineError(f"cannot set up cgroup {name}: {err}") from err
        return group

    def _limit(self, group: V1Cgroup, grant: Grant) -> None:
        folders = group.folders
        if "cpu" in folders:
            cpu = folders["cpu"]
            quota = cfs_quota_us(grant.cpu_millicores)
            fs.write(os.path.join(cpu, "cpu.cfs_period_us"), str(CFS_PERIOD_US))
            fs.write(os.path.join(cpu, "cpu.cfs_quota_us"), str(-1 if quota is None else quota))
            fs.write(os.path.join(cpu, "cpu.shares"), str(cpu_shares(grant.weight_millicores)))
        if "memory" in folders and grant.memory_bytes:
            _memory_limit(folders["memory"], grant.memory_bytes)
        if "pids" in folders:
            fs.write(os.path.join(folders["pids"], "pids.max"), str(grant.pids))
        if "devices" in folders:
            devices = folders["devices"]
            fs.write(os.path.join(devices, "devices.deny"), "a")
            rules = [*BASE_DEVICES, *(n.rule() for n in (*grant.gpus, *grant.control_nodes))]
            for rule in rules:
                fs.write(os.path.join(devices, "devices.allow"), rule)

    def open(self, name: str) -> V1Cgroup | None:
        folders = {h: self.folder(h, name) for h in self.mounts}
        if not any(os.path.isdir(f) for f in folders.values()):
            return None
        return V1Cgroup(name, folders)

    def names(self) -> list[str]:
        seen: dict[str, None] = {}
        for hierarchy in self.mounts:
            seen.update(dict.fromkeys(fs.children(self._base(hierarchy))))
        return list(seen)


def _own_limit(value: int) -> int:
    """v1 says "no limit" with the largest page-aligned number: 0 for that."""
    return 0 if value >= 1 << 60 else value


def _memory_limit(folder: str, limit: int) -> None:
    """A hard limit of ``limit`` bytes, swap included where swap is accounted (memsw must stay
    at or above the plain limit, so the order of the two writes depends on the direction)."""
    plain = os.path.join(folder, "memory.limit_in_bytes")
    memsw = os.path.join(folder, "memory.memsw.limit_in_bytes")
    try:
        fs.write(plain, str(limit))
    except OSError as err:
        if err.errno != errno.EINVAL or not os.path.exists(memsw):
            raise
        fs.write(memsw, str(limit))
        fs.write(plain, str(limit))
    if os.path.exists(memsw):
        with contextlib.suppress(OSError):
            fs.write(memsw, str(limit))
