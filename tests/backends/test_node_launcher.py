"""The node's launcher under the local backend (docs/runtime.md "How workers are started"): it
forks every worker's launcher, a killed one is started again at the next start while the gangs
it had started are watched to their ends, and it ends with its backend while the workers run on
to be re-adopted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil


def node_pid(backend) -> int:
    pid = backend.node.pid
    assert pid is not None
    return pid


async def test_every_worker_is_forked_by_the_node_launcher(local_rig) -> None:
    backend = local_rig.backend()
    for name in ("one", "two"):
        await backend.start(local_rig.spec(name), ("local",))
    await local_rig.wait_until(
        lambda: all(len(local_rig.pids(n)) == 1 for n in ("one", "two")), "both workers up"
    )
    server = node_pid(backend)
    for name in ("one", "two"):
        [launcher] = backend.worker_pids(name)
        assert psutil.Process(launcher).ppid() == server
        assert os.getsid(launcher) == launcher  # a session of its own, as before
        [worker] = local_rig.pids(name)
        assert psutil.Process(worker).ppid() == launcher
    assert backend.node.started == 1  # one interpreter for every start
    for name in ("one", "two"):
        await backend.stop(name, 2, "test over")


async def test_a_killed_node_launcher_is_started_again_and_its_gangs_still_end(
    local_rig,
) -> None:
    backend = local_rig.backend()
    await backend.start(local_rig.spec("before"), ("local",))
    await local_rig.wait_until(lambda: len(local_rig.pids("before")) == 1, "the worker up")
    first = node_pid(backend)
    os.kill(first, signal.SIGKILL)
    await local_rig.wait_until(lambda: not local_rig.alive(first), "the node's launcher to die")
    [launcher] = backend.worker_pids("before")
    assert local_rig.alive(launcher)  # its launchers and their workers run on
    await backend.start(local_rig.spec("after"), ("local",))
    assert backend.node.started == 2 and node_pid(backend) != first
    await local_rig.wait_until(lambda: len(local_rig.pids("after")) == 1, "the new worker up")
    # the gang started by the dead one is watched like a re-adopted one: its exit file
    (local_rig.workdir("before") / "control-0").write_text("4")
    failed = await local_rig.events.wait("before", "failed")
    assert failed.exit_code == 4 and "exited with code 4" in failed.message
    (local_rig.workdir("after") / "control-0").write_text("0")
    await local_rig.events.wait("after", "finished")
    assert backend.devices_in_use() == {}


async def test_the_node_launcher_ends_with_its_backend_and_the_workers_are_readopted(
    local_rig,
) -> None:
    first = local_rig.backend()
    await first.start(local_rig.spec("kept"), ("local",))
    await local_rig.wait_until(lambda: len(local_rig.pids("kept")) == 1, "the worker up")
    server = node_pid(first)
    [launcher] = first.worker_pids("kept")
    await first.close()
    assert not local_rig.alive(server)  # no orphan: it ended when its stdin closed
    assert local_rig.alive(launcher) and local_rig.alive(local_rig.pids("kept")[0])
    second = local_rig.backend()
    await second.recover([local_rig.spec("kept")])
    assert second.worker_pids("kept") == [launcher]
    (local_rig.workdir("kept") / "control-0").write_text("0")
    await local_rig.events.wait("kept", "finished")
    assert second.node.pid is None  # nothing started yet: no interpreter for nothing


async def test_a_gangs_workers_are_answered_at_once_one_after_the_other(local_rig) -> None:
    """The node's launcher's answer for the second worker, taken in by the pump just before
    the wait, is seen at once: before, the start waited for the next message (the first
    launcher's end, or the 10 s deadline and a new node's launcher)."""
    backend = local_rig.backend()
    for n in range(4):
        job = f"pair-{n}"
        sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
        spec = local_rig.spec(job, command=sleeper, gpus=0)
        began = time.monotonic()
        await backend.start(spec, ("local", "local"))
        await local_rig.events.wait(job, "running")
        assert time.monotonic() - began < 3.0
        assert len(backend.worker_cgroups(job)) == 2
        await backend.stop(job, grace=1, reason="done")
        await local_rig.events.wait(job, "released")
    assert backend.node.started == 1


def test_a_fork_that_fails_is_answered_and_the_node_launcher_serves_on() -> None:
    """os.fork refused (EAGAIN, as at a pids limit): each launch is answered with why, and the
    node's launcher serves the next request instead of ending (every gang's launch through it
    would start another). Closing its stdin ends it with 0."""
    from extension.backends.local.node_launcher import LAUNCHER

    script = (
        "import errno, importlib.util, os, sys\n"
        f"spec = importlib.util.spec_from_file_location('w', {str(LAUNCHER)!r})\n"
        "w = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(w)\n"
        "def refuse():\n"
        "    raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN))\n"
        "os.fork = refuse\n"
        "sys.exit(w.main(['--serve']))\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-I", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        for request in (1, 2):
            body = json.dumps({"id": request, "spec": {}}).encode()
            proc.stdin.write(len(body).to_bytes(4, "big") + body)
            proc.stdin.flush()
            size = int.from_bytes(proc.stdout.read(4), "big")
            answer = json.loads(proc.stdout.read(size))
            assert answer == {"id": request, "error": "fork: Resource temporarily unavailable"}
        proc.stdin.close()
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
