"""Grants held by the kernel (issue 27): each case a job of a real hub run as root, as a real
system account, that takes more than it was granted; the cgroup of each worker stops it.

The GPU nodes are character devices made with mknod (NVIDIA's major, 195) in a folder of the
test, named to the hub by $WMLA_GPU_DEVICE_TEMPLATE: opening one the cgroup allows answers ENXIO
(no driver behind it), one it refuses EPERM. That difference tells a fence from no fence."""

from __future__ import annotations

import glob
import json
import os
import secrets
import shutil
import stat
import tempfile
import time
from pathlib import Path

import pytest
import requests

from extension.confine import detect
from tests.security.accounts import accounts_with_code, remove_accounts
from tests.service.hub import PROXY, Client, Hub

AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("useradd") is not None
V1 = AS_ROOT and getattr(detect("probe"), "version", 0) == 1
pytestmark = [
    pytest.mark.skipif(not PROXY.exists(), reason="configurable-http-proxy is missing"),
    pytest.mark.skipif(not AS_ROOT, reason="cgroups are made by a hub run as root (useradd)"),
]
PREFIX = f"we{secrets.token_hex(3)}-"
USERS = ("user1", "user2")

GREEDY = r"""
import errno, json, os, sys, time
mode = sys.argv[1]
job = os.environ["WMLA_JOB_DIR"]
out = {}
if mode == "cpu":  # two busy processes for 3 s of wall time
    start, before = time.time(), os.times()
    kids = []
    for _ in range(2):
        pid = os.fork()
        if pid == 0:
            end = time.time() + 3
            while time.time() < end:
                pass
            os._exit(0)
        kids.append(pid)
    for pid in kids:
        os.waitpid(pid, 0)
    after = os.times()
    used = after.children_user + after.children_system
    used -= before.children_user + before.children_system
    out = {"cpu_seconds": used, "wall": time.time() - start}
elif mode == "memory":  # 1 GiB in 64 MiB steps
    held = []
    for step in range(16):
        held.append(bytearray(64 << 20))
        print("holding", (step + 1) * 64, "MiB", flush=True)
elif mode == "forks":  # 3,000 sleeping children
    kids = []
    for _ in range(3000):
        try:
            pid = os.fork()
        except OSError as err:
            out["error"] = errno.errorcode[err.errno]
            break
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        kids.append(pid)
    out["forked"] = len(kids)
    for pid in kids:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
elif mode == "devices":
    for index in range(4):
        path = sys.argv[2].format(index=index)
        try:
            os.close(os.open(path, os.O_RDWR))
            out[str(index)] = "opened"
        except OSError as err:
            out[str(index)] = errno.errorcode[err.errno]
    out["visible"] = os.environ.get("CUDA_VISIBLE_DEVICES")
elif mode == "shm":  # /dev/shm: its size, and a file left behind in it
    open("/dev/shm/" + os.path.basename(job) + ".left", "w").close()
    vfs = os.statvfs("/dev/shm")
    out["shm_bytes"] = vfs.f_blocks * vfs.f_frsize
elif mode == "sleep":
    open(os.path.join(job, "ready"), "w").close()
    time.sleep(float(sys.argv[2]))
json.dump(out, open(os.path.join(job, "result.json"), "w"))
"""


def account(user: str) -> str:
    return PREFIX + user


@pytest.fixture(scope="module")
def hub():
    tmp = Path(tempfile.mkdtemp(prefix="wmla-enforce-hub-"))
    os.chmod(tmp, 0o711)
    storage = Path(tempfile.mkdtemp(prefix="wmla-enforce-storage-"))
    os.chmod(storage, 0o711)
    devices = Path(tempfile.mkdtemp(prefix="wmla-enforce-dev-"))
    os.chmod(devices, 0o755)
    for index in range(4):
        os.mknod(devices / f"nvidia{index}", 0o666 | stat.S_IFCHR, os.makedev(195, index))
        os.chmod(devices / f"nvidia{index}", 0o666)
    traits = {"tick": 1, "grace": 1, "device_layout": "1x4", "cpu_oversubscription": 4}
    traits["max_pending_per_user"] = 3
    template = str(devices / "nvidia{index}")
    traits["backend_options"] = {
        "account_template": PREFIX + "{username}",
        "gpu_device_template": template,
    }
    hub = Hub(tmp, traits)
    hub.env["WMLA_STORAGE_ROOT"] = str(storage)
    hub.storage = storage
    hub.template = template
    created = []
    try:
        created = accounts_with_code(storage, USERS, account, "greedy.py", GREEDY)
        hub.start()
        names = ("admin", *USERS)
        hub.clients = {name: Client(hub, hub.user_token(name)) for name in names}
        yield hub
    finally:
        hub.stop()
        remove_accounts(created)
        for path in (storage, tmp, devices):
            shutil.rmtree(path, ignore_errors=True)


def body(*args: str, gpu: int = 0, cpu: str = "1", memory: str = "256Mi") -> dict:
    return {
        "plan": "/sample-project/training",
        "resources": {"gpu": gpu, "cpu": cpu, "memory": memory},
        "command": {"model_dir": "code", "model_main": "greedy.py", "args": list(args)},
    }


def run(client: Client, job: dict, timeout: float = 90) -> tuple[dict, dict]:
    """Submit, wait for the end; (the job, what it wrote in result.json or {})."""
    r = client.post("/jobs", json=job)
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    done = client.wait_state(job_id, {"FINISHED", "FAILED", "CANCELLED", "LOST"}, timeout)
    result = Path(done["workdir"]) / "result.json"
    return done, json.loads(result.read_text()) if result.exists() else {}


def cgroups_of(job_id: str) -> list[str]:
    return glob.glob(f"/sys/fs/cgroup/*/wmla/jobs-*/{job_id}-*") + glob.glob(
        f"/sys/fs/cgroup/wmla/jobs-*/{job_id}-*"
    )


def test_the_instance_says_what_holds_the_grants(hub: Hub) -> None:
    security = hub.clients["user1"].get("/instance").json()["security"]
    enforced = security["enforced"]
    assert set(enforced) == {"cpu", "memory", "pids", "devices", "storage"}
    # no quota configured here: said, with how to have one (tests/security/test_storage_quota.py)
    assert not enforced["storage"]["enforced"]
    assert "default_storage_quota" in enforced["storage"]["how"]
    assert all(enforced[c]["enforced"] for c in ("cpu", "memory", "pids")), enforced
    assert security["grants_enforced_by"].startswith("cgroup v")
    if V1:
        assert enforced["devices"]["enforced"], enforced


def test_two_busy_processes_on_one_cpu_get_one_cpu(hub: Hub) -> None:
    job, result = run(hub.clients["user1"], body("cpu", cpu="1"))
    assert job["state"] == "FINISHED", job
    assert result["cpu_seconds"] / result["wall"] <= 1.2, result
    assert not cgroups_of(job["id"])


def test_a_job_over_its_memory_is_killed_and_says_so_while_others_go_on(hub: Hub) -> None:
    user2 = hub.clients["user2"]
    r = user2.post("/jobs", json=body("sleep", "6", cpu="500m", memory="128Mi"))
    assert r.status_code == 201, r.text
    neighbour = r.json()["id"]
    job, _ = run(hub.clients["user1"], body("memory", memory="256Mi"))
    assert job["state"] == "FAILED", job
    assert "worker 0 was killed for using more than its 256 MiB of memory" in job["reason"], job
    assert "ask for more with --memory" in job["reason"]
    health = requests.get(hub.api + "/health", timeout=10).json()
    assert health["ok"], health
    assert user2.wait_state(neighbour, {"FINISHED", "FAILED"}, 60)["state"] == "FINISHED"
    assert not cgroups_of(job["id"]) and not cgroups_of(neighbour)


def test_a_jobs_dev_shm_is_its_own_of_its_memory_and_gone_with_it(hub: Hub) -> None:
    job, result = run(hub.clients["user1"], body("shm", memory="128Mi"))
    assert job["state"] == "FINISHED", job
    assert result["shm_bytes"] == 128 * 2**20, result  # not the machine's (half its memory)
    assert not os.path.exists(f"/dev/shm/{job['id']}.left")  # its files and memory went with it


def test_a_fork_flood_stops_at_the_pids_limit(hub: Hub) -> None:
    job, result = run(hub.clients["user1"], body("forks", memory="1Gi"), timeout=120)
    assert job["state"] == "FINISHED", job
    assert result["forked"] < 1024 and result["error"] == "EAGAIN", result
    assert requests.get(hub.api + "/health", timeout=10).json()["ok"]


@pytest.mark.skipif(not V1, reason="a devices fence needs cgroup v1 here (v2: systemd's eBPF)")
def test_a_gpu_job_opens_only_its_own_gpu_and_a_cpu_job_none(hub: Hub) -> None:
    one, result = run(hub.clients["user1"], body("devices", hub.template, gpu=1))
    assert one["state"] == "FINISHED", one
    mine = result["visible"]
    assert mine is not None and mine.isdigit(), result
    assert result[mine] == "ENXIO", result  # allowed: no driver behind the node
    assert {v for k, v in result.items() if k not in (mine, "visible")} == {"EPERM"}, result
    none, result = run(hub.clients["user2"], body("devices", hub.template, gpu=0))
    assert none["state"] == "FINISHED", none
    assert {result[str(i)] for i in range(4)} == {"EPERM"}, result


def test_cgroups_are_gone_after_a_cancel_and_after_a_service_restart(hub: Hub) -> None:
    user1 = hub.clients["user1"]
    r = user1.post("/jobs", json=body("sleep", "60", cpu="100m"))
    job = r.json()
    user1.wait_state(job["id"], {"RUNNING"})
    wait_for(lambda: (Path(job["workdir"]) / "ready").exists(), "the job's start")
    assert cgroups_of(job["id"])
    assert user1.delete(f"/jobs/{job['id']}").status_code == 200
    user1.wait_state(job["id"], {"CANCELLED"})
    wait_for(lambda: not cgroups_of(job["id"]), "the cancelled job's cgroups to go")
    r = user1.post("/jobs", json=body("sleep", "120", cpu="100m"))
    job = r.json()
    user1.wait_state(job["id"], {"RUNNING"})
    wait_for(lambda: (Path(job["workdir"]) / "ready").exists(), "the job's start")
    hub.restart()  # the worker outlives the service; the new one re-adopts it
    assert user1.get(f"/jobs/{job['id']}").json()["state"] == "RUNNING"
    assert cgroups_of(job["id"])  # kept: the new service's sweep knows it from its record
    assert user1.delete(f"/jobs/{job['id']}").status_code == 200
    user1.wait_state(job["id"], {"CANCELLED"})
    wait_for(lambda: not cgroups_of(job["id"]), "the re-adopted job's cgroups to go")


def test_a_submission_flood_is_refused_past_the_pending_cap(hub: Hub) -> None:
    user2 = hub.clients["user2"]
    admin = hub.clients["admin"]
    r = admin.post("/plans", json={"path": "/flood", "limit": {"gpu": 1}})
    assert r.status_code == 201, r.text
    flood = {**body("sleep", "60", gpu=1, cpu="100m"), "plan": "/flood"}
    r = user2.post("/jobs", json=flood)  # holds the plan's one GPU: the rest must wait
    assert r.status_code == 201, r.text
    blocker = r.json()["id"]
    user2.wait_state(blocker, {"RUNNING"})
    answers = [user2.post("/jobs", json=flood) for _ in range(4)]
    assert [a.status_code for a in answers[:3]] == [201, 201, 201], answers[0].text
    refused = answers[3]
    assert refused.status_code == 429, refused.text
    assert "3 pending jobs" in refused.json()["error"]
    assert "max_pending_per_user" in refused.json()["error"]
    mine = user2.get("/jobs").json()["jobs"]
    assert len([j for j in mine if j["plan"] == "/flood"]) == 4  # nothing stored for the 429
    for job_id in [blocker, *(a.json()["id"] for a in answers[:3])]:
        user2.delete(f"/jobs/{job_id}")


def wait_for(predicate, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")
