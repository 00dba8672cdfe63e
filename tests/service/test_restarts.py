"""A real hub, proxy and service under the faults of a restart: a locked database behind the
API, a retried submission, a second service on the same database, and a ``kill -9`` of the hub.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import requests

from .hub import Client, Hub, free_port
from .test_api import SCRIPT, error_of, job_body
from .test_faults import Locker


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("restarts")
    traits = {"tick": 1, "grace": 1, "device_layout": "1x4", "lease_seconds": 3}
    traits.update(reconcile_seconds=1, reconcile_grace=1)
    hub = Hub(tmp, traits)
    try:
        hub.start()
        hub.clients = {
            name: Client(hub, hub.user_token(name)) for name in ("admin", "user1", "user2")
        }
        folder = hub.storage / "user1" / "models" / "hi"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "main.py").write_text(SCRIPT)
        yield hub
    finally:
        hub.stop()


def database(hub: Hub) -> Path:
    found = list(hub.var.rglob("wmla.sqlite"))
    assert len(found) == 1, found
    return found[0]


def test_a_locked_database_answers_503_json_and_a_keyed_retry_makes_one_job(hub: Hub) -> None:
    user1 = hub.clients["user1"]
    body = job_body("/sample-project/training", seconds=0)
    key = {"Idempotency-Key": "retry-test-1"}
    locker = Locker(database(hub))
    try:
        began = time.monotonic()
        r = user1.post("/jobs", json=body, headers=key)
        assert r.status_code == 503, r.text
        assert "database" in error_of(r) and "try again" in error_of(r)
        assert int(r.headers["Retry-After"]) >= 1 and r.json()["retry_after"] >= 1
        assert time.monotonic() - began < 10
        r = user1.post("/jobs", json=body, headers=key)  # down: refused at once now
        assert r.status_code == 503
        assert user1.get("/jobs").status_code == 200  # reads go on past the lock
        health = requests.get(hub.api + "/health", timeout=10).json()
        assert health["status"] in ("ok", "degraded")
    finally:
        locker.release()
    deadline = time.monotonic() + 20
    while (r := user1.post("/jobs", json=body, headers=key)).status_code == 503:
        assert time.monotonic() < deadline, r.text
        time.sleep(0.5)
    assert r.status_code == 201, r.text
    first = r.json()["id"]
    again = user1.post("/jobs", json=body, headers=key)
    assert again.status_code == 200 and again.json()["id"] == first
    other = user1.post("/jobs", json={**body, "name": "other"}, headers=key)
    assert other.status_code == 422 and "different body" in error_of(other)
    bad = user1.post("/jobs", json=body, headers={"Idempotency-Key": "no spaces allowed"})
    assert bad.status_code == 400 and "Idempotency-Key" in error_of(bad)
    mine = [j for j in user1.get("/jobs").json()["jobs"] if j["id"] == first]
    assert len(mine) == 1 and user1.wait_state(first, {"FINISHED"})["state"] == "FINISHED"


def test_a_second_service_on_the_same_database_leaves_naming_the_first(hub: Hub) -> None:
    service = psutil.Process(hub.service_pid())
    env = dict(service.environ())
    env["JUPYTERHUB_SERVICE_URL"] = f"http://127.0.0.1:{free_port()}"
    began = time.monotonic()
    second = subprocess.run(
        service.cmdline(), cwd=service.cwd(), env=env, capture_output=True, text=True, timeout=60
    )
    waited = time.monotonic() - began
    assert second.returncode != 0
    assert f"another wmla service (pid {service.pid}" in second.stderr, second.stderr[-2000:]
    assert 3 <= waited < 30  # it waited for the lease (3 s here), then left
    assert requests.get(hub.api + "/health", timeout=10).json()["status"] == "ok"


def notebook_job(hub: Hub, user: str) -> str:
    body = {
        "plan": "/sample-project/notebooks",
        "kind": "notebook",
        "user": user,
        "resources": {"gpu": 0, "cpu": "100m", "memory": "64Mi"},
    }
    r = hub.clients["admin"].post("/jobs", json=body)  # what the spawner does at a spawn
    assert r.status_code == 201, r.text
    hub.clients[user].wait_state(r.json()["id"], {"RUNNING"})
    return r.json()["id"]


def wait_server(hub: Hub, user: str, ready: bool, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        own = hub.clients[user].headers  # the user's own token sees their servers
        r = requests.get(f"{hub.url}/hub/api/users/{user}", headers=own, timeout=30)
        servers = r.json().get("servers") or {}
        if bool(servers.get("", {}).get("ready")) == ready and (ready or not servers):
            return
        assert time.monotonic() < deadline, servers
        time.sleep(0.3)


def test_a_notebook_job_no_server_holds_is_released_and_one_a_server_holds_is_kept(
    hub: Hub,
) -> None:
    own = hub.clients["user2"].headers  # a user starts their own server
    server = f"{hub.url}/hub/api/users/user2/server"
    r = requests.post(server, headers=own, timeout=90)
    assert r.status_code in (201, 202), r.text
    try:
        wait_server(hub, "user2", ready=True)
        held = notebook_job(hub, "user2")  # user2's server runs: the job is held
        leaked = notebook_job(hub, "user1")  # user1 has no server: nothing holds it
        released = hub.clients["user1"].wait_state(leaked, {"CANCELLED"}, timeout=20)
        assert "no default server of user1" in released["reason"]
        time.sleep(3)  # three more rounds
        assert hub.clients["user2"].get(f"/jobs/{held}").json()["state"] == "RUNNING"
    finally:
        requests.delete(server, headers=own, timeout=60)
    wait_server(hub, "user2", ready=False)
    # the server stopped without releasing (this hub's spawner is not wmla's): freed anyway
    gone = hub.clients["user2"].wait_state(held, {"CANCELLED"}, timeout=20)
    assert gone["reason"].startswith("released: the hub has no default server of user2")


def test_a_killed_service_is_back_in_seconds_and_the_proxy_answers_json_meanwhile(
    hub: Hub,
) -> None:
    user1 = hub.clients["user1"]
    old = hub.service_pid()
    os.kill(old, signal.SIGKILL)
    began = time.monotonic()
    seen = []
    while True:
        r = user1.get("/jobs")
        if r.status_code == 200 and hub.service_pid() != old:
            break
        seen.append(r.status_code)
        assert r.status_code in (502, 503), r.text
        assert r.headers["Content-Type"].startswith("application/json"), r.text
        body = r.json()
        assert "restarting" in body["error"] and body["retry_after"] >= 1
        assert time.monotonic() - began < 25, "the hub did not restart the service"
        time.sleep(0.2)
    window = time.monotonic() - began
    print(f"service back {window:.1f} s after kill -9 ({len(seen)} JSON answers meanwhile)")
    assert seen and window < 15
    hub._collect()  # the new service's PID, to stop it at the end


def test_after_kill_9_of_the_hub_its_service_leaves_and_the_next_hub_adopts_the_jobs(
    hub: Hub,
) -> None:
    user1 = hub.clients["user1"]
    r = user1.post("/jobs", json=job_body("/sample-project/training", seconds=300))
    assert r.status_code == 201, r.text
    running = r.json()["id"]
    user1.wait_state(running, {"RUNNING"})
    service = hub.service_pid()
    hub._collect()
    assert hub.proc is not None
    os.kill(hub.proc.pid, signal.SIGKILL)
    hub.proc.wait(10)
    deadline = time.monotonic() + 15
    while psutil.pid_exists(service) and psutil.Process(service).status() != "zombie":
        assert time.monotonic() < deadline, "the orphaned service did not leave"
        time.sleep(0.2)
    hub.proc = None
    began = time.monotonic()
    hub.start()
    window = time.monotonic() - began
    print(f"hub back {window:.1f} s after the old service left")
    assert hub.service_pid() != service
    assert user1.get(f"/jobs/{running}").json()["state"] == "RUNNING"  # re-adopted
    r = user1.delete(f"/jobs/{running}")
    assert r.status_code == 200
    assert user1.wait_state(running, {"CANCELLED"})["state"] == "CANCELLED"
    log = hub.log()
    assert "address already in use" not in log.lower()
    assert sys.executable  # the same interpreter ran both hubs
