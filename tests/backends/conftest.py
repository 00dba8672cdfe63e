"""Fixtures for the local backend's tests: real worker processes, killed whatever happens.

``local_rig`` makes LocalBackends over temporary directories and records their events; on
teardown it closes them and SIGKILLs every process whose environment points into the test's
temporary directories (launchers, workers and their children), found through /proc, so no test
leaves a worker behind even when it fails half-way.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from extension.backends.base import BackendEvent, JobSpec
from extension.backends.capacity import detect_nodes
from extension.backends.local import LocalBackend
from extension.backends.local.backend import jobs_scope
from extension.confine import detect
from extension.scheduler import Resources

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "pytorch_mnist" / "main.py"
WAIT = 180.0  # a guard against hangs, not a timing assertion

# A light worker (no torch): counts steps from its last checkpoint, reports each one, saves a
# checkpoint on SIGTERM through the runtime, and obeys control files the test writes:
# ``control-<rank>`` holding an exit code makes that rank exit with it.
COUNTER = textwrap.dedent(
    """
    import os, sys, time
    from extension import runtime

    me = runtime.info()
    here = runtime.job_dir()
    os.makedirs(os.path.join(here, "pids"), exist_ok=True)
    open(os.path.join(here, "pids", f"{me.rank}-{os.getpid()}"), "w").close()
    state = runtime.checkpoint.load() or {"step": 0}
    step = state["step"]
    runtime.report(step=step, phase="start", world=me.world_size)
    steps = int(os.environ.get("STEPS", "1000000"))
    control = os.path.join(here, f"control-{me.rank}")
    while step < steps:
        code = open(control).read().strip() if os.path.exists(control) else ""
        if code:  # empty while the test is still writing it
            sys.exit(int(code))
        step += 1
        time.sleep(0.05)
        runtime.report(step=step, world=me.world_size)
        if runtime.should_stop():
            runtime.exit_stopped({"step": step})
    runtime.checkpoint.save({"step": step})
    """
)


class Events:
    """What a backend emitted, with a way to wait for the next event of some kinds."""

    def __init__(self) -> None:
        self.all: list[BackendEvent] = []

    def __call__(self, event: BackendEvent) -> None:
        self.all.append(event)

    def of(self, job_id: str) -> list[BackendEvent]:
        return [e for e in self.all if e.job_id == job_id]

    def kinds(self, job_id: str, checkpoints: bool = False) -> list[str]:
        """The job's event kinds in order; its lifecycle only, unless ``checkpoints`` (the
        runtime reports one at every save, e.g. the COUNTER's on SIGTERM)."""
        return [e.kind for e in self.of(job_id) if checkpoints or e.kind != "checkpoint"]

    async def wait(self, job_id: str, *kinds: str, after: int = 0) -> BackendEvent:
        """The first event of ``kinds`` for ``job_id`` beyond the first ``after`` of its events."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT
        while loop.time() < deadline:
            for event in self.of(job_id)[after:]:
                if event.kind in kinds:
                    return event
            await asyncio.sleep(0.05)
        raise AssertionError(f"no {kinds} event for {job_id} in {WAIT}s; got {self.of(job_id)}")


async def wait_until(predicate: Callable[[], object], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while loop.time() < deadline:
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"gave up waiting for {what} after {WAIT}s")


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class Rig:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.state_dir = base / "state"
        self.events = Events()
        self.backends: list[LocalBackend] = []
        self.counter = base / "counter.py"
        self.counter.write_text(COUNTER)
        self.example = EXAMPLE

    def backend(self, layout: str = "1x4", events: Events | None = None, **options) -> LocalBackend:
        options.setdefault("poll_interval", 0.05)
        options.setdefault("real_gpus", False)
        # Other tests on this machine create accounts named like our users; run as the service
        # unless a test is about accounts.
        options.setdefault("run_as_user", False)
        nodes = detect_nodes(layout, cpu_millicores=4000, memory_bytes=8 * 2**30)
        backend = LocalBackend(events or self.events, nodes, self.state_dir, **options)
        self.backends.append(backend)
        return backend

    def spec(
        self,
        job_id: str,
        command: list[str] | None = None,
        gpus: int = 1,
        user: str = "alice",
        env: dict[str, str] | None = None,
        workdir: Path | None = None,
    ) -> JobSpec:
        return JobSpec(
            id=job_id,
            user=user,
            leaf=f"/p/{user}",
            per_worker=Resources(gpus, 1000, 2**30),
            command=command if command is not None else ["python", str(self.counter)],
            workdir=str(workdir or self.base / "users" / user / "jobs" / job_id),
            min_workers=1,
            max_workers=4,
            env=env or {},
        )

    alive = staticmethod(lambda pid: alive(pid))
    wait_until = staticmethod(lambda predicate, what: wait_until(predicate, what))

    def workdir(self, job_id: str, user: str = "alice") -> Path:
        return self.base / "users" / user / "jobs" / job_id

    def pids(self, job_id: str, user: str = "alice") -> list[int]:
        """Pids the counter workers wrote (``pids/<rank>-<pid>``)."""
        folder = self.workdir(job_id, user) / "pids"
        return [int(p.name.split("-")[1]) for p in folder.iterdir()] if folder.exists() else []


def kill_everything_under(*dirs: str) -> list[int]:
    """SIGKILL every process whose WMLA_JOB_DIR lies under one of ``dirs``."""
    killed = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            job_dir = proc.environ().get("WMLA_JOB_DIR", "")
        except (psutil.Error, OSError):
            continue
        if job_dir and any(job_dir.startswith(d) for d in dirs):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                proc.kill()
                killed.append(proc.pid)
            except psutil.Error:
                pass
    return killed


def remove_cgroups_of(*state_dirs: str | Path) -> None:
    """The cgroups left by the workers of the backends with these state directories (their
    ``jobs_scope``): a real service's next start removes what its records no longer name, but
    a test has no next service. Call it once their processes are killed."""
    if os.geteuid() != 0:
        return
    for state_dir in state_dirs:
        confinement = detect(jobs_scope(str(state_dir)))
        for name in confinement.names():
            group = confinement.open(name)
            if group is not None:
                group.remove(5.0)
        confinement.prune()


@pytest.fixture
async def local_rig(tmp_path: Path):
    rig = Rig(tmp_path)
    # A world-readable scratch dir too, for workers that run as another account.
    rig.shared = Path(tempfile.mkdtemp(prefix="wmla-local-", dir="/tmp"))
    rig.shared.chmod(0o755)
    try:
        yield rig
    finally:
        for backend in rig.backends:
            try:
                await backend.close()
            except Exception as err:  # teardown goes on: the processes must die
                print(f"close failed: {err}", file=sys.stderr)
        kill_everything_under(str(tmp_path), str(rig.shared))
        remove_cgroups_of(rig.state_dir)
        shutil.rmtree(rig.shared, ignore_errors=True)
