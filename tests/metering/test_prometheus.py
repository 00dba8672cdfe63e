"""The shipped Grafana dashboard's queries through a real Prometheus scraping a real hub.

Debian's Prometheus (installed by .ci/run; started here by PID on a free port with its own
storage folder, never the Debian service) scrapes the wmla service with the shipped scrape job
(hub_config/grafana/prometheus.yml: only its target, token file and interval changed) through the
hub's proxy, and loads the shipped alert rules. A 2-worker job of user1 runs. Then every query of
hub_config/grafana/wmla-metering.json, with its variables substituted, is evaluated over the
job's window through Prometheus's HTTP API (``query_range``), and each returned point is checked
against what the REST API said for the same moment:

- requested, used (plans and the parent's children): the usage API's step function
  (``/usage`` ``changes``), exact;
- deserved, limit: ``/plans``, polled through the run;
- pending and running jobs: the job's own history (``/jobs/<id>/history``);
- preemptions per hour: ``/churn`` (no job was preempted: every plan's figure is 0);
- cycles per second: ``/health``'s cycle count over the run; cycle duration p50/p95: the REST
  API has no cycle durations, so they are checked to lie within the histogram's buckets;
- measured CPU per job: the job's samples (``/usage/jobs/<id>``), the same sampler's figures;
- fair-share factor and decayed usage (the hub keeps a usage history, half-life 1 h): ``/shares``,
  polled through the run; the leaf is its parent's only child, so its factor is 1 before it ran
  and exactly 0.5 after (``2 ** (-1 / 1)``), and its usage, which decays between polls, lies
  between what the polls around the point said;
- GPU utilization per job: empty unless NVML answers (``gpu_available`` of the same samples).

A Prometheus value is read at the last scrape before the evaluation time, and the service
computes its figures when it is scraped, so a point must equal the REST figure at some moment
within the scrape interval (plus one cycle) before it.

The alert rules load into that Prometheus and evaluate without error or alert on the healthy
run; and with the service's store locked by another process, the store alert's shipped
expression (its window shortened) returns the target while /metrics still answers.

Queries that may rightly return no series, and why, are printed at the end: GPU utilization
without NVML. ``wmla_preemptions_total`` is never incremented here (nothing is preempted) but
is exported at 0 for every plan, so "preemptions per hour" returns zeros, not nothing.
"""

from __future__ import annotations

import bisect
import json
import re
import shutil
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
import requests
import yaml

from tests.service.hub import PROXY, REPO, Client, Hub, free_port

PROMETHEUS = shutil.which("prometheus")
pytestmark = [
    pytest.mark.skipif(
        PROMETHEUS is None,
        reason="Debian's prometheus is not installed (.ci/run installs it: apt-get install "
        "prometheus); the shipped dashboard's queries are not run against a real Prometheus",
    ),
    pytest.mark.skipif(
        not PROXY.exists(), reason="configurable-http-proxy is missing: run `make install`"
    ),
]

SCRAPE = REPO / "hub_config" / "grafana" / "prometheus.yml"
DASHBOARDS = sorted((REPO / "hub_config" / "grafana").glob("*.json"))  # wmla-metering.json
RULES = REPO / "hub_config" / "prometheus" / "wmla-alerts.yml"
PLAN = "/sample-project/training"
LEAF = f"{PLAN}/user1"
PLANS = [PLAN, LEAF]  # the dashboard's $plan (several)
PARENT = PLAN  # the dashboard's $parent: its child is user1's leaf
LIMIT = {"gpu": 3, "cpu": "2", "memory": "1Gi"}  # so that the limit query has series
SCRAPE_INTERVAL = 1.0
# A point at time T is the last scrape before T, stamped when it began and computed when the
# service answered: it reflects the REST figures of a moment from BEFORE seconds before T (a
# scrape interval, a cycle, some slack) to AFTER seconds after it (the scrape's own latency).
BEFORE = SCRAPE_INTERVAL + 2.0
AFTER = 1.0
SCRIPT = "import time\nt = time.time()\nwhile time.time() - t < 4:\n    pass\n"
HALF_LIFE = 3600.0  # the hub's fair_share_half_life ("1h")
API_SCALE = {"gpu": 1.0, "cpu": 1000.0, "memory": 1.0}  # the REST API's cpu is millicores
RESOURCES = ("gpu", "cpu", "memory")


# -- Prometheus, by PID ----------------------------------------------------------------------
class Prometheus:
    def __init__(self, folder: Path, target: str, token_file: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        config = yaml.safe_load(SCRAPE.read_text())
        job = config["scrape_configs"][0]
        # the shipped job, pointed at this hub: only target, token file and interval change
        job["static_configs"] = [{"targets": [target]}]
        job["authorization"]["credentials_file"] = str(token_file)
        job["scrape_interval"] = f"{SCRAPE_INTERVAL:g}s"
        config["global"] = {"evaluation_interval": "1s"}
        config["rule_files"] = [str(RULES)]
        self.config = folder / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(config))
        self.log_path = folder / "prometheus.log"

    def start(self, timeout: float = 30) -> None:
        assert PROMETHEUS is not None
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={self.config}",
                    f"--storage.tsdb.path={self.folder / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if requests.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"prometheus did not come up:\n{self.log()}")

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            proc = psutil.Process(self.proc.pid)
            proc.terminate()
            proc.wait(15)
        except psutil.TimeoutExpired:
            proc.kill()
        except psutil.Error:
            pass
        self.proc.wait(10)
        self.proc = None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def api(self, path: str, **params: object) -> dict:
        r = requests.get(f"{self.url}/api/v1/{path}", params=params, timeout=30)
        assert r.status_code == 200, f"{path} {params}: {r.status_code} {r.text}"
        body = r.json()
        assert body["status"] == "success", body
        return body["data"]

    def wait_target_up(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        targets: list = []
        while time.monotonic() < deadline:
            targets = self.api("targets")["activeTargets"]
            if targets and all(t["health"] == "up" for t in targets):
                return
            time.sleep(0.3)
        raise AssertionError(f"the wmla target never came up: {targets}\n{self.log()}")


# -- what the REST API said through the run -----------------------------------------------------
@dataclass
class Record:
    """REST figures polled during the run, each with the time it was read."""

    job: dict = field(default_factory=dict)
    plans: list[tuple[float, dict]] = field(default_factory=list)  # path -> plan JSON
    samples: dict[float, dict] = field(default_factory=dict)  # the job's samples by "at"
    gpu_available: bool = False
    cycles: list[tuple[float, int]] = field(default_factory=list)  # /health's count
    shares: list[tuple[float, dict]] = field(default_factory=list)  # path -> /shares row
    start: float = 0.0
    end: float = 0.0


def _poll(hub: Hub, padmin: Client, user1: Client, job_id: str | None, record: Record) -> None:
    now = time.time()
    flat = padmin.get("/plans").json()
    plans = {p["path"]: p for p in flat["plans"]}
    plans["/"] = flat["root"]
    record.plans.append((now, plans))
    rows = padmin.get("/shares", params={"plan": PARENT}).json()["plans"]
    record.shares.append((now, {r["plan"]: r for r in rows}))
    r = user1.get(f"/usage/jobs/{job_id}") if job_id else None
    if r is not None and r.status_code == 200:
        body = r.json()
        record.gpu_available = record.gpu_available or bool(body.get("gpu_available"))
        for sample in body["samples"]:
            record.samples[sample["at"]] = sample
    health = requests.get(f"{hub.api}/health", timeout=10).json()
    record.cycles.append((now, health["cycles"]))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Hub, Prometheus, Record]]:
    tmp = tmp_path_factory.mktemp("prometheus-hub")
    traits = {"tick": 1, "grace": 2, "device_layout": "1x4", "cpu_oversubscription": 2,
              "fair_share_half_life": "1h"}  # fmt: skip
    hub = Hub(tmp, traits)
    with open(hub.config, "a") as f:  # a measured sample every second, for the job's panels
        f.write(
            'config = json.loads(service["environment"]["WMLA_SERVICE_CONFIG"])\n'
            'config["Metering"] = {"sample_interval": 1}\n'
            'service["environment"]["WMLA_SERVICE_CONFIG"] = json.dumps(config)\n'
        )
    prometheus = None
    try:
        hub.start()
        padmin = Client(hub, hub.user_token("padmin"))
        user1 = Client(hub, hub.user_token("user1"))
        r = padmin.patch(f"/plans{PLAN}", json={"limit": LIMIT})
        assert r.status_code == 200, r.text
        token_file = tmp / "wmla-token"  # a plan admin's token: /metrics needs one
        token_file.write_text(padmin.headers["Authorization"].split()[1])
        token_file.chmod(0o600)
        folder = hub.storage / "user1" / "models" / "busy"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "main.py").write_text(SCRIPT)
        prometheus = Prometheus(tmp, f"127.0.0.1:{hub.port}", token_file)
        prometheus.start()
        prometheus.wait_target_up()
        record = Record(start=time.time())
        while time.time() < record.start + 2 * SCRAPE_INTERVAL:  # idle scrapes before the job
            _poll(hub, padmin, user1, None, record)
            time.sleep(0.3)
        body = {
            "plan": PLAN,
            "workers": 2,
            "resources": {"gpu": 1, "cpu": "100m", "memory": "64Mi"},
            "command": {"model_dir": "models/busy", "model_main": "main.py"},
        }
        r = user1.post("/jobs", json=body)
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            _poll(hub, padmin, user1, job_id, record)
            job = user1.get(f"/jobs/{job_id}").json()
            if job["state"] in ("FINISHED", "FAILED"):
                break
            time.sleep(0.3)
        assert job["state"] == "FINISHED", f"{job}\n{hub.log()}"
        ended = time.time()
        while time.time() < ended + 3 * SCRAPE_INTERVAL:  # idle again, a few scrapes
            _poll(hub, padmin, user1, job_id, record)
            time.sleep(0.3)
        record.end = time.time()
        record.job = user1.get(f"/jobs/{job_id}").json()
        record.job["history"] = user1.get(f"/jobs/{job_id}/history").json()["transitions"]
        time.sleep(2 * SCRAPE_INTERVAL)  # the scrapes of the window's end are stored
        hub.clients = {"padmin": padmin, "user1": user1}
        yield hub, prometheus, record
    finally:
        if prometheus is not None:
            prometheus.stop()
        hub.stop()


# -- the dashboard ---------------------------------------------------------------------------
def dashboard_queries() -> list[tuple[str, str, str]]:
    """(panel title, expr, legendFormat) of every target of every shipped dashboard, rows'
    nested panels included."""

    def walk(panels: list) -> Iterator[dict]:
        for panel in panels:
            yield panel
            yield from walk(panel.get("panels", []))

    assert DASHBOARDS, "no dashboard in hub_config/grafana"
    return [
        (panel.get("title", ""), target["expr"], target.get("legendFormat", ""))
        for board in DASHBOARDS
        for panel in walk(json.loads(board.read_text())["panels"])
        for target in panel.get("targets", [])
        if target.get("expr")
    ]


def grafana_regex(values: list[str]) -> str:
    """A multi-value variable as Grafana's Prometheus data source writes it into a regex."""
    escaped = [re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\1", v) for v in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def substitute(expr: str, resource: str) -> str:
    out = expr.replace("$resource", resource).replace("${resource}", resource)
    out = out.replace("$parent", PARENT).replace("$plan", grafana_regex(PLANS))
    assert "$" not in out, f"a dashboard variable the test does not substitute: {out}"
    return out


# -- step functions of the REST figures ----------------------------------------------------------
def step(times: list[float], values: list[float]) -> Callable[[float], float]:
    def at(t: float) -> float:
        value = values[0] if values else 0.0
        for when, v in zip(times, values):
            if when > t:
                break
            value = v
        return value

    return at


def usage_step(client: Client, plan: str, kind: str, resource: str, record: Record) -> Callable:
    r = client.get(
        "/usage",
        params={"plan": plan, "start": record.start - 5, "end": record.end + 5, "step": 1},
    )
    assert r.status_code == 200, r.text
    changes = r.json()["changes"]
    assert changes is not None, "the usage API left out the change points"
    values = [v / API_SCALE[resource] for v in changes[kind][resource]]
    return step(changes["t"], values)


def plans_step(record: Record, plan: str, key: str, resource: str) -> Callable:
    times, values = [], []
    for when, plans in record.plans:
        if plan not in plans:  # a user leaf, before the job created it
            continue
        amount = plans[plan][key].get(resource)
        times.append(when)
        values.append(float("nan") if amount is None else amount / API_SCALE[resource])
    return step(times, values)


def jobs_step(record: Record, state: str) -> Callable:
    history = record.job["history"]
    times = [t["at"] for t in history]
    values = [1.0 if t["state"] == state.upper() else 0.0 for t in history]
    return lambda t: step(times, values)(t) if t >= times[0] else 0.0


def shares_polls(record: Record, plan: str, key: str) -> list[tuple[float, float]]:
    """(time, figure) of ``plan``'s ``/shares`` row at every poll that had it."""
    return [(when, rows[plan][key]) for when, rows in record.shares if plan in rows]


def between(points: list, polls: list[tuple[float, float]], what: str) -> int:
    """Every point lies between the least and the most the polls said from BEFORE seconds
    before it to AFTER seconds after it, with the poll either side (a figure that moves
    between polls, as decayed usage does, is bracketed by them; past the last poll it may
    have decayed for those seconds at most: the half-life is an hour)."""
    times = [when for when, _ in polls]
    keep = 0.5 ** ((BEFORE + AFTER) / HALF_LIFE)
    for t, raw in points:
        lo = max(0, bisect.bisect_left(times, t - BEFORE) - 1)
        hi = bisect.bisect_right(times, t + AFTER) + 1
        seen = [v for _, v in polls[lo:hi]]
        value = float(raw)
        # and past the last poll a leaf may still charge its job's 2 GPUs for those seconds
        grown = 2 * (BEFORE + AFTER)
        assert seen and min(seen) * keep - 1e-9 <= value <= max(seen) + grown, (
            f"{what}: {value} at {t:.3f}, /shares said {sorted(seen)} around then"
        )
    return len(points)


def agrees(points: list, expected: Callable[[float], float], what: str) -> int:
    """Every point equals the REST figure at some moment from BEFORE seconds before it to AFTER
    seconds after it; returns how many points were checked."""
    for t, raw in points:
        value = float(raw)
        moments = [t - BEFORE + i * 0.05 for i in range(int((BEFORE + AFTER) / 0.05) + 1)]
        seen = {expected(m) for m in moments}
        assert any(abs(value - s) <= 1e-9 * max(1.0, abs(s)) for s in seen), (
            f"{what}: {value} at {t:.3f}, REST said {sorted(seen)} around then"
        )
    return len(points)


def legend(fmt: str, labels: dict) -> str:
    missing = [name for name in re.findall(r"{{\s*(\w+)\s*}}", fmt) if name not in labels]
    assert not missing, f"legend {fmt!r} names labels the series lacks: {missing} ({labels})"
    return re.sub(r"{{\s*(\w+)\s*}}", lambda m: labels[m.group(1)], fmt)


# -- the test ----------------------------------------------------------------------------------
def test_every_dashboard_query_agrees_with_the_rest_api(run) -> None:
    hub, prometheus, record = run
    padmin = hub.clients["padmin"]
    job_id = record.job["id"]
    window = {"start": record.start, "end": record.end, "step": 0.5}
    queries = dashboard_queries()
    assert len(queries) >= 13, queries
    empty: dict[str, str] = {}  # query -> why no series is right
    checked = 0
    for title, template, fmt in queries:
        resources = RESOURCES if "$resource" in template else ("gpu",)
        for resource in resources:
            expr = substitute(template, resource)
            series = prometheus.api("query_range", query=expr, **window)["result"]
            what = f"{title!r}: {expr}"
            labels = [s["metric"] for s in series]
            for s in series:
                legend(fmt, s["metric"])
            if "wmla_plan_requested" in expr or "wmla_plan_used" in expr:
                kind = "requested" if "wmla_plan_requested" in expr else "used"
                want = sorted(PLANS) if "$plan" in template else [LEAF]  # $parent's child
                assert sorted(lb["plan"] for lb in labels) == want, (what, labels)
                for s in series:
                    f = usage_step(padmin, s["metric"]["plan"], kind, resource, record)
                    checked += agrees(s["values"], f, f"{what} {s['metric']['plan']}")
                    if resource == "gpu":  # the job's 2 GPUs were seen
                        assert max(float(v) for _, v in s["values"]) == 2, (what, s)
            elif "wmla_plan_deserved" in expr or "wmla_plan_limit" in expr:
                key = "deserved" if "deserved" in expr else "limit"
                assert sorted(lb["plan"] for lb in labels) == (
                    sorted(PLANS) if key == "deserved" else [PLAN]  # only PLAN has a limit
                ), (what, labels)
                for s in series:
                    f = plans_step(record, s["metric"]["plan"], key, resource)
                    checked += agrees(s["values"], f, f"{what} {s['metric']['plan']}")
            elif "wmla_plan_jobs" in expr:
                got = sorted((lb["plan"], lb["state"]) for lb in labels)
                assert got == sorted((p, st) for p in PLANS for st in ("pending", "running"))
                for s in series:
                    f = jobs_step(record, s["metric"]["state"])
                    checked += agrees(s["values"], f, f"{what} {s['metric']}")
                running = next(
                    s for s in series if s["metric"] == {"plan": LEAF, "state": "running"}
                )
                assert max(float(v) for _, v in running["values"]) == 1
            elif "wmla_preemptions_total" in expr:
                churn = padmin.get("/churn").json()["plans"]
                preempted = {p["path"]: p["preemptions"] for p in churn}
                assert sorted(lb["plan"] for lb in labels) == sorted(PLANS), (what, labels)
                for s in series:
                    n = preempted.get(s["metric"]["plan"], 0)
                    checked += agrees(s["values"], lambda t, n=n: float(n), what)
            elif "wmla_plan_fair_share_factor" in expr or "wmla_plan_usage" in expr:
                key = "fair_share_factor" if "factor" in expr else "raw_usage"
                assert [lb["plan"] for lb in labels] == [LEAF], (what, labels)  # $parent's
                polls = shares_polls(record, LEAF, key)
                checked += between(series[0]["values"], polls, what)
                values = {float(v) for _, v in series[0]["values"]}
                if key == "fair_share_factor":  # its parent's only child: 1, then 2 ** -1
                    assert values <= {1.0, 0.5} and 0.5 in values, (what, values)
                else:  # the job's 2 GPUs for about 4 s, in GPU-seconds
                    assert 6 <= max(values) <= 12, (what, values)
            elif "histogram_quantile" in expr:
                assert len(series) == 1, (what, series)
                values = [float(v) for _, v in series[0]["values"] if v != "NaN"]
                assert values, f"{what}: no cycle observed"
                assert all(0 < v <= 10 for v in values), (what, values)  # within the buckets
                checked += len(values)
            elif "wmla_scheduling_cycles_total" in expr:
                assert len(series) == 1, (what, series)
                # rate() divides the increase by the whole 5 minutes, and the series is younger
                # than that: the value x 300 is the cycles since Prometheus's first scrape, a
                # moment before the first /health read (cycles run about every second)
                (_, n_a), (t_b, n_b) = record.cycles[0], record.cycles[-1]
                t, rate = min(series[0]["values"], key=lambda p: abs(p[0] - t_b))
                assert abs(t - t_b) <= 0.5, (what, t, t_b)
                assert float(rate) * 300 == pytest.approx(n_b - n_a, abs=max(4, 0.2 * (n_b - n_a)))
                checked += 1
            elif "wmla_job_measured_cpu_cores" in expr:
                assert [lb["plan"] for lb in labels] == [LEAF], (what, labels)
                assert job_id in legend(fmt, labels[0]), f"{what}: legend {fmt!r} hides the job"
                sampled = {s["cpu_cores"] for s in record.samples.values()}
                for _, v in series[0]["values"]:
                    assert float(v) in sampled, (what, v, sorted(sampled))
                    checked += 1
                assert max(float(v) for _, v in series[0]["values"]) > 0
            elif "wmla_job_measured_gpu_utilization" in expr:
                if not record.gpu_available:
                    assert series == [], what
                    empty[expr] = "no NVML on this machine: no GPU utilization is sampled"
                    continue
                sampled = {s["gpu_utilization"] for s in record.samples.values()}
                for s in series:
                    assert job_id in legend(fmt, s["metric"])
                    for _, v in s["values"]:
                        assert float(v) in sampled, (what, v)
                        checked += 1
            elif "wmla_storage_" in expr:
                # this hub holds no storage quota (its jobs run as the service's account): the
                # families are checked where quotas are held (tests/security/test_storage_quota)
                assert series == [], (what, series)
                empty[expr] = "no storage quota on this hub"
                continue
            else:
                raise AssertionError(f"a dashboard query this test does not check: {what}")
            if not series:
                raise AssertionError(f"{what}: no series")
    assert checked > 100, checked
    print(f"\n{len(queries)} dashboard queries, {checked} points checked; empty: {empty}")


def test_the_alert_rules_load_and_stay_quiet_on_a_healthy_run(run) -> None:
    _, prometheus, _ = run
    groups = prometheus.api("rules", type="alert")["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert len(rules) == 8, rules  # hub_config/prometheus/wmla-alerts.yml
    for rule in rules:
        assert rule["health"] == "ok", rule
        assert rule["state"] != "firing", rule


def test_a_locked_store_fires_the_store_alerts_expression(run) -> None:
    """The premise of WmlaStoreUnavailable on the real service: while the store refuses writes,
    /metrics still answers (up is 1) and the cycle counter stops. The shipped expression, its
    2-minute window shortened to 3 s, is empty before the lock and returns the target during it."""
    hub, prometheus, _ = run
    rules = yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
    shipped = next(r["expr"] for r in rules if r["alert"] == "WmlaStoreUnavailable")
    assert "[2m]" in shipped, shipped
    expr = shipped.replace("[2m]", "[3s]")
    healthy = time.time()
    time.sleep(2 * SCRAPE_INTERVAL)
    assert prometheus.api("query", query=expr, time=healthy)["result"] == []
    lock = sqlite3.connect(hub.var / "wmla" / "wmla.sqlite", timeout=10)
    try:
        lock.execute("BEGIN EXCLUSIVE")  # what another process holding the database does
        deadline = time.monotonic() + 30
        health: dict = {}
        while time.monotonic() < deadline:  # the service finds out at its next write
            health = requests.get(f"{hub.api}/health", timeout=10).json()
            if "StoreUnavailable" in health.get("error", ""):
                break
            time.sleep(0.3)
        assert "StoreUnavailable" in health.get("error", ""), health
        down = time.time()
        time.sleep(3 + 2 * SCRAPE_INTERVAL)
        at = down + 3 + SCRAPE_INTERVAL
        up = prometheus.api("query", query='up{job="wmla"}', time=at)["result"]
        assert [float(s["value"][1]) for s in up] == [1.0], up  # /metrics still answered
        fired = prometheus.api("query", query=expr, time=at)["result"]
        assert [s["metric"]["job"] for s in fired] == ["wmla"], (expr, fired)
    finally:
        lock.rollback()
        lock.close()
    wait = time.monotonic() + 30
    while requests.get(f"{hub.api}/health", timeout=10).json().get("status") != "ok":
        assert time.monotonic() < wait, "the service did not find its store back"
        time.sleep(0.3)
