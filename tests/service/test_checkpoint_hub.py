"""Checkpoint reports and churn figures end to end: a real JupyterHub, proxy and wmla service,
jobs run by the real LocalBackend (tests/service/hub.py).

user1's job saves one checkpoint through ``extension.runtime``, which ``GET /jobs/<id>`` then
shows; user2's job reclaims user1's GPUs, and while it runs it lies: it claims to be user1's
job, which changes nothing of user1's. The preemption's lost GPU-seconds in /metrics, in
``GET /churn`` and on the admin page equal 4 GPUs x the time since user1's checkpoint. After a
restart of the hub and the service, the counters are the same and user2's re-adopted job still
reports through its channel.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from .hub import PROXY, Client, Hub

pytestmark = pytest.mark.skipif(
    not PROXY.exists(), reason="configurable-http-proxy is missing: run `make install`"
)

PLAN = "/sample-project/training"
LEAF1 = f"{PLAN}/user1"

# user1: one checkpoint a second after it starts (its time written next to it), then work
# without any; on SIGTERM the checkpoint runtime.exit_stopped saves, as a preempted job does.
SAVER = """
import os, time
from extension import runtime
time.sleep(1)
runtime.checkpoint.save({"step": 1}, progress=1)
open(os.path.join(runtime.job_dir(), "saved.txt"), "w").write(repr(time.time()))
step = 1
while True:
    time.sleep(0.2)
    step += 1
    if runtime.should_stop(sync=False):
        runtime.exit_stopped({"step": step})
"""

# user2: claims to be the job named in argv, reports as it, then reports every half second
# (progress 100, 101, ...) for as long as it runs.
LIAR = """
import os, sys, time
from extension import runtime
os.environ["WMLA_JOB_ID"] = sys.argv[1]
os.environ["WMLA_JOB_DIR"] = sys.argv[2]
runtime.report_checkpoint(progress=666)
progress = 100
while True:
    time.sleep(0.5)
    runtime.report_checkpoint(progress=progress)
    progress += 1
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("checkpoint-hub")
    traits = {"tick": 1, "grace": 3, "device_layout": "1x4", "min_runtime": 0}
    hub = Hub(tmp, traits)
    try:
        hub.start()
        hub.clients = {n: Client(hub, hub.user_token(n)) for n in ("admin", "user1", "user2")}
        for user, text in (("user1", SAVER), ("user2", LIAR)):
            folder = hub.storage / user / "models" / "ckpt"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "main.py").write_text(text)
        yield hub
    finally:
        hub.stop()


def body(gpus: int, args: list[str] = ()) -> dict:
    return {
        "plan": PLAN,
        "workers": 1,
        "resources": {"gpu": gpus, "cpu": "100m", "memory": "128Mi"},
        "command": {"model_dir": "models/ckpt", "model_main": "main.py", "args": list(args)},
    }


def wait_for(client: Client, job_id: str, check, what: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        job = client.get(f"/jobs/{job_id}").json()
        if check(job):
            return job
        assert time.monotonic() < deadline, f"{what}: {job}\n{client.hub.log()}"
        time.sleep(0.3)


def metric(hub: Hub, name: str, **labels: str) -> float | None:
    """One sample of /services/wmla/metrics, read with the hub admin's token."""
    r = requests.get(
        hub.url + "/services/wmla/metrics", headers=hub.clients["admin"].headers, timeout=30
    )
    assert r.status_code == 200, r.text
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return None


def churn_of(client: Client) -> dict[str, dict]:
    r = client.get("/churn")
    assert r.status_code == 200, r.text
    return {p["path"]: p for p in r.json()["plans"]}


def admin_page_churn(hub: Hub, path: str) -> dict[str, str]:
    """The churn cells of ``path``'s row on the admin page, logged in through the hub."""
    from tests.admin.test_admin_page import login

    session = login(hub, "admin")
    assert session.admin_status == 200, session.page[:300]
    row = re.search(rf'<tr class="plan[^"]*" data-path="{re.escape(path)}">(.*?)</tr>',
                    session.page, re.S)  # fmt: skip
    assert row, session.page[:2000]
    cells = dict(re.findall(r'<td class="churn-(\w+)"[^>]*>([^<]*)', row.group(1)))
    total = re.search(r'id="churn-total">(.*?)</p>', session.page, re.S)
    assert total
    cells["total_lost"] = re.search(r'churn-lost">([^<]*)', total.group(1)).group(1)
    return cells


def test_checkpoints_reach_the_job_and_a_preemption_counts_the_work_lost(hub: Hub) -> None:
    user1, user2, admin = (hub.clients[n] for n in ("user1", "user2", "admin"))
    r = user1.post("/jobs", json=body(4))
    assert r.status_code == 201, r.text
    victim = r.json()["id"]
    assert r.json()["checkpoint"] is None
    job = wait_for(user1, victim, lambda j: j["checkpoint"], "user1's checkpoint")
    saved_file = Path(job["workdir"]) / "saved.txt"
    saved_after = float(saved_file.read_text())
    assert job["checkpoint"]["progress"] == 1
    assert job["started"] < job["checkpoint"]["at"] <= saved_after
    saved = job["checkpoint"]["at"]
    time.sleep(2)  # work since the checkpoint: what a preemption now loses

    asked = time.time()
    r = user2.post("/jobs", json=body(2, [victim, job["workdir"]]))
    assert r.status_code == 201, r.text
    liar = r.json()["id"]
    wait_for(user1, victim, lambda j: j["preemptions"] == 1, "user1's job to be preempted")
    wait_for(user2, liar, lambda j: j["state"] == "RUNNING", "user2's job to run")
    history = user1.get(f"/jobs/{victim}/history").json()["transitions"]
    [preempted] = [t["at"] for t in history if t["event"] == "preempting"]
    assert asked <= preempted <= time.time()

    # the liar's reports are its own job's; user1's job only ever got its own
    # its counting reports (100, 101, ...), not only the first (666): the restart below compares
    # the count before and after
    wait_for(user2, liar, lambda j: 100 <= (j["checkpoint"] or {}).get("progress", 0) < 666,
             "lies")  # fmt: skip
    back = wait_for(user1, victim, lambda j: j["state"] == "PENDING", "user1's job to wait")
    # the checkpoint exit_stopped saved on SIGTERM (no progress given): the one it resumes from
    assert back["checkpoint"]["at"] >= preempted and back["checkpoint"]["progress"] is None
    assert user2.get(f"/jobs/{victim}").status_code == 404
    # and the API has no way in: the channel is the only one, and it is the job's own
    for client in (user1, user2):
        report = {"checkpoint": {"at": time.time(), "progress": 666}}
        assert client.post(f"/jobs/{victim}/checkpoint", json=report).status_code in (404, 405)
        assert client.patch(f"/jobs/{victim}", json=report).status_code in (404, 405)

    lost = metric(hub, "wmla_lost_gpu_seconds_total", plan=LEAF1)
    assert lost == pytest.approx(4 * (preempted - saved), rel=1e-6)
    assert 4 * (asked - saved) <= lost <= 4 * (time.time() - saved)  # the wall clock agrees
    held = metric(hub, "wmla_preempted_gpu_seconds_total", plan=LEAF1)
    assert held == pytest.approx(4 * (preempted - job["started"]), rel=1e-6)
    assert metric(hub, "wmla_lost_gpu_seconds_total", plan="/") == pytest.approx(lost)
    assert metric(hub, "wmla_preemptions_total", plan=LEAF1) == 1
    assert metric(hub, "wmla_steady_state_preemptions_total", plan="/") is not None

    figures = churn_of(admin)
    assert figures[LEAF1]["preemptions"] == 1
    assert figures[LEAF1]["lost_gpu_seconds"] == pytest.approx(lost)
    assert figures[PLAN]["lost_gpu_seconds"] == pytest.approx(lost)
    assert set(churn_of(user1)) == {LEAF1}  # a user sees their own leaves only
    assert LEAF1 not in churn_of(user2)
    cells = admin_page_churn(hub, LEAF1)
    assert cells["preemptions"].strip().startswith("1")
    assert float(cells["lost"]) == pytest.approx(lost, abs=0.05)
    assert float(cells["preempted"]) == pytest.approx(held, abs=0.05)
    assert float(cells["total_lost"]) == pytest.approx(lost, abs=0.05)

    # a restart: the counters come back from the store, the re-adopted job keeps reporting
    before = user2.get(f"/jobs/{liar}").json()["checkpoint"]["progress"]
    hub.restart()  # the workers go on; the tokens are the hub's, kept in its database
    assert user2.get(f"/jobs/{liar}").json()["state"] == "RUNNING"
    wait_for(user2, liar, lambda j: j["checkpoint"]["progress"] > before + 2, "reports after")
    assert churn_of(hub.clients["admin"])[LEAF1]["lost_gpu_seconds"] == pytest.approx(lost)
    assert metric(hub, "wmla_lost_gpu_seconds_total", plan=LEAF1) == pytest.approx(lost)


def test_the_openapi_document_has_the_checkpoint_and_churn(hub: Hub) -> None:
    doc = requests.get(hub.api + "/openapi.json", timeout=30).json()
    assert doc["components"]["schemas"]["Job"]["properties"]["checkpoint"]["nullable"] is True
    assert "lost_gpu_seconds" in json.dumps(doc["paths"]["/churn"])
