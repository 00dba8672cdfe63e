"""``wmla simulate``: the arguments and what runs them (docs/simulate.md).

- ``--scenario FILE`` alone: the scenario runner (engine.py: the replay loop with a core cycle
  at every instant and a timeline).
- ``--trace CSV --nodes N --gpus-per-node G`` or ``--scenario FILE --policy ...``: the replay
  under each ``--policy`` (repeatable, or ``all``), compared in one run; ``--json`` prints one
  object, ``--report out.html`` writes a self-contained page.

Bad input exits 2 with one line on stderr saying what is wrong, prints no JSON and writes no
report; everything is read and checked before the first replay starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:  # the simulator is imported only when it runs, not for every `wmla` command
    from .fairshare import FairShare
    from .scenario import Scenario
    from .segments import SegmentLog

TRACE_ONLY = ("gpus_per_node", "nodes", "shares")


def add_arguments(sim: argparse.ArgumentParser) -> None:
    what = sim.add_mutually_exclusive_group(required=True)
    what.add_argument("--scenario", metavar="FILE", help="scenario YAML file")
    what.add_argument(
        "--trace",
        metavar="CSV",
        help="job trace (job_id,submit_s,duration_s,gpus,team,user,status)",
    )
    sim.add_argument("--json", action="store_true", help="print the result as one JSON object")
    sim.add_argument(
        "--nodes",
        metavar="N|LAYOUT",
        help="with --trace: node count (with --gpus-per-node), or a layout like 231x8,321x2",
    )
    sim.add_argument(
        "--gpus-per-node", type=int, metavar="G", help="with --trace: GPUs of every node"
    )
    sim.add_argument(
        "--policy",
        action="append",
        metavar="NAME",
        help="wmla, gang-fifo, pod-fifo or all; repeat to compare (default: wmla)",
    )
    sim.add_argument(
        "--shares", metavar="FILE", help="with --trace: YAML/JSON team -> share (or {share, limit})"
    )
    sim.add_argument(
        "--deadlock-timeout",
        type=float,
        default=None,
        metavar="S",
        help="pod-fifo: seconds of deadlock before the operator deletes a stuck job "
        "(default 1800; 0: never)",
    )
    sim.add_argument(
        "--cycle-interval",
        type=float,
        default=0.0,
        metavar="S",
        help="decide only every S seconds of simulated time (default 0: at every event)",
    )
    _trace_timing_arguments(sim)
    sim.add_argument(
        "--timing",
        choices=("instant", "service"),
        help="when cycles run and how long the backend takes: instant (default: a cycle at "
        "every event) or service (as the service: events, a 5 s tick, victims leave after "
        "their SIGTERM checkpoint); with --scenario it replaces the file's config.timing",
    )
    _fair_share_arguments(sim)
    _output_arguments(sim)
    sim.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def _trace_timing_arguments(sim: argparse.ArgumentParser) -> None:
    """A trace replay's grace, checkpoints and min_runtime (a scenario file has its own)."""
    sim.add_argument("--grace", type=float, metavar="S", help="with --trace: grace (default 30)")
    sim.add_argument(
        "--checkpoint-every",
        type=float,
        metavar="S",
        help="with --trace: seconds between checkpoints (default 600)",
    )
    sim.add_argument(
        "--min-runtime", type=float, metavar="S", help="with --trace: min_runtime (default 0)"
    )


def _output_arguments(sim: argparse.ArgumentParser) -> None:
    """The files a run writes besides what it prints."""
    sim.add_argument("--report", metavar="HTML", help="write a self-contained HTML report here")
    sim.add_argument(
        "--jobs-csv",
        metavar="FILE",
        help="write one row per run segment of every job (job_id,team,user,gpus,submit_s,"
        "start_s,end_s,end), as sacct; with several policies FILE.<policy>.csv each",
    )


def _fair_share_arguments(sim: argparse.ArgumentParser) -> None:
    """Usage history and the starved-gang bound (docs/simulate.md "Fair share over days")."""
    sim.add_argument(
        "--fair-share-half-life",
        metavar="DURATION",
        help="weigh each plan's share by its usage decayed over this half-life (seconds or "
        "e.g. 7d, 12h; default 0: this moment's demand only)",
    )
    sim.add_argument(
        "--max-gang-wait",
        metavar="DURATION",
        help="a gang that waited this long goes first and is never a victim once started "
        "(seconds or e.g. 12h; default 0: no such rule)",
    )
    sim.add_argument(
        "--usage-reset-period",
        metavar="DURATION",
        help="with --fair-share-half-life: forget all usage at every multiple of this "
        "(default 0: never)",
    )


class UsageError(ValueError):
    """A bad combination of arguments; the message says which and what to do."""


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    comparing = args.trace or args.policy or args.report
    if args.scenario and not comparing:
        return _scenario_runner(args, out, err)
    try:
        job = _prepare(args)
    except (UsageError, ValueError) as problem:
        print(f"wmla simulate: {problem}", file=err)
        return 2
    result, summaries = _replay_all(job, None if args.quiet else err)
    if args.report:
        from .report import write_report

        write_report(job["report"], result, summaries)
    if args.json:
        json.dump(result, out, indent=1, sort_keys=True)
        print(file=out)
    else:
        _print_table(result, out)
    return 0


def _scenario_runner(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """The scenario runner (its output is pinned by the scenario tests)."""
    from .engine import public_json, simulate
    from .scenario import ScenarioError, load_scenario

    bad = _trace_options_given(args)
    if bad:
        print(f"wmla simulate: {bad} goes with --trace, not --scenario", file=err)
        return 2
    try:
        fair = _fair_share(args)
        csv_path = _output_path(args.jobs_csv, "--jobs-csv", ".csv")
        scenario = _with_timing(load_scenario(args.scenario), args)
    except (ScenarioError, UsageError) as problem:
        print(f"wmla simulate: {problem}", file=err)
        return 2
    _with_fair_share(scenario, fair)
    log = _segment_log(csv_path)
    ran = simulate(scenario, log)
    if csv_path is not None and log is not None:
        from .segments import write_jobs_csv

        write_jobs_csv(csv_path, log, ran.jobs.values())
    result = public_json(ran)
    if args.json:
        json.dump(result, out, indent=1, sort_keys=True)
        print(file=out)
    else:
        for job_id, job in result["jobs"].items():
            line = f"{job_id:<12} {job['state']:<10} {job['charged_to']:<40}"
            print(line + f" start={job['started']} end={job['ended']}", file=out)
        print(json.dumps(result["summary"]), file=out)
    return 0


def _fair_share(args: argparse.Namespace) -> FairShare | None:
    """The fair-share options given, checked; None when none was given (the scenario's own
    ``config`` then stands)."""
    from .fairshare import FairShare, FairShareError, parse_span

    given = (args.fair_share_half_life, args.max_gang_wait, args.usage_reset_period)
    if all(v is None for v in given):
        return None
    names = ("--fair-share-half-life", "--max-gang-wait", "--usage-reset-period")
    try:
        spans = [0.0 if v is None else parse_span(v, n) for v, n in zip(given, names)]
        return FairShare(*spans)
    except FairShareError as problem:
        raise UsageError(str(problem)) from None


def _with_fair_share(scenario: Scenario, fair: FairShare | None) -> None:
    """The options given on the command line in place of the scenario's ``config`` (each
    option not given is off)."""
    if fair is not None:
        scenario.with_fair_share(fair)


def _segment_log(path: Path | None) -> SegmentLog | None:
    from .segments import SegmentLog

    return None if path is None else SegmentLog()


def _with_timing(scenario: Scenario, args: argparse.Namespace) -> Scenario:
    """``--timing``, when given, in place of the scenario's own."""
    from .timing import PRESETS

    if args.timing:
        scenario.timing = PRESETS[args.timing]
    return scenario


def _trace_options_given(args: argparse.Namespace) -> str | None:
    for name in (*TRACE_ONLY, "grace", "checkpoint_every", "min_runtime"):
        if getattr(args, name) is not None:
            return "--" + name.replace("_", "-")
    return None


def _prepare(args: argparse.Namespace) -> dict[str, Any]:
    """Read and check everything before anything runs.

    The checks run in this order and the first problem found is the one reported, so a
    command line with several mistakes always gets the same message.
    """
    from .policies import expand_policies

    policies = expand_policies(args.policy)
    timeout = _deadlock_timeout(args)
    _check_not_negative(args)
    fair = _fair_share(args)
    report = _output_path(args.report, "--report", ".html")
    jobs_csv = _output_path(args.jobs_csv, "--jobs-csv", ".csv")
    scenario, source = _read_trace(args) if args.trace else _read_scenario(args)
    _with_fair_share(scenario, fair)
    return {
        "scenario": scenario,
        "policies": policies,
        "timeout": timeout,
        "interval": args.cycle_interval,
        "report": report,
        "jobs_csv": jobs_csv,
        "source": source,
    }


def _deadlock_timeout(args: argparse.Namespace) -> float:
    """``--deadlock-timeout``, pod-fifo's default when not given; 0 means never."""
    from .policies import DEFAULT_DEADLOCK_TIMEOUT

    timeout = args.deadlock_timeout
    if timeout is None:
        timeout = DEFAULT_DEADLOCK_TIMEOUT
    if timeout < 0:
        raise UsageError(f"--deadlock-timeout must be 0 (never) or more seconds, got {timeout:g}")
    return timeout


def _check_not_negative(args: argparse.Namespace) -> None:
    """Durations in seconds: ``--cycle-interval`` and the trace's ``--grace`` and the like."""
    if args.cycle_interval < 0:
        raise UsageError(f"--cycle-interval must not be negative, got {args.cycle_interval:g}")
    if args.cycle_interval and args.timing == "service":
        raise UsageError(
            "--cycle-interval is a periodic scheduler, --timing service has the service's own "
            "cycles: give one or the other"
        )
    for name in ("grace", "checkpoint_every", "min_runtime"):
        value = getattr(args, name)
        if value is not None and value < 0:
            raise UsageError(f"--{name.replace('_', '-')} must not be negative, got {value:g}")


def _output_path(given: str | None, option: str, suffix: str) -> Path | None:
    """``--report`` or ``--jobs-csv``, checked to be writable now rather than after hours of
    replay."""
    if not given:
        return None
    path = Path(given)
    if path.is_dir():
        raise UsageError(f"{option} {path}: is a folder; give a file name like out{suffix}")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{option} {path}: the folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"{option} {path}: cannot write in {parent}")
    return path


def _read_trace(args: argparse.Namespace) -> tuple[Scenario, dict[str, Any]]:
    """``--trace`` with its cluster and options: the scenario, and the input as the result
    names it."""
    from .timing import PRESETS
    from .trace import TraceError, TraceOptions, load_trace_scenario

    if args.nodes is None:
        raise UsageError(
            "--trace needs the cluster: --nodes N --gpus-per-node G (or --nodes 231x8,321x2)"
        )
    defaults = TraceOptions()
    options = TraceOptions(
        grace=defaults.grace if args.grace is None else args.grace,
        min_runtime=defaults.min_runtime if args.min_runtime is None else args.min_runtime,
        checkpoint_every=(
            defaults.checkpoint_every if args.checkpoint_every is None else args.checkpoint_every
        ),
        timing=PRESETS[args.timing or "instant"],
    )
    try:
        scenario = load_trace_scenario(
            args.trace, args.nodes, args.gpus_per_node, args.shares, options
        )
    except TraceError as problem:
        raise UsageError(str(problem)) from None
    source: dict[str, Any] = {"trace": str(args.trace), "nodes": str(args.nodes)}
    if args.gpus_per_node is not None:
        source["gpus_per_node"] = args.gpus_per_node
    if args.shares:
        source["shares"] = str(args.shares)
    return scenario, source


def _read_scenario(args: argparse.Namespace) -> tuple[Scenario, dict[str, Any]]:
    """``--scenario`` compared under ``--policy``: the trace's options do not apply to it."""
    from .scenario import ScenarioError, load_scenario

    bad = _trace_options_given(args)
    if bad:
        raise UsageError(f"{bad} goes with --trace, not --scenario")
    try:
        scenario = _with_timing(load_scenario(args.scenario), args)
    except ScenarioError as problem:
        raise UsageError(str(problem)) from None
    if args.cycle_interval and scenario.timing.service_cycles:
        raise UsageError(
            f"--cycle-interval: {args.scenario} has the service's timing (config.timing), "
            "which has its own cycles; give one or the other"
        )
    return scenario, {"scenario": str(args.scenario)}


def _replay_all(job: dict[str, Any], progress: TextIO | None) -> tuple[dict, dict]:
    from .policies import make_policy
    from .replay import Replay

    scenario = job["scenario"]
    result: dict[str, Any] = {
        "input": {
            **job["source"],
            "jobs": len(scenario.jobs),
            "node_count": len(scenario.instance.nodes),
            "capacity_gpu": scenario.instance.capacity.gpu,
            "plans": sorted(p.path for p in scenario.plans),
            "policies": list(job["policies"]),  # in the order asked (the keys below are sorted)
            "cycle_interval_s": job["interval"],
            "timing": dataclasses.asdict(scenario.timing),
        },
        "policies": {},
    }
    fair = {
        "fair_share_half_life_s": scenario.config.fair_share_half_life,
        "max_gang_wait_s": scenario.config.max_gang_wait,
        "usage_reset_period_s": scenario.usage_reset_period,
    }
    if any(fair.values()):  # off, the input reads as it always did
        result["input"]["fair_share"] = fair
    summaries = {}
    for name in job["policies"]:
        policy = make_policy(name, job["timeout"])
        replay = Replay(scenario, policy, progress=progress, interval=job["interval"])
        replay.recorder.segments = _segment_log(job["jobs_csv"])
        summary = replay.run()
        summaries[name] = summary
        result["policies"][name] = summary.to_json()
        _write_segments(job["jobs_csv"], name, len(job["policies"]) > 1, replay)
    return result, summaries


def _write_segments(path: Path | None, policy: str, several: bool, replay: Any) -> None:
    """``--jobs-csv``: FILE, or FILE's stem + ``.<policy>`` + its suffix with several policies."""
    if path is None or replay.recorder.segments is None:
        return
    from .segments import write_jobs_csv

    if several:
        path = path.with_name(f"{path.stem}.{policy}{path.suffix or '.csv'}")
    write_jobs_csv(path, replay.recorder.segments, replay.jobs.values())


def _print_table(result: dict, out: TextIO) -> None:
    rows = [
        ("finished", lambda p: p["jobs"]["finished"]),
        ("unfinished", lambda p: p["jobs"]["unfinished"]),
        ("GPU held while contended", lambda p: p["gpu_allocation"]["held_while_contended"]),
        ("GPU busy while contended", lambda p: p["gpu_allocation"]["busy_while_contended"]),
        ("queueing delay p50 s", lambda p: p["queueing_delay_s"]["overall"]["p50"]),
        ("queueing delay p90 s", lambda p: p["queueing_delay_s"]["overall"]["p90"]),
        ("queueing delay p99 s", lambda p: p["queueing_delay_s"]["overall"]["p99"]),
        ("JCT p50 s", lambda p: p["jct_s"]["overall"]["p50"]),
        ("JCT p90 s", lambda p: p["jct_s"]["overall"]["p90"]),
        ("JCT p99 s", lambda p: p["jct_s"]["overall"]["p99"]),
        ("fairness dev, teams (GPUs)", _team_dev),
        ("share dev, with demand (GPUs)", lambda p: p["share_deviation"]["mean_abs_dev_gpu"]),
        ("GPU utilization", lambda p: p["gpu_utilization"]),
        ("preemptions", lambda p: p["preemptions"]),
        ("jobs preempted", lambda p: p["churn"]["jobs_preempted"]),
        ("steady-state preemptions", lambda p: p["churn"]["steady_state_preemptions"]),
        ("preempted GPU-hours", lambda p: _hours(p["churn"]["preempted_gpu_s"])),
        ("lost GPU-hours", lambda p: _hours(p["churn"]["lost_gpu_s"])),
        ("broken gangs", lambda p: p["broken_gangs"]),
        ("deadlocked GPU-hours", lambda p: p["deadlocked_gpu_hours"]),
        ("simulation wall s", lambda p: p["sim_wall_s"]),
    ]
    names = list(result["policies"])
    print(f"{'':<28}" + "".join(f"{n:>14}" for n in names), file=out)
    for label, get in rows:
        cells = []
        for n in names:
            value = get(result["policies"][n])
            cells.append(f"{'-' if value is None else value:>14}")
        print(f"{label:<28}" + "".join(cells), file=out)


def _hours(gpu_s: float) -> float:
    return round(gpu_s / 3600, 3)


def _team_dev(p: dict) -> Any:
    level = p["fairness"].get("1")
    return level["contended"]["mean_abs_dev_gpu"] if level else None
