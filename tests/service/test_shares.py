"""The fair-share API, its samples and its gauges through a real JupyterHub, proxy and service.

The service runs with ``c.WmlaService.fair_share_half_life = "10m"``. Under /fs (two children of
equal share), user1 runs a 2-GPU gang in /fs/a while user2 runs a 1-GPU job in /fs/b, side by
side on the 4 devices. Then ``GET /shares`` gives sshare's rows: usage in GPU-seconds as the jobs'
own start and end times say, /fs/a's twice /fs/b's, each factor ``2 ** (-U / S)`` and ordered
(a < b < 1); user1 sees their own leaf and not user2's; ``/shares/history`` has the usage
growing over the samples; ``/metrics`` has the same factors and usage; an admin's reset forgets
it all. (A hub without history: tests/cli/test_cli.py's ``wmla shares``.)
"""

from __future__ import annotations

import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from .hub import PROXY, Client, Hub
from .openapi_schema import schema_checker
from .shares_hub import HALF_LIFE, shares_hub

pytestmark = pytest.mark.skipif(
    not PROXY.exists(), reason="configurable-http-proxy is missing: run `make install`"
)
SECONDS = 6  # each job's sleep


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory):
    with shares_hub(tmp_path_factory.mktemp("shares-hub"), ("user1", "user2"), "sleep") as hub:
        hub.clients = {n: Client(hub, hub.user_token(n)) for n in ("padmin", "user1", "user2")}
        yield hub


def sleeper(plan: str, workers: int) -> dict:
    return {
        "plan": plan,
        "workers": workers,
        "resources": {"gpu": 1, "cpu": "100m", "memory": "64Mi"},
        "command": {"model_dir": "models/sleep", "model_main": "main.py", "args": [str(SECONDS)]},
    }


@pytest.fixture(scope="module")
def ran(hub: Hub) -> dict:
    """/fs/a and /fs/b (share 1 each); user1's 2-GPU gang in a beside user2's 1 GPU in b."""
    padmin = hub.clients["padmin"]
    for path in ("/fs", "/fs/a", "/fs/b"):
        assert padmin.post("/plans", json={"path": path}).status_code == 201
    jobs = {}
    for user, plan, workers in (("user1", "/fs/a", 2), ("user2", "/fs/b", 1)):
        r = hub.clients[user].post("/jobs", json=sleeper(plan, workers))
        assert r.status_code == 201, r.text
        jobs[user] = r.json()["id"]
    return {u: hub.clients[u].wait_state(j, {"FINISHED", "FAILED"}) for u, j in jobs.items()}


def rows(answer: dict) -> dict[str, dict]:
    return {r["plan"]: r for r in answer["plans"]}


def test_shares_give_sshares_columns_from_the_jobs_that_ran(hub: Hub, ran: dict) -> None:
    assert {j["state"] for j in ran.values()} == {"FINISHED"}, ran
    answer = hub.clients["padmin"].get("/shares").json()
    assert answer["history"] is True and answer["half_life"] == HALF_LIFE
    assert answer["weights"] == {"gpu": 1.0, "cpu": 0.0, "memory": 0.0}
    assert answer["unit"] == "GPU-seconds"
    assert "usage decays by half every 10m; usage in GPU-seconds" in answer["message"]
    by = rows(answer)
    a, b, fs = by["/fs/a"], by["/fs/b"], by["/fs"]
    # GPU-seconds as the jobs' own times say (charged per 1 s cycle: a cycle either side)
    for row, job, gpus in ((a, ran["user1"], 2), (b, ran["user2"], 1)):
        held = gpus * (job["ended"] - job["started"])
        assert held - 2.5 * gpus <= row["raw_usage"] <= held + 2.5 * gpus, (row, held)
        assert row["raw_usage"] >= SECONDS * gpus * 0.9
    assert fs["raw_usage"] == pytest.approx(a["raw_usage"] + b["raw_usage"])
    assert by["/fs/a/user1"]["raw_usage"] == pytest.approx(a["raw_usage"])
    assert by["/fs/b/user2"]["raw_usage"] == pytest.approx(b["raw_usage"])
    total = a["raw_usage"] + b["raw_usage"]
    for row in (a, b):
        assert row["share"] == 1 and row["normalized_share"] == 0.5
        assert row["effective_usage"] == pytest.approx(row["raw_usage"] / total)
        assert row["fair_share_factor"] == pytest.approx(2 ** (-row["effective_usage"] / 0.5))
        assert row["usage_over_share"] == pytest.approx(row["effective_usage"] / 0.5)
    # the gang used about twice as much: its factor is the lower one, both below 1
    assert 1.4 < a["raw_usage"] / b["raw_usage"] < 2.8
    assert a["fair_share_factor"] < b["fair_share_factor"] < 1.0
    # /fs holds all the usage at the top: its factor is the lowest there, the others' 1
    top = [r for r in answer["plans"] if r["parent"] == "/"]
    assert fs["effective_usage"] == 1.0
    assert min(r["fair_share_factor"] for r in top) == fs["fair_share_factor"]
    assert all(r["fair_share_factor"] == 1.0 for r in top if r["plan"] != "/fs")
    under = hub.clients["padmin"].get("/shares", params={"plan": "/fs/"}).json()
    assert sorted(rows(under)) == ["/fs", "/fs/a", "/fs/a/user1", "/fs/b", "/fs/b/user2"]


def test_a_user_sees_every_plan_but_only_their_own_leaf(hub: Hub, ran: dict) -> None:
    user1 = hub.clients["user1"]
    answer = user1.get("/shares").json()
    by = rows(answer)
    assert "/fs/a/user1" in by and "/fs/b/user2" not in by
    assert {"/fs", "/fs/a", "/fs/b"} <= set(by)
    assert answer["hidden_user_leaves"] >= 1
    assert by["/fs/b"]["raw_usage"] > 0  # a plan's figure includes its leaves
    r = user1.get("/shares", params={"plan": "/fs/b/user2"})
    assert r.status_code == 404 and "there is no plan '/fs/b/user2'" in r.json()["error"]
    assert hub.clients["padmin"].get("/shares", params={"plan": "/fs/b/user2"}).ok
    history = user1.get("/shares/history", params={"plan": "/fs/b"}).json()
    assert history["plans"] == []  # b's one child is user2's leaf


@pytest.mark.parametrize(
    ("params", "status", "message"),
    [
        ({"plan": "fs"}, 400, "plan must be a plan path such as /project1/dev-team, got 'fs'"),
        ({"plan": "/nope"}, 404, "there is no plan '/nope'"),
        ({"user": "user2"}, 400, "unknown parameter 'user'; the parameter is plan"),
        ({"plan": ["/fs", "/fs/a"]}, 400, "plan is given 2 times; give it once"),
    ],
)
def test_bad_parameters_are_refused_with_what_to_write(hub: Hub, params, status, message) -> None:
    for path in ("/shares", "/shares/history"):
        r = hub.clients["user1"].get(path, params=params)
        assert r.status_code == status and r.json()["error"] == message, (path, r.text)


def test_history_samples_the_usage_as_it_grew(hub: Hub, ran: dict) -> None:
    history = hub.clients["padmin"].get("/shares/history", params={"plan": "/fs"}).json()
    assert history["history"] is True
    assert history["interval"] == pytest.approx(HALF_LIFE / 360)  # one half-life in the ring
    t = history["t"]
    assert len(t) >= 4 and t == sorted(t)  # a sample every other 1 s cycle, then now
    series = {s["plan"]: s for s in history["plans"]}
    assert sorted(series) == ["/fs/a", "/fs/b"]
    now = rows(hub.clients["padmin"].get("/shares", params={"plan": "/fs"}).json())
    for path in ("/fs/a", "/fs/b"):
        usage, factor = series[path]["raw_usage"], series[path]["fair_share_factor"]
        assert len(usage) == len(factor) == len(t)
        assert usage[0] == 0.0 and factor[0] == 1.0  # sampled before the jobs ran
        assert len(set(usage)) >= 3  # it grew sample by sample while they ran
        assert usage[-1] == pytest.approx(now[path]["raw_usage"], rel=1e-3)
        assert factor[-1] == pytest.approx(now[path]["fair_share_factor"], rel=1e-3)
        assert max(usage) <= now[path]["raw_usage"] * 1.001  # decayed since, never above


def metrics(hub: Hub) -> dict[str, dict[str, float]]:
    headers = hub.clients["padmin"].headers
    r = requests.get(f"{hub.url}/services/wmla/metrics", headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out.setdefault(s.name, {})[s.labels.get("plan", "")] = s.value
    return out


def test_metrics_give_each_plans_factor_and_decayed_usage(hub: Hub, ran: dict) -> None:
    shown = metrics(hub)
    answer = rows(hub.clients["padmin"].get("/shares").json())
    factors, usage = shown["wmla_plan_fair_share_factor"], shown["wmla_plan_usage"]
    for path in ("/fs", "/fs/a", "/fs/b", "/fs/a/user1", "/fs/b/user2", "/sample-project"):
        # decayed to the scrape's moment: a few ms from the answer's at 10 minutes' half-life
        assert factors[path] == pytest.approx(answer[path]["fair_share_factor"], rel=1e-3)
        assert usage[path] == pytest.approx(answer[path]["raw_usage"], rel=1e-3)
    assert factors["/fs/a"] < factors["/fs/b"] < 1.0 and usage["/fs/a"] > usage["/fs/b"] > 0


def test_the_openapi_document_describes_the_answers(hub: Hub, ran: dict) -> None:
    doc = hub.clients["user1"].get("/openapi.json").json()
    assert {"/shares", "/shares/history", "/shares/reset"} <= set(doc["paths"])
    check = schema_checker(doc)
    check(hub.clients["user1"].get("/shares").json(), "Shares")
    check(hub.clients["padmin"].get("/shares/history", params={"plan": "/fs"}).json(),
          "SharesHistory")  # fmt: skip


def test_only_an_admin_resets_and_then_every_usage_is_gone(hub: Hub, ran: dict) -> None:
    r = hub.clients["user1"].post("/shares/reset")
    assert r.status_code == 403
    assert r.json()["error"].startswith("only plan admins may reset the usage history; user1")
    assert rows(hub.clients["padmin"].get("/shares").json())["/fs/a"]["raw_usage"] > 0
    r = hub.clients["padmin"].post("/shares/reset")
    assert r.status_code == 200, r.text
    after = r.json()["plans"]
    assert after and all(row["raw_usage"] == 0 for row in after)
    assert all(row["fair_share_factor"] == 1.0 for row in after)
    time.sleep(1.5)  # a cycle or more later, still nothing (nothing runs)
    assert all(r["raw_usage"] == 0 for r in hub.clients["padmin"].get("/shares").json()["plans"])
    assert not any(metrics(hub).get("wmla_plan_usage", {}).values())
