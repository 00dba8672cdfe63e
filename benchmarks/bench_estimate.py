"""Estimated start benchmark (issue 19): how close the forward run's estimate
(extension/sim/estimate.py) comes to the real start on a contended Philly slice, beside a naive
baseline in the same run, and what one estimate of a busy cluster costs.

    .venv/bin/python benchmarks/bench_estimate.py [--quick] [--json]

The replay: Philly October 2017 (shared/data/traces), the jobs of four virtual clusters
submitted from Oct 16 00:00 for 24 h (``--quick``: 12 h), each a team plan at shares
``6c71a0`` 2, ``ee9e8c`` 1, ``11cb48`` 1, ``7f04ca`` 1, on 12 x 8 GPUs (a job of more than 8
GPUs is a gang of whole nodes), replayed by the simulator: the real core under the instant
timing (a cycle at every event, victims hold through the 30 s grace), ``min_runtime`` 600 s,
checkpoints every 600 s. The trace has no users: a team's jobs alternate between two.

Runtime limits: Philly has none, so half the jobs (seeded) get one the way users set them:
their real duration times a factor drawn from [0.9, 1.5), rounded up to the next of 5, 15, 30
minutes, 1, 2, 3, 4, 6, 8, 12, 16 hours, 1, 1.5, 2, 3, 4, 5, 7, 10, 14 days. A job whose limit
is below its duration is killed at its limit (it runs for its limit in the replay).

At each submission, after the cycle that sees it, the forward run gets the replay's live state
(the core's jobs, the plans, the reservation) and the inputs the service gives it
(extension/sim/runtimes.py ``forward_inputs``, the same function): a running job ends at its
start plus its limit, or without one plus the median runtime of that user's last 20 finished
jobs in that plan, else the plan's last 20, else 1 hour; one past that guess runs as long again
as it has so far (within its limit); nothing ends before now + the grace; a pending job runs
its limit or that guess (the service reads the history again every minute; here it is always up
to date). A second forward run at the same instant
gets the true inputs (each running job's real end, each pending job's real runtime: what the
replay's fake backend knows), so what error is left there is the forward run's own and that
of its no-arrivals assumption. Each forward run has the service's default budget (0.15 s).
Every job still pending after its submission's cycle has its estimates compared with its real
start: median and p90 absolute error and the median of error / actual wait, for jobs with a
limit and without, beside the baseline: now + the mean wait so far of that plan's started jobs.

The cost: ``estimate_starts`` on benchmarks/bench_scheduler.py's busy world(1000) (1,000
pending on 512 x 8 GPUs, 1,111 plans, every GPU busy, settled after its first cycle: its victims
terminating), with running jobs ending uniformly over the next 8 hours and pending ones running
30 minutes to 4 hours; p50 and p99 wall time over 5 runs (quick: 2), the cycles run, whether it
was exact, how many jobs got a start and how many of those the rough tail gave
(extension/sim/tail.py); and the rough tail's error against the core alone run with a roomy
budget (30 s, quick 5 s: hundreds of cycles, binned): the median of |start - the core's| over
the core's wait, for the jobs the reference's core reached.

Goals (issue 19): jobs with limits, median error at most a quarter of the actual wait; jobs
without, a median error at most 3/4 of the baseline's; at 1,000 pending on 512 nodes, under
200 ms, and with every pending job given a start.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.bench_scheduler import percentile, settle, world  # noqa: E402
from extension.scheduler import JobState, Preempt, Snapshot, Start  # noqa: E402
from extension.sim.estimate import estimate_starts  # noqa: E402
from extension.sim.policies import Wmla  # noqa: E402
from extension.sim.replay import Replay  # noqa: E402
from extension.sim.runtimes import HISTORY, RunHistory, forward_inputs  # noqa: E402
from extension.sim.trace import (  # noqa: E402
    TraceOptions,
    TraceRow,
    parse_nodes,
    read_trace,
    trace_scenario,
)

TRACE = REPO.parent / "shared" / "data" / "traces" / "philly_vc_2017-10.csv"
SHARES = {"6c71a0": 2.0, "ee9e8c": 1.0, "11cb48": 1.0, "7f04ca": 1.0}
NODES = "12x8"
START_DAY = 15  # Oct 16 00:00
HOURS, QUICK_HOURS = 24, 12
OPTIONS = TraceOptions(grace=30.0, min_runtime=600.0, checkpoint_every=600.0)
SEED = 19
LIMIT_FRACTION = 0.5
LIMIT_FACTOR = (0.9, 1.5)
MINUTE, HOUR, DAY = 60, 3600, 86400
LADDER = [m * MINUTE for m in (5, 15, 30)] + [h * HOUR for h in (1, 2, 3, 4, 6, 8, 12, 16)]
LADDER += [d * DAY for d in (1, 1.5, 2, 3, 4, 5, 7, 10, 14)]
DEFAULT_RUNTIME = 3600.0  # the service's default_runtime
GOAL_RELATIVE = 0.25  # median error over the actual wait, jobs with limits
GOAL_BASELINE = 0.75  # jobs without: median error at most this share of the baseline's
GOAL_MS = 200.0


# -- the workload ---------------------------------------------------------------------------
def philly_slice(hours: float) -> list[TraceRow]:
    """The four teams' jobs submitted in the window, times from its start, two users a team."""
    lo, hi = START_DAY * DAY, START_DAY * DAY + hours * HOUR
    out, seen = [], dict.fromkeys(SHARES, 0)
    for r in read_trace(TRACE):
        if lo <= r.submit < hi and r.team in SHARES:
            seen[r.team] += 1
            user = f"{r.team}-{1 + seen[r.team] % 2}"
            out.append(TraceRow(r.job_id, r.submit - lo, r.duration, r.gpus, r.team, user, ""))
    return out


def round_up(seconds: float) -> float:
    """The next step of the ladder users pick limits from (the last one beyond it)."""
    return next((step for step in LADDER if step >= seconds), LADDER[-1])


def give_limits(rows: list[TraceRow]) -> dict[str, float]:
    """A limit for LIMIT_FRACTION of the jobs (seeded): duration x U(LIMIT_FACTOR), rounded up."""
    rng = random.Random(SEED)
    limits = {}
    for r in rows:
        factor = rng.uniform(*LIMIT_FACTOR)
        if rng.random() < LIMIT_FRACTION:
            limits[r.job_id] = round_up(r.duration * factor)
    return limits


def scenario(rows: list[TraceRow], limits: dict[str, float]):
    """The replay's scenario; a job runs for min(duration, limit): killed at its limit."""
    teams = {r.team for r in rows}  # a short window may miss a team
    shares = {t: {"share": s, "limit": math.inf} for t, s in SHARES.items() if t in teams}
    sc = trace_scenario(rows, parse_nodes(NODES, None), shares, OPTIONS)
    sc.jobs = [replace(j, duration=min(j.duration, limits.get(j.id, math.inf))) for j in sc.jobs]
    return sc


# -- the replay, estimating -----------------------------------------------------------------
class Estimating(Wmla):
    """The wmla policy that, after the cycle at an instant with submissions, runs the forward
    estimate from the live state twice, on the service's inputs and on the true ones, and keeps
    the new jobs' estimates (those still pending) with the baseline's."""

    def __init__(self, limits: dict[str, float]) -> None:
        super().__init__()
        self.limits = limits
        self.fresh: list[str] = []
        self.history = RunHistory(HISTORY)
        self.waits: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])  # sum, count
        self.release_at: dict[str, float] = {}  # victims: when their grace ends
        self.records: dict[str, dict] = {}
        self.runs: dict[str, list[tuple[float, int, bool]]] = defaultdict(list)

    def arrive(self, jobs, now: float) -> None:
        super().arrive(jobs, now)
        self.fresh += [j.id for j in jobs]

    def finished(self, job, now: float) -> None:
        started = job.core.started
        if started is not None:  # the runtime of its last run, as the service stores it
            self.history.add(job.core.user, job.core.plan, "train", now - started)
        super().finished(job, now)

    def cycle(self, now: float):
        result = super().cycle(now)
        for d in result.decisions:
            if isinstance(d, Start):
                job = self.live[d.job_id]
                if job.first_start == now and not job.preemptions:  # its first start
                    waited = self.waits[job.core.plan]
                    waited[0] += now - job.core.submitted
                    waited[1] += 1
            elif isinstance(d, Preempt):
                self.release_at[d.job_id] = now + d.grace
        return result

    def step(self, now: float) -> None:
        super().step(now)
        if not self.fresh:
            return
        waiting = [i for i in self.fresh if i in self.live and self.live[i].state == "PENDING"]
        self.fresh = []
        if waiting:
            self._estimate(now, waiting)

    def service_inputs(self, now: float) -> tuple[dict, dict]:
        """Each running job's end and each pending job's runtime, as the service builds them
        (extension/sim/runtimes.py ``forward_inputs``, called by extension/service/queue.py)."""
        jobs = (live.core for live in self.live.values())
        grace = self.config.grace
        ends, runtimes, _ = forward_inputs(
            jobs, now, grace, self.limits, {}, self.history, DEFAULT_RUNTIME
        )
        return ends, runtimes

    def true_inputs(self, now: float) -> tuple[dict, dict]:
        """What the replay's fake backend knows: every running job's real end, every pending
        job's real runtime, a victim back in line with its work left at the end of its grace.
        What error is left then comes from the forward run and its no-arrivals assumption."""
        backend = self.replay.backend
        ends, runtimes = {}, {}
        for job_id, live in self.live.items():
            job, run = live.core, backend.runs[job_id]
            left = (run.work - run.done) / job.max_workers
            if job.state is JobState.PENDING:
                runtimes[job_id] = left
            elif job.terminating:
                ends[job_id], runtimes[job_id] = self.release_at[job_id], left
            else:
                ends[job_id] = run.finish_at
        return ends, runtimes

    def _estimate(self, now: float, new: list[str]) -> None:
        jobs = list(self.core_jobs.values())
        snap = Snapshot(self.plans, self.replay.instance, jobs, self.config, self.reserved)
        got = {}
        for method, inputs in (("service", self.service_inputs), ("true", self.true_inputs)):
            ends, runtimes = inputs(now)
            got[method] = estimate_starts(snap, now, ends, runtimes)
            self.runs[method].append((got[method].seconds, got[method].cycles, got[method].exact))
        for job_id in new:
            total, count = self.waits[self.live[job_id].core.plan]
            self.records[job_id] = {
                "at": now,
                "limit": job_id in self.limits,
                "baseline": now + (total / count if count else 0.0),
                **{method: e.jobs[job_id].start for method, e in got.items()},
            }


METHODS = ("service", "true", "baseline")
LABELS = {
    "service": "estimate, service inputs",
    "true": "estimate, true ends",
    "baseline": "baseline (plan's mean wait)",
}


def accuracy(hours: float) -> dict:
    rows = philly_slice(hours)
    limits = give_limits(rows)
    policy = Estimating(limits)
    began = time.perf_counter()
    replay = Replay(scenario(rows, limits), policy)
    replay.run()
    wall = time.perf_counter() - began
    samples: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for job_id, rec in policy.records.items():
        start = replay.jobs[job_id].first_start  # every job starts: the replay runs to the end
        wait = start - rec["at"]
        for group in ("with limit" if rec["limit"] else "without", "all"):
            for method in METHODS:
                guess = rec[method]
                error = None if guess is None else abs(guess - start)
                samples[group][method].append((error, wait))
    return {
        "jobs": len(rows),
        "with_limit": len(limits),
        "killed_at_limit": sum(1 for r in rows if limits.get(r.job_id, math.inf) < r.duration),
        "estimated": len(policy.records),
        "groups": {
            group: {method: _errors(samples[group][method]) for method in METHODS}
            for group in ("with limit", "without", "all")
            if samples[group]
        },
        "forward_runs": {method: _runs(runs) for method, runs in policy.runs.items()},
        "preemptions": replay.preemptions,
        "wall_s": round(wall, 1),
    }


def _errors(samples: list[tuple[float | None, float]]) -> dict:
    """Absolute errors and errors over the actual wait; an estimate that gave no start (the
    budget ran out first) is counted apart."""
    errors = [e for e, _ in samples if e is not None]
    relative = [e / w for e, w in samples if e is not None and w > 0]
    return {
        "n": len(samples),
        "no_start": len(samples) - len(errors),
        "median_wait_s": round(statistics.median(w for _, w in samples)),
        "median_s": round(statistics.median(errors)) if errors else None,
        "p90_s": round(percentile(errors, 0.9)) if errors else None,
        "median_over_wait": round(statistics.median(relative), 3) if relative else None,
    }


def _runs(runs: list[tuple[float, int, bool]]) -> dict:
    seconds = [s for s, _, _ in runs]
    return {
        "count": len(runs),
        "p50_ms": round(1000 * statistics.median(seconds), 1),
        "p99_ms": round(1000 * percentile(seconds, 0.99), 1),
        "mean_cycles": round(statistics.mean(c for _, c, _ in runs), 1),
        "exact_share": round(sum(1 for _, _, e in runs if e) / len(runs), 3),
    }


# -- the cost -------------------------------------------------------------------------------
def cost(repeats: int, reference_s: float) -> dict:
    snap = world(1000)
    settle(snap)  # the first cycle's starts running, its victims terminating
    rng = random.Random(SEED)
    now, grace = 100.0, snap.config.grace
    ends, runtimes = {}, {}
    for job in snap.jobs:
        if job.state is JobState.RUNNING:
            ends[job.id] = now + (grace if job.terminating else rng.uniform(60, 8 * HOUR))
        else:
            runtimes[job.id] = rng.uniform(30 * MINUTE, 4 * HOUR)
    runs = [estimate_starts(snap, now, ends, runtimes) for _ in range(repeats)]
    ms = [1000 * r.seconds for r in runs]
    # the reference: the core as far as a roomy budget takes it (binned; its own rough starts,
    # if any, are left out of the comparison)
    ref = estimate_starts(snap, now, ends, runtimes, budget_s=reference_s)
    errors = []  # the rough tail's starts against the reference's core's
    for job_id, e in runs[-1].jobs.items():
        truth = ref.jobs[job_id].start
        if e.rough and e.start is not None and truth is not None and not ref.jobs[job_id].rough:
            errors.append(abs(e.start - truth) / max(truth - now, 1.0))
    return {
        "pending": sum(1 for j in snap.jobs if j.state is JobState.PENDING),
        "running": sum(1 for j in snap.jobs if j.state is JobState.RUNNING),
        "p50_ms": round(statistics.median(ms), 1),
        "p99_ms": round(percentile(ms, 0.99), 1),
        "cycles": [r.cycles for r in runs],
        "exact": [r.exact for r in runs],
        "reached": [sum(1 for e in r.jobs.values() if e.start is not None) for r in runs],
        "horizon_s": [round(r.horizon - now) for r in runs],
        "rough": [r.rough for r in runs],
        "reference": {"budget_s": reference_s, "cycles": ref.cycles, "rough": ref.rough},
        "rough_error_over_wait_p50": round(statistics.median(errors), 3) if errors else None,
        "rough_compared": len(errors),
    }


# -- output ---------------------------------------------------------------------------------
def goals(report: dict) -> list[tuple[str, bool]]:
    groups = report["accuracy"]["groups"]
    out = []
    limited = groups.get("with limit")
    if limited:
        rel = limited["service"]["median_over_wait"]
        met = rel is not None and rel <= GOAL_RELATIVE
        out.append((f"jobs with limits: median error / actual wait {rel} <= {GOAL_RELATIVE}", met))
    unlimited = groups.get("without")
    if unlimited:
        e, b = unlimited["service"]["median_s"], unlimited["baseline"]["median_s"]
        met = e is not None and e <= GOAL_BASELINE * b
        text = f"jobs without limits: median error {e} s <= {GOAL_BASELINE} x the baseline's {b} s"
        out.append((text, met))
    c = report["cost"]
    text = f"cost at 1,000 pending on 512 nodes: p99 {c['p99_ms']} ms < {GOAL_MS:.0f} ms"
    out.append((text, c["p99_ms"] < GOAL_MS))
    fewest = min(c["reached"])
    text = f"and every pending job given a start in that time: {fewest} of {c['pending']}"
    out.append((text, c["p99_ms"] < GOAL_MS and fewest == c["pending"]))
    return out


def print_report(report: dict) -> None:
    a = report["accuracy"]
    print(
        f"replay: {a['jobs']} jobs ({a['with_limit']} with a limit, {a['killed_at_limit']} "
        f"killed at it), {a['estimated']} still pending after the cycle of their submission "
        f"and estimated then, {a['preemptions']} preemptions, {a['wall_s']} s"
    )
    for method, f in a["forward_runs"].items():
        print(
            f"forward runs ({LABELS[method]}): {f['count']}, p50 {f['p50_ms']} ms, p99 "
            f"{f['p99_ms']} ms, {f['mean_cycles']} cycles on average, exact "
            f"{100 * f['exact_share']:.0f}%"
        )
    width = max(len(label) for label in LABELS.values())
    print(
        f"{'':<11}{'n':>5}{'wait p50 s':>11}  {'':<{width}}{'no start':>9}{'err p50 s':>10}"
        f"{'err p90 s':>10}{'err/wait p50':>13}"
    )
    for group, by_method in a["groups"].items():
        for i, method in enumerate(METHODS):
            e = by_method[method]
            lead = f"{group:<11}{e['n']:>5}{e['median_wait_s']:>11,}  " if i == 0 else " " * 29
            print(
                f"{lead}{LABELS[method]:<{width}}{e['no_start']:>9}{_num(e['median_s']):>10}"
                f"{_num(e['p90_s']):>10}{_num(e['median_over_wait']):>13}"
            )
    c = report["cost"]
    print(
        f"cost: world(1000) settled ({c['pending']} pending, {c['running']} running): "
        f"p50 {c['p50_ms']} ms, p99 {c['p99_ms']} ms; cycles {c['cycles']}, exact {c['exact']}, "
        f"jobs given a start {c['reached']} of {c['pending']}, by the rough tail {c['rough']}, "
        f"horizon {c['horizon_s']} s"
    )
    ref = c["reference"]
    print(
        f"  the rough tail against the core alone with a {ref['budget_s']:.0f} s budget "
        f"({ref['cycles']} cycles, binned): error / wait p50 {_num(c['rough_error_over_wait_p50'])}"
        f" over {c['rough_compared']} jobs"
    )
    for text, met in goals(report):
        print(f"goal {text}: {'met' if met else 'NOT met'}")


def _num(value) -> str:
    if value is None:
        return "-"
    return f"{value:,}" if isinstance(value, int) else f"{value}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="6 h of the trace, 2 cost runs")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report = {
        "accuracy": accuracy(QUICK_HOURS if args.quick else HOURS),
        "cost": cost(2 if args.quick else 5, 5.0 if args.quick else 30.0),
    }
    report["goals"] = [{"goal": t, "met": m} for t, m in goals(report)]
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
