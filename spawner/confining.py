"""A notebook server's cgroup: made by the hub (root) with the server's grant (what the service
admitted its notebook job with: cpu and memory, its ``cpu_limit``/``mem_limit`` where set, a pids
limit, and no GPU node for a server without GPUs), entered by the server's process between fork
and exec before it drops to the user's account, removed with whatever is left in it when the
server stops. A server the kernel killed for memory says so in the hub's log."""

from __future__ import annotations

import logging

from extension.confine import (
    DEFAULT_PIDS,
    SERVERS_SCOPE,
    ConfineError,
    Confinement,
    Grant,
    Usage,
    detect,
    gpu_grant,
    killed_for_memory,
    users_memory_default,
)

from .mixin.record import JobGrant

_CONFINEMENT: Confinement | None = None


def confinement() -> Confinement:
    """The hub's one confinement of notebook servers (scope ``notebooks``), detected once."""
    global _CONFINEMENT
    if _CONFINEMENT is None:
        _CONFINEMENT = detect(SERVERS_SCOPE, users_memory=users_memory_default())
    return _CONFINEMENT


def server_grant(granted: JobGrant, gpus: int, template: str, pids: int = DEFAULT_PIDS) -> Grant:
    """The grant of a server from its notebook job (what the service answered), as
    Kubernetes holds a container: the CPU quota is the cpu limit and the CPU weight the cpu
    request (a server asking 100m under a 2-core ceiling weighs 100m when CPUs are busy, not 2
    cores), memory.max the memory limit; where the job set no limit, the request is both, as a
    job worker's grant is. The GPU nodes of the indexes the service holds for it
    (``devices``), none without."""
    resources = dict(granted.resources or {})
    limits = dict(granted.limits or {})
    cpu_request = _amount(resources.get("cpu"))
    cpu_limit = _amount(limits.get("cpu")) or cpu_request
    memory = _amount(limits.get("memory")) or _amount(resources.get("memory"))
    indexes = server_gpus(granted) if gpus else ()
    weight = cpu_request or cpu_limit
    return gpu_grant(cpu_limit, memory, pids, template, indexes, cpu_weight_millicores=weight)


def _amount(value: object) -> int:
    """The service answers in its units (millicores, bytes); anything else grants 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return 0
    return int(value)


def server_gpus(granted: JobGrant) -> tuple[int, ...]:
    """The GPU indexes held for the server (its one worker's), () when none are."""
    devices = granted.devices or []
    if not devices or not isinstance(devices[0], list):
        return ()
    return tuple(int(i) for i in devices[0])


class ServerCgroup:
    """The cgroup of one server, by name (kept in the spawner's state across hub restarts)."""

    def __init__(self, name: str, log: logging.Logger, where: str) -> None:
        self.name = name
        self.log = log
        self.where = where

    @classmethod
    def create(cls, name: str, grant: Grant, log: logging.Logger, where: str) -> ServerCgroup:
        confine = confinement()
        for missing in confine.report.missing():
            log.warning("%s: the server's %s is not enforced: %s", where, missing.value,
                        confine.report.controls[missing].how)  # fmt: skip
        if confine.report.mechanism == "none":
            return cls("", log, where)
        confine.create(name, grant)
        return cls(name, log, where)

    def enter_files(self) -> tuple[str, ...]:
        group = confinement().open(self.name) if self.name else None
        if self.name and group is None:
            raise ConfineError(f"cgroup {self.name} is gone before the server started")
        return group.enter_files() if group is not None else ()

    def usage(self) -> Usage | None:
        group = confinement().open(self.name) if self.name else None
        return group.usage() if group is not None else None

    def say_why_it_died(self) -> str:
        """Log (and return) the memory reason when the kernel killed the server for memory."""
        usage = self.usage()
        if usage is None or not usage.oom_kills:
            return ""
        message = killed_for_memory(
            usage,
            f"{self.where}: the notebook server",
            "pick a bigger profile or ask your admin for more memory",
            "ask your admin for memory of its own",
        )
        self.log.error(message)
        return message

    def remove(self) -> None:
        group = confinement().open(self.name) if self.name else None
        if group is not None and not group.remove(5.0):
            self.log.error("%s: cgroup %s still holds processes; left in place", self.where,
                           self.name)  # fmt: skip
