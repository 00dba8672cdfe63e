"""cgroup v2: one folder ``<mount>/<parent>/<scope>/<name>`` with cpu.max, memory.max (and
memory.swap.max 0), pids.max. Its devices fence is an eBPF program the kernel attaches, which
only systemd (DevicePolicy=closed, DeviceAllow=) provides here: without it devices are reported
as not enforced, never skipped silently."""

from __future__ import annotations

import contextlib
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

NEEDED = ("cpu", "memory", "pids")
USERS_CPU_WEIGHT = 12  # all users' work together yields to the platform (v1.USERS_CPU_SHARES)


def cpu_weight(millicores: int) -> int:
    """cpu.weight for a grant: 100 a core (v2's default weight), 1..10000."""
    return min(10000, max(1, millicores * 100 // 1000))


class V2Cgroup:
    """One worker's or server's cgroup."""

    def __init__(self, name: str, folder: str) -> None:
        self.name = name
        self.folder = folder

    def enter_files(self) -> tuple[str, ...]:
        return (os.path.join(self.folder, "cgroup.procs"),)

    def usage(self) -> Usage:
        f = self.folder
        current = fs.read_int(os.path.join(f, "memory.current"))
        peak = fs.read_int(os.path.join(f, "memory.peak")) or current  # peak: kernel 5.19+
        return Usage(
            fs.keyed(os.path.join(f, "cpu.stat"), "usage_usec") / 1e6,
            current,
            peak,
            fs.keyed(os.path.join(f, "memory.events"), "oom_kill"),
            fs.read_int(os.path.join(f, "memory.max")),  # "max" reads as 0: none
        )

    def pids(self) -> set[int]:
        return fs.procs(self.folder)

    def remove(self, wait: float = 5.0) -> bool:
        return fs.remove([self.folder], wait)


class CgroupV2:
    """Confinement in the unified hierarchy mounted at ``mount``."""

    version = 2

    def __init__(self, mount: str, parent: str, scope: str, users_memory: int) -> None:
        self.mount = mount
        self.parent = parent
        self.scope = scope
        self.users_memory = users_memory
        available = set(fs.read(os.path.join(mount, "cgroup.controllers")).split())
        self.controllers = [c for c in NEEDED if c in available]
        self.report = self._report(available)
        self._parents_ready = False

    def _report(self, available: set[str]) -> Report:
        how = {Control.CPU: "cgroup v2 cpu.max", Control.MEMORY: "cgroup v2 memory.max "
               "(memory.swap.max 0)", Control.PIDS: "cgroup v2 pids.max"}  # fmt: skip
        controls = {
            control: Enforced(True, text)
            if control.value in available
            else Enforced(False, f"the cgroup v2 hierarchy at {self.mount} has no "
                          f"{control.value} controller (bound to a v1 hierarchy?)")
            for control, text in how.items()
        }  # fmt: skip
        controls[Control.DEVICES] = Enforced(
            False,
            "cgroup v2 fences devices with an eBPF program; run the hub under systemd "
            "(DevicePolicy=closed with DeviceAllow= for each GPU) or on cgroup v1",
        )
        return Report("cgroup v2", controls)

    def _ensure_parents(self) -> None:
        """The parent and the scope with the controllers on (``prune`` may have removed the
        scope); the users' CPU weight and memory cap once."""
        top = os.path.join(self.mount, self.parent)
        scope = os.path.join(top, self.scope)
        enable = " ".join(f"+{c}" for c in self.controllers)
        for folder in (self.mount, top, scope):
            if (fs.make(folder) or not self._parents_ready or folder == scope) and enable:
                fs.write(os.path.join(folder, "cgroup.subtree_control"), enable)
        if not self._parents_ready and "cpu" in self.controllers:
            fs.write_weight(os.path.join(top, "cpu.weight"), USERS_CPU_WEIGHT)
        if not self._parents_ready and self.users_memory > 0 and "memory" in self.controllers:
            fs.write(os.path.join(top, "memory.max"), str(self.users_memory))
        self._parents_ready = True

    def prune(self) -> None:
        """Remove the scope's folder when no cgroup is left in it."""
        with contextlib.suppress(OSError):
            os.rmdir(os.path.join(self.mount, self.parent, self.scope))

    def folder(self, name: str) -> str:
        return os.path.join(self.mount, self.parent, self.scope, fs.safe_name(name))

    def create(self, name: str, grant: Grant) -> V2Cgroup:
        try:
            self._ensure_parents()
        except OSError as err:
            raise ConfineError(f"cannot make the users' cgroups ({err})") from err
        group = V2Cgroup(name, self.folder(name))
        try:
            if not fs.make(group.folder):
                fs.remove([group.folder], 2.0)
                fs.make(group.folder)
            self._limit(group.folder, grant)
        except OSError as err:
            group.remove(2.0)
            raise ConfineError(f"cannot set up cgroup {name}: {err}") from err
        return group

    def _limit(self, folder: str, grant: Grant) -> None:
        if "cpu" in self.controllers:
            millis = grant.cpu_millicores
            quota = cfs_quota_us(millis)
            fs.write(os.path.join(folder, "cpu.max"), f"{quota or 'max'} {CFS_PERIOD_US}")
            weight = cpu_weight(grant.weight_millicores)
            fs.write(os.path.join(folder, "cpu.weight"), str(weight))
        if "memory" in self.controllers and grant.memory_bytes:
            fs.write(os.path.join(folder, "memory.max"), str(grant.memory_bytes))
            swap = os.path.join(folder, "memory.swap.max")
            if os.path.exists(swap):
                fs.write(swap, "0")
        if "pids" in self.controllers:
            fs.write(os.path.join(folder, "pids.max"), str(grant.pids))

    def open(self, name: str) -> V2Cgroup | None:
        folder = self.folder(name)
        return V2Cgroup(name, folder) if os.path.isdir(folder) else None

    def names(self) -> list[str]:
        return fs.children(os.path.join(self.mount, self.parent, self.scope))
