"""The local backend: a job's workers as OS processes on this machine, gang-launched for DDP.

One worker per entry of the placement (rank i on node ``placement[i]``; a node may be one of
the virtual nodes a layout such as ``4x8`` cuts the machine into). Every worker is started by
``local_launch.py`` as the leader of its own session, with the torch.distributed variables and
exactly the devices it was given, in the job's directory, its output in
``<workdir>/logs/worker-<rank>.log``. When the service runs as root, nothing of the job (its
directory, log, environment) is touched by a root process: the job directory is made and read by
a helper running as the user's account (``userfs.UserFiles``), and the launcher's child drops to
the account before it opens the log and executes the command (docs/security.md).

The gang lives and dies whole. A worker that exits non-zero makes the backend stop the others
(SIGTERM, ``failure_grace``, SIGKILL) and report ``failed`` with that exit code and the tail of
its log; all workers exiting 0 is ``finished``. ``stop`` sends SIGTERM to every worker's process
group, waits up to ``grace`` seconds for them to checkpoint and leave, kills what is left, then
reports ``released``. ``resize`` is a stop followed by a start at the new size: the training
runtime resumes from the checkpoint written on SIGTERM.

Workers outlive the service (own session, and nothing of theirs depends on the service's pipes).
For every gang the backend keeps ``<state_dir>/jobs/<job>/record.json`` with each worker's pid
and start time; a new backend over the same ``state_dir`` re-adopts them in ``recover`` (the
start time tells a recycled pid from the worker), and learns the exit codes of those that ended
meanwhile from the launcher's exit files. A job it cannot find is reported ``lost``.

Devices: node ``k`` owns device indexes ``[offset_k, offset_k + gpus_k)`` where ``offset_k`` is
the sum of the GPUs of the nodes before it, so virtual nodes on one machine never share a device.
A worker asking for ``g`` GPUs on a node takes the ``g`` lowest free indexes there, in rank order;
they are free again when the gang is gone. ``CUDA_VISIBLE_DEVICES`` holds exactly those (empty
when the worker has none), on real and virtual devices alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import json
import logging
import os
import random
import shlex
import shutil
import signal
import site
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote

import psutil

from extension.backends.accounts import (
    MIN_UID,
    Account,
    AccountError,
    account_python,
    create_account,
    find_account,
    unreachable,
)
from extension.backends.base import BackendEvent, Emit, JobSpec
from extension.backends.userfs import UserFileError, UserFiles, off_loop
from extension.scheduler import Node

log = logging.getLogger("wmla.backends.local")

LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "local_launch.py")
# The directory that holds the ``extension`` package: put on the workers' PYTHONPATH so that
# ``from extension import runtime`` works in a training script however the project is installed.
PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STOPPED_EXIT_CODE = 143  # what extension.runtime exits with after a SIGTERM checkpoint
# All the launcher (root, when the service is) starts with: nothing of the service's or the job's
# environment reaches a process that has not yet dropped to the user (local_launch.py).
LAUNCHER_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}

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


class StartError(Exception):
    """The gang could not be started; the message says why and what to do."""


@dataclass
class _Worker:
    rank: int
    node: str
    devices: tuple[int, ...]
    pid: int
    create_time: float
    exit_file: str
    proc: subprocess.Popen | None = None  # None: adopted from an earlier service
    exit_code: int | None = None
    exited_at: float | None = None
    done: bool = False
    vanished: bool = False  # gone without an exit status (SIGKILL, reboot)

    def record(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "node": self.node,
            "devices": list(self.devices),
            "pid": self.pid,
            "create_time": self.create_time,
            "exit_file": self.exit_file,
        }


@dataclass(frozen=True)
class _Ready:
    """What ``_prepare`` found out for one start: who runs it, and what exactly."""

    account: Account | None
    command: list[str]
    hub_paths: list[str]


@dataclass
class _Gang:
    job_id: str
    user: str
    workdir: str
    placement: tuple[str, ...]
    port: int
    launch: str
    started_at: float
    workers: list[_Worker]
    state: str = "running"  # running -> stopping -> done
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    outcome: str = ""  # the event kind that ended it

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


class LocalBackend:
    """Runs gangs of worker processes on this machine; see the module docstring.

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
    ) -> None:
        if not nodes:
            raise ValueError("LocalBackend needs at least one node; see capacity.detect_nodes()")
        names = [n.name for n in nodes]
        if len(set(names)) != len(names):
            raise ValueError(f"node names must be unique, got {names}")
        self._emit_fn = emit
        self._nodes = list(nodes)
        self.state_dir = os.path.abspath(os.fspath(state_dir))
        self.python = python
        self.account_python = account_python
        if "{username}" not in account_template:
            raise ValueError(
                f"account_template {account_template!r} must contain {{username}}, e.g. "
                "'{username}' or 'wmla-{username}' (the spawner's system_user_template)"
            )
        self.account_template = account_template
        self.run_as_user = run_as_user
        self.create_accounts = create_accounts
        self.min_uid = int(min_uid)
        if real_gpus is None:
            from extension.backends.capacity import physical_gpus

            real_gpus = physical_gpus() > 0
        self.real_gpus = real_gpus
        self.master_addr = master_addr
        self.poll_interval = poll_interval
        self.failure_grace = failure_grace
        self.kill_wait = kill_wait
        self.log_tail_lines = log_tail_lines
        self.env_keep = tuple(env_keep)
        self.extra_env = dict(extra_env or {})
        self.pythonpath = pythonpath
        self.stop_orphans = stop_orphans
        if not 1024 <= port_range[0] <= port_range[1] <= 65535:
            raise ValueError(f"port_range {port_range} must be (low, high) within 1024-65535")
        self.port_range = (int(port_range[0]), int(port_range[1]))

        self._devices: dict[str, list[int]] = {}
        offset = 0
        for node in self._nodes:
            count = int(node.capacity.gpu)
            self._devices[node.name] = list(range(offset, offset + count))
            offset += count
        self._used: dict[str, set[int]] = {n.name: set() for n in self._nodes}
        self._gangs: dict[str, _Gang] = {}
        self._workdirs: dict[str, tuple[str, str]] = {}  # job id -> (workdir, user)
        self._recent_ports: list[int] = []
        self._monitor: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self._closed = False
        _private_dirs(self._jobs_dir())

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
        when every worker had already exited 0). A job this backend does not run is left alone:
        it already ended and its event was emitted.
        """
        gang = self._gangs.get(job_id)
        if gang is None:
            log.info("stop of job %s: not running here (already ended)", job_id)
            return
        if gang.state != "running":
            await gang.ended.wait()
            return
        await self._end(gang, grace, reason, emit_released=True)

    async def recover(self, specs: Sequence[JobSpec]) -> None:
        """Re-adopt the workers of ``specs`` from the records in ``state_dir``.

        Per job: all workers alive (pid and start time match) -> adopted silently, watched from
        now on; some ended meanwhile -> the gang is judged as if watched all along (a non-zero
        exit fails it, all zero finishes it); a worker gone without an exit status, or no record
        at all -> ``lost``. Gangs on record that are not in ``specs`` are stopped when
        ``stop_orphans`` (their devices would be counted by nobody).
        """
        self._check_open()
        wanted = {spec.id: spec for spec in specs}
        on_disk = self._read_records()
        for spec in specs:
            self._workdirs.setdefault(spec.id, (spec.workdir, spec.user))
            if spec.id in self._gangs:
                continue
            rec = on_disk.pop(spec.id, None)
            if rec is None:
                self._emit(
                    spec.id,
                    "lost",
                    message=f"no record of job {spec.id}'s workers in {self.state_dir}: "
                    "they were started elsewhere or their record was removed",
                )
                continue
            self._adopt(rec)
        for job_id, rec in on_disk.items():
            if job_id in wanted or job_id in self._gangs:
                continue
            if self.stop_orphans:
                log.warning("job %s has workers on record but is not listed: stopping it", job_id)
                gang = self._adopt(rec, quiet=True)
                if gang is not None:
                    gang.state = "stopping"
                    await self._terminate(gang, self.failure_grace)
                    self._forget(gang, "orphan")
        self._ensure_monitor()

    def logs(self, job_id: str, worker: int | None = None, tail: int | None = None) -> str:
        """One worker's log, or every worker's with ``[worker-N]`` before each line.

        ``tail`` keeps the last lines of each worker's log. Read with the job's user's rights
        (``UserFiles``): a log the user replaced by a link or a FIFO is refused, not followed.
        Blocking (a helper process as root): call it from a thread on an event loop.
        """
        known = self._workdirs.get(job_id)
        if known is None:
            raise KeyError(f"job {job_id} has not run on this backend since the service started")
        if tail is not None and tail < 0:
            raise ValueError(f"tail must be 0 or more lines, got {tail}")
        workdir, user = known
        try:
            return self.files_for(user).read_logs(workdir, worker, tail)
        except AccountError as err:
            raise UserFileError(f"job {job_id}'s logs cannot be read: {err}") from None

    def account_for(self, user: str, home: str | None = None) -> Account | None:
        """The account ``user``'s workers run as (None: the service's own), created when
        missing as root (``create_accounts``, home = ``home``, the user's folder).

        Raises AccountError with what to do when there is none: as root a job never runs as
        root by default.
        """
        if self.run_as_user is False:
            return None
        name = self.account_template.format(username=user)
        found = find_account(name, self.min_uid)
        if os.geteuid() != 0:
            if self.run_as_user is None:
                return None
            if found is None:
                raise AccountError(
                    f"run_as_user is set but user {user!r} has no account {name!r} on this "
                    "machine; create it (useradd) or set run_as_user=False"
                )
            if found.uid != os.geteuid():
                raise AccountError(
                    f"running workers as {user!r} needs the service to run as root; start it "
                    "as root or set run_as_user=False"
                )
            return found
        if found is None:
            if not self.create_accounts or home is None:
                raise AccountError(
                    f"user {user!r} has no account {name!r} on this machine, and jobs never "
                    "run as root; create it (useradd) or set LocalBackend create_accounts=True"
                )
            found = create_account(name, home, self.min_uid)
            log.info("created account %s (uid %d) for hub user %s", name, found.uid, user)
        return found

    def files_for(self, user: str) -> UserFiles:
        """``user``'s files with their account's rights (in-process when it is ours)."""
        return UserFiles.of(self.account_for(user))

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

    # launching ---------------------------------------------------------------------------------
    def _prepare(self, spec: JobSpec) -> _Ready:
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
            command[0] = self.python
        if not spec.workdir or not os.path.isabs(spec.workdir):
            raise StartError(
                f"job {spec.id}: workdir must be an absolute path, got {spec.workdir!r}"
            )
        home = os.path.dirname(os.path.dirname(spec.workdir))  # <root>/<user>/jobs/<id>
        try:
            account = self.account_for(spec.user, home=home)
        except AccountError as err:
            raise StartError(f"job {spec.id}: {err}") from None
        hub_paths: list[str] = []
        if account is not None:
            command, hub_paths = self._python_for(account, command)
        files = UserFiles.of(account)
        script = command[1] if len(command) > 1 and os.path.isabs(command[1]) else ""
        try:
            files.prepare_job(spec.workdir)
            if account is not None:
                problem = files.check_runnable(command[0], script, os.environ.get("PATH", ""))
                if problem:
                    raise StartError(
                        f"job {spec.id}: user {account.name!r} {problem}; put it where the "
                        "account can reach it, point LocalBackend(python=...) at such an "
                        "interpreter, or set run_as_user=False"
                    )
        except UserFileError as err:
            raise StartError(f"job {spec.id}: {err}") from None
        return _Ready(account, command, hub_paths)

    def _launch(self, spec: JobSpec, placement: tuple[str, ...], ready: _Ready) -> _Gang:
        if not placement:
            raise StartError(f"job {spec.id}: the placement is empty; a gang needs 1+ workers")
        unknown = sorted({n for n in placement if n not in self._used})
        if unknown:
            raise StartError(
                f"job {spec.id}: unknown node(s) {', '.join(unknown)}; this backend has "
                f"{', '.join(self._used)}"
            )
        account, command, hub_paths = ready.account, ready.command, ready.hub_paths
        devices = self._allocate(spec, placement)
        launch = uuid.uuid4().hex[:12]
        workers: list[_Worker] = []
        try:
            logs_dir = os.path.join(spec.workdir, "logs")
            exit_dir = os.path.join(self._job_dir(spec.id), launch)
            _private_dirs(exit_dir)
            port = self._free_port()
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
                    nccl=self.real_gpus and gpus > 0,
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
                        exit_dir,
                        logs_dir,
                        account,
                        len(placement),
                    )
                )
        except BaseException as err:
            for worker in workers:
                _kill_group(worker.pid, signal.SIGKILL)
                if worker.proc is not None:
                    with contextlib.suppress(Exception):
                        worker.proc.wait(timeout=self.kill_wait)
            self._free(placement, devices)
            with contextlib.suppress(OSError):
                _rmtree(self._job_dir(spec.id))
            if isinstance(err, StartError):
                raise
            if isinstance(err, OSError):
                raise StartError(f"job {spec.id}: cannot start its workers: {err}") from err
            raise
        gang = _Gang(
            job_id=spec.id,
            user=spec.user,
            workdir=spec.workdir,
            placement=placement,
            port=port,
            launch=launch,
            started_at=time.time(),
            workers=workers,
        )
        self._gangs[spec.id] = gang
        self._write_record(gang)
        log.info("job %s: started %d worker(s) on %s", spec.id, len(workers), ",".join(placement))
        return gang

    def _spawn(
        self,
        spec: JobSpec,
        command: list[str],
        env: dict[str, str],
        rank: int,
        node: str,
        devices: tuple[int, ...],
        exit_dir: str,
        logs_dir: str,
        account: Account | None,
        world: int,
    ) -> _Worker:
        exit_file = os.path.join(exit_dir, f"worker-{rank}.exit")
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
        if account is not None:
            groups = os.getgrouplist(account.name, account.gid)
            launch.update(uid=account.uid, gid=account.gid, groups=groups)
        # The job's env travels in a file of the backend's private state directory, not in the
        # launcher's environment: nothing of it may reach a process still running as root.
        spec_file = os.path.join(exit_dir, f"worker-{rank}.json")
        fd = os.open(spec_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(launch, out)
        proc = subprocess.Popen(
            [sys.executable, "-I", LAUNCHER, spec_file],
            cwd="/",
            env=LAUNCHER_ENV,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # own session: survives the service, one group to signal
            close_fds=True,
        )
        try:
            create_time = psutil.Process(proc.pid).create_time()
        except psutil.Error:  # already gone: poll() will tell how
            create_time = 0.0
        return _Worker(rank, node, tuple(devices), proc.pid, create_time, exit_file, proc=proc)

    def _python_for(self, account: Account, command: list[str]) -> tuple[list[str], list[str]]:
        """The command with an interpreter the account can run, and the hub's package folders
        it then needs on PYTHONPATH. When the service's Python is out of the account's reach
        (a pyenv under /root, mode 0700), ``account_python`` ("auto": the system Python of the
        same major.minor, so compiled packages load unchanged) runs over the service's
        packages, as the spawner does for notebooks. Otherwise the command is unchanged and the
        helper's check_runnable (in ``_prepare``) says why it cannot run."""
        if command[0] != self.python or not self.account_python:
            return command, []
        if unreachable(self.python, account) is None:
            return command, []
        paths = [p for p in site.getsitepackages() if os.path.isdir(p)]
        python = account_python(account, self.account_python, paths)
        return ([python, *command[1:]], paths) if python else (command, [])

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
            if any(fnmatch.fnmatchcase(k, pattern) for pattern in self.env_keep)
        }
        if account is not None:
            env.update(HOME=account.home, USER=account.name, LOGNAME=account.name)
        env.update(self.extra_env)
        threads = max(1, int(spec.per_worker.cpu) // 1000)
        env.setdefault("OMP_NUM_THREADS", str(threads))  # torchrun's guard against oversubscription
        env["PYTHONUNBUFFERED"] = "1"  # logs readable while the job runs
        env.update({str(k): str(v) for k, v in spec.env.items()})
        if self.pythonpath or hub_paths:
            given = [p for p in env.get("PYTHONPATH", "").split(":") if p]
            parts = [p for p in (self.pythonpath, *hub_paths) if p] + given
            env["PYTHONPATH"] = ":".join(dict.fromkeys(parts))
        # Ours last: a job's env cannot move a worker to another rank or device.
        env.update(
            MASTER_ADDR=self.master_addr,
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

    def _allocate(self, spec: JobSpec, placement: tuple[str, ...]) -> list[tuple[int, ...]]:
        gpus = spec.per_worker.gpu
        if gpus != int(gpus) or gpus < 0:
            raise StartError(f"job {spec.id}: GPUs per worker must be a whole number, got {gpus}")
        taken: dict[str, set[int]] = {node: set() for node in placement}
        out: list[tuple[int, ...]] = []
        for rank, node in enumerate(placement):
            free = [d for d in self._devices[node] if d not in self._used[node] | taken[node]]
            if len(free) < int(gpus):
                raise StartError(
                    f"job {spec.id}: worker {rank} needs {int(gpus)} GPU(s) on {node} but only "
                    f"{len(free)} of {len(self._devices[node])} are free there"
                )
            mine = tuple(free[: int(gpus)])
            taken[node].update(mine)
            out.append(mine)
        for node, devices in taken.items():
            self._used[node].update(devices)
        return out

    def _free(self, placement: Iterable[str], devices: Iterable[Iterable[int]]) -> None:
        for node, mine in zip(placement, devices):
            self._used.get(node, set()).difference_update(mine)

    def _free_port(self) -> int:
        """A port nobody listens on, below the kernel's ephemeral range.

        Port 0 would hand out an ephemeral port, the very range where gloo's own connections and
        every client socket on the machine take theirs, so another job could grab it between
        this check and rank 0's bind. Ports in ``port_range`` (default 20000-32767) are only
        ever taken on purpose.
        """
        low, high = self.port_range
        rng = random.Random()
        for _ in range(200):
            port = rng.randint(low, high)
            if port in self._recent_ports:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((self.master_addr, port))
                except OSError:
                    continue
            self._recent_ports = [*self._recent_ports[-255:], port]
            return port
        raise StartError(f"no free TCP port in {low}-{high} for the rendezvous")

    # watching ----------------------------------------------------------------------------------
    def _ensure_monitor(self) -> None:
        if self._monitor is None or self._monitor.done():
            self._monitor = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while not self._closed:
            try:
                self._poll_once()
            except Exception:  # one bad poll must not stop the watching of every job
                log.exception("local backend: error while watching the workers")
            await asyncio.sleep(self.poll_interval)

    def _poll_once(self) -> None:
        for gang in list(self._gangs.values()):
            if gang.state != "running":
                continue
            self._refresh(gang)
            failed = [w for w in gang.workers if w.done and (w.exit_code != 0 or w.vanished)]
            if failed:
                gang.state = "stopping"  # now, so that no other poll or stop handles it twice
                self._spawn_task(self._fail(gang, _first_failure(failed)))
            elif all(w.done for w in gang.workers):
                self._finish(gang)

    def _spawn_task(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _refresh(self, gang: _Gang) -> None:
        for worker in gang.workers:
            if not worker.done:
                _check_worker(worker)

    def _finish(self, gang: _Gang) -> None:
        gang.state = "stopping"
        self._sweep(gang)
        ended = _ended_at(gang)  # before _forget removes the exit files
        self._forget(gang, "finished")
        self._emit(gang.job_id, "finished", placement=gang.placement, exit_code=0, at=ended)

    async def _fail(self, gang: _Gang, culprit: _Worker) -> None:
        gang.state = "stopping"
        await self._terminate(gang, self.failure_grace)
        message = await off_loop(self._failure_message, gang, culprit)
        ended = _ended_at(gang)  # before _forget removes the exit files
        self._forget(gang, "failed")
        self._emit(
            gang.job_id,
            "failed",
            placement=gang.placement,
            exit_code=culprit.exit_code,
            message=message,
            at=ended,
        )

    def _failure_message(self, gang: _Gang, worker: _Worker) -> str:
        if worker.vanished:
            why = f"worker {worker.rank} (pid {worker.pid}) disappeared without an exit status"
        elif worker.exit_code is not None and worker.exit_code < 0:
            name = _signal_name(-worker.exit_code)
            why = f"worker {worker.rank} was killed by {name} (exit code {worker.exit_code})"
        elif worker.exit_code == STOPPED_EXIT_CODE:
            why = (
                f"worker {worker.rank} exited with code {STOPPED_EXIT_CODE}: it got SIGTERM from "
                "outside the service (its checkpoint, if any, was saved)"
            )
        else:
            why = f"worker {worker.rank} exited with code {worker.exit_code}"
        error = _exit_record(worker.exit_file).get("error")
        if error:  # the launcher could not even start it (its log may not exist)
            why = f"{why}: it could not be started: {error}"
        path = os.path.join(gang.workdir, "logs", f"worker-{worker.rank}.log")
        try:  # with the user's rights: a log replaced by a link to a secret is refused
            text = self.files_for(gang.user).tail(path, self.log_tail_lines)[-8000:]
        except (UserFileError, AccountError) as err:
            return f"{why}; its log was not read: {err}"
        return f"{why}; last lines of {path}:\n{text}" if text else f"{why}; its log is empty"

    async def _end(self, gang: _Gang, grace: float, reason: str, emit_released: bool) -> str:
        """Stop a running gang; returns the outcome (``reason``, or ``finished``/``failed``)."""
        self._refresh(gang)
        if all(w.done for w in gang.workers):
            failed = [w for w in gang.workers if w.exit_code != 0 or w.vanished]
            if failed:  # it failed just before we came: that is what it did
                await self._fail(gang, _first_failure(failed))
                return "failed"
            self._finish(gang)
            return "finished"
        gang.state = "stopping"
        await self._terminate(gang, grace)
        self._forget(gang, reason)
        if emit_released:
            self._emit(gang.job_id, "released", placement=gang.placement, message=reason)
        return reason

    async def _terminate(self, gang: _Gang, grace: float) -> None:
        """SIGTERM to each live worker's group, up to ``grace`` seconds, then SIGKILL."""
        self._refresh(gang)
        for worker in gang.workers:
            if not worker.done:
                _kill_group(worker.pid, signal.SIGTERM)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, grace)
        while loop.time() < deadline and not all(w.done for w in gang.workers):
            await asyncio.sleep(min(0.05, self.poll_interval))
            self._refresh(gang)
        alive = [w for w in gang.workers if not w.done]
        for worker in alive:
            log.info("job %s: worker %d outlived its grace; SIGKILL", gang.job_id, worker.rank)
            _kill_group(worker.pid, signal.SIGKILL)
        deadline = loop.time() + self.kill_wait
        while loop.time() < deadline and not all(w.done for w in gang.workers):
            await asyncio.sleep(0.05)
            self._refresh(gang)
        for worker in gang.workers:
            if not worker.done:  # e.g. stuck in uninterruptible I/O: say so, do not hang
                log.error(
                    "job %s: worker %d (pid %d) still there %.0fs after SIGKILL; its devices "
                    "are released anyway",
                    gang.job_id,
                    worker.rank,
                    worker.pid,
                    self.kill_wait,
                )
        self._sweep(gang)

    def _sweep(self, gang: _Gang) -> None:
        """Kill what is left in the gang's process groups (a worker's own children).

        A process is taken for the gang's only when its group is one of the gang's and its
        environment names the job: a group id recycled by an unrelated process is left alone.
        """
        pgids = {w.pid for w in gang.workers}
        for proc in psutil.process_iter():
            try:
                if os.getpgid(proc.pid) not in pgids:
                    continue
                if proc.environ().get("WMLA_JOB_ID") == gang.job_id:
                    proc.kill()
            except (psutil.Error, ProcessLookupError, PermissionError):
                continue

    def _forget(self, gang: _Gang, outcome: str) -> None:
        gang.state = "done"
        gang.outcome = outcome
        self._free(gang.placement, [w.devices for w in gang.workers])
        if self._gangs.get(gang.job_id) is gang:
            del self._gangs[gang.job_id]
        with contextlib.suppress(OSError):
            _rmtree(self._job_dir(gang.job_id))
        gang.ended.set()

    # records and re-adoption -------------------------------------------------------------------
    def _jobs_dir(self) -> str:
        return os.path.join(self.state_dir, "jobs")

    def _job_dir(self, job_id: str) -> str:
        return os.path.join(self._jobs_dir(), quote(job_id, safe=""))

    def _write_record(self, gang: _Gang) -> None:
        path = os.path.join(self._job_dir(gang.job_id), "record.json")
        _private_dirs(os.path.dirname(path))
        tmp = f"{path}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(gang.record(), out, indent=1)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)

    def _read_records(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        try:
            entries = sorted(os.listdir(self._jobs_dir()))
        except FileNotFoundError:
            return out
        for entry in entries:
            path = os.path.join(self._jobs_dir(), entry, "record.json")
            try:
                with open(path, encoding="utf-8") as src:
                    rec = json.load(src)
                out[str(rec["job_id"])] = rec
            except FileNotFoundError:
                continue
            except (OSError, ValueError, KeyError, TypeError) as err:
                log.error("unreadable worker record %s (%s): left alone", path, err)
        return out

    def _adopt(self, rec: dict[str, Any], quiet: bool = False) -> _Gang | None:
        job_id = str(rec["job_id"])
        try:
            workers = [
                _Worker(
                    rank=int(w["rank"]),
                    node=str(w["node"]),
                    devices=tuple(int(d) for d in w["devices"]),
                    pid=int(w["pid"]),
                    create_time=float(w["create_time"]),
                    exit_file=str(w["exit_file"]),
                )
                for w in rec["workers"]
            ]
            gang = _Gang(
                job_id=job_id,
                user=str(rec.get("user", "")),
                workdir=str(rec["workdir"]),
                placement=tuple(str(n) for n in rec["placement"]),
                port=int(rec.get("port", 0)),
                launch=str(rec.get("launch", "")),
                started_at=float(rec.get("started_at", 0.0)),
                workers=workers,
            )
        except (KeyError, TypeError, ValueError) as err:
            if not quiet:
                self._emit(job_id, "lost", message=f"its worker record is unreadable ({err})")
            return None
        self._workdirs.setdefault(job_id, (gang.workdir, gang.user))
        for worker in workers:
            _check_worker(worker)
        vanished = [w for w in workers if w.vanished]
        for worker in workers:  # count their devices until we know better
            if worker.node in self._used:
                self._used[worker.node].update(worker.devices)
        self._gangs[job_id] = gang
        if vanished and not quiet:
            gang.state = "stopping"
            names = ", ".join(f"worker {w.rank} (pid {w.pid})" for w in vanished)
            message = (
                f"after the service restarted, {names} could not be found (ended without an exit "
                "status, or the pid now belongs to another process)"
            )

            async def lose() -> None:
                await self._terminate(gang, self.failure_grace)
                self._forget(gang, "lost")
                self._emit(job_id, "lost", placement=gang.placement, message=message)

            self._spawn_task(lose())
            return gang
        if not quiet:
            log.info("job %s: re-adopted %d worker(s)", job_id, len(workers))
        return gang

    # helpers -----------------------------------------------------------------------------------
    def _emit(
        self,
        job_id: str,
        kind: str,
        placement: tuple[str, ...] = (),
        exit_code: int | None = None,
        message: str = "",
        at: float | None = None,
    ) -> None:
        when = time.time() if at is None else at
        event = BackendEvent(job_id, kind, when, tuple(placement), exit_code, message)
        try:
            self._emit_fn(event)
        except Exception:  # the receiver's bug must not stop the backend
            log.exception("emit(%s) raised", event)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this LocalBackend is closed; make a new one over the state_dir")


def _check_worker(worker: _Worker) -> None:
    """Bring ``worker.done`` / ``exit_code`` up to date without blocking."""
    if worker.proc is not None:
        code = worker.proc.poll()
        if code is None:
            return
        recorded = _read_exit(worker.exit_file)
        worker.exit_code = recorded if recorded is not None else code
        worker.vanished = False
        worker.done = True
        worker.exited_at = time.time()
        return
    if _alive(worker.pid, worker.create_time):
        return
    recorded = _read_exit(worker.exit_file)
    worker.done = True
    worker.exited_at = time.time()
    if recorded is None:
        worker.vanished = True
        worker.exit_code = None
    else:
        worker.exit_code = recorded


def _alive(pid: int, create_time: float) -> bool:
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


def _exit_record(path: str) -> dict[str, Any]:
    """What the launcher wrote when its worker ended (in our state directory), or {}."""
    try:
        with open(path, encoding="utf-8") as src:
            record = json.load(src)
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _read_exit(path: str) -> int | None:
    try:
        return int(_exit_record(path)["code"])
    except (KeyError, TypeError, ValueError):
        return None


def _exit_time(worker: _Worker) -> float:
    try:
        return float(_exit_record(worker.exit_file)["at"])
    except (KeyError, TypeError, ValueError):
        return worker.exited_at or float("inf")


def _ended_at(gang: _Gang) -> float:
    """When the gang's last worker ended: the launchers' exit files say so, also for a gang
    that ended while no service watched it (re-adopted: metering charges until then, not until
    the restart noticed). A worker without a file ended when it was seen gone."""
    now = time.time()
    ends = [_exit_time(w) for w in gang.workers]
    last = max(ends, default=now)
    return now if last == float("inf") else min(last, now)


def _first_failure(failed: list[_Worker]) -> _Worker:
    """The worker whose failure came first (the others often fail because it did)."""
    return min(failed, key=lambda w: (w.vanished, _exit_time(w), w.rank))


def _kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _private_dirs(path: str) -> None:
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


def _rmtree(path: str) -> None:
    shutil.rmtree(path)
