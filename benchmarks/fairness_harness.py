"""One workload through the real service in real time and through the simulator, and the same
figures from both (benchmarks/bench_fairness.py, tests/e2e/test_sim_matches_service.py).

A workload is a list of ``WorkJob`` (submission time, team, user, workers, GPUs per worker, run
time), its plans a ``Setup`` (teams at shares under one parent plan, the device layout and the
service's timing: tick, grace, min_runtime, the jobs' checkpoint period and exit after SIGTERM).

- ``run_service``: the repository's jupyterhub_config.py in a subprocess (tests/service/hub.py:
  JupyterHub, configurable-http-proxy, the wmla service, SQLite), the service's backend
  ``benchmarks.timed_backend.TimedBackend`` on virtual nodes; every job is submitted at its
  time through the proxy with its user's own hub token; at the end every job and its
  transitions are read back from the API (``GET /jobs``, ``GET /jobs/<id>/history``).
- ``run_sim``: the same workload as a scenario through ``extension.sim`` (a policy:
  ``wmla``, the real core, or ``gang-fifo``), every job's held GPUs recorded at each change.
- ``figures``: from each job's submission, end and held-GPU steps alone, so both runs are
  measured by one definition (docs/simulate.md "Fairness benchmark").
"""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import json
import math
import os
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from extension.backends.capacity import detect_nodes  # noqa: E402
from extension.backends.fake import FakeBackend  # noqa: E402
from extension.scheduler import Instance, Node, PlanTree, Resources, SchedulerConfig  # noqa: E402
from extension.sim.metrics import PlanShape, deserved_gpus, percentiles  # noqa: E402
from extension.sim.policies import make_policy  # noqa: E402
from extension.sim.replay import Replay, backend_for  # noqa: E402
from extension.sim.scenario import Scenario, ScenarioJob  # noqa: E402
from tests.service.pages import every_job  # noqa: E402

CPU_M, MEMORY = 10, 16 * 2**20  # per worker: far below any node's, so GPUs alone bind
SCRIPT = "# a virtual job: benchmarks/timed_backend.py runs it for --seconds, never this file\n"


@dataclass(frozen=True)
class WorkJob:
    name: str  # unique; the service job's name
    at: float  # submission, seconds from the start of the run
    team: str  # the plan <parent>/<team>
    user: str
    workers: int
    gpus: int  # per worker
    seconds: float  # run time at full size

    @property
    def width(self) -> int:
        return self.workers * self.gpus


def read_workload(path: str | Path) -> list[WorkJob]:
    """A workload CSV: ``name,at,team,user,workers,gpus,seconds`` (a header, one job a line)."""
    with open(path, newline="") as f:
        return [
            WorkJob(
                r["name"],
                float(r["at"]),
                r["team"],
                r["user"],
                int(r["workers"]),
                int(r["gpus"]),
                float(r["seconds"]),
            )  # fmt: skip
            for r in csv.DictReader(f)
        ]


def write_workload(workload: list[WorkJob], path: str | Path) -> None:
    """``workload`` as ``read_workload`` reads it."""
    names = [f.name for f in dataclasses.fields(WorkJob)]
    with open(path, "w", newline="") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow(names)
        out.writerows([getattr(j, n) for n in names] for j in workload)


@dataclass(frozen=True)
class Setup:
    teams: dict[str, float]  # team -> share
    parent: str = "/fair"
    layout: str = "4x8"
    tick: float = 1.0
    grace: float = 5.0
    min_runtime: float = 10.0
    checkpoint_every: float = 10.0
    exit_after_term: float = 1.0
    cpu_oversubscription: float = 4.0
    # seconds from a backend event to the cycle that folds it, in the simulator's service model
    # (the timed backend stamps events exactly; what is left is the loop's wake-up and commit:
    # 1-2 ms from a finish to the next start measured on this machine)
    event_delay: float = 0.002
    # fair over days (docs/scheduling.md "Deserved share 2", "Admission 6"): 0 is off
    fair_share_half_life: float = 0.0
    max_gang_wait: float = 0.0

    def config(self) -> SchedulerConfig:
        """The core's knobs for the simulator, as ``service_traits`` gives them the service."""
        return SchedulerConfig(
            grace=self.grace,
            min_runtime=self.min_runtime,
            fair_share_half_life=self.fair_share_half_life,
            max_gang_wait=self.max_gang_wait,
        )

    def plans(self) -> dict[str, dict]:
        out: dict[str, dict] = {self.parent: {}}
        out.update({f"{self.parent}/{t}": {"share": s} for t, s in self.teams.items()})
        return out

    def nodes(self) -> list[Node]:
        """The virtual nodes the service builds from the layout on this machine."""
        cores = os.cpu_count() or 1
        return detect_nodes(self.layout, int(cores * 1000 * self.cpu_oversubscription))


@dataclass
class JobRun:
    """What happened to one job, in seconds from the start of the run."""

    job: WorkJob
    submitted: float
    first_start: float | None = None
    ended: float | None = None
    state: str = "PENDING"
    preemptions: int = 0
    holds: list[tuple[float, float]] = field(default_factory=list)  # (t, GPUs held from t)


@dataclass
class Outcome:
    label: str
    capacity: float
    runs: list[JobRun]
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)  # the service's, for the simulator
    # the service's median seconds from a start decision to the backend's ``running`` (which the
    # timed backend stamps when its start() is called): how late the loop acts on this machine
    # in this run, the simulator's ``event_delay`` for the same run
    start_lag: float | None = None
    scheduled: int = 0  # the simulator's: how many backend events it scheduled (``Stall.nth``)


# -- the simulator ------------------------------------------------------------------------------
class _TracedReplay(Replay):
    """A replay that also records every job's held GPUs whenever they change (the replay's
    own recorder keeps only sums)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.holds: dict[str, list[tuple[float, float]]] = {}

    def _refresh(self, job) -> None:  # the one place a job's held GPUs change
        super()._refresh(job)
        # the recorder was advanced to this instant before anything of it was decided
        self.holds.setdefault(job.id, []).append((self.recorder.last_t, job.held))


@dataclass(frozen=True)
class Stall:
    """One backend event (the ``nth`` the backend schedules, from 1) seen ``seconds`` late: a
    busy machine's loop that stalls once."""

    nth: int
    seconds: float = 0.5


class _StalledBackend(FakeBackend):
    """The simulator's backend with one event late (``stall``); it counts what it schedules."""

    stall: Stall | None = None
    scheduled = 0

    def _push(
        self, t: float, kind: str, job_id: str, gen: int | None, nodes: tuple, at: float
    ) -> None:
        self.scheduled += 1
        if self.stall is not None and self.scheduled == self.stall.nth:
            t += self.stall.seconds
        super()._push(t, kind, job_id, gen, nodes, at)


def sim_timing(setup: Setup, kind: str):
    """The simulator's timing model (extension/sim/timing.py, issue 18): ``instant`` (its old
    model) or ``service`` (the service's preset, with this setup's tick, exit after SIGTERM and
    event delays); None where the simulator has no timing model."""
    try:
        from extension.sim import timing
    except ImportError:
        return None
    if kind == "instant":
        return timing.Timing()
    ours = {
        "tick": setup.tick,
        "exit_after_term": setup.exit_after_term,
        "start_delay": setup.event_delay,
        "finish_seen_after": setup.event_delay,
        "release_seen_after": setup.event_delay,
        "checkpoint_on_sigterm": True,
    }
    known = {f.name for f in dataclasses.fields(timing.Timing)}
    return dataclasses.replace(
        timing.PRESETS["service"], **{k: v for k, v in ours.items() if k in known}
    )


def scenario(
    workload: list[WorkJob], setup: Setup, nodes: list[Node] | None = None, timing=None
) -> Scenario:
    jobs = [
        ScenarioJob(
            id=j.name,
            at=j.at,
            user=j.user,
            plan=f"{setup.parent}/{j.team}",
            min_workers=j.workers,
            max_workers=j.workers,
            per_worker=Resources(j.gpus, CPU_M, MEMORY),
            duration=j.seconds,
        )
        for j in workload
    ]
    extra = {"timing": timing} if timing is not None else {}
    return Scenario(
        Instance(tuple(nodes or setup.nodes())),
        PlanTree.from_dict(setup.plans()),
        setup.config(),
        setup.checkpoint_every,
        jobs,
        until=math.inf,
        **extra,
    )


def run_sim(
    workload: list[WorkJob],
    setup: Setup,
    policy: str = "wmla",
    timing: str = "service",
    label: str = "",
    nodes: list[Node] | None = None,
    stall: Stall | None = None,
) -> Outcome:
    """The workload through the simulator under ``policy`` (``wmla`` or ``gang-fifo``) with
    the ``timing`` model (``service`` or ``instant``), and ``stall``'s one event late."""
    model = sim_timing(setup, timing)
    plan = scenario(workload, setup, nodes, model)
    backend = backend_for(plan, _StalledBackend)
    backend.stall = stall
    replay = _TracedReplay(plan, make_policy(policy), backend=backend)
    t0 = time.perf_counter()
    replay.run()
    wall = time.perf_counter() - t0
    runs = []
    for j in workload:
        rj = replay.jobs[j.name]
        run = JobRun(j, j.at, rj.first_start, rj.ended, rj.state, rj.preemptions)
        run.holds = replay.holds.get(j.name, [])
        runs.append(run)
    out = Outcome(label or f"sim {policy}", replay.capacity_gpu, runs, wall)
    out.scheduled = backend.scheduled
    if model is None:
        out.notes.append("this simulator has no timing model: its instant model was used")
    else:
        out.notes.append(f"timing {model}")
    return out


def timeline(out: Outcome) -> list[dict]:
    """Each job as it went in ``out``, in seconds from the run's start: what to lay beside
    another run's when their figures differ (which job was reclaimed once more, and when)."""
    return [
        {
            "name": r.job.name,
            "team": r.job.team,
            "submitted": round(r.submitted, 3),
            "first_start": None if r.first_start is None else round(r.first_start, 3),
            "ended": None if r.ended is None else round(r.ended, 3),
            "preemptions": r.preemptions,
            "holds": [(round(t, 3), gpus) for t, gpus in r.holds],
        }
        for r in out.runs
    ]


def gaps(a: dict, b: dict) -> dict[str, float]:
    """How far figures ``a`` are from ``b``: preemptions and each team's held GPU-seconds, as
    fractions of ``b``'s."""
    out = {"preemptions": abs(a["preemptions"] - b["preemptions"]) / max(1, b["preemptions"])}
    for team, held in b["held_gpu_s"].items():
        out[f"held {team}"] = abs(a["held_gpu_s"][team] - held) / held
    return out


def held_gap(gap: dict[str, float]) -> float:
    """The largest of ``gaps``' held GPU-second fractions."""
    return max(v for k, v in gap.items() if k.startswith("held"))


def moved_by(
    workload: list[WorkJob],
    setup: Setup,
    held: float,
    preemptions: float,
    stall: float = 0.5,
    delays: tuple[float, ...] = (0.002, 0.03),
) -> list[str]:
    """What moves the simulator's run of ``workload`` further than ``held`` (held GPU-seconds)
    or ``preemptions`` (as fractions, ``gaps``) from its plain run: each event delay of
    ``delays``, any one submission ``stall`` seconds late, any one backend event ``stall``
    seconds late (a busy machine's loop stalls). Empty where nothing does: a workload whose
    service run the simulator can be held to."""
    plain = run_sim(workload, setup)
    base = figures(plain, setup)

    def moved(figs: dict) -> bool:
        gap = gaps(figs, base)
        return held_gap(gap) > held or gap["preemptions"] > preemptions

    out = []
    for delay in delays:
        other = dataclasses.replace(setup, event_delay=delay)
        if moved(figures(run_sim(workload, other), other)):
            out.append(f"event delay {1000 * delay:.0f} ms")
    for job in workload:
        late = [dataclasses.replace(j, at=j.at + stall) if j is job else j for j in workload]
        if moved(figures(run_sim(late, setup), setup)):
            out.append(f"{job.name} submitted {stall} s late")
    for nth in range(1, plain.scheduled + 1):
        if moved(figures(run_sim(workload, setup, stall=Stall(nth, stall)), setup)):
            out.append(f"backend event {nth} seen {stall} s late")
    return out


# -- figures ------------------------------------------------------------------------------------
def _changes(out: Outcome, setup: Setup, horizon: float) -> list[tuple[float, str, str, float]]:
    """(t, what, key, amount) steps: demand of a user leaf, GPUs held by a team."""
    steps = []
    for r in out.runs:
        leaf = f"{setup.parent}/{r.job.team}/{r.job.user}"
        end = r.ended if r.ended is not None else horizon
        steps.append((r.submitted, "demand", leaf, float(r.job.width)))
        steps.append((end, "demand", leaf, -float(r.job.width)))
        held = 0.0
        for t, gpus in sorted(r.holds, key=lambda h: h[0]):
            steps.append((t, "held", r.job.team, gpus - held))
            held = gpus
        if held:
            steps.append((end, "held", r.job.team, -held))
    return sorted(steps, key=lambda s: s[0])


class _Integral:
    """Held GPU-seconds per team, wanted GPU-seconds, and |held - deserved| per team over
    the whole run and over contended time (demand above capacity)."""

    def __init__(self, setup: Setup, capacity: float) -> None:
        self.setup, self.capacity = setup, capacity
        self.shape = PlanShape(
            [(p, s.get("share", 1.0), math.inf) for p, s in setup.plans().items()]
        )
        self.teams = list(setup.teams)
        self.held = dict.fromkeys(self.teams, 0.0)
        self.held_gs = dict.fromkeys(self.teams, 0.0)
        self.demand: dict[str, float] = {}
        self.deserved: dict[str, float] = {}
        self.dev = {k: dict.fromkeys(self.teams, 0.0) for k in ("whole", "contended")}
        self.span = {"whole": 0.0, "contended": 0.0}
        self.wanted = 0.0

    def step(self, what: str, key: str, amount: float) -> None:
        if what == "held":
            self.held[key] += amount
            return
        self.shape.add(key)
        self.demand[key] = self.demand.get(key, 0.0) + amount
        self.deserved = {}

    def span_of(self, dt: float) -> None:
        if dt <= 0:
            return
        if not self.deserved:
            self.deserved = deserved_gpus(self.shape, self.demand, self.capacity)
        total = sum(v for v in self.demand.values())
        self.wanted += min(self.capacity, total) * dt
        kinds = ("whole", "contended") if total > self.capacity + 1e-9 else ("whole",)
        for kind in kinds:
            self.span[kind] += dt
        for team in self.teams:
            self.held_gs[team] += self.held[team] * dt
            gap = abs(self.held[team] - self.deserved.get(f"{self.setup.parent}/{team}", 0.0))
            for kind in kinds:
                self.dev[kind][team] += gap * dt


def figures(out: Outcome, setup: Setup) -> dict:
    """Every figure the benchmark prints, from ``out``'s jobs alone (docs/simulate.md)."""
    ends = [r.ended for r in out.runs if r.ended is not None]
    horizon = max(ends + [r.submitted for r in out.runs]) if out.runs else 0.0
    acc = _Integral(setup, out.capacity)
    last = None
    for t, what, key, amount in _changes(out, setup, horizon):
        if last is not None:
            acc.span_of(t - last)
        acc.step(what, key, amount)
        last = t
    held_total = sum(acc.held_gs.values())
    finished = [r for r in out.runs if r.state == "FINISHED"]
    useful = sum(r.job.seconds * r.job.width for r in finished)
    waits = {r.job.name: r.first_start - r.submitted for r in out.runs if r.first_start is not None}
    gangs = [waits[r.job.name] for r in out.runs if r.job.workers > 1 and r.job.name in waits]
    return {
        "jobs": len(out.runs),
        "finished": len(finished),
        "makespan_s": round(horizon, 2),
        "utilization": round(held_total / acc.wanted, 4) if acc.wanted else None,
        "held_gpu_s": {t: round(v, 1) for t, v in acc.held_gs.items()},
        "mean_dev_gpu": {
            kind: round(sum(acc.dev[kind].values()) / len(acc.teams) / acc.span[kind], 3)
            if acc.span[kind]
            else 0.0
            for kind in acc.dev
        },
        "contended_s": round(acc.span["contended"], 1),
        "waits": {
            t: percentiles(
                waits[r.job.name] for r in out.runs if r.job.team == t and r.job.name in waits
            )
            for t in acc.teams
        },
        "largest_gang_wait_s": round(max(gangs), 2) if gangs else None,
        "preemptions": sum(r.preemptions for r in out.runs),
        "preempted_jobs": sum(1 for r in out.runs if r.preemptions),
        "lost_gpu_s": round(sum(acc.held_gs.values()) - useful, 1)
        if len(finished) == len(out.runs)
        else None,
        "wall_s": round(out.wall_s, 1),
    }


# -- the service ----------------------------------------------------------------------------
def service_traits(setup: Setup) -> dict:
    """``c.WmlaService`` for the run: the timed backend on the layout's virtual nodes, the
    setup's timing, and its plans as the store's first plans."""
    return {
        "backend_class": "benchmarks.timed_backend.TimedBackend",
        "backend_options": {
            "checkpoint_every": setup.checkpoint_every,
            "exit_after_term": setup.exit_after_term,
        },
        "device_layout": setup.layout,
        "cpu_oversubscription": setup.cpu_oversubscription,
        "tick": setup.tick,
        "grace": setup.grace,
        "min_runtime": setup.min_runtime,
        "fair_share_half_life": setup.fair_share_half_life,
        "max_gang_wait": setup.max_gang_wait,
        "default_plans": setup.plans(),
        "reconcile_seconds": 0,  # no notebooks here
    }


def job_body(j: WorkJob, setup: Setup) -> dict:
    return {
        "plan": f"{setup.parent}/{j.team}",
        "name": j.name,
        "workers": j.workers,
        "resources": {"gpu": j.gpus, "cpu": f"{CPU_M}m", "memory": f"{MEMORY // 2**20}Mi"},
        "command": {
            "model_dir": "models/virtual",
            "model_main": "virtual-job.py",
            "args": ["--seconds", repr(float(j.seconds))],
        },
    }


def run_service(
    workload: list[WorkJob], setup: Setup, tmp: Path, say=None, timeout: float | None = None
) -> Outcome:
    """The workload through hub + proxy + service in real time; every process it starts is
    stopped by PID whatever happens (``Hub.stop``)."""
    from tests.service.hub import Hub

    say = say or (lambda text: print(text, file=sys.stderr, flush=True))
    hub = Hub(tmp, service_traits(setup))
    hub.env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p
    )
    try:
        say("starting the hub, the proxy and the wmla service ...")
        hub.start(timeout=120)
        tokens = _make_users(hub, sorted({j.user for j in workload}))
        admin = hub.user_token("padmin")
        instance = asyncio.run(_get(hub.api + "/instance", admin))
        nodes = [
            Node(
                n["name"],
                Resources(**{k: n["capacity"].get(k, 0) for k in ("gpu", "cpu", "memory")}),
            )
            for n in instance["nodes"]
        ]
        last = max(j.at for j in workload)
        say(f"submitting {len(workload)} jobs over {last:.0f} s of real time ...")
        t0 = time.time() + 1.0
        wall0 = time.perf_counter()
        sent = asyncio.run(_submit_all(hub.api, workload, setup, tokens, t0))
        limit = timeout or 3 * (last + max(j.seconds for j in workload)) + 60
        asyncio.run(_wait_ended(hub.api, admin, t0 + limit))
        wall = time.perf_counter() - wall0
        jobs, histories = asyncio.run(_read_back(hub.api, admin))
    finally:
        hub.stop()
    out = _outcome(workload, jobs, histories, t0, sum(n.capacity.gpu for n in nodes))
    out.wall_s, out.nodes = wall, nodes
    out.start_lag = start_lag(histories)
    if out.start_lag is not None:
        out.notes.append(f"a start decision to running: median {1000 * out.start_lag:.0f} ms")
    late = max((s[1] - j.at for j, s in zip(workload, sent)), default=0.0)
    bad = [s for s in sent if s[0] != 201]
    out.notes.append(f"submissions at most {1000 * late:.0f} ms after their time")
    if bad:
        out.notes.append(f"{len(bad)} submissions not accepted: {bad[:3]}")
    return out


def start_lag(histories: dict[str, list[dict]]) -> float | None:
    """The median of each start's ``started`` to its next ``running`` transition, in seconds;
    None where no start ran."""
    lags = []
    for steps in histories.values():
        started = None
        for step in sorted(steps, key=lambda s: s["at"]):
            if step["event"] == "started":
                started = step["at"]
            elif step["event"] == "running" and started is not None:
                lags.append(step["at"] - started)
                started = None
    return statistics.median(lags) if lags else None


def as_measured(setup: Setup, service: Outcome) -> Setup:
    """``setup`` with the service's own start lag in that run as the simulator's event delay
    (never below the setup's): a busy machine's loop acts later on every event."""
    lag = max(setup.event_delay, service.start_lag or 0.0)
    return dataclasses.replace(setup, event_delay=lag)


def as_submitted(service: Outcome) -> list[WorkJob]:
    """The service's workload at the times its jobs reached it (a busy machine's client, proxy
    or loop makes a submission late): what the simulator replays to predict that run."""
    return [dataclasses.replace(r.job, at=max(0.0, r.submitted)) for r in service.runs]


def predicted(service: Outcome, setup: Setup) -> Outcome:
    """The simulator's run of what the service ran, as the service ran it: its jobs at the
    times they reached it, its start lag as the event delay, its nodes."""
    return run_sim(as_submitted(service), as_measured(setup, service), nodes=service.nodes)


def _make_users(hub, names: list[str]) -> dict[str, str]:
    """Hub users with their own API tokens, and the (never run) script in each one's folder."""
    r = hub.hub_api("POST", "/users", json={"usernames": names})
    assert r.status_code in (201, 409), r.text
    tokens = {}
    for name in names:
        r = hub.hub_api("POST", f"/users/{name}/tokens", json={"note": "wmla fairness"})
        assert r.status_code == 201, r.text
        tokens[name] = r.json()["token"]
        folder = hub.storage / name / "models" / "virtual"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "virtual-job.py").write_text(SCRIPT)
    return tokens


async def _get(url: str, token: str, **params) -> dict:
    import aiohttp

    headers = {"Authorization": f"token {token}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.get(url, params=params) as r:
            text = await r.text()
            if r.status != 200:
                raise RuntimeError(f"GET {url} {params}: {r.status} {text[:300]}")
            return json.loads(text)


async def _submit_all(
    api: str, workload: list[WorkJob], setup: Setup, tokens: dict[str, str], t0: float
) -> list[tuple[object, float, float]]:
    """Each job POSTed at ``t0 + at`` by its own user: (status, sent, answered) per job, in
    seconds from ``t0``."""
    import aiohttp

    sessions = {
        user: aiohttp.ClientSession(headers={"Authorization": f"token {token}"})
        for user, token in tokens.items()
    }

    async def one(j: WorkJob) -> tuple[object, float, float]:
        await asyncio.sleep(max(0.0, t0 + j.at - time.time()))
        sent = time.time() - t0
        key = {"Idempotency-Key": uuid.uuid4().hex}
        try:
            async with sessions[j.user].post(
                api + "/jobs", json=job_body(j, setup), headers=key
            ) as r:
                await r.read()
                status: object = r.status
        except aiohttp.ClientError as err:
            status = type(err).__name__
        return status, sent, time.time() - t0

    try:
        return list(await asyncio.gather(*(one(j) for j in workload)))
    finally:
        for session in sessions.values():
            await session.close()


async def _wait_ended(api: str, token: str, deadline: float) -> None:
    while time.time() < deadline:
        live = await _get(api + "/jobs", token, state="PENDING,RUNNING", limit="1")
        if not live["jobs"]:
            return
        await asyncio.sleep(0.5)
    raise RuntimeError("jobs still live at the deadline")


async def _read_back(api: str, token: str) -> tuple[list[dict], dict[str, list[dict]]]:
    """Every job (as a plan admin) and every job's transitions."""
    jobs = await every_job(_get, api + "/jobs", token)
    gate = asyncio.Semaphore(8)

    async def history(job_id: str) -> list[dict]:
        async with gate:
            return (await _get(f"{api}/jobs/{job_id}/history", token))["transitions"]

    found = await asyncio.gather(*(history(j["id"]) for j in jobs))
    return jobs, {j["id"]: h for j, h in zip(jobs, found)}


def _outcome(
    workload: list[WorkJob],
    jobs: list[dict],
    histories: dict[str, list[dict]],
    t0: float,
    capacity: float,
) -> Outcome:
    """The service's record of each job, in seconds from ``t0``: held GPUs from the
    transitions (``workers`` hold from ``at`` on), the first start, the end."""
    by_name = {j["name"]: j for j in jobs}
    runs = []
    for w in workload:
        job = by_name[w.name]
        steps = histories[job["id"]]
        run = JobRun(w, job["submitted"] - t0, None, None, job["state"], job["preemptions"])
        if job["ended"] is not None:
            run.ended = job["ended"] - t0
        for step in sorted(steps, key=lambda s: s["at"]):
            if step["event"] == "started" and run.first_start is None:
                run.first_start = step["at"] - t0
            held = step["workers"] * step["per_worker"].get("gpu", 0)
            if not run.holds or run.holds[-1][1] != held:
                run.holds.append((step["at"] - t0, held))
        runs.append(run)
    return Outcome("service", capacity, runs)
