"""Starting a gang: every worker is started by a launcher (``worker_launcher.py``) that the
node's launcher forks (``node_launcher.py``), the leader of its own session, with the
torch.distributed variables and exactly the devices it was given, in the job's directory, its
output in ``<workdir>/logs/worker-<rank>.log``.

When the service runs as root, nothing of the job (its directory, log, environment) is touched
by a root process: the job directory is made and checked by a helper running as the user's
account (``userfs.UserFiles``), the job's env travels to the launcher through the node's
launcher's stdin (never a file), and the launcher's child drops to the account before it opens
the log and executes the command (docs/security.md)."""

from __future__ import annotations

import contextlib
import fnmatch
import logging
import os
import shlex
import signal
import site
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

from extension.backends.base import JobSpec
from extension.confine import ConfineError
from extension.userfs.accounts import Account, AccountError, account_python, unreachable
from extension.userfs.errors import UserFileError
from extension.userfs.files import UserFiles
from extension.userfs.pool import identity

from .allocation import DeviceTable, RendezvousPorts
from .confining import WorkerCgroups
from .errors import StartError
from .node_launcher import NodeLauncher
from .records import Gang, GangRecords, Worker, private_dirs, report_file
from .supervision import kill_group
from .users import UserAccounts

log = logging.getLogger("wmla.backends.local")

_HERE = os.path.dirname(os.path.abspath(__file__))  # extension/backends/local
# The directory that holds the ``extension`` package: put on the workers' PYTHONPATH so that
# ``from extension import runtime`` works in a training script however the project is installed.
PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(_HERE)))

DEFAULT_ENV_KEEP = (
    "PATH",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TZ",
    "TMPDIR",
    "HOME",
    "PYTHONPATH",
    "LD_LIBRARY_PATH",
    "CUDA_HOME",
    "NCCL_*",
    "GLOO_*",
)
_PYTHON_NAMES = ("python", "python3")
# seconds an account's interpreter (``Launcher._python_for``) is reused: a change of the
# folders' modes reaches the starts after it (the helper's check_runnable sees it at once)
PYTHON_FRESH = 10.0


@dataclass(frozen=True)
class LaunchOptions:
    """The ``LocalBackend`` options of the same names that shape a worker's start."""

    python: str
    account_python: str
    real_gpus: bool
    master_addr: str
    kill_wait: float
    env_keep: tuple[str, ...]
    extra_env: dict[str, str] = field(default_factory=dict)
    pythonpath: str | None = None


@dataclass(frozen=True)
class Reservation:
    """What a start holds before its workers exist: devices by rank, the port, the launch."""

    placement: tuple[str, ...]
    devices: list[tuple[int, ...]]
    port: int
    launch: str


@dataclass(frozen=True)
class Ready:
    """What ``Launcher.prepare`` found out for one start: who runs it, and what exactly."""

    account: Account | None
    command: list[str]
    hub_paths: list[str]


class Launcher:
    """Prepares a start as the user, and has ``node`` fork one launcher per worker: the
    devices, the port, the cgroups and the record of the gang are its collaborators'."""

    def __init__(
        self,
        options: LaunchOptions,
        accounts: UserAccounts,
        devices: DeviceTable,
        ports: RendezvousPorts,
        records: GangRecords,
        cgroups: WorkerCgroups,
        node: NodeLauncher,
    ) -> None:
        self.options = options
        self.accounts = accounts
        self.devices = devices
        self.ports = ports
        self.records = records
        self.cgroups = cgroups
        self.node = node
        # (account, python) -> (until when, the Python it runs instead or "", hub paths)
        self._pythons: dict[tuple, tuple[float, str, tuple[str, ...]]] = {}

    def prepare(self, spec: JobSpec) -> Ready:
        """Everything about a start that blocks or touches the user's folder, none of it as
        root: the account (created when missing), an interpreter it can run, the job directory
        made and the program checked by a helper that runs as the account. Runs in a thread."""
        command = list(spec.command)
        if not command or not all(isinstance(a, str) and a for a in command):
            raise StartError(
                f"job {spec.id}: the command must be a non-empty list of non-empty strings, "
                f"got {spec.command!r}"
            )
        if command[0] in _PYTHON_NAMES:
            command[0] = self.options.python
        if not spec.workdir or not os.path.isabs(spec.workdir):
            raise StartError(
                f"job {spec.id}: workdir must be an absolute path, got {spec.workdir!r}"
            )
        home = os.path.dirname(os.path.dirname(spec.workdir))  # <root>/<user>/jobs/<id>
        try:
            account = self.accounts.account_for(spec.user, home=home)
        except AccountError as err:
            raise StartError(f"job {spec.id}: {err}") from None
        hub_paths: list[str] = []
        if account is not None:
            command, hub_paths = self._python_for(account, command)
        self._prepare_files(spec, account, command)
        return Ready(account, command, hub_paths)

    def _prepare_files(self, spec: JobSpec, account: Account | None, command: list[str]) -> None:
        """The job directory made and the program checked as the account, one round trip to
        its helper (in-process when there is no account: nothing to check then)."""
        files = UserFiles.of(account)
        try:
            if account is None:
                files.prepare_job(spec.workdir)
                return
            script = command[1] if len(command) > 1 and os.path.isabs(command[1]) else ""
            path = os.environ.get("PATH", "")
            problem = files.prepare_start(spec.workdir, command[0], script, path)
        except UserFileError as err:
            storage = self.accounts.storage_reason(spec.user)  # its folder at its quota?
            raise StartError(
                f"job {spec.id}: {err}" + (f": {storage}" if storage else "")
            ) from None
        if problem:
            raise StartError(
                f"job {spec.id}: user {account.name!r} {problem}; put it where the account can "
                "reach it, point LocalBackend(python=...) at such an interpreter, or set "
                "run_as_user=False"
            )

    def reserve(self, spec: JobSpec, placement: tuple[str, ...]) -> Reservation:
        """The devices and the rendezvous port of a start (on the event loop: the tables are
        the loop's); ``release`` gives them back when the start fails."""
        self.devices.check_placement(spec, placement)
        devices = self.devices.allocate(spec, placement)
        try:
            port = self.ports.pick()
        except BaseException:
            self.devices.free(placement, devices)
            raise
        return Reservation(placement, devices, port, uuid.uuid4().hex[:12])

    def release(self, held: Reservation) -> None:
        self.devices.free(held.placement, held.devices)

    def launch(self, spec: JobSpec, held: Reservation, ready: Ready) -> Gang:
        """Start every worker, record the gang. Blocking (cgroups, the node's launcher, the
        record): run in a thread. Whatever fails half-way, nothing of the start is left behind
        but the reservation, for the caller to ``release`` (StartError says why)."""
        workers: list[Worker] = []
        try:
            private_dirs(self.records.job_dir(spec.id))
            self._spawn_workers(spec, held, ready, workers)
        except BaseException as err:
            self._undo_launch(spec, workers)
            if isinstance(err, StartError):
                raise
            if isinstance(err, ConfineError):
                raise StartError(
                    f"job {spec.id}: cannot hold its workers to their grant: {err}"
                ) from err
            if isinstance(err, OSError):
                raise StartError(f"job {spec.id}: cannot start its workers: {err}") from err
            raise
        gang = Gang(
            job_id=spec.id,
            user=spec.user,
            workdir=spec.workdir,
            placement=held.placement,
            port=held.port,
            launch=held.launch,
            started_at=time.time(),
            workers=workers,
        )
        self.records.write(gang)
        log.info(
            "job %s: started %d worker(s) on %s", spec.id, len(workers), ",".join(held.placement)
        )
        return gang

    def _spawn_workers(
        self, spec: JobSpec, held: Reservation, ready: Ready, workers: list[Worker]
    ) -> None:
        """Start one launcher per rank, each appended to ``workers`` as soon as it exists, so
        that a failure half-way lets ``launch`` kill exactly the ones already started."""
        account, command, hub_paths = ready.account, ready.command, ready.hub_paths
        placement, devices, port, launch = held.placement, held.devices, held.port, held.launch
        logs_dir = os.path.join(spec.workdir, "logs")
        per_node: dict[str, int] = {}
        for node in placement:
            per_node[node] = per_node.get(node, 0) + 1
        seen: dict[str, int] = {}
        gpus = int(spec.per_worker.gpu)
        for rank, node in enumerate(placement):
            local_rank = seen.get(node, 0)
            seen[node] = local_rank + 1
            env = self._worker_env(
                spec,
                account,
                rank=rank,
                world=len(placement),
                local_rank=local_rank,
                local_world=per_node[node],
                port=port,
                devices=devices[rank],
                node=node,
                nccl=self.options.real_gpus and gpus > 0,
                hub_paths=hub_paths,
            )
            workers.append(
                self._spawn(
                    spec,
                    command,
                    env,
                    rank,
                    node,
                    devices[rank],
                    launch,
                    logs_dir,
                    account,
                    len(placement),
                )
            )

    def _undo_launch(self, spec: JobSpec, workers: list[Worker]) -> None:
        """A start that failed half-way leaves nothing behind: the workers already started are
        killed (and waited for), their cgroups and the job's state directory removed."""
        for worker in workers:
            kill_group(worker.pid, signal.SIGKILL)
            if worker.proc is not None:
                with contextlib.suppress(Exception):
                    worker.proc.wait(timeout=self.options.kill_wait)
        self.cgroups.remove([w.cgroup for w in workers])
        self.records.remove(spec.id)

    def _spawn(
        self,
        spec: JobSpec,
        command: list[str],
        env: dict[str, str],
        rank: int,
        node: str,
        devices: tuple[int, ...],
        launch_id: str,
        logs_dir: str,
        account: Account | None,
        world: int,
    ) -> Worker:
        # in the job's own folder of the state directory, named by the launch (one folder, so
        # the gang's end removes it in a few calls)
        exit_file = os.path.join(self.records.job_dir(spec.id), f"{launch_id}-worker-{rank}.exit")
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        launch = {
            "argv": command,
            "env": env,
            "cwd": spec.workdir,
            "log": os.path.join(logs_dir, f"worker-{rank}.log"),
            "header": f"==== wmla: job {spec.id} worker {rank} of {world} on {node}, devices "
            f"[{','.join(map(str, devices))}], {stamp}: {shlex.join(command)[:300]}\n",
            "exit_file": exit_file,
        }
        if rank == 0:  # the launcher relays rank 0's checkpoint reports (worker_launcher.py)
            launch["report_file"] = report_file(exit_file)
        if account is not None:  # its groups as the helpers get them (read again when they change)
            groups = list(identity(account)[3])
            launch.update(uid=account.uid, gid=account.gid, groups=groups)
        tmp = self.accounts.job_tmp(spec.user, spec.id)
        if tmp is not None:  # bound on /tmp and /var/tmp in the worker's own mount namespace
            launch["tmp"] = tmp
        if account is not None and spec.ceiling.memory > 0:  # and /dev/shm its own, its size
            launch["shm_bytes"] = int(spec.ceiling.memory)
        group = self.cgroups.create(spec, launch_id, rank, tuple(devices))
        cgroup = group.name if group is not None else ""
        try:
            launch.update(self.cgroups.launch_spec(group))
            # The job's env travels over the node's launcher's stdin, not in any process's
            # environment: nothing of it may reach a process still running as root.
            proc = self.node.launch(launch)
        except BaseException:
            self.cgroups.remove([cgroup])
            raise
        return Worker(
            rank,
            node,
            tuple(devices),
            proc.pid,
            proc.create_time,
            exit_file,
            proc=proc,
            cgroup=cgroup,
        )

    def _python_for(self, account: Account, command: list[str]) -> tuple[list[str], list[str]]:
        """The command with an interpreter the account can run, and the hub's package folders
        it then needs on PYTHONPATH. When the service's Python is out of the account's reach
        (a pyenv under /root, mode 0700), ``account_python`` ("auto": the system Python of the
        same major.minor, so compiled packages load unchanged) runs over the service's
        packages, as the spawner does for notebooks. Otherwise the command is unchanged and the
        helper's check_runnable (in ``prepare``) says why it cannot run."""
        if command[0] != self.options.python or not self.options.account_python:
            return command, []
        key, now = (account, self.options.python), time.monotonic()
        known = self._pythons.get(key)
        if known is None or known[0] < now:  # a dozen stats and group reads: kept a while
            known = (now + PYTHON_FRESH, *self._reachable_python(account))
            if len(self._pythons) > 4096:  # accounts come and go: a bound, not an LRU
                self._pythons.clear()
            self._pythons[key] = known
        _, python, paths = known
        return ([python, *command[1:]], list(paths)) if python else (command, [])

    def _reachable_python(self, account: Account) -> tuple[str, tuple[str, ...]]:
        """("", ()) when the account can run the service's Python; else the one it can run
        instead and the hub's package folders (("", ()) too when there is none)."""
        if unreachable(self.options.python, account) is None:
            return "", ()
        paths = [p for p in site.getsitepackages() if os.path.isdir(p)]
        python = account_python(account, self.options.account_python, paths)
        return (python, tuple(paths)) if python else ("", ())

    def _worker_env(
        self,
        spec: JobSpec,
        account: Account | None,
        *,
        rank: int,
        world: int,
        local_rank: int,
        local_world: int,
        port: int,
        devices: tuple[int, ...],
        node: str,
        nccl: bool,
        hub_paths: Sequence[str] = (),
    ) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if any(fnmatch.fnmatchcase(k, pattern) for pattern in self.options.env_keep)
        }
        if account is not None:
            env.update(HOME=account.home, USER=account.name, LOGNAME=account.name)
        env.update(self.options.extra_env)
        threads = max(1, int(spec.per_worker.cpu) // 1000)
        env.setdefault("OMP_NUM_THREADS", str(threads))  # torchrun's guard against oversubscription
        env["PYTHONUNBUFFERED"] = "1"  # logs readable while the job runs
        env.update({str(k): str(v) for k, v in spec.env.items()})
        pythonpath = self.options.pythonpath
        if pythonpath or hub_paths:
            given = [p for p in env.get("PYTHONPATH", "").split(":") if p]
            parts = [p for p in (pythonpath, *hub_paths) if p] + given
            env["PYTHONPATH"] = ":".join(dict.fromkeys(parts))
        # Ours last: a job's env cannot move a worker to another rank or device.
        env.update(
            MASTER_ADDR=self.options.master_addr,
            MASTER_PORT=str(port),
            RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_RANK=str(local_rank),
            LOCAL_WORLD_SIZE=str(local_world),
            CUDA_VISIBLE_DEVICES=",".join(map(str, devices)),
            WMLA_JOB_ID=spec.id,
            WMLA_JOB_DIR=spec.workdir,
            WMLA_USER=spec.user,
            WMLA_BACKEND="nccl" if nccl else "gloo",
            WMLA_NODE=node,
        )
        return env
