"""The local backend with light real workers (no torch): environment, gang failure, stop and
resume, re-adoption after a service restart, running as the user's account."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from extension.backends.base import Backend
from extension.runtime import STOPPED_EXIT_CODE, metrics

ENV_DUMP = textwrap.dedent(
    """
    import json, os
    keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "CUDA_VISIBLE_DEVICES",
            "MASTER_ADDR", "MASTER_PORT", "WMLA_JOB_ID", "WMLA_JOB_DIR", "WMLA_USER",
            "WMLA_BACKEND", "WMLA_NODE", "OMP_NUM_THREADS", "JOB_OWN", "JUPYTERHUB_API_TOKEN"]
    out = {k: os.environ.get(k) for k in keys}
    out["cwd"] = os.getcwd()
    out["uid"] = os.getuid()
    out["session_of_launcher"] = os.getsid(0) == os.getppid() == os.getpgid(0)
    with open(f"env-{os.environ['RANK']}.json", "w") as f:
        json.dump(out, f)
    """
)


def test_it_implements_the_protocol(local_rig) -> None:
    assert isinstance(local_rig.backend(), Backend)


async def test_each_worker_gets_its_rank_world_and_exactly_its_devices(
    local_rig, monkeypatch
) -> None:
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "service-secret")
    backend = local_rig.backend("2x2")
    dump = local_rig.base / "env_dump.py"
    dump.write_text(ENV_DUMP)
    first = local_rig.spec("env-a", ["python", str(dump)], env={"JOB_OWN": "x", "RANK": "9"})
    second = local_rig.spec("env-b", ["python", str(dump)])

    await backend.start(first, ("local-1", "local-1", "local-2"))
    await backend.start(second, ("local-2",))  # the last free device, on the second node
    assert backend.devices_in_use() == {"local-1": [0, 1], "local-2": [2, 3]}
    await local_rig.events.wait("env-a", "finished")
    await local_rig.events.wait("env-b", "finished")

    assert local_rig.events.kinds("env-a") == ["running", "finished"]
    assert local_rig.events.of("env-a")[0].placement == ("local-1", "local-1", "local-2")
    workdir = local_rig.workdir("env-a")
    got = [json.loads((workdir / f"env-{r}.json").read_text()) for r in range(3)]
    expected = [  # (RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, CUDA_VISIBLE_DEVICES, WMLA_NODE)
        ("0", "0", "2", "0", "local-1"),
        ("1", "1", "2", "1", "local-1"),
        ("2", "0", "1", "2", "local-2"),
    ]
    for env, (rank, local_rank, local_world, devices, node) in zip(got, expected):
        assert (
            env["RANK"],
            env["LOCAL_RANK"],
            env["LOCAL_WORLD_SIZE"],
            env["CUDA_VISIBLE_DEVICES"],
            env["WMLA_NODE"],
        ) == (rank, local_rank, local_world, devices, node)
        assert env["WORLD_SIZE"] == "3"
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert env["MASTER_PORT"] == got[0]["MASTER_PORT"] and int(env["MASTER_PORT"]) > 0
        assert env["WMLA_JOB_ID"] == "env-a" and env["WMLA_USER"] == "alice"
        assert env["WMLA_JOB_DIR"] == str(workdir) and env["cwd"] == str(workdir)
        assert env["WMLA_BACKEND"] == "gloo"  # virtual devices: no nccl
        assert env["OMP_NUM_THREADS"] == "1"  # one core per worker asked
        assert env["JOB_OWN"] == "x"  # the job's env arrives...
        assert env["JUPYTERHUB_API_TOKEN"] is None  # ...the service's secrets do not
        assert env["session_of_launcher"]  # own session: outlives the service, one group
    b_env = json.loads((local_rig.workdir("env-b") / "env-0.json").read_text())
    assert b_env["CUDA_VISIBLE_DEVICES"] == "3" and b_env["WORLD_SIZE"] == "1"
    assert b_env["MASTER_PORT"] != got[0]["MASTER_PORT"]
    assert backend.devices_in_use() == {}  # all freed when the gangs ended
    for rank in range(3):
        assert (workdir / "logs" / f"worker-{rank}.log").exists()


@pytest.mark.parametrize(
    "placement, gpus, command, expected",
    [
        pytest.param(("nowhere",), 1, None, "unknown node(s) nowhere", id="unknown-node"),
        pytest.param(("local",) * 5, 1, None, "only 0 of 4 are free", id="too-many-gpus"),
        pytest.param(("local",), 1, [], "non-empty list", id="empty-command"),
        pytest.param((), 1, None, "placement is empty", id="empty-placement"),
    ],
)
async def test_a_job_that_cannot_start_fails_with_the_reason_and_leaves_nothing(
    local_rig, placement, gpus, command, expected
) -> None:
    backend = local_rig.backend("1x4")
    spec = local_rig.spec("bad", command, gpus=gpus)
    await backend.start(spec, placement)
    event = await local_rig.events.wait("bad", "failed")
    assert expected in event.message
    assert local_rig.events.kinds("bad") == ["failed"]
    assert backend.devices_in_use() == {}
    assert backend.worker_pids("bad") == []
    assert not (local_rig.state_dir / "jobs" / "bad").exists()


async def test_a_missing_program_fails_the_gang_with_code_127(local_rig) -> None:
    backend = local_rig.backend()
    await backend.start(local_rig.spec("nope", ["/no/such/program"]), ("local", "local"))
    event = await local_rig.events.wait("nope", "failed")
    assert event.exit_code == 127
    assert "cannot start '/no/such/program'" in event.message


FAIL_ONE = textwrap.dedent(
    """
    import os, subprocess, sys, time
    rank = int(os.environ["RANK"])
    os.makedirs("pids", exist_ok=True)
    os.makedirs("ready", exist_ok=True)
    open(f"pids/{rank}-{os.getpid()}", "w").close()
    if rank == 1:
        # a child of the worker that shrugs off SIGTERM: only the sweep of the group ends it
        child = subprocess.Popen([sys.executable, "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
        open(f"pids/9-{child.pid}", "w").close()
        while len(os.listdir("ready")) < 2:
            time.sleep(0.02)
        print("about to fail: the answer is not 42", flush=True)
        sys.exit(7)
    open(f"ready/{rank}", "w").close()
    time.sleep(600)
    """
)


async def test_one_worker_failing_fails_the_whole_gang_and_frees_it(local_rig) -> None:
    backend = local_rig.backend(failure_grace=1.0)
    script = local_rig.base / "fail_one.py"
    script.write_text(FAIL_ONE)
    await backend.start(local_rig.spec("gang", ["python", str(script)]), ("local",) * 3)
    launchers = backend.worker_pids("gang")
    assert len(launchers) == 3
    event = await local_rig.events.wait("gang", "failed")

    assert event.exit_code == 7
    assert event.message.startswith("worker 1 exited with code 7")
    assert "about to fail: the answer is not 42" in event.message
    folder = local_rig.workdir("gang") / "pids"
    pids = [int(p.name.split("-")[1]) for p in folder.iterdir()]
    assert len(pids) == 4  # three workers and rank 1's stubborn child
    for pid in [*pids, *launchers]:
        assert not local_rig.alive(pid), f"pid {pid} survived the gang's failure"
    assert backend.devices_in_use() == {}
    assert local_rig.events.kinds("gang") == ["running", "failed"]
    assert "[worker-1] about to fail" in backend.logs("gang")
    assert backend.logs("gang", worker=1, tail=1) == "about to fail: the answer is not 42\n"


async def test_stop_checkpoints_and_a_restart_resumes_where_it_was(local_rig) -> None:
    backend = local_rig.backend()
    spec = local_rig.spec("resume", env={"STEPS": "1000000"})
    metrics_file = local_rig.workdir("resume") / "metrics.jsonl"
    await backend.start(spec, ("local", "local"))
    await local_rig.wait_until(
        lambda: len(metrics.read(str(metrics_file))) >= 6, "six reported steps"
    )
    pids = local_rig.pids("resume")

    await backend.stop("resume", grace=30, reason="preempted for job-9")
    released = await local_rig.events.wait("resume", "released")
    assert released.message == "preempted for job-9"
    assert released.placement == ("local", "local")
    for pid in [*pids, *backend.worker_pids("resume")]:
        assert not local_rig.alive(pid)
    assert backend.devices_in_use() == {}
    saved = metrics.read(str(metrics_file))[-1]["step"]
    from extension.runtime import checkpoint

    os.environ["WMLA_JOB_DIR"] = str(local_rig.workdir("resume"))
    try:
        assert checkpoint.load() == {"step": saved}  # written on SIGTERM, the last step reported
    finally:
        del os.environ["WMLA_JOB_DIR"]

    spec2 = local_rig.spec("resume", env={"STEPS": str(saved + 5)})
    await backend.start(spec2, ("local", "local"))
    await local_rig.events.wait("resume", "finished")
    lines = metrics.read(str(metrics_file))
    restart = [line for line in lines if line.get("phase") == "start"]
    assert [line["step"] for line in restart] == [0, saved]  # the step counter continued
    steps = [line["step"] for line in lines if "phase" not in line]
    assert steps == list(range(1, saved + 6))
    assert local_rig.events.kinds("resume") == ["running", "released", "running", "finished"]
    # each save was reported: the one on SIGTERM before the stop ended, the last before the end
    assert local_rig.events.kinds("resume", checkpoints=True) == [
        "running", "checkpoint", "released", "running", "checkpoint", "finished",
    ]  # fmt: skip


STUBBORN = textwrap.dedent(
    """
    import os, signal, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    open(f"up-{os.environ['RANK']}", "w").close()
    time.sleep(600)
    """
)


async def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace(local_rig) -> None:
    backend = local_rig.backend()
    script = local_rig.base / "stubborn.py"
    script.write_text(STUBBORN)
    await backend.start(local_rig.spec("stubborn", ["python", str(script)]), ("local",) * 2)
    workdir = local_rig.workdir("stubborn")
    await local_rig.wait_until(
        lambda: (workdir / "up-0").exists() and (workdir / "up-1").exists(), "up"
    )
    launchers = backend.worker_pids("stubborn")
    workers = [c.pid for p in launchers for c in psutil.Process(p).children()]
    assert len(workers) == 2
    await backend.stop("stubborn", grace=0.5, reason="cancelled")
    assert local_rig.events.kinds("stubborn") == ["running", "released"]
    for pid in [*launchers, *workers]:
        assert not local_rig.alive(pid)


async def test_stop_of_a_job_that_already_ended_emits_nothing_more(local_rig) -> None:
    backend = local_rig.backend()
    await backend.start(local_rig.spec("quick", env={"STEPS": "1"}), ("local",))
    await local_rig.events.wait("quick", "finished")
    await backend.stop("quick", grace=1, reason="cancelled")
    assert local_rig.events.kinds("quick") == ["running", "finished"]


async def test_a_worker_stopped_from_outside_fails_the_job_rather_than_finishing_it(
    local_rig,
) -> None:
    backend = local_rig.backend()
    await backend.start(local_rig.spec("outside"), ("local", "local"))
    await local_rig.wait_until(lambda: len(local_rig.pids("outside")) == 2, "workers up")
    worker = sorted(local_rig.pids("outside"))[0]
    os.kill(worker, signal.SIGTERM)  # someone else's SIGTERM: the runtime checkpoints, exits 143
    event = await local_rig.events.wait("outside", "failed")
    assert event.exit_code == STOPPED_EXIT_CODE
    assert "SIGTERM from outside the service" in event.message


async def test_resize_restarts_at_the_new_size_from_the_checkpoint(local_rig) -> None:
    backend = local_rig.backend()
    spec = local_rig.spec("elastic")
    metrics_file = local_rig.workdir("elastic") / "metrics.jsonl"

    def reported() -> list[dict]:
        return metrics.read(str(metrics_file))

    await backend.start(spec, ("local", "local"))
    for size in (1, 2):
        before = len(reported())
        await local_rig.wait_until(lambda n=before: len(reported()) >= n + 4, "progress")
        await backend.resize(spec, ("local",) * size, grace=30)
        assert local_rig.events.of("elastic")[-1].kind == "resized"
        assert local_rig.events.of("elastic")[-1].placement == ("local",) * size
        assert backend.devices_in_use() == {"local": list(range(size))}
    await local_rig.wait_until(
        lambda: reported()[-1].get("world") == 2 and len(reported()) > 3, "world 2"
    )
    await backend.stop("elastic", grace=30, reason="done")
    lines = reported()
    starts = [(line["step"], line["world"]) for line in lines if line.get("phase") == "start"]
    assert [w for _, w in starts] == [2, 1, 2]
    assert starts[0][0] == 0 and 0 < starts[1][0] < starts[2][0]  # each resumed, none restarted
    steps = [line["step"] for line in lines if "phase" not in line]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    assert local_rig.events.kinds("elastic") == ["running", "resized", "resized", "released"]


async def test_a_new_backend_readopts_running_workers_and_reports_the_rest_lost(
    local_rig,
) -> None:
    first = local_rig.backend("1x4")
    jobs = {name: local_rig.spec(name) for name in ("keep", "fail", "dead", "recycled")}
    for spec in jobs.values():
        await first.start(spec, ("local",))
    await local_rig.wait_until(
        lambda: all(len(local_rig.pids(name)) == 1 for name in jobs), "every worker up"
    )
    launchers = {name: first.worker_pids(name) for name in jobs}
    await first.close()  # the service goes away; the workers do not

    for name in ("dead", "recycled"):  # both die without an exit status...
        os.killpg(launchers[name][0], signal.SIGKILL)
    # ...and the recycled one's pid now belongs to an unrelated process
    stranger = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        await _check_readoption(local_rig, jobs, launchers, stranger)
    finally:
        stranger.kill()
        stranger.wait()


async def _check_readoption(local_rig, jobs, launchers, stranger) -> None:
    record = local_rig.state_dir / "jobs" / "recycled" / "record.json"
    data = json.loads(record.read_text())
    data["workers"][0]["pid"] = stranger.pid  # same start time on record: not the stranger's
    record.write_text(json.dumps(data))
    for name in ("dead", "recycled"):
        await local_rig.wait_until(lambda n=name: not local_rig.alive(launchers[n][0]), "death")

    second = local_rig.backend("1x4")
    never = local_rig.spec("never")
    await second.recover([*jobs.values(), never])

    lost = await local_rig.events.wait("dead", "lost")
    assert "could not be found" in lost.message
    assert "no record" in (await local_rig.events.wait("never", "lost")).message
    assert "could not be found" in (await local_rig.events.wait("recycled", "lost")).message
    # a recycled pid is not ours: it is neither adopted nor killed
    assert local_rig.alive(stranger.pid)
    assert second.worker_pids("keep") == launchers["keep"]
    assert second.worker_pids("fail") == launchers["fail"]
    assert second.devices_in_use() == {"local": [0, 1]}

    # the adopted workers are watched like our own: exit codes come from the launcher's file
    (local_rig.workdir("fail") / "control-0").write_text("5")
    failed = await local_rig.events.wait("fail", "failed")
    assert failed.exit_code == 5 and "worker 0 exited with code 5" in failed.message
    (local_rig.workdir("keep") / "control-0").write_text("0")
    await local_rig.events.wait("keep", "finished")
    for name in ("keep", "fail", "dead"):
        assert not any(local_rig.alive(p) for p in [*launchers[name], *local_rig.pids(name)])
    assert second.devices_in_use() == {}


async def test_a_gang_that_ended_while_nobody_watched_reports_its_real_end(local_rig) -> None:
    """Metering charges a job until its event's time: a re-adopted gang that finished during
    the restart must say when it finished, not when the new backend noticed."""
    first = local_rig.backend("1x4")
    await first.start(local_rig.spec("early"), ("local",))
    await local_rig.wait_until(lambda: len(local_rig.pids("early")) == 1, "the worker up")
    [launcher] = first.worker_pids("early")
    await first.close()
    (local_rig.workdir("early") / "control-0").write_text("0")
    await local_rig.wait_until(lambda: not local_rig.alive(launcher), "the worker to end")
    ended = time.time()
    await asyncio.sleep(1.5)  # the service is still away
    second = local_rig.backend("1x4")
    recovered = time.time()
    await second.recover([local_rig.spec("early")])
    event = await local_rig.events.wait("early", "finished")
    assert event.at <= ended + 0.2 < recovered, (event.at, ended, recovered)


async def test_recover_stops_gangs_the_service_no_longer_lists(local_rig) -> None:
    first = local_rig.backend()
    await first.start(local_rig.spec("orphan"), ("local",))
    await local_rig.wait_until(lambda: len(local_rig.pids("orphan")) == 1, "worker up")
    pids = [*first.worker_pids("orphan"), *local_rig.pids("orphan")]
    await first.close()
    second = local_rig.backend()
    await second.recover([])
    assert not any(local_rig.alive(p) for p in pids)
    assert local_rig.events.kinds("orphan") == ["running"]  # nothing emitted for an unknown job
    assert not (local_rig.state_dir / "jobs" / "orphan").exists()


def test_logs_of_an_unknown_job_say_so(local_rig) -> None:
    with pytest.raises(KeyError, match="has not run on this backend"):
        local_rig.backend().logs("ghost")


# -- running as the user's account ---------------------------------------------------------------
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching accounts needs root")


def nobody_folder(rig) -> Path:
    """A user folder of the account nobody, as the spawner makes them (0700, theirs)."""
    folder = rig.shared / "nobody"
    folder.mkdir(mode=0o700, exist_ok=True)
    entry = pwd.getpwnam("nobody")
    os.chown(folder, entry.pw_uid, entry.pw_gid)
    return folder


@needs_root
async def test_as_root_workers_run_as_the_users_account(local_rig) -> None:
    nobody = pwd.getpwnam("nobody")
    # An interpreter the account may run (this machine's venv python lives under /root, 0700).
    system_python = "/usr/bin/python3"
    if not os.path.exists(system_python):
        pytest.skip("no system python that another account could run")
    backend = local_rig.backend(run_as_user=True, python=system_python)
    dump = local_rig.shared / "env_dump.py"
    dump.write_text(ENV_DUMP)
    dump.chmod(0o644)
    workdir = nobody_folder(local_rig) / "jobs" / "as-user"
    spec = local_rig.spec("as-user", ["python", str(dump)], user="nobody", workdir=workdir)
    await backend.start(spec, ("local",))
    await local_rig.events.wait("as-user", "finished", "failed")
    assert local_rig.events.kinds("as-user") == ["running", "finished"], backend.logs("as-user")
    env = json.loads((workdir / "env-0.json").read_text())
    assert env["uid"] == nobody.pw_uid
    assert os.stat(workdir).st_uid == nobody.pw_uid  # made by the user, not chowned by root
    assert os.stat(workdir / "logs" / "worker-0.log").st_uid == nobody.pw_uid


@needs_root
async def test_as_root_a_user_without_an_account_never_runs_as_root(local_rig) -> None:
    user = "wmla-no-such-account"
    with pytest.raises(KeyError):
        pwd.getpwnam(user)
    backend = local_rig.backend(run_as_user=None, create_accounts=False)
    dump = local_rig.base / "env_dump.py"
    dump.write_text(ENV_DUMP)
    await backend.start(local_rig.spec("as-svc", ["python", str(dump)], user=user), ("local",))
    event = await local_rig.events.wait("as-svc", "failed", "finished")
    assert event.kind == "failed"
    assert "has no account" in event.message and "never run as root" in event.message
    assert not (local_rig.workdir("as-svc", user) / "env-0.json").exists()
    assert backend.devices_in_use() == {}


@needs_root
async def test_an_interpreter_the_account_cannot_reach_fails_clearly(local_rig) -> None:
    hidden = local_rig.shared / "private"
    hidden.mkdir(mode=0o700)
    program = hidden / "python"
    program.symlink_to(sys.executable)
    backend = local_rig.backend(run_as_user=True, python=str(program), account_python="")
    workdir = nobody_folder(local_rig) / "jobs" / "unreachable"
    await backend.start(local_rig.spec("unreachable", user="nobody", workdir=workdir), ("local",))
    event = await local_rig.events.wait("unreachable", "failed")
    assert f"user 'nobody' cannot run {program}" in event.message
    assert f"no access to the directory {hidden}" in event.message
    assert backend.devices_in_use() == {}


@needs_root
async def test_an_unreachable_interpreter_falls_back_to_the_system_python_over_our_packages(
    local_rig,
) -> None:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    system = shutil.which(version, path="/usr/bin:/usr/local/bin")
    if system is None:
        pytest.skip(f"no system {version} to fall back to")
    hidden = local_rig.shared / "private-auto"
    hidden.mkdir(mode=0o700)
    program = hidden / "python"
    program.symlink_to(sys.executable)
    backend = local_rig.backend(run_as_user=True, python=str(program))  # account_python="auto"
    probe = local_rig.shared / "probe.py"
    probe.write_text(
        "import json, os, sys, psutil\n"
        "from extension import runtime\n"
        "json.dump({'exe': sys.executable, 'uid': os.getuid()}, open('probe.json', 'w'))\n"
    )
    probe.chmod(0o644)
    workdir = nobody_folder(local_rig) / "jobs" / "fallback"
    spec = local_rig.spec("fallback", ["python", str(probe)], user="nobody", workdir=workdir)
    await backend.start(spec, ("local",))
    event = await local_rig.events.wait("fallback", "finished", "failed")
    assert event.kind == "finished", backend.logs("fallback")
    seen = json.loads((workdir / "probe.json").read_text())
    assert seen == {"exe": system, "uid": pwd.getpwnam("nobody").pw_uid}


async def test_run_as_user_required_but_no_account_fails_with_a_clear_message(local_rig) -> None:
    backend = local_rig.backend(run_as_user=True, create_accounts=False)
    await backend.start(local_rig.spec("no-acct", user="wmla-no-such-account"), ("local",))
    event = await local_rig.events.wait("no-acct", "failed")
    assert "has no account" in event.message and "on this machine" in event.message
    assert backend.devices_in_use() == {}


def test_the_launcher_runs_isolated_on_the_standard_library_alone() -> None:
    from extension.backends import local

    out = subprocess.run(
        [sys.executable, "-I", local.LAUNCHER], capture_output=True, text=True, env={}
    )
    assert out.returncode == 2 and "SPEC.json" in out.stderr


async def test_a_start_during_the_jobs_stop_waits_for_the_old_gang(local_rig) -> None:
    backend = local_rig.backend()
    script = local_rig.base / "stubborn.py"
    script.write_text(STUBBORN)
    spec = local_rig.spec("again", ["python", str(script)])
    await backend.start(spec, ("local", "local"))
    with pytest.raises(ValueError, match="already running on this backend"):
        await backend.start(spec, ("local",))
    workdir = local_rig.workdir("again")
    await local_rig.wait_until(lambda: len(list(workdir.glob("up-*"))) == 2, "both up")
    old = backend.worker_pids("again")
    stopping = asyncio.get_running_loop().create_task(backend.stop("again", 1.0, "preempted"))
    await asyncio.sleep(0.1)  # the stop is in its grace period (the workers ignore SIGTERM)
    await backend.start(spec, ("local",))
    await stopping
    assert local_rig.events.kinds("again") == ["running", "released", "running"]
    assert not any(local_rig.alive(p) for p in old)
    assert backend.devices_in_use() == {"local": [0]}
    await backend.stop("again", 0.5, "cancelled")
