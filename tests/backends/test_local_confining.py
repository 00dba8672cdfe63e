"""The local backend's workers in cgroups of their own (issue 27), at the backend's level: the
cgroups go with the gang whatever ends it (a preemption, a resize, a failure), a restarted
backend removes the ones no record names, and a notebook server's devices are held like a
gang's. The kernel's side of it is tests/security/test_enforcement.py and tests/confine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from extension.confine import SERVERS_SCOPE, Grant, detect, enter

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/sys/fs/cgroup/pids").is_dir(),
    reason="cgroups are made as root (cgroup v1 here)",
)
SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def ran(launcher: int) -> bool:
    """The launcher's child is the worker's command already (not the launcher's fork)."""
    kids = psutil.Process(launcher).children()
    return bool(kids) and "time.sleep(60)" in " ".join(kids[0].cmdline())


def existing(backend, names: list[str]) -> list[str]:
    return [n for n in names if backend.cgroups.confinement.open(n) is not None]


async def test_a_preemption_and_a_resize_take_the_cgroups_with_the_gang(local_rig) -> None:
    backend = local_rig.backend()
    spec = local_rig.spec("victim", command=SLEEPER, gpus=0)
    await backend.start(spec, ("local", "local"))
    await local_rig.events.wait("victim", "running")
    first = backend.worker_cgroups("victim")
    assert len(first) == 2 and existing(backend, first) == first
    launchers = backend.worker_pids("victim")
    # executed, not merely forked: the child joins its cgroup between the fork and the exec
    await local_rig.wait_until(lambda: all(map(ran, launchers)), "the workers started")
    for launcher, name in zip(launchers, first):
        (worker,) = psutil.Process(launcher).children()  # the launcher itself stays outside
        assert f"/{name}" in Path(f"/proc/{worker.pid}/cgroup").read_text()
        assert f"/{name}" not in Path(f"/proc/{launcher}/cgroup").read_text()
    await backend.resize(spec, ("local",), grace=1)
    await local_rig.events.wait("victim", "resized")
    second = backend.worker_cgroups("victim")
    assert len(second) == 1 and not existing(backend, first)
    await backend.stop("victim", grace=1, reason="preempted for job-9")
    await local_rig.events.wait("victim", "released")
    assert not existing(backend, second)


async def test_a_restarted_backend_removes_the_cgroups_no_record_names(local_rig) -> None:
    backend = local_rig.backend()
    leftover = backend.cgroups.confinement.create("job-gone-abc-w0", Grant(100, 0))
    proc = subprocess.Popen(["sleep", "60"])
    try:
        for path in leftover.enter_files():
            Path(path).write_text(str(proc.pid))
        again = local_rig.backend()
        await again.recover([])
        assert proc.wait(10) == -9  # what was left in it went with it
        assert again.cgroups.confinement.open("job-gone-abc-w0") is None
    finally:
        if proc.poll() is None:
            proc.kill()


async def test_a_notebook_holds_its_gpu_like_a_gang_and_across_a_restart(local_rig) -> None:
    backend = local_rig.backend()
    notebook = local_rig.spec("nb", gpus=1)
    assert backend.hold_devices(notebook, ("local",)) == [(0,)]
    assert backend.hold_devices(notebook, ("local",)) == [(0,)]  # the same while held
    again = local_rig.backend()  # a restarted service: the hold is on record
    assert again.held_devices("nb") == [(0,)]
    job = local_rig.spec("job", command=SLEEPER, gpus=2)
    await again.start(job, ("local",))
    await local_rig.events.wait("job", "running")
    assert again.gang_devices("job") == [("local", (1, 2))]  # never the notebook's
    again.keep_holds(set())  # the notebook's job ended while no service ran
    assert again.held_devices("nb") is None
    assert again.devices_in_use() == {"local": [1, 2]}
    await again.stop("job", grace=1, reason="done")


async def test_a_notebook_servers_cgroup_is_metered_as_its_job(local_rig) -> None:
    """The spawner names a server's cgroup by its notebook job's id (spawner/confining.py): the
    backend's worker_pids and job_usage find it, so metering samples the server as a job."""
    backend = local_rig.backend()
    servers = detect(SERVERS_SCOPE)
    job_id = f"job-nb{os.getpid()}"
    group = servers.create(job_id, Grant(500, 256 << 20))
    server = subprocess.Popen(["sleep", "60"], preexec_fn=lambda: enter(group.enter_files()))
    try:
        assert backend.worker_pids(job_id) == [server.pid]
        usage = backend.job_usage(job_id)
        assert usage is not None and usage.memory_limit_bytes == 256 << 20
        assert backend.worker_pids("job-none") == [] and backend.job_usage("job-none") is None
    finally:
        server.kill()
        server.wait(10)
        group.remove(5.0)
