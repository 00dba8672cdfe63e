"""Fairness over days (issue 29): a multi-day window of the Philly trace through the simulator,
with usage history off and on, beside gang-FIFO in the same run.

    .venv/bin/python benchmarks/bench_fairness_days.py [--days 4] [--json]
        [--configs gang-fifo,off,1d,7d] [--nodes 16x8] [--limit 12h] [--tick 5]

**Workload.** Philly October 2017 (``shared/data/traces/philly_vc_2017-10.csv``), the jobs
submitted from Oct 10 00:00 (``--start-day 9``) for ``--days`` days by three virtual clusters,
each a team plan at share 1 (``--teams``): ``6214e9`` (a flood of 1-GPU jobs), ``ee9e8c``
(4-, 8- and 16-GPU gangs) and ``6c71a0`` (1-GPU jobs and 4- and 8-GPU gangs). Demand comes and
goes: on the first day only the first team (``6214e9``) submits (the others' jobs of that day
are left out), so it has the cluster to itself; from the second day on all three contend.
Each job runs its trace duration cut at the runtime limit (``--limit``, 12 h: the one limit in
play, as if every job had it; a job past it is stopped there). A job of up to 8 GPUs is one
worker, a larger one a gang of 8-GPU workers (``wmla simulate --trace``'s rule), on 16 nodes
of 8 GPUs (``--nodes``; 8x8 is three times oversubscribed on the contended days). The
replay stops at the end of the window (jobs still pending then are counted as waiting until
then).

**Timing.** The simulator's service model (``PRESETS["service"]``: a cycle on every submission
and backend event and every ``--tick`` seconds, the backend's delays, victims leave after their
SIGTERM checkpoint), grace 30 s, ``min_runtime`` 10 min, checkpoints every 10 min.

**Configurations** (``--configs``, comma separated; default ``gang-fifo,off,1d,7d``):
``gang-fifo`` (the baseline: gangs in submission order, no shares, no preemption), ``off``
(the wmla core as today: no history, no ``max_gang_wait``), ``<half-life>`` (e.g. ``1d``:
usage history with that half-life and ``max_gang_wait`` = the runtime limit),
``<half-life>/<max_gang_wait>`` (e.g. ``7d/6h``; ``0/12h`` for the gang bound alone).

**Figures** per configuration:
- **cumulative GPU-hours** of each team at the end of each day, beside its **entitlement**:
  the team's share over the shares of the teams that had demand so far (submitted a job by
  then), times the GPU-hours all teams held so far;
- **cumulative deviation** at the end of day d: among the teams that had demand by then, the
  mean of ``|cum_i / sum_j cum_j - share_i / sum_j share_j|`` (``cum_i``: team i's GPU-hours
  held from the start of the window to the end of day d, any worker of its jobs bound,
  terminating victims included); ``final`` is the last day's, ``mean`` the mean over the days
  on which more than one team had demand;
- **attainable deviation**: the same against what each team could have held at most. A team
  whose jobs all started at their submission would have held ``cap_i`` GPU-hours by the end of
  day d (``no_wait``: each job's GPUs times its run, clipped to the limit, cut at the end of
  the day); no scheduler can give it more. Its **attainable entitlement** ``ent_i`` is the
  water-filling (``extension.scheduler.shares.water_fill``, weights the shares) of the
  GPU-hours all teams held so far with those caps; the attainable deviation is
  ``sum_i |cum_i - ent_i| / n / sum_j cum_j`` over the n teams with demand. Where every
  team could use its share the two deviations are the same; where one could not (on this
  window ``6c71a0`` asks for less than a third of what the cluster gives), the first keeps a
  floor that no scheduler can go below and only the second measures the scheduler;
- **gang waits**: a gang is a job of more than 1 GPU (what smaller work can overtake); its
  wait is its first start minus its submission, or the end of the window minus its
  submission for one that never started (a lower bound); the largest and the p99 (nearest
  rank);
- **preemptions** (victims that let go) and **utilization** (GPU-seconds held over capacity x
  the window);
- **gang-wait floor** (of the workload, not of a configuration): the least final deviation of
  any schedule in which every gang waits at most twice the limit and no gang that started is
  stopped. A gang submitted at ``s`` then starts by ``s + 2 limit``, so by the end of the
  window its team holds at least its GPUs times ``min(run, end - s - 2 limit)``; all teams
  together hold at most the first team's day-1 demand (capped by the cluster) plus the whole
  cluster after it; a team forced past its entitlement by ``x`` GPU-hours adds ``2x`` to the
  sum of the gaps. It counts GPU-hours, not when they are free, so it is a lower bound. Where
  it is above half of ``off``'s deviation no scheduler meets both goals; the report also gives
  the least bound on every gang's wait that half of ``off``'s deviation allows.

**Synthetic workload** (``--synthetic LOAD``, issue 41, e.g. ``--synthetic 2.4 --nodes 4x8
--days 3``): three teams (``SYNTHETIC``), the first alone on day 1 asking for LOAD times the
cluster's GPU-hours of the day, then all three together asking for LOAD times it, a third each;
``--seed`` makes it the same every run (``synthetic``).

**Goal** (issue 29; issue 41 at every load), for each configuration with history against
``off``: final cumulative deviation at most half of ``off``'s (both the plain and the
attainable one are checked and reported); the largest gang wait at most twice the runtime
limit; preemptions no more than ``off``'s + 10 % and utilization no lower than ``off``'s less
0.01.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from extension.durations import format_duration  # noqa: E402
from extension.scheduler.shares import water_fill  # noqa: E402
from extension.sim.fairshare import FairShare, parse_span  # noqa: E402
from extension.sim.metrics import percentile  # noqa: E402
from extension.sim.policies import make_policy  # noqa: E402
from extension.sim.replay import Replay  # noqa: E402
from extension.sim.scenario import Scenario  # noqa: E402
from extension.sim.segments import SegmentLog  # noqa: E402
from extension.sim.timing import PRESETS  # noqa: E402
from extension.sim.trace import TraceOptions, TraceRow, parse_nodes, trace_scenario  # noqa: E402

TRACE = REPO.parent / "shared" / "data" / "traces" / "philly_vc_2017-10.csv"
DAY = 86400.0
TEAMS = ("6214e9", "ee9e8c", "6c71a0")  # the first one has the first day to itself
GRACE, MIN_RUNTIME, CHECKPOINT = 30.0, 600.0, 600.0


@dataclass(frozen=True)
class Config:
    label: str
    policy: str  # wmla or gang-fifo
    fair: FairShare


def parse_configs(text: str, limit: float) -> list[Config]:
    """``gang-fifo``, ``off``, ``1d`` (half-life, max_gang_wait = limit), ``7d/6h``
    (half-life/max wait)."""
    out = []
    for item in text.split(","):
        item = item.strip()
        if item == "gang-fifo":
            out.append(Config("gang-fifo", "gang-fifo", FairShare()))
            continue
        if item == "off":
            out.append(Config("off", "wmla", FairShare()))
            continue
        half, _, wait = item.partition("/")
        half_s = parse_span(half, "half-life")
        wait_s = parse_span(wait, "max_gang_wait") if wait else limit
        label = f"hl {format_duration(half_s) or 0} / wait {format_duration(wait_s) or 0}"
        out.append(Config(label, "wmla", FairShare(half_s, wait_s)))
    return out


# -- the workload ---------------------------------------------------------------------------
def workload(start_day: int, days: int, teams: tuple[str, ...], limit: float) -> list[TraceRow]:
    """The teams' jobs of the window, times from its start; the first team alone on day 0."""
    lo = start_day * DAY
    rows = []
    with open(TRACE, newline="") as f:
        for r in csv.DictReader(f):
            at, team = float(r["submit_s"]) - lo, r["team"]
            if team not in teams or not 0 <= at < days * DAY:
                continue
            if at < DAY and team != teams[0]:
                continue  # the others are away on the first day
            duration = min(float(r["duration_s"]), limit)
            rows.append(TraceRow(r["job_id"], at, duration, int(r["gpus"]), team, "anonymous", ""))
    return rows


@dataclass(frozen=True)
class TeamMix:
    """What one team of the synthetic workload submits: job sizes (GPUs; a job of more than 8
    GPUs is a gang of 8-GPU workers) and the range of run times, seconds."""

    team: str
    gpus: tuple[int, ...]
    shortest: float
    longest: float


# issue 41's held-back workload, rebuilt: the first team alone on day 1 (a stream of small
# jobs that fills the cluster), then all three, one of them of gangs only
SYNTHETIC = (
    TeamMix("early", (1, 1, 2, 4), 1800.0, 6 * 3600.0),
    TeamMix("gangs", (8, 16), 2 * 3600.0, 12 * 3600.0),
    TeamMix("mixed", (1, 2, 4, 8), 1800.0, 8 * 3600.0),
)


def synthetic(days: int, load: float, gpus: int, limit: float, seed: int) -> list[TraceRow]:
    """Day 1: the first team alone asks for ``load`` times the cluster's GPU-hours of the day;
    from day 2 on all teams together ask for ``load`` times it, a third each. Submission
    times uniform over each period, run times uniform in the team's range (cut at
    ``limit``), a job's GPU-hours counted at its cut run time; ``seed`` makes it the same
    every run."""
    rng = random.Random(seed)
    rows: list[TraceRow] = []
    periods = [(0.0, DAY, SYNTHETIC[:1]), (DAY, days * DAY, SYNTHETIC)]
    for start, end, mixes in periods:
        each = load * gpus * (end - start) / 3600.0 / len(mixes)
        for mix in mixes:
            asked = 0.0
            while asked < each:
                size = rng.choice(mix.gpus)
                run = min(rng.uniform(mix.shortest, mix.longest), limit)
                at = rng.uniform(start, end)
                name = f"{mix.team}-{len(rows)}"
                rows.append(TraceRow(name, at, run, size, mix.team, "anonymous", ""))
                asked += size * run / 3600.0
    rows.sort(key=lambda r: (r.submit, r.job_id))
    return rows


def scenario(rows: list[TraceRow], args: argparse.Namespace, config: Config) -> Scenario:
    timing = PRESETS["service"]
    if args.tick != timing.tick:
        from dataclasses import replace

        timing = replace(timing, tick=args.tick)
    options = TraceOptions(GRACE, MIN_RUNTIME, CHECKPOINT, timing)
    out = trace_scenario(rows, parse_nodes(args.nodes, None), None, options)
    out.until = args.days * DAY
    out.with_fair_share(config.fair)
    return out


# -- the figures ----------------------------------------------------------------------------
def cumulative(log: SegmentLog, replay: Replay, teams: tuple[str, ...], days: int) -> list[dict]:
    """GPU-hours each team held from the start to the end of each day."""
    until = days * DAY
    out = [dict.fromkeys(teams, 0.0) for _ in range(days)]
    for seg in log.rows(replay.jobs.values()):
        if seg.start is None:
            continue
        team, end = seg.job.team, until if seg.end is None else seg.end
        for d in range(days):
            upto = min(end, (d + 1) * DAY)
            if upto > seg.start:
                out[d][team] += seg.gpus * (upto - seg.start) / 3600.0
    return out


def daily(cum: list[dict], replay: Replay, teams: tuple[str, ...]) -> list[dict]:
    """Per day: each team's GPU-hours and entitlement, and the cumulative deviation."""
    first = {}
    for job in replay.jobs.values():
        first[job.team] = min(first.get(job.team, job.spec.at), job.spec.at)
    out = []
    for d, held in enumerate(cum):
        wanting = [t for t in teams if t in first and first[t] < (d + 1) * DAY]
        total = sum(held[t] for t in wanting)
        share = 1.0 / len(wanting) if wanting else 0.0  # every team at share 1
        parts = {t: (held[t] / total if total else 0.0) for t in wanting}
        dev = sum(abs(parts[t] - share) for t in wanting) / len(wanting) if wanting else 0.0
        out.append(
            {
                "day": d + 1,
                "teams_with_demand": len(wanting),
                "gpu_h": {t: round(held[t], 1) for t in teams},
                "entitled_gpu_h": {t: round(share * total, 1) for t in wanting},
                "deviation": round(dev, 4),
            }
        )
    return out


def no_wait(rows: list[TraceRow], teams: tuple[str, ...], days: int) -> list[dict]:
    """GPU-hours each team would have held by the end of each day had every job started at
    its submission: the most any scheduler could give it."""
    out = [dict.fromkeys(teams, 0.0) for _ in range(days)]
    for r in rows:
        for d in range(days):
            upto = min(r.submit + r.duration, (d + 1) * DAY)
            if upto > r.submit:
                out[d][r.team] += r.gpus * (upto - r.submit) / 3600.0
    return out


def gang_floor(
    rows: list[TraceRow], teams: tuple[str, ...], days: int, gpus: int, bound: float
) -> dict:
    """The least final deviation of any schedule in which every gang waits at most ``bound``
    and no started gang is stopped (module docstring, "gang-wait floor"): each gang submitted
    at ``s`` then runs from ``s + bound`` at the latest, so its team holds at least its GPUs
    times ``min(run, end - s - bound)`` by the end (``need``); all teams together hold at most
    ``most`` (the first team's day 1 capped by its demand, then the whole cluster); a team
    forced above its entitlement puts its excess into the deviation twice (its own and what
    the others lack). None where the needs alone exceed ``most``: no schedule meets the bound."""
    end, n = days * DAY, len(teams)
    need = dict.fromkeys(teams, 0.0)
    for r in rows:
        latest = r.submit + bound
        if 1 < r.gpus <= gpus and latest < end:  # a larger one is rejected: no wait
            need[r.team] += r.gpus * min(r.duration, end - latest) / 3600.0
    caps = no_wait(rows, teams, days)
    day_one = min(caps[0][teams[0]], gpus * 24.0)
    most = min(sum(caps[-1].values()), day_one + gpus * 24.0 * (days - 1))
    out: dict = {"need_gpu_h": {t: round(v, 1) for t, v in need.items()}, "most_gpu_h": most}
    if sum(need.values()) > most:
        return {**out, "deviation": None, "attainable_deviation": None}
    ents = water_fill(most, [caps[-1][t] for t in teams], [1.0] * n)
    plain = sum(max(0.0, need[t] - most / n) for t in teams)
    attainable = sum(max(0.0, need[t] - e) for t, e in zip(teams, ents))
    return {
        **out,
        "deviation": 2 * plain / n / most,
        "attainable_deviation": 2 * attainable / n / most,
    }


def least_gang_bound(
    rows: list[TraceRow], teams: tuple[str, ...], days: int, gpus: int, deviation: float
) -> float:
    """The least bound on every gang's wait that a schedule with a final deviation of at most
    ``deviation`` (and no started gang stopped) can meet, seconds (``gang_floor``: its
    deviation only falls as the bound grows), to a minute."""
    lo, hi = 0.0, days * DAY
    while hi - lo > 60.0:
        mid = (lo + hi) / 2
        floor = gang_floor(rows, teams, days, gpus, mid)["deviation"]
        lo, hi = (lo, mid) if floor is not None and floor <= deviation else (mid, hi)
    return hi


def with_attainable(days: list[dict], caps: list[dict]) -> None:
    """Each day's attainable entitlement and deviation, from its GPU-hours and the caps."""
    for day, cap in zip(days, caps):
        wanting = list(day["entitled_gpu_h"])
        total = sum(day["gpu_h"][t] for t in wanting)
        ents = water_fill(total, [cap[t] for t in wanting], [1.0] * len(wanting))
        day["attainable_gpu_h"] = {t: round(e, 1) for t, e in zip(wanting, ents)}
        gaps = sum(abs(day["gpu_h"][t] - e) for t, e in zip(wanting, ents))
        dev = gaps / len(wanting) / total if wanting and total else 0.0
        day["attainable_deviation"] = round(dev, 4)


def deviation_figures(days: list[dict]) -> dict:
    """The final day's and the mean over the contended days, plain and attainable."""
    contended = [d for d in days if d["teams_with_demand"] > 1]
    out = {}
    for key, name in (("deviation", ""), ("attainable_deviation", "attainable_")):
        values = [d[key] for d in contended]
        out[f"{name}final"] = days[-1][key]
        out[f"{name}mean"] = round(sum(values) / len(values), 4) if values else 0.0
    return out


def gang_waits(replay: Replay, until: float) -> dict:
    waits = []
    for job in replay.jobs.values():
        if job.gpu * job.core.min_workers <= 1 or job.state == "REJECTED":
            continue
        start = job.first_start if job.first_start is not None else until
        waits.append(start - job.spec.at)
    waits.sort()
    return {
        "gangs": len(waits),
        "largest_s": round(waits[-1]) if waits else 0,
        "p99_s": round(percentile(waits, 0.99)) if waits else 0,
        "never_started": sum(
            1
            for j in replay.jobs.values()
            if j.first_start is None and j.gpu * j.core.min_workers > 1 and j.state != "REJECTED"
        ),
    }


def run_one(
    rows: list[TraceRow], args: argparse.Namespace, config: Config, caps: list[dict]
) -> dict:
    sc = scenario(rows, args, config)
    replay = Replay(sc, make_policy(config.policy))
    log = replay.recorder.segments = SegmentLog()
    t0 = time.perf_counter()
    summary = replay.run().to_json()
    wall = time.perf_counter() - t0
    days = daily(cumulative(log, replay, args.teams, args.days), replay, args.teams)
    with_attainable(days, caps)
    return {
        "policy": config.policy,
        "fair_share_half_life_s": config.fair.half_life,
        "max_gang_wait_s": config.fair.max_gang_wait,
        "days": days,
        "deviation": deviation_figures(days),
        "gang_wait": gang_waits(replay, sc.until),
        "preemptions": summary["preemptions"],
        "utilization": summary["gpu_utilization"],
        "jobs": summary["jobs"],
        "wall_s": round(wall, 1),
    }


def goal(results: dict[str, dict], limit: float) -> dict:
    """Each configuration with history against ``off`` (module docstring)."""
    base = results.get("off")
    out = {}
    for label, r in results.items():
        if base is None or r["policy"] != "wmla" or label == "off":
            continue
        mine, theirs = r["deviation"], base["deviation"]
        checks = {
            "deviation_at_most_half": mine["final"] <= theirs["final"] / 2,
            "attainable_deviation_at_most_half": (
                mine["attainable_final"] <= theirs["attainable_final"] / 2
            ),
            "gang_wait_within_2x_limit": r["gang_wait"]["largest_s"] <= 2 * limit,
            "preemptions_within_10pct": r["preemptions"] <= 1.1 * base["preemptions"],
            "utilization_within_0.01": (r["utilization"] or 0) >= (base["utilization"] or 0) - 0.01,
        }
        out[label] = {**checks, "met": all(checks.values())}
    return out


def gang_goal_floor(
    rows: list[TraceRow],
    args: argparse.Namespace,
    gpus: int,
    limit: float,
    results: dict[str, dict],
) -> dict:
    """Whether any schedule can meet the gang wait goal together with the deviation goal
    (``gang_floor`` at twice the limit against half of ``off``'s final deviation), and the
    least gang wait bound a schedule meeting the deviation goal can keep
    (``least_gang_bound``)."""
    floor = gang_floor(rows, args.teams, args.days, gpus, 2 * limit)
    out = {**floor, "bound_s": 2 * limit, "most_gpu_h": round(floor["most_gpu_h"], 1)}
    for key in ("deviation", "attainable_deviation"):
        out[key] = None if floor[key] is None else round(floor[key], 4)
    base = results.get("off")
    if base is not None:
        half = base["deviation"]["final"] / 2
        out["off_half"] = half
        out["both_attainable"] = floor["deviation"] is not None and floor["deviation"] <= half
        out["least_bound_s"] = round(least_gang_bound(rows, args.teams, args.days, gpus, half))
    return out


# -- output ---------------------------------------------------------------------------------
def print_report(result: dict) -> None:
    results, teams = result["configs"], result["input"]["teams"]
    labels = list(results)
    width = max(14, *(len(x) for x in labels))
    print(" " * 34 + "".join(f"{x:>{width + 2}}" for x in labels))

    def line(name: str, cell) -> None:
        print(f"{name:<34}" + "".join(f"{cell(results[x]):>{width + 2}}" for x in labels))

    line("cum. deviation, final day", lambda r: f"{r['deviation']['final']:.4f}")
    line("cum. deviation, mean (contended)", lambda r: f"{r['deviation']['mean']:.4f}")
    line("attainable dev., final day", lambda r: f"{r['deviation']['attainable_final']:.4f}")
    line("attainable dev., mean", lambda r: f"{r['deviation']['attainable_mean']:.4f}")
    line("largest gang wait h", lambda r: f"{r['gang_wait']['largest_s'] / 3600:.1f}")
    line("gang wait p99 h", lambda r: f"{r['gang_wait']['p99_s'] / 3600:.1f}")
    line("gangs never started", lambda r: str(r["gang_wait"]["never_started"]))
    line("preemptions", lambda r: str(r["preemptions"]))
    line("utilization", lambda r: f"{r['utilization']:.4f}")
    line("jobs finished", lambda r: str(r["jobs"]["finished"]))
    line("simulation wall s", lambda r: f"{r['wall_s']:.1f}")
    print("\ncumulative GPU-hours (entitlement) at the end of each day, and the deviation:")
    for label in labels:
        print(f"  {label}")
        for d in results[label]["days"]:
            cells = []
            for t in teams:
                ent = d["entitled_gpu_h"].get(t)
                shown = f" ({ent:6.0f})" if ent is not None else " (  -   )"
                cells.append(f"{t} {d['gpu_h'][t]:7.0f}{shown}")
            devs = f"dev {d['deviation']:.4f}, attainable {d['attainable_deviation']:.4f}"
            print(f"    day {d['day']}: " + "  ".join(cells) + "  " + devs)
        last = results[label]["days"][-1]["attainable_gpu_h"]
        print("    attainable entitlement, last day: " + ", ".join(
            f"{t} {v:.0f}" for t, v in last.items()))  # fmt: skip
    print()
    print_floor(result["gang_floor"])
    for label, g in result["goal"].items():
        verdict = "MET" if g["met"] else "not met"
        misses = [k for k, v in g.items() if k != "met" and not v]
        print(f"goal, {label}: {verdict}" + (f" (missed: {', '.join(misses)})" if misses else ""))


def print_floor(floor: dict) -> None:
    """The gang-wait floor (``gang_goal_floor``) in words."""
    bound = floor["bound_s"] / 3600
    if floor["deviation"] is None:
        print(
            f"gang-wait floor: no schedule starts every gang within {bound:.0f} h "
            f"(the GPU-hours they would hold exceed the {floor['most_gpu_h']:.0f} the window has)"
        )
    else:
        print(
            f"gang-wait floor: every gang within {bound:.0f} h means a final deviation of at "
            f"least {floor['deviation']:.4f} (attainable {floor['attainable_deviation']:.4f})"
        )
    if "least_bound_s" in floor:
        print(
            f"  half of off's deviation ({floor['off_half']:.4f}) allows no bound under "
            f"{floor['least_bound_s'] / 3600:.1f} h; both goals attainable: "
            f"{'yes' if floor['both_attainable'] else 'no'}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--days", type=int, default=4)
    parser.add_argument("--start-day", type=int, default=9, help="0 = Oct 1 (default Oct 10)")
    parser.add_argument("--teams", default=",".join(TEAMS), help="the first is alone on day 1")
    parser.add_argument("--nodes", default="16x8")
    parser.add_argument("--limit", default="12h", help="runtime limit of every job")
    parser.add_argument("--tick", type=float, default=5.0, help="the service's tick, s")
    parser.add_argument("--configs", default="gang-fifo,off,1d,7d")
    parser.add_argument(
        "--synthetic",
        type=float,
        default=0.0,
        metavar="LOAD",
        help="the synthetic workload at LOAD times the capacity (e.g. 2.4), not Philly",
    )
    parser.add_argument("--seed", type=int, default=41, help="of the synthetic workload")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.days < 2:
        parser.error("--days must be at least 2: one alone, then all contend")
    limit = parse_span(args.limit, "--limit")
    gpus = sum(n.capacity.gpu for n in parse_nodes(args.nodes, None))
    if args.synthetic > 0:
        args.teams = tuple(mix.team for mix in SYNTHETIC)
        rows = synthetic(args.days, args.synthetic, gpus, limit, args.seed)
    else:
        args.teams = tuple(t.strip() for t in args.teams.split(","))
        rows = workload(args.start_day, args.days, args.teams, limit)
    caps = no_wait(rows, args.teams, args.days)
    results = {}
    for config in parse_configs(args.configs, limit):
        print(f"running {config.label} ...", file=sys.stderr, flush=True)
        r = results[config.label] = run_one(rows, args, config, caps)
        print(
            f"  deviation {r['deviation']}, gang wait {r['gang_wait']}, preemptions "
            f"{r['preemptions']}, utilization {r['utilization']}, {r['wall_s']} s",
            file=sys.stderr,
            flush=True,
        )
    result = {
        "input": {
            "trace": f"synthetic, load {args.synthetic}" if args.synthetic else str(TRACE),
            "start_day": args.start_day,
            "days": args.days,
            "teams": list(args.teams),
            "jobs": {t: sum(1 for r in rows if r.team == t) for t in args.teams},
            "nodes": args.nodes,
            "runtime_limit_s": limit,
            "tick_s": args.tick,
            "grace_s": GRACE,
            "min_runtime_s": MIN_RUNTIME,
            "no_wait_gpu_h": [{t: round(v, 1) for t, v in c.items()} for c in caps],
        },
        "configs": results,
    }
    result["goal"] = goal(results, limit)
    result["gang_floor"] = gang_goal_floor(rows, args, gpus, limit, results)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print_report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
