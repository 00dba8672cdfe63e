"""The usage API and the metrics endpoint over the real scheduling loop, store and handlers (the
store on SQLite, then on PostgreSQL).

The loop, the store and metering are the real ones (the loop over the test double backend of
``tests/service``, driven cycle by cycle). Only authentication is replaced: ``AsUser`` takes the
caller from an ``X-Test-User`` header instead of asking a hub, because this layer tests the
handlers' own rules (ranges, steps, permissions, messages); ``test_hub.py`` runs the same API
behind a real JupyterHub with real tokens.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from urllib.parse import urlencode

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tornado import web
from tornado.httpclient import AsyncHTTPClient
from tornado.httpserver import HTTPServer

from extension.metering.handlers import MeasuredHandler, MetricsHandler, UsageHandler
from extension.metering.meter import Metering
from tests.service.test_scheduling import Rig

USERS = {
    "user1": {"name": "user1", "admin": False, "groups": [], "scopes": []},
    "user2": {"name": "user2", "admin": False, "groups": [], "scopes": []},
    "padmin": {"name": "padmin", "admin": False, "groups": [], "scopes": ["custom:wmla:admin"]},
}


class AsUser:
    """Test-only stand-in for HubOAuth: the caller named in the X-Test-User header."""

    def get_current_user(self):
        return USERS.get(self.request.headers.get("X-Test-User", ""))


class UsageAsUser(AsUser, UsageHandler):
    pass


class MetricsAsUser(AsUser, MetricsHandler):
    pass


class MeasuredAsUser(AsUser, MeasuredHandler):
    pass


@pytest.fixture(scope="module")
async def api(tmp_path_factory: pytest.TempPathFactory, module_store_url: str):
    rig = Rig(Path(tmp_path_factory.mktemp("metering")), module_store_url)
    await rig.start()
    meter = Metering(store=rig.store, clock=rig.clock, sample_interval=3600)
    meter.attach(rig.sched)
    app = web.Application(
        [
            (r"/usage", UsageAsUser),
            (r"/metrics", MetricsAsUser),
            (r"/usage/jobs/([^/]+)", MeasuredAsUser),
        ],
        wmla_meter=meter,
        wmla_scheduler=rig.sched,
        cookie_secret="x",
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = HTTPServer(app)
    server.listen(port, "127.0.0.1")
    rig.url = f"http://127.0.0.1:{port}"
    rig.meter = meter
    try:
        rig.jobs = [
            await rig.submit("user1", "/project1/dev-team", "2"),
            await rig.submit("user2", "/project1/dev-team", "2"),
        ]
        await rig.cycle()
        await rig.cycle()  # the running events
        rig.clock.offset += 3600  # an hour of both jobs running
        await rig.cycle()
        yield rig
    finally:
        server.stop()
        await rig.sched.stop()
        rig.store.close()


async def get(rig, path: str, as_user: str | None, **params):
    headers = {"X-Test-User": as_user} if as_user else {}
    url = f"{rig.url}{path}?{urlencode(params)}" if params else rig.url + path
    return await AsyncHTTPClient().fetch(url, headers=headers, raise_error=False)


def error(r, status: int) -> str:
    assert r.code == status, (r.code, r.body)
    assert r.headers["Content-Type"].startswith("application/json")
    body = json.loads(r.body)
    assert body["status"] == status and body["error"]
    return body["error"]


async def test_admin_sees_every_leaf_with_the_hour_each_job_ran(api) -> None:
    r = await get(api, "/usage", "padmin", plan="/project1/dev-team", start="now-2h", step="1h")
    assert r.code == 200, r.body
    answer = json.loads(r.body)
    rows = {c["path"]: c["totals"] for c in answer["children"]}
    assert set(rows) == {"/project1/dev-team/user1", "/project1/dev-team/user2"}
    for totals in rows.values():  # 2 GPUs for (about) the hour the clock moved
        assert totals["used"]["gpu_hours"] == pytest.approx(2.0, rel=0.01)
        assert totals["requested"]["gpu_hours"] == pytest.approx(2.0, rel=0.01)
    assert answer["totals"]["gpu_hours"] == sum(t["gpu_hours"] for t in rows.values())
    assert len(answer["series"]["t"]) == 2 and answer["step"] == 3600
    assert answer["series"]["used"]["gpu"][1] == pytest.approx(4.0, rel=0.01)


async def test_ranges_and_steps(api) -> None:
    now = int(api.clock())
    r = await get(api, "/usage", "padmin", plan="/project1", start=now - 7200, end=now, step="30m")
    answer = json.loads(r.body)
    assert answer["series"]["t"] == [now - 7200 + i * 1800 for i in range(4)]
    assert [c["path"] for c in answer["children"]] == ["/project1/dev-team"]
    r = await get(api, "/usage", "padmin")  # defaults: the root, the last day, 5-minute steps
    answer = json.loads(r.body)
    assert answer["plan"] == "/" and answer["step"] == 300 and len(answer["series"]["t"]) == 288
    assert answer["end"] - answer["start"] == 86400
    r = await get(
        api, "/usage", "padmin", start="2026-01-01T00:00:00Z", end="2026-01-02", step=3600
    )
    answer = json.loads(r.body)
    assert answer["start"] == 1767225600 and len(answer["series"]["t"]) == 24
    assert answer["totals"]["gpu_hours"] == 0  # nothing ran then
    r = await get(api, "/usage", "padmin", plan="/project1", start=now - 5400, end=now, step=3600)
    assert len(json.loads(r.body)["series"]["t"]) == 2  # the last step is the shorter rest


async def test_users_see_only_their_own_leaves(api) -> None:
    r = await get(api, "/usage", "user2", plan="/project1/dev-team", start="now-2h")
    answer = json.loads(r.body)
    assert [c["path"] for c in answer["children"]] == ["/project1/dev-team/user2"]
    assert answer["user"] == "user2"
    r = await get(api, "/usage", "user2", plan="/project1/dev-team/user1", start="now-2h")
    answer = json.loads(r.body)
    assert answer["children"] == [] and answer["totals"]["gpu_hours"] == 0
    message = error(await get(api, "/usage", "user2", user="user1"), 403)
    assert "your own usage" in message and "user=user2" in message
    r = await get(api, "/usage", "padmin", plan="/project1", user="user1", start="now-2h")
    assert [c["path"] for c in json.loads(r.body)["children"]] == ["/project1/dev-team/user1"]
    assert "token" in error(await get(api, "/usage", None), 403)


@pytest.mark.parametrize(
    ("params", "status", "words"),
    [
        ({"start": "yesterday"}, 400, "ISO 8601"),
        ({"step": "0"}, 400, "more than 0"),
        ({"step": "fast"}, 400, "duration such as"),
        ({"start": "now-1s", "step": "5ms"}, 400, "at least 1 second"),
        ({"start": "now-30d", "step": "1s"}, 400, "ask for step >="),
        ({"start": "now", "end": "now-1h"}, 400, "must be before end"),
        ({"start": "now-500d"}, 400, "at most 400 days"),
        ({"format": "xml"}, 400, "json or csv"),
        ({"plans": "/project1"}, 400, "unknown parameter 'plans'"),
        ({"plan": "project1"}, 400, "plan path such as"),
        ({"plan": "/nope"}, 404, "no plan '/nope'"),
        ({"user": "a b"}, 400, "not a hub user name"),
    ],
    ids=lambda v: str(v) if not isinstance(v, dict) else "&".join(f"{k}={x}" for k, x in v.items()),
)
async def test_bad_parameters_answer_4xx_with_a_message(api, params, status, words) -> None:
    assert words in error(await get(api, "/usage", "padmin", **params), status)


async def test_csv_export_for_chargeback(api) -> None:
    r = await get(api, "/usage", "user1", plan="/project1", start="now-2h", step="1h", format="csv")
    assert r.code == 200 and r.headers["Content-Type"].startswith("text/csv")
    assert "attachment" in r.headers["Content-Disposition"]
    lines = r.body.decode().strip().split("\n")
    assert lines[0].startswith("plan,start,end,requested_gpu_hours,used_gpu_hours")
    assert [line.split(",")[0] for line in lines[1:]] == ["/project1/dev-team/user1"] * 2
    assert sum(float(line.split(",")[4]) for line in lines[1:]) == pytest.approx(2.0, rel=0.01)


async def test_metrics_parse_and_carry_the_loop_figures(api) -> None:
    assert "plan admins" in error(await get(api, "/metrics", "user1"), 403)
    r = await get(api, "/metrics", "padmin")
    assert r.code == 200 and r.headers["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(r.body.decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value

    def value(name: str, **labels) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    team = "/project1/dev-team"
    assert value("wmla_plan_used", plan=team, resource="gpu") == 4
    assert value("wmla_plan_used", plan=team + "/user1", resource="gpu") == 2
    assert value("wmla_plan_used", plan=team, resource="cpu") == 1.0  # 4 x 250m, in cores
    assert value("wmla_plan_requested", plan="/", resource="gpu") == 4
    assert value("wmla_plan_limit", plan=team, resource="gpu") == 4
    assert ("wmla_plan_limit", (("plan", "/project1"), ("resource", "gpu"))) not in samples
    assert value("wmla_plan_deserved", plan=team, resource="gpu") == 4
    assert value("wmla_plan_jobs", plan=team, state="running") == 2
    assert value("wmla_plan_jobs", plan=team, state="pending") == 0
    assert value("wmla_preemptions_total", plan=team) == 0
    cycles = value("wmla_scheduling_cycles_total")
    assert cycles == api.sched.cycles >= 3
    assert value("wmla_scheduling_cycle_duration_seconds_count") == cycles


def test_openapi_document_lists_usage() -> None:
    from extension.service.openapi import openapi_document

    doc = openapi_document()
    usage = doc["paths"]["/usage"]["get"]
    assert {p["name"] for p in usage["parameters"]} == {
        "plan",
        "user",
        "start",
        "end",
        "step",
        "format",
    }
    refs = {
        r["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
        for code, r in usage["responses"].items()
        if code != "200"
    }
    assert refs <= set(doc["components"]["schemas"])


def test_knobs_come_from_the_service_config(store_url: str) -> None:
    from traitlets.config import Config

    from extension.service.app import WmlaService
    from extension.service.store import Store

    service = WmlaService()
    service.update_config(Config({"Metering": {"bucket": 900, "full_resolution": 86400}}))
    store = Store.open(store_url)
    try:
        meter = Metering(parent=service, store=store)
        assert (meter.bucket, meter.full_resolution) == (900, 86400)
        assert meter.ledger.bucket == 900_000 and meter.ledger.window == 86_400_000
    finally:
        store.close()


async def test_metrics_can_leave_user_leaves_out(api) -> None:
    api.meter.metrics_user_leaves = False
    try:
        r = await get(api, "/metrics", "padmin")
    finally:
        api.meter.metrics_user_leaves = True
    plans = {
        s.labels.get("plan")
        for family in text_string_to_metric_families(r.body.decode())
        for s in family.samples
    }
    assert "/project1/dev-team" in plans and "/project1/dev-team/user1" not in plans


async def test_measured_utilization_of_a_running_job(api) -> None:
    """The double runs no processes: its jobs' 'workers' are this test process."""
    api.backend.worker_pids = lambda job_id: [os.getpid()]
    try:
        api.meter.sample(time.time())
        api.meter.sample(time.time() + 1)
    finally:
        del api.backend.worker_pids
    job = api.jobs[0]
    r = await get(api, f"/usage/jobs/{job}", "user1")
    answer = json.loads(r.body)
    assert answer["sampling"] and len(answer["samples"]) == 2
    assert answer["samples"][-1]["memory_bytes"] > 0
    assert "no job" in error(await get(api, f"/usage/jobs/{job}", "user2"), 404)
    assert (await get(api, f"/usage/jobs/{job}", "padmin")).code == 200
    r = await get(api, "/metrics", "padmin")
    assert f'wmla_job_measured_memory_bytes{{job="{job}",plan="/project1/dev-team/user1"}}' in (
        r.body.decode()
    )


async def test_used_matches_what_the_scheduler_allocated(api) -> None:
    """The ledger (from transitions) and the core's own figures agree after a cycle."""
    await api.cycle()
    figures = api.sched.figures
    assert "/project1/dev-team/user1" in figures
    for path, fig in figures.items():
        gpu, cpu, memory = api.meter.ledger.current(path, "used")
        assert (gpu / 1000, cpu, memory) == tuple(fig.allocated), path
