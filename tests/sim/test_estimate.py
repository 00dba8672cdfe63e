"""The estimated start (extension/sim/estimate.py): the real core run forward from a live state.

- Exact: in scenarios where every job runs exactly to its limit, the estimate taken at an
  instant equals the start the simulator really gives each pending job. The simulator runs
  the wmla policy on full snapshots (``Wmla(aggregate=False)``) under its plain instant timing
  (``Timing()``): a cycle at every instant something happens and when a ``min_runtime`` runs
  out, victims holding their resources through the whole grace: the estimator's own model.
  Checkpoints every second at whole-second times, so a preemption loses nothing, as the
  estimator assumes. The state is taken at the instant, before the cycle there, so that the
  forward run's first cycle is the simulator's cycle at that instant.
- Gangs, the reservation, plan shares, ``min_runtime`` and grace worked out by hand.
- Ranks total and deterministic; the budget cuts a big state (``exact`` False, every job
  still ranked, the rest started by the rough tail); binning only ever makes a start later
  in a FIFO world.
- No arrivals are assumed: a later submission that the fair order puts ahead starts first,
  and the job starts later than its estimate said.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict

import pytest

from extension.scheduler import (
    Instance,
    JobState,
    Preempt,
    Resources,
    SchedulerConfig,
    Snapshot,
    Start,
)
from extension.sim import estimate
from extension.sim.estimate import estimate_starts
from extension.sim.policies import Wmla
from extension.sim.replay import Replay
from extension.sim.scenario import Scenario, ScenarioJob
from tests.scheduler.builders import nodes, pending, running, tree

ROOMY = 30.0  # seconds of budget: exactness must not hang on how busy the machine is


# -- the simulator, watched ---------------------------------------------------------------------
class Watch(Wmla):
    """The wmla policy on full snapshots that, at the first instant at or after ``at`` and
    before the cycle there, estimates every pending job's start from the live state (each
    running job's end as the fake backend will report it, each pending job's work left), and
    then records every start the replay really makes."""

    def __init__(self, at: float) -> None:
        super().__init__(aggregate=False)
        self.at = at
        self.taken: tuple[float, estimate.Estimates, list[str]] | None = None
        self.starts: dict[str, list[float]] = defaultdict(list)
        self.release_at: dict[str, float] = {}

    def step(self, now: float) -> None:
        if self.taken is None and now >= self.at:
            self.taken = self._estimate(now)
        super().step(now)

    def cycle(self, now: float):
        result = super().cycle(now)
        for d in result.decisions:
            if isinstance(d, Start):
                self.starts[d.job_id].append(now)
            elif isinstance(d, Preempt):
                self.release_at[d.job_id] = now + d.grace
        return result

    def _estimate(self, now: float) -> tuple:
        backend = self.replay.backend
        ends, runtimes = {}, {}
        for job_id, job in self.live.items():
            run = backend.runs[job_id]
            left = (run.work - run.done) / job.core.max_workers
            if job.core.state is JobState.PENDING:
                runtimes[job_id] = left
            elif job.core.terminating:  # a victim: back in line after its grace
                ends[job_id], runtimes[job_id] = self.release_at[job_id], left
            else:
                ends[job_id] = run.finish_at
        snapshot = Snapshot(
            self.plans,
            self.replay.instance,
            [j.core for j in self.live.values()],
            self.config,
            self.reserved,
        )
        waiting = [j.id for j in self.live.values() if j.core.state is JobState.PENDING]
        return now, estimate_starts(snapshot, now, ends, runtimes, budget_s=ROOMY), waiting

    def next_start(self, job_id: str, after: float) -> float | None:
        return next((t for t in self.starts[job_id] if t >= after), None)


def contended(seed: int, min_runtime: float = 0.0, jobs: int = 30) -> Scenario:
    """8 GPUs on 2 nodes, three plans at 2:1:1, jobs submitted over the first 20 s, each user
    with one gang size (1, 2 or 4 one-GPU workers) and whole-second durations."""
    rng = random.Random(seed)
    instance = Instance(nodes(2, gpu=4))
    plans = tree({"/a": (2, None), "/b": (1, None), "/c": (1, None)})
    config = SchedulerConfig(grace=5.0, min_runtime=min_runtime)
    scenario = Scenario(instance, plans, config, checkpoint_every=1.0, until=math.inf)
    for i in range(jobs):
        user = rng.randrange(3)
        workers = (1, 2, 4)[user]
        scenario.jobs.append(
            ScenarioJob(
                id=f"j{i:02d}",
                at=float(rng.randrange(20)),
                user=f"u{user}",
                plan=rng.choice(("/a", "/b", "/c")),
                min_workers=workers,
                max_workers=workers,
                per_worker=Resources(1, 0, 0),
                duration=float(rng.randrange(5, 60)),
            )
        )
    return scenario


def watched(scenario: Scenario, at: float) -> Watch:
    policy = Watch(at)
    Replay(scenario, policy).run()
    assert policy.taken is not None
    return policy


# -- (a) exact where every job runs to its limit -------------------------------------------------
@pytest.mark.parametrize("min_runtime", [0.0, 10.0], ids=["no-min-runtime", "min-runtime-10"])
@pytest.mark.parametrize("seed", range(8))
def test_the_estimate_is_the_real_start_when_every_job_runs_to_its_limit(seed, min_runtime):
    policy = watched(contended(seed, min_runtime), at=25.0)
    now, estimates, waiting = policy.taken
    assert waiting and estimates.exact
    assert set(estimates.jobs) == set(waiting)
    got = {job_id: estimates.jobs[job_id].start for job_id in waiting}
    real = {job_id: policy.next_start(job_id, now) for job_id in waiting}
    assert got == real


def test_the_exact_scenarios_preempt():
    assert watched(contended(0), at=25.0).replay.preemptions > 0


def test_the_forward_run_does_not_touch_the_callers_jobs():
    jobs = [running("r", "/a", ("n1",)), pending("p", "/a", submitted=1.0)]
    before = [(j.state, j.placement, j.started, j.terminating) for j in jobs]
    snap = Snapshot(tree({"/a": (1, None)}), Instance(nodes(1, gpu=1)), jobs)
    got = estimate_starts(snap, 5.0, {"r": 10.0}, {"p": 3.0})
    assert got.jobs["p"].start == 10.0
    assert [(j.state, j.placement, j.started, j.terminating) for j in jobs] == before


# -- (b) gangs, the reservation, plan shares, min_runtime and grace, by hand ----------------------
def world(shares: dict, gpus: int, jobs: list, **config) -> Snapshot:
    plans = tree({path: (share, None) for path, share in shares.items()})
    return Snapshot(plans, Instance(nodes(1, gpu=gpus)), jobs, SchedulerConfig(**config))


def test_a_4_gpu_gang_behind_1_gpu_jobs_takes_what_they_free_by_its_reservation():
    # 6 GPUs, /a and /b at 1:2: /b deserves 4, so its 4-GPU gang g is within its share and
    # holds the reservation (/a's jobs are not preemptible: no reclaim). /a's six jobs end at
    # 10, 20, ... 60: what they free is held for g, which starts at 40 when four are free;
    # /a's queued a7 and a8 (submitted before g) get what a5 and a6 free: 50 and 60
    jobs = [running(f"a{i}", "/a", ("n1",), preemptible=False) for i in range(1, 7)]
    jobs += [pending("a7", "/a", submitted=1.0), pending("a8", "/a", submitted=2.0)]
    jobs.append(pending("g", "/b", user="u2", workers=4, submitted=3.0))
    ends = {f"a{i}": 10.0 * i for i in range(1, 7)}
    runtimes = {"a7": 100.0, "a8": 100.0, "g": 50.0}
    got = estimate_starts(world({"/a": 1, "/b": 2}, 6, jobs), 5.0, ends, runtimes)
    assert {k: (e.start, e.rank) for k, e in got.jobs.items()} == {
        "g": (40.0, 0),
        "a7": (50.0, 1),
        "a8": (60.0, 2),
    }
    assert got.exact and got.horizon == 60.0


def test_a_plan_at_its_share_waits_while_the_other_gets_what_frees():
    # 4 GPUs, /a and /b at 1:1, each holding its 2. /a's jobs queued first, but what /b frees
    # at 10 goes to /b (under its share then): b3 at 10. At 20 /b's demand is down to b3, so
    # /a deserves 3 and a3 starts; a4 when b3 ends (60), /b having no demand left (/a borrows)
    jobs = [
        running("a1", "/a", ("n1",)),
        running("a2", "/a", ("n1",)),
        running("b1", "/b", ("n1",), user="u2"),
        running("b2", "/b", ("n1",), user="u2"),
        pending("a3", "/a", submitted=0.0),
        pending("a4", "/a", submitted=0.5),
        pending("b3", "/b", user="u2", submitted=1.0),
    ]
    ends = {"a1": 100.0, "a2": 200.0, "b1": 10.0, "b2": 20.0}
    runtimes = dict.fromkeys(("a3", "a4", "b3"), 50.0)
    got = estimate_starts(world({"/a": 1, "/b": 1}, 4, jobs), 5.0, ends, runtimes)
    assert {k: e.start for k, e in got.jobs.items()} == {"b3": 10.0, "a3": 20.0, "a4": 60.0}
    assert [k for k, _ in sorted(got.jobs.items(), key=lambda kv: kv[1].rank)] == [
        "b3",
        "a3",
        "a4",
    ]


def test_a_plan_under_its_share_reclaims_when_min_runtime_runs_out_and_the_grace_is_over():
    # /b borrows all 4 GPUs with jobs started at 0; /a's job (deserved 1) may reclaim one only
    # when they are past min_runtime (60), the victim leaves after the grace (5): start at 65
    jobs = [running(f"b{i}", "/b", ("n1",), user="u2", started=0.0) for i in range(4)]
    jobs.append(pending("a1", "/a", submitted=10.0))
    snap = world({"/a": 1, "/b": 1}, 4, jobs, grace=5.0, min_runtime=60.0)
    ends = {f"b{i}": 1000.0 for i in range(4)}
    got = estimate_starts(snap, 10.0, ends, {"a1": 100.0})
    assert got.jobs["a1"].start == 65.0 and got.exact


@pytest.mark.parametrize(
    "victim_runtime, expected", [(50.0, 65.0), (None, 15.0)], ids=["comes-back", "is-gone"]
)
def test_a_victim_in_its_grace_comes_back_in_line_when_it_has_a_runtime(victim_runtime, expected):
    # 1 GPU. v (submitted first) is being stopped until 5; p, blocked since before, holds the
    # reservation and takes the GPU at 5 (to 15). With a runtime left for v, v is pending again
    # from 5 and goes before q (submitted later): q at 65; without one v is gone: q at 15
    victim = running("v", "/a", ("n1",), submitted=0.0, terminating=True)
    jobs = [victim, pending("p", "/a", submitted=3.0), pending("q", "/a", submitted=4.0)]
    runtimes = {"p": 10.0, "q": 10.0}
    if victim_runtime is not None:
        runtimes["v"] = victim_runtime
    snap = world({"/a": 1}, 1, jobs)
    snap.reserved = "p"
    got = estimate_starts(snap, 0.0, {"v": 5.0}, runtimes)
    assert (got.jobs["p"].start, got.jobs["q"].start) == (5.0, expected)


def test_an_elastic_job_grows_in_the_forward_run_and_its_end_stays():
    # e (1..3 workers) grows into what r frees at 10; it still ends at its runtime (40), then p
    jobs = [
        running("e", "/a", ("n1",), workers=(1, 3)),
        running("r", "/a", ("n1", "n1")),
        pending("p", "/a", workers=3, submitted=1.0),
    ]
    got = estimate_starts(world({"/a": 1}, 3, jobs), 0.0, {"e": 40.0, "r": 10.0}, {"p": 5.0})
    assert got.jobs["p"].start == 40.0


# -- (c) ranks -----------------------------------------------------------------------------------
def test_ranks_are_total_follow_the_starts_and_are_deterministic():
    policy = watched(contended(3), at=25.0)
    now, first, waiting = policy.taken
    again = watched(contended(3), at=25.0).taken[1]
    assert {k: (e.start, e.rank) for k, e in first.jobs.items()} == {
        k: (e.start, e.rank) for k, e in again.jobs.items()
    }
    ranks = sorted(e.rank for e in first.jobs.values())
    assert ranks == list(range(len(waiting)))
    by_rank = sorted(first.jobs.values(), key=lambda e: e.rank)
    assert [e.start for e in by_rank] == sorted(e.start for e in by_rank)


def test_jobs_never_reached_come_last_by_priority_then_submission_then_id():
    # p1 takes the only GPU and never ends (no runtime given): the others never start, and
    # nothing was cut, so the answer is still exact
    jobs = [
        running("r", "/a", ("n1",)),
        pending("p1", "/a", submitted=0.0, priority=5),
        pending("z", "/a", submitted=2.0),
        pending("y", "/a", submitted=2.0),
        pending("x", "/a", submitted=3.0, priority=1),
        pending("w", "/a", submitted=1.0),
    ]
    got = estimate_starts(world({"/a": 1}, 1, jobs), 0.0, {"r": 7.0}, {"z": 1, "y": 1, "x": 1})
    assert got.jobs["p1"] == estimate.Estimate(7.0, 0)
    rest = sorted((e.rank, k) for k, e in got.jobs.items() if e.start is None)
    assert [k for _, k in rest] == ["x", "w", "y", "z"]
    assert got.exact and got.horizon == 7.0


# -- (d) the budget --------------------------------------------------------------------------------
def busy(pending_jobs: int = 100, seed: int = 5) -> tuple[Snapshot, dict, dict]:
    """16 nodes x 8 GPUs full of 2-GPU jobs ending over the next 8 hours, and a queue of
    1-, 2- and 4-GPU jobs over 8 plans."""
    rng = random.Random(seed)
    plans = tree({f"/t{i}": (rng.choice((1, 2, 4)), None) for i in range(8)})
    jobs, ends, runtimes = [], {}, {}
    for i in range(64):
        node = f"n{i // 4 + 1}"
        jobs.append(running(f"r{i}", f"/t{i % 8}", (node, node), user=f"u{i % 3}"))
        ends[f"r{i}"] = rng.uniform(60, 8 * 3600)
    for i in range(pending_jobs):
        workers = rng.choice((1, 1, 2, 4))
        plan, user, priority = f"/t{rng.randrange(8)}", f"u{rng.randrange(3)}", rng.choice((0, 1))
        job = pending(f"p{i}", plan, user, workers, submitted=float(i), priority=priority)
        jobs.append(job)
        runtimes[job.id] = rng.uniform(600, 4 * 3600)
    return Snapshot(plans, Instance(nodes(16)), jobs), ends, runtimes


def test_the_budget_cuts_a_big_state_and_every_job_still_has_a_rank():
    snap, ends, runtimes = busy()
    got = estimate_starts(snap, 0.0, ends, runtimes, budget_s=0.0)
    assert got.cycles == 1 and not got.exact  # the first cycle always runs, then the cut
    assert sorted(e.rank for e in got.jobs.values()) == list(range(100))
    # the cluster is full now: every start is the rough tail's (tests/sim/test_tail.py)
    assert got.rough == 100 and all(e.rough and e.start > 0 for e in got.jobs.values())
    whole = estimate_starts(snap, 0.0, ends, runtimes, budget_s=ROOMY)
    assert whole.exact and all(e.start is not None for e in whole.jobs.values())


def test_binning_makes_a_start_only_later_in_a_fifo_world(monkeypatch):
    # one plan of 1-GPU jobs: capacity freed late (at a bin's end) can only start a job late
    plans = tree({"/a": (1, None)})
    jobs = [running(f"r{i}", "/a", (f"n{i // 8 + 1}",)) for i in range(16)]
    jobs += [pending(f"p{i:03d}", "/a", submitted=float(i)) for i in range(120)]
    snap = Snapshot(plans, Instance(nodes(2)), jobs)
    rng = random.Random(2)
    ends = {f"r{i}": rng.uniform(1, 3600) for i in range(16)}
    runtimes = {j.id: rng.uniform(60, 1800) for j in jobs if j.id.startswith("p")}
    exact = estimate_starts(snap, 0.0, ends, runtimes, budget_s=ROOMY)
    # price every cycle at a tenth of the budget: about ten cycles, so the events are binned
    monkeypatch.setattr(estimate._Forward, "_price", lambda self: ROOMY / 10)
    binned = estimate_starts(snap, 0.0, ends, runtimes, budget_s=ROOMY)
    assert exact.exact and not binned.exact and binned.cycles < exact.cycles
    for job_id, e in binned.jobs.items():
        if not e.rough:  # the core's starts (the rough tail's are tests/sim/test_tail.py's)
            assert e.start >= exact.jobs[job_id].start - 1e-9
    assert any(not e.rough for e in binned.jobs.values())


# -- (e) no arrivals are assumed -------------------------------------------------------------------
def late_arrival(arrives: bool) -> Scenario:
    """2 GPUs: /a runs a1 (to 10) and a2 (to 100), a3 queued at 0; /b submits b1 at 5 if
    ``arrives``: /b is under its share and goes before a3."""
    plans = tree({"/a": (1, None), "/b": (1, None)})
    scenario = Scenario(Instance(nodes(1, gpu=2)), plans, SchedulerConfig(), 1.0, until=math.inf)
    one = Resources(1, 0, 0)
    specs = [("a1", 0, "/a", 10), ("a2", 0, "/a", 100), ("a3", 0, "/a", 20)]
    if arrives:
        specs.append(("b1", 5, "/b", 30))
    for job_id, at, plan, duration in specs:
        scenario.jobs.append(ScenarioJob(job_id, at, "u1", plan, 1, 1, one, duration))
    return scenario


def test_the_estimate_assumes_nobody_else_comes():
    alone = watched(late_arrival(False), at=0.0)
    _, estimates, _ = alone.taken
    assert estimates.jobs["a3"].start == 10.0 == alone.next_start("a3", 0.0)
    crowded = watched(late_arrival(True), at=0.0)
    assert crowded.taken[1].jobs["a3"].start == 10.0  # taken at 0, before b1 was submitted
    # b1 (/b under its share) reclaimed one of /a's GPUs at 5 and a3 waits behind it
    assert crowded.next_start("b1", 0.0) < crowded.next_start("a3", 0.0)
    assert crowded.next_start("a3", 0.0) > 10.0


def test_a_batch_of_many_events_scales_the_price_of_its_cycle():
    # 64 running jobs ending at 10 s apart; after batches of 2 events a cycle taking 8 may cost
    # 4 times as much, one taking all of them at most BATCH_SCALE times
    snap, ends, runtimes = busy()
    ends = {f"r{i}": 100.0 + 10 * (i // 2) for i in range(64)}
    run = estimate._Forward(snap, 0.0, ends, runtimes, estimate.IndexCache())
    run.batches = [2, 2, 2]
    assert run._scale(100.0) == 1.0  # 2 events, as usual
    assert run._scale(130.0) == 4.0  # 8 events
    assert run._scale(1e9) == estimate.BATCH_SCALE  # 64
    run.batches = [64]
    assert run._scale(1e9) == 1.0
