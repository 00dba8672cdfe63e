"""Service load benchmark: concurrent clients submitting jobs through a real hub and proxy.

    .venv/bin/python benchmarks/bench_service.py [--jobs N] [--clients C] [--quick] [--json]
        [--finish-after S] [--profile py-spy|cprofile] [--keep] [--as-root] [--warm]

World: the repository's own jupyterhub_config.py in a subprocess (tests/service/hub.py: the
real JupyterHub, configurable-http-proxy, the wmla service and its SQLite store), with one
change: ``c.WmlaService.backend_class`` is ``benchmarks.instant_backend.InstantBackend``, whose
jobs emit ``running`` and ``finished`` as soon as they are started (``--finish-after``
seconds apart). ``--clients`` hub users (50) each hold their own hub API token and submit,
one request at a time, through the proxy at /services/wmla/api/v1/jobs until ``--jobs``
(10,000; ``--quick`` 1,000) were sent: one-GPU jobs on a 4x8 device layout.

Measured, in the same run:
- the baseline: the same clients sending a trivial authenticated GET (``api/v1/``, who am I)
  through the same proxy, before the load;
- submissions per second (overall, and over the middle 80% of the answers: sustained), the
  submit latency p50/p99/max, and answers other than 201;
- the same GET, one client every 50 ms, during the load (what a reader waits meanwhile);
- the time from the first submission until every job was admitted (its ``started``), and until
  every job had ended;
- the scheduling loop: every cycle's own duration (core + store writes, the figure the loop
  hands its ``cycle_hooks``) p50/p99/max and the share of the load's time the loop was busy,
  and the event loop's lag (a 10 ms timer's lateness: what held the loop, cycles or handlers);
- CPU seconds of the service, the hub, the proxy and the benchmark's own clients over the load,
  and the service's RSS: peak during the load, and when each tenth of the answers had come
  (``rss_mib_by_tenth``; ``rss_growth_after_first_tenth_mib``: the most it grew past the first
  tenth, under 10 MiB at 100,000 jobs is issue 31's goal);
- lost and duplicated jobs: the ids answered 201 against ``GET /jobs`` (all jobs, as a plan
  admin) at the end; must both be 0 (the exit status is 1 otherwise), and every job FINISHED.

``--warm``: before the load, each client submits one job, all at once, timed apart (new
users' first jobs make their accounts, helpers, folders and storage images), and the load
starts once those ended: the load is then of users the service knows, as a running hub's are.

``--as-root`` (as root, with useradd): the path a deployment of the embedded default takes.
Each client is a hub user with a system account of its own (made by the benchmark, removed
after), and the backend is the real ``LocalBackend`` (``observed_local_backend.py``: the same
logs of the loop): every submission resolves the user's files through that user's helper, every
job is a launcher that enters its cgroup, drops to the account and runs a script that exits at
once (``pass``; 0 GPUs, 250m cpu, 64Mi memory). Reported besides: jobs launched and finished
per second end to end, the time to drain after the last answer, the CPU per job of the service
and of the launchers and their workers (the node's launcher's own and its reaped children's,
read from its /proc stat: exact where "all other processes of the machine" also counts whatever
else the machine ran meanwhile), and the service's RSS at each tenth of the answers.

Goals (issue 15): at least 500 submissions/s sustained with p99 under 200 ms, and a loop p99
under 50 ms at that load. ``--profile py-spy`` samples the service with py-spy during the load
(``.venv/bin/pip install py-spy``) and prints the top functions by self and total time and the
time per submission by part; ``--profile cprofile`` runs the service under cProfile instead.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import aiohttp  # noqa: E402

from tests.service.hub import PROXY, Hub  # noqa: E402
from tests.service.pages import every_job  # noqa: E402

PLAN = "/sample-project/training"
GOAL_RATE = 500  # submissions per second, sustained
GOAL_P99_MS = 200  # submit latency
GOAL_LOOP_P99_MS = 50  # one scheduling cycle
SCRIPT = "print('instant')\n"
UNLIMITED = {"RequestRate": {"per_second": 0}}
CLK_TCK = os.sysconf("SC_CLK_TCK")

# parts of a submission's cost in the service: a sample counts for a part when a frame on its
# stack is one of these functions (qualified names as py-spy writes them; "*.name": a method
# ``name`` of any class in this project, wherever it moves)
PARTS = [
    ("hub auth (token check, HubAuth)", ("HubAuthenticated.get_current_user", "HubAuth._get_user")),
    ("  waiting for HubAuth's own thread", ("HubAuth._synchronize",)),
    ("tornado: reading and parsing the request", ("HTTP1Connection._read_message",)),
    ("JSON body (APIHandler.body)", ("*.body",)),
    ("validation (parse_submission)", ("parse_submission",)),
    ("  user_root (Path.resolve)", ("user_root",)),
    ("  files_for (account, ensure_folder)", ("*.files_for",)),
    ("idempotency lookup (Store.jobs_by_keys)", ("*.jobs_by_keys",)),
    ("Scheduler.submit", ("*.submit",)),
    ("  check_submission (core)", ("check_submission",)),
    ("store: add_job", ("*.add_job",)),
    ("store: job / jobs_by_id reads", ("*.job", "*.jobs_by_id")),
    ("scheduling cycle (Scheduler.cycle)", ("*.cycle", "*._cycle")),
    ("  core schedule()", ("schedule",)),
    ("  events folded (_fold_events)", ("*._fold_events",)),
    ("  decisions applied (_apply)", ("*._apply",)),
    ("store: commit_cycle", ("*.commit_cycle",)),
    ("store: update_jobs", ("*.update_jobs",)),
    ("store: SQLAlchemy commit", ("SessionTransaction.commit", "Transaction.commit")),
    ("metering (cycle hook, refresh)", ("Metering.on_cycle", "Metering.refresh")),
    ("answer (job_json + reply)", ("*.reply", "job_json")),
    ("request log line (RequestHandler._log)", ("RequestHandler._log",)),
]


# -- processes --------------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid`` and of every child it reaped (and theirs, as they reaped them):
    for the node's launcher, every worker's launcher it forked and every worker."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return sum(int(f) for f in fields[11:15]) / CLK_TCK  # utime, stime, cutime, cstime


def helpers_cpu_seconds(service: int, node: int | None) -> float:
    """CPU seconds of the service's children other than the node's launcher: the accounts'
    user-files helpers."""
    import psutil

    try:
        children = psutil.Process(service).children()
    except psutil.Error:
        return 0.0
    seconds = [cpu_seconds(c.pid) for c in children if c.pid != node]
    return sum(s for s in seconds if s >= 0)  # nan: it ended meanwhile


@dataclass(frozen=True)
class CpuNow:
    """CPU seconds so far: each benchmarked process, this one, the whole machine, and (as
    root) the node's launcher's tree and the accounts' helpers (0 where there is none yet)."""

    each: dict[str, float]
    own: float
    machine: float
    launches: float
    helpers: float


def cpu_now(pids: dict[str, int], as_root: bool) -> CpuNow:
    node = node_launcher_pid(pids["service"]) if as_root else None
    return CpuNow(
        {k: cpu_seconds(p) if p else float("nan") for k, p in pids.items()},
        time.process_time(),
        machine_cpu_seconds(),
        tree_cpu_seconds(node) if node else 0.0,
        helpers_cpu_seconds(pids["service"], node),
    )


def node_launcher_pid(service: int) -> int | None:
    """The local backend's node's launcher (``worker_launcher.py --serve``), a child of the
    service."""
    import psutil

    try:
        children = psutil.Process(service).children()
    except psutil.Error:
        return None
    for child in children:
        try:
            if "--serve" in child.cmdline() and "worker_launcher" in " ".join(child.cmdline()):
                return child.pid
        except psutil.Error:
            continue
    return None


def machine_cpu_seconds() -> float:
    """CPU seconds every process of the machine used since boot (busy time, /proc/stat)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) in MiB."""
    found = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                found[key] = int(value.split()[0]) / 1024
    except OSError:
        pass
    return found.get("VmRSS", float("nan")), found.get("VmHWM", float("nan"))


def proxy_pid(hub: Hub) -> int | None:
    import psutil

    for child in psutil.Process(hub.proc.pid).children(recursive=True):
        try:
            if "configurable-http-proxy" in " ".join(child.cmdline()):
                return child.pid
        except psutil.Error:
            continue
    return None


class RssSampler(threading.Thread):
    def __init__(self, pid: int, every: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.pid, self.every, self.peak = pid, every, 0.0
        self.samples: list[tuple[float, float]] = []  # (wall time, RSS MiB)
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.every):
            rss = rss_mib(self.pid)[0]
            self.peak = max(self.peak, rss)
            self.samples.append((time.time(), rss))

    def by_tenth(self, times: list[float]) -> list[float]:
        """The RSS when each tenth of ``times`` (wall times of the answers) had passed."""
        ordered = sorted(times)
        out = []
        for k in range(1, 11):
            at = ordered[max(0, len(ordered) * k // 10 - 1)] if ordered else 0.0
            near = [r for t, r in self.samples if t <= at] or [r for _, r in self.samples[:1]]
            out.append(round(near[-1], 1) if near else float("nan"))
        return out


# -- figures ----------------------------------------------------------------------------------
def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def ms(x: float) -> float:
    return round(1000 * x, 1)


def latency(values: list[float]) -> dict:
    return {
        "n": len(values),
        "p50_ms": ms(pct(values, 50)),
        "p99_ms": ms(pct(values, 99)),
        "max_ms": ms(max(values)) if values else None,
    }


def tenths(ok: list[tuple]) -> list[dict]:
    ordered = sorted(ok, key=lambda a: a[2])
    out = []
    size = max(1, len(ordered) // 10)
    for i in range(0, len(ordered) - size + 1, size):
        part = ordered[i : i + size]
        span = part[-1][2] - part[0][2]
        out.append(
            {
                "per_second": round((len(part) - 1) / span, 1) if span > 0 else None,
                "p99_ms": ms(pct([a[2] - a[1] for a in part], 99)),
            }
        )
    return out[:10]


def read_log(path: Path, start: float, end: float) -> list[list[float]]:
    rows = []
    try:
        text = path.read_text()
    except OSError:
        return rows
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and start <= float(parts[0]) <= end:
            rows.append([float(p) for p in parts])
    return rows


# -- clients ----------------------------------------------------------------------------------
# what each job asks for: the instant backend runs nothing; a real job is held to its grant
INSTANT_JOB = {"gpu": 1, "cpu": "10m", "memory": "16Mi"}
REAL_JOB = {"gpu": 0, "cpu": "250m", "memory": "64Mi"}
RESOURCES = dict(INSTANT_JOB)


def job_body(k: int) -> dict:
    return {
        "plan": PLAN,
        "name": f"bench-{k}",
        "workers": 1,
        "resources": RESOURCES,
        "command": {"model_dir": "models/bench", "model_main": "main.py"},
    }


async def gets(api: str, tokens: list[str], n: int) -> tuple[list[float], Counter]:
    """``n`` authenticated GET api/v1/ spread over one client per token, one at a time each."""
    counter = itertools.count()
    times: list[float] = []
    statuses: Counter = Counter()

    async def client(token: str) -> None:
        headers = {"Authorization": f"token {token}"}
        async with aiohttp.ClientSession(headers=headers) as session:
            while next(counter) < n:
                t0 = time.perf_counter()
                try:
                    async with session.get(api + "/") as r:
                        await r.read()
                        statuses[r.status] += 1
                except aiohttp.ClientError as err:
                    statuses[type(err).__name__] += 1
                times.append(time.perf_counter() - t0)

    await asyncio.gather(*(client(t) for t in tokens))
    return times, statuses


async def submissions(api: str, tokens: list[str], n: int, probe_token: str) -> dict:
    counter = itertools.count()
    answers: list[tuple[int, float, float, object, str]] = []  # k, t0, t1, status, id
    probe_times: list[float] = []
    done = asyncio.Event()

    async def client(token: str) -> None:
        headers = {"Authorization": f"token {token}"}
        async with aiohttp.ClientSession(headers=headers) as session:
            while (k := next(counter)) < n:
                t0 = time.perf_counter()
                status: object
                job_id = ""
                try:
                    # one Idempotency-Key per submission, as the wmla client sends
                    key = {"Idempotency-Key": uuid.uuid4().hex}
                    async with session.post(api + "/jobs", json=job_body(k), headers=key) as r:
                        data = await r.read()
                        status = r.status
                    if status in (200, 201):
                        job_id = json.loads(data)["id"]
                except aiohttp.ClientError as err:
                    status = type(err).__name__
                answers.append((k, t0, time.perf_counter(), status, job_id))

    async def probe() -> None:
        headers = {"Authorization": f"token {probe_token}"}
        async with aiohttp.ClientSession(headers=headers) as session:
            while not done.is_set():
                t0 = time.perf_counter()
                try:
                    async with session.get(api + "/") as r:
                        await r.read()
                    probe_times.append(time.perf_counter() - t0)
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.05)

    wall0, t0 = time.time(), time.perf_counter()
    probing = asyncio.ensure_future(probe())
    await asyncio.gather(*(client(t) for t in tokens))
    t1 = time.perf_counter()
    done.set()
    await probing
    return {"answers": answers, "probe": probe_times, "wall0": wall0, "t0": t0, "t1": t1}


async def first_submissions(api: str, tokens: list[str]) -> list[float]:
    """Each client's first job at once, as fifty new users' first jobs: the seconds to each
    answer (a new user's account, helper, folder and storage image are made on this path)."""

    async def one(k: int, token: str) -> float:
        headers = {"Authorization": f"token {token}", "Idempotency-Key": uuid.uuid4().hex}
        body = {**job_body(k), "name": f"first-{k}"}
        t0 = time.perf_counter()
        async with aiohttp.ClientSession(headers=headers) as session:
            async with session.post(api + "/jobs", json=body) as r:
                text = await r.text()
                if r.status != 201:
                    raise RuntimeError(f"a first submission was answered {r.status}: {text}")
        return time.perf_counter() - t0

    return list(await asyncio.gather(*(one(k, t) for k, t in enumerate(tokens))))


async def admin_get(url: str, token: str, **params) -> dict:
    headers = {"Authorization": f"token {token}"}
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout) as session:
        async with session.get(url, params=params) as r:
            text = await r.text()
            if r.status != 200:
                raise RuntimeError(f"GET {url} {params}: {r.status} {text[:300]}")
            return json.loads(text) if "json" in r.headers.get("Content-Type", "") else text


async def wait_ended(api: str, token: str, timeout: float) -> float | None:
    """Seconds until no job is PENDING or RUNNING (None: still some after ``timeout``)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        # one job is enough to know: a full listing each poll would be the service's load
        live = await admin_get(api + "/jobs", token, state="PENDING,RUNNING", limit="1")
        if not live["jobs"]:
            return time.perf_counter() - t0
        await asyncio.sleep(0.25)
    return None


# -- profiles ---------------------------------------------------------------------------------
FRAME_LINE = re.compile(r":\d+\)$")
# leaves of a thread that waits (py-spy counts some of them as active): not time spent
IDLE_LEAVES = (
    "_worker (concurrent/futures/thread.py)",
    "wait (threading.py)",
    "Condition.wait (threading.py)",
    "Event.wait (threading.py)",
    "select (selectors.py)",
    "EpollSelector.select (selectors.py)",
    "_run_safe_shutdown_loop (pycares/__init__.py)",
    "_ChannelShutdownManager._run_safe_shutdown_loop (pycares/__init__.py)",
)
MAIN_IDLE_LEAVES = ("select (selectors.py)", "EpollSelector.select (selectors.py)")


def summarize_pyspy(
    path: Path, submissions: int, service_cpu: float, rate: int, top: int = 25
) -> dict:
    """Self and total shares of the service's busy samples by function (py-spy raw format),
    idle leaves (a pool thread waiting for work, the loop in select) left out; ``ms_per_job``
    is busy wall time (samples / rate: on the CPU, in a commit's fsync, or waiting for a core)
    per submission."""
    selfs: Counter = Counter()
    totals: Counter = Counter()
    parts: Counter = Counter()
    threads: Counter = Counter()
    total = idle = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [FRAME_LINE.sub(")", f) for f in stack.split(";")]
        if frames and frames[0].startswith("process "):
            frames = frames[1:]
        thread = frames[0] if frames and frames[0].startswith("thread ") else ""
        frames = [f for f in frames if not f.startswith("thread ")]
        if not frames:
            continue
        # "thread (0x7f..): wmla-store-read_2" -> "wmla-store-read" (a pool, not one thread)
        name = re.sub(r"^thread\s*(\([^)]*\)\s*)*:?\s*", "", thread)
        # the event loop's thread waits in select only: blocked on a lock or a future it holds
        # up every request (HubAuth's sync get_user waits for its own thread that way)
        waits = MAIN_IDLE_LEAVES if name == "MainThread" else IDLE_LEAVES
        if frames[-1] in waits:
            idle += n
            continue
        total += n
        threads[re.sub(r"_\d+$", "", name) or "?"] += n
        selfs[frames[-1]] += n
        for f in set(frames):
            totals[f] += n
        names = {f.split(" (", 1)[0] for f in frames}
        ours = {
            "*." + name.rsplit(".", 1)[-1]
            for name, f in zip((f.split(" (", 1)[0] for f in frames), frames)
            if "(extension/" in f
        }
        for part, functions in PARTS:
            if names.intersection(functions) or ours.intersection(functions):
                parts[part] += n
    if not total:
        return {"samples": 0, "idle_samples": idle}
    per_job_ms = 1000 * total / rate / max(1, submissions)

    def rows(counter: Counter) -> list[dict]:
        return [
            {
                "function": f,
                "share": round(c / total, 4),
                "ms_per_job": round(per_job_ms * c / total, 3),
            }
            for f, c in counter.most_common(top)
        ]

    return {
        "samples": total,
        "idle_samples": idle,
        "cpu_ms_per_submission": round(1000 * service_cpu / max(1, submissions), 3),
        "busy_ms_per_submission": round(per_job_ms, 3),
        "threads": {t: round(c / total, 3) for t, c in threads.most_common()},
        "parts": [
            {
                "part": name,
                "share": round(parts[name] / total, 4),
                "ms_per_job": round(per_job_ms * parts[name] / total, 3),
            }
            for name, _ in PARTS
        ],  # fmt: skip
        "self": rows(selfs),
        "total": rows(totals),
    }


def summarize_cprofile(path: Path, top: int = 25) -> str:
    import io
    import pstats

    out = io.StringIO()
    stats = pstats.Stats(str(path), stream=out)
    stats.strip_dirs().sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)
    return out.getvalue()


SERVICE_ENV_CONFIG = """
c.JupyterHub.services[0]["environment"].update({env!r})
"""
CPROFILE_CONFIG = """
import sys
_wmla = c.JupyterHub.services[0]
_wmla["command"] = [sys.executable, "-m", "cProfile", "-o", {out!r}, "-m", "extension.service"]
"""


# -- the run ----------------------------------------------------------------------------------
def service_traits(tmp: Path, finish_after: float, accounts: str = "") -> dict:
    """The instant backend, or with ``accounts`` (an account template) the real local one."""
    logs = {
        "cycle_log": str(tmp / "cycles.log"),
        "lag_log": str(tmp / "lag.log"),
        "lag_interval": 0.01,
    }
    if accounts:
        backend = "benchmarks.observed_local_backend.ObservedLocalBackend"
        options = {**logs, "account_template": accounts, "real_gpus": False}
    else:
        backend = "benchmarks.instant_backend.InstantBackend"
        options = {**logs, "finish_after": finish_after}
    return {
        "backend_class": backend,
        "backend_options": options,
        "device_layout": "4x8",
        "cpu_oversubscription": 16,
        "max_pending_per_user": 0,  # the benchmark's clients submit far ahead of the starts
    }


def make_users(hub: Hub, names: list[str], accounts: str = "") -> list[str]:
    """Hub users with a token each and the job's script in their folder; with ``accounts``, a
    system account each (``accounts`` the template), owning its folder."""
    r = hub.hub_api("POST", "/users", json={"usernames": names})
    assert r.status_code in (201, 409), r.text
    tokens = []
    for name in names:
        r = hub.hub_api("POST", f"/users/{name}/tokens", json={"note": "wmla bench"})
        assert r.status_code == 201, r.text
        tokens.append(r.json()["token"])
        if accounts:
            from extension.userfs.accounts import create_account, ensure_folder

            account = create_account(accounts.format(username=name), hub.storage / name)
            ensure_folder(hub.storage, name, account)
        folder = hub.storage / name / "models" / "bench"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "main.py").write_text(SCRIPT)
        if accounts:
            for path in (folder.parent, folder, folder / "main.py"):
                os.chown(path, account.uid, account.gid)
    return tokens


def remove_accounts(names: list[str], accounts: str) -> None:
    for name in names:
        subprocess.run(["userdel", accounts.format(username=name)], capture_output=True)


def run(args: argparse.Namespace, tmp: Path) -> dict:
    accounts = f"wb{uuid.uuid4().hex[:4]}-{{username}}" if args.as_root else ""
    if accounts:
        RESOURCES.clear()
        RESOURCES.update(REAL_JOB)
        os.chmod(tmp, 0o711)  # the accounts reach their folders under it
    # the service's capacity, not its per-user policy (c.RequestRate, 20 a second a user by
    # default; tests/service/test_request_rate.py): the probe alone GETs every 50 ms
    hub = Hub(tmp, service_traits(tmp, args.finish_after, accounts), UNLIMITED)
    hub.env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
    )
    if args.service_env:
        env = dict(item.split("=", 1) for item in args.service_env)
        with open(hub.config, "a") as f:
            f.write(SERVICE_ENV_CONFIG.format(env=env))
    if args.profile == "cprofile":
        with open(hub.config, "a") as f:
            f.write(CPROFILE_CONFIG.format(out=str(tmp / "service.prof")))
    spy: subprocess.Popen | None = None
    report: dict = {"jobs": args.jobs, "clients": args.clients, "as_root": bool(accounts)}
    names = [f"bench{i:02d}" for i in range(args.clients)]
    try:
        print("starting the hub, the proxy and the wmla service ...", file=sys.stderr)
        hub.start(timeout=120)
        pids = {"service": hub.service_pid(), "hub": hub.proc.pid, "proxy": proxy_pid(hub)}
        tokens = make_users(hub, names, accounts)
        admin = hub.user_token("padmin")
        api = hub.api

        print(f"baseline: {args.baseline:,} GET api/v1/ ...", file=sys.stderr)
        asyncio.run(gets(api, tokens, len(tokens)))  # each token checked with the hub once
        b0, bcpu0 = time.perf_counter(), cpu_seconds(pids["service"])
        base_times, base_status = asyncio.run(gets(api, tokens, args.baseline))
        b_elapsed, bcpu1 = time.perf_counter() - b0, cpu_seconds(pids["service"])
        report["baseline_get"] = {
            **latency(base_times),
            "per_second": round(len(base_times) / b_elapsed),
            "service_cpu_ms_per_get": round(1000 * (bcpu1 - bcpu0) / len(base_times), 3),
            "statuses": {str(k): v for k, v in base_status.items()},
        }

        if args.warm:
            print(f"warm: {len(tokens)} new users' first submissions ...", file=sys.stderr)
            firsts = asyncio.run(first_submissions(api, tokens))
            report["first_submissions"] = latency(firsts)
            asyncio.run(wait_ended(api, admin, timeout=120))

        if args.profile in ("py-spy", "py-spy-gil"):
            spy_bin = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
            spy = subprocess.Popen(
                [spy_bin, "record", "--pid", str(pids["service"]), "--rate", str(args.rate),
                 "--format", "raw", "--threads", "-o", str(tmp / "profile.txt"),
                 *(["--gil"] if args.profile == "py-spy-gil" else [])],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
            )  # fmt: skip
            time.sleep(1.0)

        print(f"load: {args.jobs:,} submissions from {args.clients} clients ...", file=sys.stderr)
        start = cpu_now(pids, bool(accounts))
        cpu0, own0, all0 = start.each, start.own, start.machine
        sampler = RssSampler(pids["service"])
        sampler.start()
        load = asyncio.run(submissions(api, tokens, args.jobs, admin))
        mid = cpu_now(pids, bool(accounts))
        timeout = max(120, args.jobs / (10 if accounts else 20))
        ended = asyncio.run(wait_ended(api, admin, timeout=timeout))
        sampler.done.set()
        wall_end = time.time()
        cpu1 = {k: cpu_seconds(p) if p else float("nan") for k, p in pids.items()}
        own1, all1 = time.process_time(), machine_cpu_seconds()
        node = node_launcher_pid(pids["service"]) if accounts else None
        launches = tree_cpu_seconds(node) if node else float("nan")  # started during the load
        rss, hwm = rss_mib(pids["service"])
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            try:
                spy.wait(60)
            except subprocess.TimeoutExpired:
                spy.kill()
                spy.wait(10)
            err = spy.stderr.read().decode(errors="replace") if spy.stderr else ""
            spy = None
            if not (tmp / "profile.txt").exists():
                print(f"py-spy wrote no profile:\n{err[-2000:]}", file=sys.stderr)

        answers = load["answers"]
        elapsed = load["t1"] - load["t0"]
        ok = [a for a in answers if a[3] == 201]
        lat = [a[2] - a[1] for a in answers]
        done_at = sorted(a[2] - load["t0"] for a in ok)
        lo, hi = pct(done_at, 10), pct(done_at, 90)
        middle = [t for t in done_at if lo <= t <= hi]
        sustained = (len(middle) - 1) / (hi - lo) if hi > lo else float("nan")

        print("listing every job ...", file=sys.stderr)
        listing = asyncio.run(every_job(admin_get, api + "/jobs", admin))
        ids = [j["id"] for j in listing]
        by_name = Counter(j["name"] for j in listing)
        accepted = {a[4] for a in ok}
        started = [j["started"] for j in listing if j["started"] is not None]
        submit_t1 = load["wall0"] + elapsed
        states = Counter(j["state"] for j in listing)
        report.update(
            {
                "submissions_per_second": round(len(ok) / elapsed, 1),
                "sustained_per_second": round(sustained, 1),
                "submit_seconds": round(elapsed, 2),
                "submit_latency": latency(lat),
                # answers per second and p99 in each tenth of the run: does it slow down as the
                # store grows?
                "by_tenth": tenths(ok),
                "statuses": {str(k): v for k, v in Counter(a[3] for a in answers).items()},
                "get_during_load": latency(load["probe"]),
                "all_admitted_after_s": round(max(started) - load["wall0"], 2) if started else None,
                "admitted_after_last_answer_s": (
                    round(max(started) - submit_t1, 2) if started else None
                ),
                "all_ended_after_last_answer_s": None if ended is None else round(ended, 2),
                "states": dict(states),
                "lost": len(accepted - set(ids)),
                "duplicated": sum(c - 1 for c in by_name.values() if c > 1)
                + (len(ids) - len(set(ids))),
                "unanswered_but_stored": sum(
                    1 for j in listing if j["id"] not in accepted and j["name"].startswith("bench-")
                ),
            }
        )
        cycles = read_log(tmp / "cycles.log", load["wall0"], wall_end)
        seconds = [c[1] for c in cycles]
        window = wall_end - load["wall0"]
        report["loop"] = {
            **latency(seconds),
            "busy_share": round(sum(seconds) / window, 3) if window > 0 else None,
            "decisions_per_cycle_p50": pct([c[2] for c in cycles], 50) if cycles else None,
            "live_jobs_p99": pct([c[3] for c in cycles], 99) if cycles else None,
        }
        lags = [row[1] for row in read_log(tmp / "lag.log", load["wall0"], wall_end)]
        report["event_loop_lag"] = latency(lags)
        report["cpu_seconds"] = {
            **{k: round(cpu1[k] - cpu0[k], 2) for k in pids},
            "bench clients": round(own1 - own0, 2),
            "window_s": round(window, 2),
            "cores": os.cpu_count(),
        }
        ours = sum(cpu1[k] - cpu0[k] for k in pids if cpu1[k] == cpu1[k]) + own1 - own0
        report["cpu_seconds"]["other processes"] = round(max(0.0, all1 - all0 - ours), 2)
        # while the submissions came: who had the two cores (the jobs' launches run meanwhile)
        during = {k: mid.each[k] - cpu0[k] for k in pids if mid.each[k] == mid.each[k]}
        during["bench clients"] = mid.own - own0
        if accounts:
            during["launchers and workers"] = mid.launches - start.launches
            during["helpers"] = mid.helpers - start.helpers
        during["other processes"] = max(0.0, mid.machine - all0 - sum(during.values()))
        report["cpu_seconds_while_submitting"] = {
            **{k: round(v, 2) for k, v in during.items()},
            "window_s": round(load["t1"] - load["t0"], 2),
        }
        report["service_cpu_ms_per_submission"] = round(
            1000 * (cpu1["service"] - cpu0["service"]) / max(1, len(ok)), 3
        )
        report["service_rss_mib"] = {
            "end": round(rss, 1),
            "peak_during_load": round(sampler.peak, 1),
            "hwm": round(hwm, 1),
            "by_tenth": sampler.by_tenth([load["wall0"] + a[2] - load["t0"] for a in ok]),
        }
        # memory flat in the jobs run (issue 31): what the service keeps past the first tenth
        rss_tenths = report["rss_mib_by_tenth"] = report["service_rss_mib"]["by_tenth"]
        report["rss_growth_after_first_tenth_mib"] = round(max(rss_tenths) - rss_tenths[0], 1)
        ends = [j["ended"] for j in listing if j["ended"] is not None and j["state"] == "FINISHED"]
        if ends:
            last = max(ends)
            report["jobs_finished_per_second"] = round(len(ends) / (last - load["wall0"]), 1)
            report["drain_after_last_answer_s"] = round(last - submit_t1, 2)
        jobs_done = max(1, len(ends))
        # the node's launcher's own CPU and its reaped children's (the launchers it forked and
        # their workers): exact, where "other processes" also counts whatever else the machine
        # ran meanwhile; the second when there is no node's launcher
        others = report["cpu_seconds"]["other processes"]
        report["cpu_ms_per_job"] = {
            "service": round(1000 * (cpu1["service"] - cpu0["service"]) / jobs_done, 2),
            "launchers_and_workers": round(
                1000 * (launches if launches == launches else others) / jobs_done, 2
            ),
            "other_processes_on_the_machine": round(1000 * others / jobs_done, 2),
        }
        report["prometheus_cycle_histogram"] = prometheus_cycles(hub, admin)
        if args.profile in ("py-spy", "py-spy-gil") and (tmp / "profile.txt").exists():
            report["profile"] = summarize_pyspy(
                tmp / "profile.txt", len(ok), cpu1["service"] - cpu0["service"], args.rate
            )
            report["profile"]["mode"] = args.profile
    finally:
        if spy is not None and spy.poll() is None:
            spy.kill()
            spy.wait(10)
        hub.stop()
        if accounts:
            remove_accounts(names, accounts)
    if args.profile == "cprofile" and (tmp / "service.prof").exists():
        report["cprofile"] = summarize_cprofile(tmp / "service.prof")
    return report


def prometheus_cycles(hub: Hub, token: str) -> dict:
    """The service's own cycle-duration histogram (since its start), as a cross-check."""
    from prometheus_client.parser import text_string_to_metric_families

    text = asyncio.run(admin_get(f"{hub.url}/services/wmla/metrics", token))
    buckets: dict[float, float] = {}
    count = 0.0
    for family in text_string_to_metric_families(text):
        if family.name != "wmla_scheduling_cycle_duration_seconds":
            continue
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                buckets[float(sample.labels["le"])] = sample.value
            elif sample.name.endswith("_count"):
                count = sample.value
    at_goal = buckets.get(GOAL_LOOP_P99_MS / 1000)
    return {
        "cycles": int(count),
        "share_within_50ms": round(at_goal / count, 4) if count and at_goal is not None else None,
    }


# -- output -----------------------------------------------------------------------------------
def goals(report: dict) -> dict:
    return {
        "rate": report["sustained_per_second"] >= GOAL_RATE,
        "p99": report["submit_latency"]["p99_ms"] < GOAL_P99_MS,
        "loop_p99": (report["loop"]["p99_ms"] or 0) < GOAL_LOOP_P99_MS,
        "correct": report["lost"] == 0
        and report["duplicated"] == 0
        and set(report["states"]) == {"FINISHED"}
        and report["statuses"] == {"201": report["jobs"]},
    }


def print_report(r: dict) -> None:
    b, s, g, lp, lag = (
        r["baseline_get"], r["submit_latency"], r["get_during_load"], r["loop"],
        r["event_loop_lag"],
    )  # fmt: skip
    cpu = r["cpu_seconds"]
    print(f"{r['jobs']:,} submissions from {r['clients']} clients through hub + proxy:")
    print(
        f"  baseline GET api/v1/ : p50 {b['p50_ms']} ms, p99 {b['p99_ms']} ms, "
        f"{b['per_second']:,}/s ({b['n']:,} requests, {b['statuses']});"
        f" service {b['service_cpu_ms_per_get']} ms CPU per GET"
    )
    print(
        f"  POST /jobs           : p50 {s['p50_ms']} ms, p99 {s['p99_ms']} ms,"
        f" max {s['max_ms']} ms;"
        f" {r['submissions_per_second']:,}/s overall, {r['sustained_per_second']:,}/s sustained"
        f" ({r['submit_seconds']} s; answers {r['statuses']})"
    )
    print(
        f"  POST vs baseline GET : p50 x{s['p50_ms'] / max(b['p50_ms'], 0.1):.1f}, "
        f"p99 x{s['p99_ms'] / max(b['p99_ms'], 0.1):.1f}"
    )
    if "first_submissions" in r:
        f = r["first_submissions"]
        print(
            f"  before the load      : {f['n']} new users' first submissions at once, p50"
            f" {f['p50_ms']} ms, p99 {f['p99_ms']} ms (their accounts, folders and storage made)"
        )
    tenth = ", ".join(f"{t['per_second']}/s" for t in r["by_tenth"])
    print(f"  by tenth of the run  : {tenth}")
    print(f"  GET during the load  : p50 {g['p50_ms']} ms, p99 {g['p99_ms']} ms ({g['n']} probes)")
    print(
        f"  admitted             : all {r['all_admitted_after_s']} s after the first submission"
        f" ({r['admitted_after_last_answer_s']} s after the last answer); all ended"
        f" {r['all_ended_after_last_answer_s']} s after it; states {r['states']}"
    )
    print(
        f"  scheduling loop      : {lp['n']:,} cycles, p50 {lp['p50_ms']} ms,"
        f" p99 {lp['p99_ms']} ms,"
        f" max {lp['max_ms']} ms, busy {100 * (lp['busy_share'] or 0):.0f}% of the time"
        f" (Prometheus: {r['prometheus_cycle_histogram']['share_within_50ms']} of cycles <= 50 ms)"
    )
    print(
        f"  event loop lag       : p50 {lag['p50_ms']} ms, p99 {lag['p99_ms']} ms, "
        f"max {lag['max_ms']} ms"
    )
    print(
        f"  CPU seconds          : service {cpu['service']}, hub {cpu['hub']},"
        f" proxy {cpu['proxy']},"
        f" clients {cpu['bench clients']}, other processes {cpu['other processes']}"
        f" over {cpu['window_s']} s on {cpu['cores']} cores;"
        f" service {r['service_cpu_ms_per_submission']} ms CPU per submission"
    )
    sub = r["cpu_seconds_while_submitting"]
    print(
        "  CPU while submitting : "
        + ", ".join(f"{k} {v}" for k, v in sub.items() if k != "window_s")
        + f" over {sub['window_s']} s"
    )
    m = r["service_rss_mib"]
    print(f"  service RSS          : {m['peak_during_load']} MiB peak, {m['end']} MiB at the end;"
          f" by tenth of the answers {m['by_tenth']}, grown"
          f" {r['rss_growth_after_first_tenth_mib']} MiB past the first")  # fmt: skip
    if "jobs_finished_per_second" in r:
        per = r["cpu_ms_per_job"]
        print(
            f"  jobs run end to end  : {r['jobs_finished_per_second']}/s launched and finished"
            f" ({'real accounts, LocalBackend' if r['as_root'] else 'instant backend'}); drained"
            f" {r['drain_after_last_answer_s']} s after the last answer; CPU per job: service"
            f" {per['service']} ms, launchers and workers {per['launchers_and_workers']} ms"
            f" (all other processes of the machine: {per['other_processes_on_the_machine']} ms)"
        )
    print(
        f"  lost {r['lost']}, duplicated {r['duplicated']},"
        f" stored without a 201 {r['unanswered_but_stored']}"
    )
    met = goals(r)
    print(
        f"goals: >= {GOAL_RATE}/s sustained {'met' if met['rate'] else 'NOT met'}; "
        f"p99 < {GOAL_P99_MS} ms {'met' if met['p99'] else 'NOT met'}; "
        f"loop p99 < {GOAL_LOOP_P99_MS} ms {'met' if met['loop_p99'] else 'NOT met'}; "
        f"no job lost or duplicated, all FINISHED: {'yes' if met['correct'] else 'NO'}"
    )
    prof = r.get("profile")
    if prof and prof.get("samples"):
        print(
            f"\nprofile ({prof['mode']}, {prof['samples']:,} busy samples of the service, "
            f"{prof['idle_samples']:,} idle left out; {prof['busy_ms_per_submission']} ms busy"
            f" and {prof['cpu_ms_per_submission']} ms CPU per submission):"
            f" threads {prof['threads']}"
        )
        print("  busy time per submission, by part (a sample counts for every part on its stack):")
        for p in prof["parts"]:
            print(f"    {p['part']:<46} {100 * p['share']:5.1f}%  {p['ms_per_job']:7.3f} ms")
        for key, title in (("total", "total (inclusive)"), ("self", "self")):
            print(f"  top functions by {title} time:")
            for row in prof[key]:
                share, cost = 100 * row["share"], row["ms_per_job"]
                print(f"    {share:5.1f}%  {cost:7.3f} ms  {row['function']}")
    if r.get("cprofile"):
        print("\ncProfile of the service (main thread):\n" + r["cprofile"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="1,000 jobs")
    parser.add_argument("--baseline", type=int, default=0, help="baseline GETs (default 2,000)")
    parser.add_argument("--finish-after", type=float, default=0.0, help="seconds a job runs")
    parser.add_argument(
        "--profile",
        choices=["py-spy", "py-spy-gil", "cprofile"],
        default=None,
        help="py-spy: every busy thread's stack; py-spy-gil: only the thread holding the GIL "
        "(where the service's Python CPU goes, without the time threads wait for it)",
    )
    parser.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    parser.add_argument(
        "--service-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a variable for the service's environment (repeat), e.g. to compare two settings",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--json-out", default="", help="also write the report as JSON here")
    parser.add_argument("--keep", action="store_true", help="keep the run's folder (logs)")
    parser.add_argument(
        "--as-root",
        action="store_true",
        help="each client a system account, the real LocalBackend, real launches (root only)",
    )
    parser.add_argument(
        "--warm",
        action="store_true",
        help="each client submits one job first (timed apart), so the load is of known users",
    )
    args = parser.parse_args()
    if args.as_root and (os.geteuid() != 0 or not shutil.which("useradd")):
        print("--as-root needs root and useradd", file=sys.stderr)
        return 2
    if args.quick:
        args.jobs = min(args.jobs, 1_000)
    args.baseline = args.baseline or min(2_000, max(args.jobs, 500))
    if not PROXY.exists():
        print("configurable-http-proxy is missing: run `make install`", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="wmla-bench-service-"))
    try:
        report = run(args, tmp)
    finally:
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=1))
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print_report(report)
    return 0 if goals(report)["correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
