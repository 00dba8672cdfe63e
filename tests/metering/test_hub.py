"""Metering through a real JupyterHub, proxy and wmla service (real LocalBackend workers).

A job of user1 runs and ends; its GPU-hours in the usage API equal the integral of its own
history (``/jobs/<id>/history``); user2 cannot see them; /metrics needs a plan admin's token and
parses with prometheus_client.
"""

from __future__ import annotations

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.service.hub import PROXY, Client, Hub

pytestmark = pytest.mark.skipif(
    not PROXY.exists(), reason="configurable-http-proxy is missing: run `make install`"
)

SCRIPT = "import time\ntime.sleep(1.5)\n"
PLAN = "/sample-project/training"


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("metering-hub")
    hub = Hub(tmp, {"tick": 1, "grace": 2, "device_layout": "1x4", "cpu_oversubscription": 2})
    try:
        hub.start()
        hub.clients = {
            name: Client(hub, hub.user_token(name)) for name in ("padmin", "user1", "user2")
        }
        folder = hub.storage / "user1" / "models" / "nap"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "main.py").write_text(SCRIPT)
        yield hub
    finally:
        hub.stop()


def test_usage_and_metrics_through_the_hub(hub: Hub) -> None:
    user1, user2, padmin = (hub.clients[n] for n in ("user1", "user2", "padmin"))
    body = {
        "plan": PLAN,
        "workers": 2,
        "resources": {"gpu": 1, "cpu": "100m", "memory": "64Mi"},
        "command": {"model_dir": "models/nap", "model_main": "main.py"},
    }
    r = user1.post("/jobs", json=body)
    assert r.status_code == 201, r.text
    job = user1.wait_state(r.json()["id"], {"FINISHED", "FAILED"})
    assert job["state"] == "FINISHED", job
    history = user1.get(f"/jobs/{job['id']}/history").json()["transitions"]
    # the job's own record, integrated by hand: workers x gpu over each interval
    gpu_seconds = sum(
        t["workers"] * t["per_worker"]["gpu"] * (nxt["at"] - t["at"])
        for t, nxt in zip(history, history[1:])
    )
    assert gpu_seconds > 0
    r = user1.get("/usage", params={"plan": PLAN, "start": "now-1h", "step": "5m"})
    assert r.status_code == 200, r.text
    answer = r.json()
    leaf = f"{PLAN}/user1"
    assert [c["path"] for c in answer["children"]] == [leaf]
    assert answer["children"][0]["totals"]["used"]["gpu_hours"] == pytest.approx(
        gpu_seconds / 3600,
        abs=2e-6,  # the store keeps milliseconds
    )
    r = user2.get("/usage", params={"plan": PLAN, "start": "now-1h"})
    assert r.status_code == 200 and leaf not in r.text
    r = user2.get("/usage", params={"user": "user1"})
    assert r.status_code == 403 and "your own usage" in r.json()["error"]
    r = padmin.get("/usage", params={"plan": PLAN, "start": "now-1h", "format": "csv"})
    assert r.status_code == 200 and r.text.startswith("plan,start,end") and leaf in r.text

    metrics = f"{hub.url}/services/wmla/metrics"
    r = requests.get(metrics, headers=user1.headers, timeout=30)
    assert r.status_code == 403
    r = requests.get(metrics, headers=padmin.headers, timeout=30)
    assert r.status_code == 200, r.text
    names = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            names[(s.name, s.labels.get("plan"), s.labels.get("resource"))] = s.value
    assert names[("wmla_plan_used", PLAN, "gpu")] == 0  # the job has ended
    assert names[("wmla_plan_deserved", "/", "gpu")] == 0
    assert ("wmla_plan_requested", leaf, "gpu") in names
    assert names[("wmla_scheduling_cycles_total", None, None)] > 0
