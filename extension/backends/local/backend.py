"""``LocalBackend``: its options, the collaborators it builds from them, and the Backend
protocol's calls, each delegated to the collaborator that owns it."""

from __future__ import annotations

import hashlib
import logging
import os
import sys
from collections.abc import Collection, Iterable, Mapping, Sequence

from extension.backends.base import Emit, EventKind, JobSpec
from extension.confine import (
    DEFAULT_GPU_TEMPLATE,
    DEFAULT_PIDS,
    SERVERS_SCOPE,
    Report,
    Usage,
    detect,
)
from extension.scheduler import Node
from extension.userfs.accounts import MIN_UID, Account
from extension.userfs.files import UserFiles, off_loop

from .allocation import DeviceTable, RendezvousPorts
from .confining import WorkerCgroups
from .errors import StartError
from .events import Emitter
from .holds import DeviceHolds, HoldRecords
from .launching import DEFAULT_ENV_KEEP, PROJECT_ROOT, Launcher, LaunchOptions
from .node_launcher import NodeLauncher
from .offload import Offload
from .records import GangRecords, GangState
from .recovery import Recovery
from .supervision import SupervisionOptions, Supervisor
from .users import JobOwner, UserAccounts

log = logging.getLogger("wmla.backends.local")


class LocalBackend:
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
    - ``adopt_accounts``: which existing accounts jobs may run as, the spawner's option of the
      same name: "ours" (only one that looks made by ``create_accounts``' useradd) or "any";
      default "ours" when ``create_accounts`` is on and the template is not "{username}".
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

    Its collaborators, built here and handed what they need: ``DeviceTable`` and
    ``RendezvousPorts`` (allocation.py), ``GangRecords`` (records.py), ``UserAccounts``
    (users.py), ``WorkerCgroups`` (confining.py), ``DeviceHolds`` (holds.py), ``Launcher``
    (launching.py) over the ``NodeLauncher`` (node_launcher.py), ``Supervisor``
    (supervision.py), ``Recovery`` (recovery.py), and the ``Emitter`` (events.py) the last two
    report through.
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
        adopt_accounts: str | None = None,
        gpu_device_template: str = DEFAULT_GPU_TEMPLATE,
        pids_limit: int = DEFAULT_PIDS,
        users_memory_limit: int | None = None,
        cgroups: WorkerCgroups | None = None,
    ) -> None:
        self._nodes = _checked_nodes(nodes)
        self.state_dir = os.path.abspath(os.fspath(state_dir))
        self.accounts = UserAccounts(
            run_as_user, create_accounts, account_template, min_uid, adopt_accounts
        )
        launch = LaunchOptions(
            python=python,
            account_python=account_python,
            real_gpus=_has_gpus() if real_gpus is None else real_gpus,
            master_addr=master_addr,
            kill_wait=kill_wait,
            env_keep=tuple(env_keep),
            extra_env=dict(extra_env or {}),
            pythonpath=pythonpath,
        )
        ports = RendezvousPorts(master_addr, port_range)
        self.cgroups = cgroups or self._cgroups(gpu_device_template, pids_limit, users_memory_limit)
        self.servers = detect(SERVERS_SCOPE)  # the notebook servers' cgroups (see _cgroups)
        self.devices = DeviceTable(self._nodes)
        self.records = GangRecords(self.state_dir)
        self.holds = DeviceHolds(HoldRecords(self.state_dir), self.devices)
        # the node's launcher: one interpreter, started once, that forks each worker's launcher
        self.node = NodeLauncher()
        # the blocking part of starts (cgroups, launchers, records) and of ends (their removal)
        self.starts, self.ends = Offload("wmla-start", 2), Offload("wmla-end", 1)
        self.launcher = Launcher(
            launch, self.accounts, self.devices, ports, self.records, self.cgroups, self.node
        )
        pace = SupervisionOptions(poll_interval, failure_grace, kill_wait, log_tail_lines)
        self._watch(Emitter(emit), pace, stop_orphans)

    def _cgroups(
        self, gpu_device_template: str, pids_limit: int, users_memory_limit: int | None
    ) -> WorkerCgroups:
        """The job workers' cgroups under this backend's scope. The spawner's notebook servers
        are each in a cgroup named by its notebook job's id (spawner/confining.py): read by the
        backend (``self.servers``), never made, so metering sees what they use."""
        return WorkerCgroups.detect(
            jobs_scope(self.state_dir), gpu_device_template, pids_limit, users_memory_limit
        )

    def _watch(self, emit: Emitter, pace: SupervisionOptions, stop_orphans: bool) -> None:
        """The supervisor and the recovery over the collaborators built before them."""
        self._emit = emit
        self.supervisor = Supervisor(
            pace, emit, self.devices, self.records, self.accounts, self.cgroups, self.ends
        )
        self.recovery = Recovery(
            emit,
            self.records,
            self.supervisor,
            self.devices,
            self.accounts,
            self.cgroups,
            stop_orphans,
        )

    @property
    def run_as_user(self) -> bool | None:
        """The option of that name (the service warns when it is False, as root)."""
        return self.accounts.run_as_user

    # protocol --------------------------------------------------------------------------------
    def capacity(self) -> list[Node]:
        return list(self._nodes)

    async def start(self, spec: JobSpec, placement: tuple[str, ...]) -> None:
        """Start the gang; ``running`` is emitted once every worker process exists.

        A job that cannot start (bad command, no such account, devices taken) is reported
        ``failed`` with the reason, and nothing of it is left behind.
        """
        self._check_open()
        old = self.supervisor.gang(spec.id)
        if old is not None and old.state is GangState.RUNNING:
            raise ValueError(
                f"job {spec.id} is already running on this backend; stop or resize it instead"
            )
        if old is not None:  # its stop is still under way: start once the old gang is gone
            await old.ended.wait()
        await self._launch(spec, tuple(placement), EventKind.RUNNING)

    async def resize(self, spec: JobSpec, placement: tuple[str, ...], grace: float) -> None:
        """Stop the gang (SIGTERM, ``grace``, SIGKILL), start it at ``len(placement)`` workers.

        The workers resume from the checkpoint they wrote on SIGTERM. Returns after ``resized``
        (or ``finished``, when the gang ended by itself before it was stopped, or ``failed``
        when the new gang cannot start).
        """
        self._check_open()
        gang = self.supervisor.gang(spec.id)
        if gang is not None and gang.state is not GangState.RUNNING:
            await gang.ended.wait()  # a failure or stop under way decides the job's fate
            return
        if gang is not None:
            ended = await self.supervisor.end(gang, grace, reason=None)
            if ended is not EventKind.RELEASED:
                return
        else:
            log.warning("resize of job %s that is not running here: starting it", spec.id)
        await self._launch(spec, tuple(placement), EventKind.RESIZED)

    async def _launch(self, spec: JobSpec, placement: tuple[str, ...], kind: EventKind) -> None:
        """Prepare (off the loop) and launch the gang, watch it, report ``kind``; a start that
        cannot happen is reported ``failed`` instead."""
        self.accounts.note(spec.id, JobOwner(spec.workdir, spec.user))
        try:
            ready = await off_loop(self.launcher.prepare, spec)
            held = self.launcher.reserve(spec, placement)
            try:
                gang = await self.starts.run(self.launcher.launch, spec, held, ready)
            except Exception:
                self.launcher.release(held)
                raise
        except StartError as err:
            self._emit(spec.id, EventKind.FAILED, placement=placement, message=str(err))
            return
        self.supervisor.add(gang)
        self._emit(spec.id, kind, placement=gang.placement)
        self.supervisor.ensure_monitor()

    async def stop(self, job_id: str, grace: float, reason: str) -> None:
        """SIGTERM every worker's process group, wait up to ``grace``, SIGKILL the rest.

        Returns once the workers are gone and ``released`` was emitted (``finished`` instead
        when every worker had already exited 0, or exits 0 within the grace: it finished its
        work by itself). A job this backend does not run is left alone: it already ended and
        its event was emitted.
        """
        gang = self.supervisor.gang(job_id)
        if gang is None:
            log.info("stop of job %s: not running here (already ended)", job_id)
            return
        if gang.state is not GangState.RUNNING:
            await gang.ended.wait()
            return
        await self.supervisor.end(gang, grace, reason)

    async def recover(self, specs: Sequence[JobSpec]) -> None:
        """Re-adopt the workers of ``specs`` from the records in ``state_dir``
        (``Recovery.recover`` says how each job is judged)."""
        self._check_open()
        await self.recovery.recover(specs, self.state_dir)

    def ends_stored(self, job_ids: Collection[str]) -> None:
        """The service stored these jobs' ends (``KeepsEnds``): their records, kept with the
        outcome since their gangs ended, are removed (``Supervisor.stored``)."""
        self.supervisor.stored(job_ids)

    def logs(self, job_id: str, worker: int | None = None, tail: int | None = None) -> str:
        """One worker's log, or every worker's (``UserAccounts.logs``). Blocking."""
        return self.accounts.logs(job_id, worker, tail)

    async def close(self) -> None:
        """Stop watching. Running workers keep running (and their launchers, which the node's
        launcher forked, though it ends here); their records stay for ``recover``."""
        await self.supervisor.close()
        self.node.close()
        self.starts.close()
        self.ends.close()

    # accounts (LocalAccounts) ------------------------------------------------------------------
    def account_for(self, user: str, home: str | None = None) -> Account | None:
        """The account ``user``'s workers run as (``UserAccounts.account_for``)."""
        return self.accounts.account_for(user, home)

    def files_for(self, user: str) -> UserFiles:
        """``user``'s files with their account's rights."""
        return self.accounts.files_for(user)

    # devices for notebook servers (HoldsDevices) ----------------------------------------------
    def hold_devices(self, spec: JobSpec, placement: tuple[str, ...]) -> list[tuple[int, ...]]:
        """Take devices for a notebook server the spawner runs (``DeviceHolds.hold``)."""
        return self.holds.hold(spec, placement)

    def release_devices(self, job_id: str) -> None:
        self.holds.release(job_id)

    def held_devices(self, job_id: str) -> list[tuple[int, ...]] | None:
        return self.holds.held(job_id)

    def keep_holds(self, job_ids: set[str]) -> None:
        self.holds.keep(job_ids)

    # inspection (tests, the service's status page) ---------------------------------------------
    def devices_in_use(self) -> dict[str, list[int]]:
        return self.devices.in_use()

    def gang_devices(self, job_id: str) -> list[tuple[str, tuple[int, ...]]]:
        """(node, device indexes) of each worker of a gang this backend runs, by rank."""
        gang = self.supervisor.gang(job_id)
        return [(w.node, w.devices) for w in gang.workers] if gang else []

    def worker_pids(self, job_id: str) -> list[int]:
        """The launchers of a gang, or the processes of a notebook job's server."""
        gang = self.supervisor.gang(job_id)
        if gang:
            return [w.pid for w in gang.workers]
        server = self.servers.open(job_id)
        return sorted(server.pids()) if server is not None else []

    @property
    def enforcement(self) -> Report:
        """What holds the workers to their grants on this machine (GET /instance)."""
        return self.cgroups.report

    def job_usage(self, job_id: str) -> Usage | None:
        """What the kernel counted for the gang's workers (their cgroups), or a notebook job's
        server (its cgroup); None when there is none."""
        gang = self.supervisor.gang(job_id)
        if gang:
            return self.cgroups.usage(gang.cgroups)
        server = self.servers.open(job_id)
        return server.usage() if server is not None else None

    def worker_cgroups(self, job_id: str) -> list[str]:
        gang = self.supervisor.gang(job_id)
        return gang.cgroups if gang else []

    def _check_open(self) -> None:
        if self.supervisor.closed:
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


def _has_gpus() -> bool:
    from extension.backends.capacity import physical_gpus

    return physical_gpus() > 0
