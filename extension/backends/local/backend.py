"""``LocalBackend``: its options, the state its parts share, and the protocol's calls. The parts
are mixins, one module each, named in the class."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import sys
import time
from collections.abc import Iterable, Mapping, Sequence

from extension.backends.accounts import MIN_UID
from extension.backends.base import BackendEvent, Emit, JobSpec
from extension.backends.userfs import off_loop
from extension.confine import (
    DEFAULT_GPU_TEMPLATE,
    DEFAULT_PIDS,
    Report,
    Usage,
)
from extension.scheduler import Node

from .allocation import _Allocation, _device_table
from .confining import WorkerCgroups
from .holds import Hold, HoldRecords
from .launching import DEFAULT_ENV_KEEP, PROJECT_ROOT, StartError, _Launching
from .records import _Gang, _private_dirs, _Records
from .recovery import _Recovery
from .supervision import _Supervision
from .users import _Users

log = logging.getLogger("wmla.backends.local")


class LocalBackend(_Launching, _Allocation, _Supervision, _Recovery, _Records, _Users):
    """Runs gangs of worker processes on this machine; see the package docstring.

    Options (keyword arguments):
    - ``python``: the interpreter that replaces a command's leading ``python``/``python3``
      (default: the service's own).
    - ``run_as_user``: run workers as the Unix account named like the job's user. None (default)
      does it whenever the service runs as root: a user without an account gets one
      (``create_accounts``) or the job is refused, never run as root; True requires it (also
      when not root: then the account must be the service's own); False never (every job runs
      as the service's account: as root that is root, so only for a machine with one tenant;
      the service warns loudly).
    - ``create_accounts``: as root, ``useradd`` a missing account the way the spawner does
      (home = the user's folder, no login shell); False refuses such jobs instead.
    - ``min_uid``: accounts below this uid (root, daemon, ...) are never run as (default 1000).
    - ``real_gpus``: whether device indexes are NVIDIA GPUs (torch backend nccl); None detects.
    - ``master_addr``: rendezvous address of rank 0 (default 127.0.0.1).
    - ``poll_interval``: seconds between checks of the workers (default 0.2).
    - ``failure_grace``: seconds the rest of a failed gang gets between SIGTERM and SIGKILL.
    - ``kill_wait``: seconds to wait for killed workers to disappear before giving up.
    - ``log_tail_lines``: lines of the failing worker's log in a ``failed`` message.
    - ``env_keep``: names (``fnmatch`` patterns) of the service's variables workers inherit;
      nothing else of the service's environment (its hub token!) reaches user code.
    - ``extra_env``: variables every worker gets (a job's own ``env`` wins over them).
    - ``pythonpath``: prepended to the workers' PYTHONPATH so ``extension.runtime`` imports.
    - ``port_range``: where rendezvous ports (MASTER_PORT) are picked, below the ephemeral range.
    - ``account_template``: the Unix account of a hub user, ``{username}`` replaced (default
      "{username}"); it must match the spawner's ``system_user_template``, so that a user's
      notebook and jobs run as one account and can both use the user's folder.
    - ``account_python``: when workers run as an account that cannot reach ``python`` (a pyenv
      under /root), the interpreter they use instead over the service's packages; "auto" (the
      default) is the system Python of the same major.minor; "" never falls back.
    - ``stop_orphans``: in ``recover``, stop gangs on record that the service did not list
      (nothing would account for their devices otherwise).
    - ``gpu_device_template``: the device node of GPU index ``i`` (default ``/dev/nvidia{index}``);
      a worker's cgroup may open its own GPUs' nodes and the NVIDIA control nodes beside them,
      no other GPU node.
    - ``pids_limit``: processes and threads per worker (default 1024).
    - ``users_memory_limit``: bytes all users' work may hold together (the parent cgroup's
      limit), so the OOM killer never has to choose the hub, the proxy or the service; None
      (default) is the machine's memory less 1 GiB (and at least a tenth), 0 no cap.
    - ``cgroups``: the workers' cgroups (``confining.WorkerCgroups``); default: detected from
      this machine (cgroup v1 or v2; none when the service is not root, said in the report).

    Its parts: ``_Launching`` (launching.py: prepare as the user, start the workers),
    ``_Allocation`` (allocation.py: devices and rendezvous ports), ``_Supervision``
    (supervision.py: watch the workers, end a gang), ``_Recovery`` (recovery.py: re-adopt after
    a restart), ``_Records`` (records.py: the records and exit files in ``state_dir``),
    ``_Users`` (users.py: accounts, logs read with the user's rights).
    """

    def __init__(
        self,
        emit: Emit,
        nodes: Sequence[Node],
        state_dir: str | os.PathLike[str],
        *,
        python: str = sys.executable,
        run_as_user: bool | None = None,
        real_gpus: bool | None = None,
        master_addr: str = "127.0.0.1",
        poll_interval: float = 0.2,
        failure_grace: float = 5.0,
        kill_wait: float = 10.0,
        log_tail_lines: int = 40,
        env_keep: Iterable[str] = DEFAULT_ENV_KEEP,
        extra_env: Mapping[str, str] | None = None,
        pythonpath: str | None = PROJECT_ROOT,
        stop_orphans: bool = True,
        port_range: tuple[int, int] = (20000, 32767),
        account_python: str = "auto",
        account_template: str = "{username}",
        create_accounts: bool = True,
        min_uid: int = MIN_UID,
        gpu_device_template: str = DEFAULT_GPU_TEMPLATE,
        pids_limit: int = DEFAULT_PIDS,
        users_memory_limit: int | None = None,
        cgroups: WorkerCgroups | None = None,
    ) -> None:
        self._nodes = _checked_nodes(nodes)
        self._emit_fn = emit
        self.state_dir = os.path.abspath(os.fspath(state_dir))
        self.python = python
        self.account_python = account_python
        self.account_template = _checked_template(account_template)
        self.run_as_user = run_as_user
        self.create_accounts = create_accounts
        self.min_uid = int(min_uid)
        self.real_gpus = _has_gpus() if real_gpus is None else real_gpus
        self.master_addr = master_addr
        self.poll_interval = poll_interval
        self.failure_grace = failure_grace
        self.kill_wait = kill_wait
        self.log_tail_lines = log_tail_lines
        self.env_keep = tuple(env_keep)
        self.extra_env = dict(extra_env or {})
        self.pythonpath = pythonpath
        self.stop_orphans = stop_orphans
        self.port_range = _checked_port_range(port_range)
        self.cgroups = cgroups or WorkerCgroups.detect(
            jobs_scope(self.state_dir), gpu_device_template, pids_limit, users_memory_limit
        )
        self._devices = _device_table(self._nodes)
        self._start_empty()
        _private_dirs(self._jobs_dir())
        self.hold_records = HoldRecords(self.state_dir)
        self._take_held()

    def _take_held(self) -> None:
        """The devices held for notebook servers before this backend began: still taken."""
        for hold in self.hold_records.read():
            self._holds[hold.job_id] = hold
            for node, devices in zip(hold.placement, hold.devices):
                self._used.get(node, set()).update(devices)

    def _start_empty(self) -> None:
        """The state the parts share, as it is before anything runs: no device or port taken, no
        gang, no monitor. Apart from the options so that one screen shows all of it."""
        self._used: dict[str, set[int]] = {n.name: set() for n in self._nodes}
        self._gangs: dict[str, _Gang] = {}
        self._holds: dict[str, Hold] = {}  # devices of notebook servers (holds.py)
        self._workdirs: dict[str, tuple[str, str]] = {}  # job id -> (workdir, user)
        self._recent_ports: list[int] = []
        self._monitor: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self._closed = False

    # protocol --------------------------------------------------------------------------------
    def capacity(self) -> list[Node]:
        return list(self._nodes)

    async def start(self, spec: JobSpec, placement: tuple[str, ...]) -> None:
        """Start the gang; ``running`` is emitted once every worker process exists.

        A job that cannot start (bad command, no such account, devices taken) is reported
        ``failed`` with the reason, and nothing of it is left behind.
        """
        self._check_open()
        old = self._gangs.get(spec.id)
        if old is not None and old.state == "running":
            raise ValueError(
                f"job {spec.id} is already running on this backend; stop or resize it instead"
            )
        if old is not None:  # its stop is still under way: start once the old gang is gone
            await old.ended.wait()
        self._workdirs[spec.id] = (spec.workdir, spec.user)
        try:
            ready = await off_loop(self._prepare, spec)
            gang = self._launch(spec, tuple(placement), ready)
        except StartError as err:
            self._emit(spec.id, "failed", placement=tuple(placement), message=str(err))
            return
        self._emit(spec.id, "running", placement=gang.placement)
        self._ensure_monitor()

    async def resize(self, spec: JobSpec, placement: tuple[str, ...], grace: float) -> None:
        """Stop the gang (SIGTERM, ``grace``, SIGKILL), start it at ``len(placement)`` workers.

        The workers resume from the checkpoint they wrote on SIGTERM. Returns after ``resized``
        (or ``finished``, when the gang ended by itself before it was stopped, or ``failed``
        when the new gang cannot start).
        """
        self._check_open()
        gang = self._gangs.get(spec.id)
        if gang is not None and gang.state != "running":
            await gang.ended.wait()  # a failure or stop under way decides the job's fate
            return
        if gang is not None:
            outcome = await self._end(gang, grace, "resized", emit_released=False)
            if outcome != "resized":
                return
        else:
            log.warning("resize of job %s that is not running here: starting it", spec.id)
        self._workdirs[spec.id] = (spec.workdir, spec.user)
        try:
            ready = await off_loop(self._prepare, spec)
            new = self._launch(spec, tuple(placement), ready)
        except StartError as err:
            self._emit(spec.id, "failed", placement=tuple(placement), message=str(err))
            return
        self._emit(spec.id, "resized", placement=new.placement)
        self._ensure_monitor()

    async def stop(self, job_id: str, grace: float, reason: str) -> None:
        """SIGTERM every worker's process group, wait up to ``grace``, SIGKILL the rest.

        Returns once the workers are gone and ``released`` was emitted (``finished`` instead
        when every worker had already exited 0, or exits 0 within the grace: it finished its
        work by itself). A job this backend does not run is left alone: it already ended and
        its event was emitted.
        """
        gang = self._gangs.get(job_id)
        if gang is None:
            log.info("stop of job %s: not running here (already ended)", job_id)
            return
        if gang.state != "running":
            await gang.ended.wait()
            return
        await self._end(gang, grace, reason, emit_released=True)

    async def close(self) -> None:
        """Stop watching. Running workers keep running; their records stay for ``recover``."""
        self._closed = True
        tasks = [t for t in [self._monitor, *self._tasks] if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._monitor = None
        # Dropping the Popen objects hands still-running children to subprocess's own reaping.
        self._gangs.clear()

    # devices for notebook servers (HoldsDevices) ----------------------------------------------
    def hold_devices(self, spec: JobSpec, placement: tuple[str, ...]) -> list[tuple[int, ...]]:
        """Take devices for a notebook server the spawner runs: as a gang's, the lowest free
        indexes of each node, so no job is given the same GPU; kept on record."""
        held = self._holds.get(spec.id)
        if held is not None:
            return list(held.devices)
        self._check_placement(spec, tuple(placement))
        devices = self._allocate(spec, tuple(placement))
        hold = Hold(spec.id, tuple(placement), tuple(tuple(d) for d in devices))
        self._holds[spec.id] = hold
        self.hold_records.write(hold)
        return list(hold.devices)

    def release_devices(self, job_id: str) -> None:
        hold = self._holds.pop(job_id, None)
        if hold is not None:
            self._free(hold.placement, hold.devices)
            self.hold_records.remove(job_id)

    def held_devices(self, job_id: str) -> list[tuple[int, ...]] | None:
        hold = self._holds.get(job_id)
        return list(hold.devices) if hold is not None else None

    def keep_holds(self, job_ids: set[str]) -> None:
        for job_id in [j for j in self._holds if j not in job_ids]:
            log.warning("device hold of job %s, which is no longer running: released", job_id)
            self.release_devices(job_id)

    # inspection (tests, the service's status page) ---------------------------------------------
    def devices_in_use(self) -> dict[str, list[int]]:
        return {node: sorted(used) for node, used in self._used.items() if used}

    def gang_devices(self, job_id: str) -> list[tuple[str, tuple[int, ...]]]:
        """(node, device indexes) of each worker of a gang this backend runs, by rank."""
        gang = self._gangs.get(job_id)
        return [(w.node, w.devices) for w in gang.workers] if gang else []

    def worker_pids(self, job_id: str) -> list[int]:
        gang = self._gangs.get(job_id)
        return [w.pid for w in gang.workers] if gang else []

    @property
    def enforcement(self) -> Report:
        """What holds the workers to their grants on this machine (GET /instance)."""
        return self.cgroups.report

    def job_usage(self, job_id: str) -> Usage | None:
        """What the kernel counted for the gang's workers (their cgroups), or None."""
        gang = self._gangs.get(job_id)
        return self.cgroups.usage([w.cgroup for w in gang.workers]) if gang else None

    def worker_cgroups(self, job_id: str) -> list[str]:
        gang = self._gangs.get(job_id)
        return [w.cgroup for w in gang.workers] if gang else []

    # helpers -----------------------------------------------------------------------------------
    def _emit(
        self,
        job_id: str,
        kind: str,
        placement: tuple[str, ...] = (),
        exit_code: int | None = None,
        message: str = "",
        at: float | None = None,
        progress: float | None = None,
    ) -> None:
        when = time.time() if at is None else at
        event = BackendEvent(job_id, kind, when, tuple(placement), exit_code, message, progress)
        try:
            self._emit_fn(event)
        except Exception:  # the receiver's bug must not stop the backend
            log.exception("emit(%s) raised", event)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this LocalBackend is closed; make a new one over the state_dir")


def jobs_scope(state_dir: str) -> str:
    """The cgroup folder of one backend's workers: one per state directory, so that two
    services on a machine (or two tests) never sweep each other's."""
    digest = hashlib.sha256(os.path.abspath(state_dir).encode()).hexdigest()[:10]
    return f"jobs-{digest}"


def _checked_nodes(nodes: Sequence[Node]) -> list[Node]:
    """The nodes, refused when there are none or two share a name (a placement names them)."""
    if not nodes:
        raise ValueError("LocalBackend needs at least one node; see capacity.detect_nodes()")
    names = [n.name for n in nodes]
    if len(set(names)) != len(names):
        raise ValueError(f"node names must be unique, got {names}")
    return list(nodes)


def _checked_template(account_template: str) -> str:
    if "{username}" not in account_template:
        raise ValueError(
            f"account_template {account_template!r} must contain {{username}}, e.g. "
            "'{username}' or 'wmla-{username}' (the spawner's system_user_template)"
        )
    return account_template


def _has_gpus() -> bool:
    from extension.backends.capacity import physical_gpus

    return physical_gpus() > 0


def _checked_port_range(port_range: tuple[int, int]) -> tuple[int, int]:
    """The rendezvous port range, refused unless it is (low, high) of unprivileged ports."""
    if not 1024 <= port_range[0] <= port_range[1] <= 65535:
        raise ValueError(f"port_range {port_range} must be (low, high) within 1024-65535")
    return (int(port_range[0]), int(port_range[1]))
