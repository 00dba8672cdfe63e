"""The real service on PostgreSQL: a real JupyterHub, proxy and wmla service whose store is a
database on the suite's PostgreSQL server (``c.WmlaService.db_url``), real LocalBackend workers.

Plans, a submitted job run to its end, its history and metering read back through the API; the
rows are in PostgreSQL (read there directly); a restart of the hub and the service keeps
everything. Skips, saying why, where PostgreSQL or configurable-http-proxy is missing.
"""

from __future__ import annotations

import pytest

from extension.service.store import Store

from .hub import PROXY, Client, Hub

pytestmark = [
    pytest.mark.skipif(
        not PROXY.exists(), reason="configurable-http-proxy is missing: run `make install`"
    ),
    pytest.mark.postgresql,
]

SCRIPT = "import time\ntime.sleep(1.5)\n"
PLAN = "/pg-project/team"


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory, postgres):
    url = postgres.create_database("hub")
    traits = {"tick": 1, "grace": 2, "device_layout": "1x4", "cpu_oversubscription": 2}
    traits["db_url"] = url
    hub = Hub(tmp_path_factory.mktemp("pg-hub"), traits)
    hub.db_url = url
    try:
        hub.start()
        hub.clients = {name: Client(hub, hub.user_token(name)) for name in ("admin", "user1")}
        folder = hub.storage / "user1" / "models" / "nap"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "main.py").write_text(SCRIPT)
        yield hub
    finally:
        hub.stop()


def job_body() -> dict:
    return {
        "plan": PLAN,
        "workers": 2,
        "resources": {"gpu": 1, "cpu": "100m", "memory": "64Mi"},
        "command": {"model_dir": "models/nap", "model_main": "main.py"},
    }


def test_plans_a_job_and_its_metering_on_postgresql(hub: Hub) -> None:
    admin, user1 = hub.clients["admin"], hub.clients["user1"]
    assert not (hub.var / "wmla" / "wmla.sqlite").exists()  # the store is not a SQLite file
    for body in (
        {"path": "/pg-project"},
        {"path": PLAN, "share": 2, "limit": {"gpu": 2}, "members": {"users": ["user1"]}},
    ):
        r = admin.post("/plans", json=body)
        assert r.status_code == 201, r.text
    # longer than the store's path columns: PostgreSQL refused it with a 500 before the bound
    r = admin.post("/plans", json={"path": "/" + "p" * 300})
    assert r.status_code == 400 and "at most 256" in r.json()["error"], r.text

    r = user1.post("/jobs", json=job_body())
    assert r.status_code == 201, r.text
    job = user1.wait_state(r.json()["id"], {"FINISHED", "FAILED"})
    assert job["state"] == "FINISHED", job
    history = user1.get(f"/jobs/{job['id']}/history").json()["transitions"]
    assert [t["event"] for t in history][0] == "submitted" and history[-1]["event"] == "finished"
    gpu_seconds = sum(
        t["workers"] * t["per_worker"]["gpu"] * (nxt["at"] - t["at"])
        for t, nxt in zip(history, history[1:])
    )
    assert gpu_seconds > 0
    r = user1.get("/usage", params={"plan": PLAN, "start": "now-1h", "step": "5m"})
    assert r.status_code == 200, r.text
    (child,) = r.json()["children"]
    assert child["path"] == f"{PLAN}/user1"
    assert child["totals"]["used"]["gpu_hours"] == pytest.approx(gpu_seconds / 3600, abs=2e-6)

    store = Store.open(hub.db_url)  # what the service wrote, read in PostgreSQL itself
    try:
        assert store.engine.dialect.name == "postgresql"
        row = store.job(job["id"])
        assert row is not None and row.state == "FINISHED" and row.leaf == f"{PLAN}/user1"
        assert [t.event for t in store.transitions(job["id"])] == [t["event"] for t in history]
        plan = next(p for p in store.plans() if p.path == PLAN)
        assert (plan.share, plan.limit.gpu, plan.users) == (2.0, 2.0, ["user1"])
    finally:
        store.close()


def test_a_restart_on_postgresql_keeps_plans_jobs_and_usage(hub: Hub) -> None:
    admin, user1 = hub.clients["admin"], hub.clients["user1"]
    plans_before = admin.get("/plans").json()["plans"]
    jobs_before = {j["id"]: j["state"] for j in admin.get("/jobs").json()["jobs"]}
    usage = {"plan": PLAN, "start": "now-1h", "end": "now", "step": "1h"}
    r = user1.get("/usage", params=usage)
    assert r.status_code == 200, r.text
    used_before = r.json()["totals"]["used"]["gpu_hours"]
    assert jobs_before and used_before > 0
    hub.restart()
    assert admin.get("/plans").json()["plans"] == plans_before
    assert {j["id"]: j["state"] for j in admin.get("/jobs").json()["jobs"]} == jobs_before
    used_after = user1.get("/usage", params=usage).json()["totals"]["used"]["gpu_hours"]
    assert used_after == pytest.approx(used_before, abs=2e-6)
    r = user1.post("/jobs", json=job_body())  # and it goes on taking jobs
    assert r.status_code == 201, r.text
    assert user1.wait_state(r.json()["id"], {"FINISHED", "FAILED"})["state"] == "FINISHED"
