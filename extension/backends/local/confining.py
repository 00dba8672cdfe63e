"""Each worker's cgroup: made with the worker's grant before its launcher starts, named in the
launch spec so the launcher's child enters it before dropping to the user, read for metering and
for the reason of a death by memory, removed (with whatever is left in it) when the gang ends.

A collaborator of ``LocalBackend``, passed in: ``WorkerCgroups(confinement, ...)``."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading

from extension.backends.base import JobSpec
from extension.confine import (
    DEFAULT_GPU_TEMPLATE,
    DEFAULT_PIDS,
    USER_OOM_SCORE_ADJ,
    Cgroup,
    Confinement,
    Report,
    Usage,
    check_template,
    detect,
    gpu_grant,
    killed_for_memory,
    users_memory_default,
)

log = logging.getLogger("wmla.backends.local")


class WorkerCgroups:
    """Makes, reads and removes the cgroups of the workers (scope ``jobs``).

    ``enforce`` false (the service is not root, or the machine has no cgroups): no cgroup is
    made and ``report`` says what is not enforced; a machine that has them but refuses one makes
    the start fail instead, so a worker never runs outside its grant by accident."""

    def __init__(
        self,
        confinement: Confinement,
        gpu_device_template: str = DEFAULT_GPU_TEMPLATE,
        pids_limit: int = DEFAULT_PIDS,
    ) -> None:
        self.confinement = confinement
        self.gpu_device_template = check_template(gpu_device_template)
        if int(pids_limit) < 1:
            raise ValueError(f"pids_limit must be 1 or more, got {pids_limit}")
        self.pids_limit = int(pids_limit)
        # cgroups made here and not yet removed: the scope is looked at (every hierarchy's
        # folder listed) for pruning only when this comes to 0, not at every gang's end
        self.live = 0
        # starts and ends run in threads of their own: a prune never removes the scope under
        # a cgroup being made
        self._lock = threading.Lock()

    @classmethod
    def detect(
        cls,
        scope: str,
        gpu_device_template: str = DEFAULT_GPU_TEMPLATE,
        pids_limit: int = DEFAULT_PIDS,
        users_memory_limit: int | None = None,
    ) -> WorkerCgroups:
        """The cgroups this machine offers (``confine.detect``); ``users_memory_limit`` None:
        the machine's memory less the platform's reserve, 0: no cap on users' work."""
        cap = users_memory_default() if users_memory_limit is None else int(users_memory_limit)
        return cls(detect(scope, users_memory=cap), gpu_device_template, pids_limit)

    @property
    def report(self) -> Report:
        return self.confinement.report

    @property
    def enforce(self) -> bool:
        return self.report.mechanism != "none"

    @staticmethod
    def name(job_id: str, launch: str, rank: int) -> str:
        return f"{job_id}-{launch}-w{rank}"

    def create(
        self, spec: JobSpec, launch: str, rank: int, devices: tuple[int, ...]
    ) -> Cgroup | None:
        """The worker's cgroup, made with its grant (None when nothing is enforced). Raises
        ConfineError when it cannot be made."""
        if not self.enforce:
            return None
        # as a kubelet: the CPU quota and the memory limit are the limits, the weight the
        # request (what the scheduler charged)
        ceiling = spec.ceiling
        grant = gpu_grant(
            int(ceiling.cpu),
            int(ceiling.memory),
            self.pids_limit,
            self.gpu_device_template,
            tuple(devices),
            cpu_weight_millicores=int(spec.per_worker.cpu),
        )
        with self._lock:
            group = self.confinement.create(self.name(spec.id, launch, rank), grant)
            self.live += 1
        return group

    @staticmethod
    def launch_spec(group: Cgroup | None) -> dict[str, object]:
        """What the launcher's child needs to enter the cgroup (worker_launcher.py)."""
        if group is None:
            return {}
        return {"cgroup_procs": list(group.enter_files()), "oom_score_adj": USER_OOM_SCORE_ADJ}

    def _open(self, name: str) -> Cgroup | None:
        return self.confinement.open(name) if name else None

    def usage(self, names: list[str]) -> Usage | None:
        """The workers' cgroups added up; None when none of them exists."""
        total, found = Usage(), False
        for group in filter(None, map(self._open, names)):
            total, found = total.plus(group.usage()), True
        return total if found else None

    def memory_reason(self, name: str, rank: int) -> str:
        """ "worker 0 was killed for using more than its 256 MiB ..." when the kernel killed a
        process of this worker's cgroup for memory; "" otherwise."""
        group = self._open(name)
        if group is None:
            return ""
        return killed_for_memory(
            group.usage(),
            f"worker {rank}",
            'ask for more with --memory (or "resources": {"memory": ...} in the job)',
            "ask for memory of its own with --memory",
        )

    def remove(self, names: list[str], wait: float = 5.0) -> None:
        """Kill what is left in the cgroups and remove them."""
        for name in names:
            group = self._open(name)
            if group is not None and not group.remove(wait):
                log.error("cgroup %s: processes still there after %.0fs; left in place", name, wait)
        with self._lock:
            self.live = max(0, self.live - sum(1 for name in names if name))
            if names and not self.live and not self.confinement.names():
                self.confinement.prune()

    def kill(self, names: list[str]) -> None:
        """SIGKILL every process still in the cgroups (the cgroup stays, for its figures)."""
        for group in filter(None, map(self._open, names)):
            for pid in group.pids():
                _kill(pid)

    def sweep(self, keep: set[str]) -> list[str]:
        """Remove the cgroups of gangs no record names (left by a crash); their names."""
        gone = [n for n in self.confinement.names() if n not in keep]
        self.remove(gone, wait=2.0)
        return gone


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)
