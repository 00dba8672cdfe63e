"""Bad input answers a JSON 4xx naming what was wrong, never a 5xx; extreme shares never stall
scheduling; a failing cycle shows in /health (issue 15's first part).

Through a real hub, proxy and service (tests/service/hub.py), as a client would send it.
"""

from __future__ import annotations

import json

import pytest
import requests

from extension.scheduler import plans
from extension.service import scheduling

from .hub import PROXY, Client, Hub
from .test_scheduling import Rig

pytestmark = pytest.mark.skipif(not PROXY.exists(), reason="configurable-http-proxy is missing")


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory):
    hub = Hub(tmp_path_factory.mktemp("bad-input"), {"tick": 1, "device_layout": "1x4"})
    try:
        hub.start()
        hub.clients = {n: Client(hub, hub.user_token(n)) for n in ("admin", "user1")}
        folder = hub.storage / "user1" / "models" / "hi"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "main.py").write_text("print('hi')\n")
        yield hub
    finally:
        hub.stop()


def raw(client: Client, method: str, path: str, data: bytes) -> requests.Response:
    headers = {**client.headers, "Content-Type": "application/json"}
    return requests.request(method, client.hub.api + path, headers=headers, data=data, timeout=60)


def job(**command) -> dict:
    return {
        "plan": "/sample-project/training",
        "resources": {"gpu": 0, "cpu": "100m", "memory": "64Mi"},
        "command": {"model_dir": "models/hi", "model_main": "main.py", **command},
    }


def json_error(r: requests.Response, status: int) -> str:
    assert r.status_code == status, (r.status_code, r.text[:300])
    assert r.headers["Content-Type"].startswith("application/json"), r.headers
    return r.json()["error"]


@pytest.mark.parametrize(
    "method, path", [("POST", "/jobs"), ("POST", "/plans"), ("PATCH", "/plans/sample-project")]
)
@pytest.mark.parametrize("depth", [100_000, 40], ids=["100k", "40"])
def test_a_deeply_nested_body_is_a_400(hub: Hub, method: str, path: str, depth: int) -> None:
    body = b"[" * depth + b"]" * depth
    assert "nested more than 32 levels" in json_error(raw(hub.clients["admin"], method, path,
                                                           body), 400)  # fmt: skip


def test_a_body_over_one_mebibyte_is_a_json_413_naming_the_limit(hub: Hub) -> None:
    body = json.dumps({**job(), "name": "x" * (2 * 1024 * 1024)}).encode()
    assert "at most 1,048,576" in json_error(raw(hub.clients["user1"], "POST", "/jobs", body), 413)


@pytest.mark.parametrize(
    "command, words",
    [
        ({"model_dir": "m" * 10_000}, "at most 1024"),
        ({"model_dir": "models/" + "d" * 300}, "is not a folder"),  # ENAMETOOLONG inside
        ({"model_main": "x" * 300 + ".py"}, "is not a file"),
    ],
    ids=["10k-chars", "long-component", "long-script"],
)
def test_long_paths_are_a_400(hub: Hub, command: dict, words: str) -> None:
    assert words in json_error(hub.clients["user1"].post("/jobs", json=job(**command)), 400)


@pytest.mark.parametrize(
    "body",
    [
        {**job(), "resources": {"cpu": 1e306}},
        {**job(), "limits": {"cpu": 1e307}},
        {**job(), "resources": {"memory": "99999999999Ti"}},
        {**job(), "resources": {"gpu": 10**30}},
    ],
    ids=["cpu-1e306", "limit-1e307", "memory-huge", "gpu-huge"],
)
def test_huge_quantities_are_a_400_naming_the_bound(hub: Hub, body: dict) -> None:
    assert "too large; at most" in json_error(hub.clients["user1"].post("/jobs", json=body), 400)


def test_a_huge_plan_limit_is_a_400(hub: Hub) -> None:
    r = hub.clients["admin"].post("/plans", json={"path": "/huge", "limit": {"cpu": 1e307}})
    assert "too large; at most" in json_error(r, 400)


@pytest.mark.parametrize("share", [1e17, 1e308, 5e-324, 1e-4])
def test_an_extreme_share_is_a_400_naming_the_bounds(hub: Hub, share: float) -> None:
    admin = hub.clients["admin"]
    error = json_error(admin.post("/plans", json={"path": "/extreme", "share": share}), 400)
    assert "from 0.001 to 1,000,000" in error
    error = json_error(admin.patch("/plans/sample-project", json={"share": share}), 400)
    assert "from 0.001 to 1,000,000" in error


def test_the_bounds_of_shares_still_schedule(hub: Hub) -> None:
    admin, user1 = hub.clients["admin"], hub.clients["user1"]
    for path, share in (("/tiny", 0.001), ("/giant", 1_000_000)):
        assert admin.post("/plans", json={"path": path, "share": share}).status_code == 201
    submitted = []
    for plan in ("/tiny", "/giant"):
        r = user1.post("/jobs", json={**job(), "plan": plan, "resources": {"gpu": 1}})
        assert r.status_code == 201, r.text
        submitted.append(r.json()["id"])
    for job_id in submitted:  # GPUs are free: both start, the loop is not stalled
        assert user1.wait_state(job_id, {"FINISHED", "FAILED"})["state"] == "FINISHED"
    health = requests.get(hub.api + "/health", timeout=10).json()
    assert health["ok"] is True and health["status"] == "ok"


async def test_a_failing_cycle_shows_in_health_until_one_succeeds(tmp_path, monkeypatch) -> None:
    rig = Rig(tmp_path)
    await rig.start()
    try:

        def broken(snapshot, now, cache=None):  # noqa: ANN001 - the core's signature
            raise ZeroDivisionError("float division by zero")

        real = scheduling.schedule
        monkeypatch.setattr(scheduling, "schedule", broken)
        assert await rig.sched.run_cycle() is False
        assert rig.sched.last_error == "ZeroDivisionError: float division by zero"
        monkeypatch.setattr(scheduling, "schedule", real)
        assert await rig.sched.run_cycle() is True and rig.sched.last_error is None
    finally:
        await rig.sched.stop()
        rig.store.close()


def test_the_core_refuses_shares_outside_its_bounds() -> None:
    tree = plans.PlanTree()
    for share in (plans.MIN_SHARE / 2, plans.MAX_SHARE * 2):
        with pytest.raises(plans.PlanError, match="share must be from"):
            tree.add("/p", share)
    tree.add("/p", plans.MIN_SHARE)
    tree.add("/q", plans.MAX_SHARE)


def test_the_admin_pages_say_when_scheduling_is_failing() -> None:
    from extension.service.admin.handlers import _env

    page = _env.get_template("base.html").render(
        prefix="/services/wmla/", page="plans", user="admin", degraded="ZeroDivisionError: x"
    )
    assert 'id="degraded"' in page and "Scheduling is failing: ZeroDivisionError: x" in page
    quiet = _env.get_template("base.html").render(prefix="/", page="plans", user="admin")
    assert 'id="degraded"' not in quiet
