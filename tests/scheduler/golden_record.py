"""Golden files: what the core decided, cycle by cycle, on every scenario file, on seeded random
streams (the property tests' generator) and on a contended slice of the Philly trace.

They were recorded before the core was cut into phases (issue 17) and guard that no refactor
changes a decision: ``test_golden.py`` checks the files are byte-identical to what the core
produces now. A change of behaviour that is meant re-records them on purpose:

    .venv/bin/python -m tests.scheduler.golden_record --write

Every cycle is written as its ``now``, the reserved job, every decision (its repr, in order),
every waiting job with its reason (in order) and every plan's figures (in order). The Philly
slice and the benchmark's worlds have hundreds of waiting jobs a cycle, so there the waits and
the figures are written as a count and a digest of that text (the decisions stay readable); of
the random streams, the first seeds are written whole and a thousand more as one digest each.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import random
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from extension.scheduler import CycleResult, Snapshot, check_submission, schedule
from extension.sim import policies
from extension.sim.engine import simulate
from extension.sim.policies import Wmla
from extension.sim.replay import Replay
from extension.sim.scenario import load_scenario
from extension.sim.trace import TraceOptions, parse_nodes, read_trace, trace_scenario

from . import streams

HERE = Path(__file__).parent
GOLDEN = HERE / "golden"
SCENARIOS = HERE.parent / "scenarios"
PHILLY = Path("/work/shared/data/traces/philly_vc_2017-10.csv")
# the slice: 6 hours of submissions from day 9 (1,085 jobs of 8 virtual clusters, 4,100
# GPU-hours) on 6 nodes of 8 GPUs, so the teams contend, borrow and reclaim all the time
PHILLY_FROM, PHILLY_HOURS, PHILLY_NODES = 9 * 86_400, 6, "6x8"
STREAM_TEXT, STREAM_DIGESTS = 12, 1000  # seeds written out whole, then seeds as one digest line
BENCH = Path(__file__).parents[2] / "benchmarks" / "bench_scheduler.py"


def digest(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def cycle_lines(now: float, result: CycleResult, compact: bool = False) -> list[str]:
    """One cycle as text: everything ``compact`` or not; ``compact`` digests waits and plans."""
    out = [f"cycle now={now!r} reserved={result.reserved!r}"]
    out += [f"  {d!r}" for d in result.decisions]
    waits = [f"  wait {job_id}: {reason}" for job_id, reason in result.waiting.items()]
    plans = [f"  plan {path} {f!r}" for path, f in result.plans.items()]
    if compact:
        out.append(f"  waiting {len(waits)} {digest(waits)}; plans {len(plans)} {digest(plans)}")
    else:
        out += waits + plans
    return out


@contextmanager
def recording(compact: bool = False) -> Iterator[list[str]]:
    """Every ``schedule`` call the simulator's wmla policy makes, as text lines."""
    lines: list[str] = []
    real = policies.schedule

    def record(snapshot: Snapshot, now: float, cache=None) -> CycleResult:
        result = real(snapshot, now, cache)
        lines.extend(cycle_lines(now, result, compact))
        return result

    policies.schedule = record
    try:
        yield lines
    finally:
        policies.schedule = real


def scenario_text(path: Path) -> str:
    """A scenario file through ``wmla simulate --scenario``: its submission answers, every
    cycle, and each job's end."""
    scenario = load_scenario(path)
    lines = [f"# {path.name}"]
    empty = Snapshot(scenario.plans, scenario.instance, [], scenario.config)
    with recording() as cycles:
        result = simulate(scenario)
        for job in result.jobs.values():
            lines.append(f"check {job.id}: {check_submission(empty, job.core)!r}")
    lines += cycles
    for job_id, job in result.jobs.items():
        lines.append(f"job {job_id} {job.state} started={job.first_start!r} ended={job.ended!r}")
    return "\n".join(lines) + "\n"


def stream_world(seed: int, staggered: bool = False) -> tuple:
    rng = random.Random(seed)
    world = streams.world(rng.choice)
    picks = [rng.randrange(31) for _ in range(rng.randrange(1, 7))]
    if staggered:  # a cycle for every submission time (0-5), so every job arrives
        picks += [rng.randrange(31) for _ in range(6 - len(picks))]
    return world, picks


def stream_lines(seed: int, staggered: bool) -> list[str]:
    world, picks = stream_world(seed, staggered)
    lines = []
    runs = streams.run_stream(world, picks, fresh_index=False, check=False, staggered=staggered)
    for now, result in runs:
        lines += cycle_lines(now, result)
    return lines


def streams_text(staggered: bool) -> str:
    how = "staggered arrivals" if staggered else "every job pending at once"
    out = [f"# seeded random streams (tests/scheduler/streams.py), {how}"]
    for seed in range(STREAM_TEXT):
        out.append(f"## seed {seed}")
        out += stream_lines(seed, staggered)
    out.append(f"# seeds {STREAM_TEXT}-{STREAM_TEXT + STREAM_DIGESTS - 1}: a digest of each")
    for seed in range(STREAM_TEXT, STREAM_TEXT + STREAM_DIGESTS):
        lines = stream_lines(seed, staggered)
        out.append(f"seed {seed}: {len(lines)} lines {digest(lines)}")
    return "\n".join(out) + "\n"


def bench_text() -> str:
    """benchmarks/bench_scheduler.py's busy worlds at 1,000 and 10,000 pending: the first cycle
    (the reclaim burst) and the settled one, with a kept index over 1,000 leaves."""
    spec = importlib.util.spec_from_file_location("bench_scheduler", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    lines = []
    for pending in (1_000, 10_000):
        lines.append(f"# bench_scheduler world({pending})")
        snapshot = bench.world(pending)
        lines += cycle_lines(100.0, schedule(snapshot, 100.0), compact=True)
        lines.append(f"settled: {bench.settle(snapshot)} victims")
        lines += cycle_lines(100.0, schedule(snapshot, 100.0), compact=True)
    return "\n".join(lines) + "\n"


def philly_text() -> str:
    rows = read_trace(PHILLY)
    end = PHILLY_FROM + PHILLY_HOURS * 3600
    window = [r for r in rows if PHILLY_FROM <= r.submit < end]
    options = TraceOptions(grace=30.0, min_runtime=600.0, checkpoint_every=600.0)
    scenario = trace_scenario(window, parse_nodes(PHILLY_NODES, None), None, options)
    scenario.until = end + 86_400.0  # a day after the last submission
    lines = [
        f"# philly_vc_2017-10.csv, submissions in [{PHILLY_FROM}, {end}) s: {len(window)} jobs "
        f"on {PHILLY_NODES}, grace 30 s, min_runtime 600 s, until {scenario.until:g} s"
    ]
    with recording(compact=True) as cycles:
        replay = Replay(scenario, Wmla())
        replay.run()
    lines += cycles
    states: dict[str, int] = {}
    for job in replay.jobs.values():
        states[job.state] = states.get(job.state, 0) + 1
    lines.append(f"states {sorted(states.items())} preemptions {replay.preemptions}")
    return "\n".join(lines) + "\n"


def golden_files() -> dict[str, Callable[[], str]]:
    """File name -> what makes its text."""
    files: dict[str, Callable[[], str]] = {}
    for path in sorted(SCENARIOS.glob("*.yaml")):
        files[f"scenario_{path.stem}.txt"] = lambda path=path: scenario_text(path)
    files["streams.txt"] = lambda: streams_text(staggered=False)
    files["streams_staggered.txt"] = lambda: streams_text(staggered=True)
    files["bench_worlds.txt"] = bench_text
    files["philly_slice.txt"] = philly_text
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="record or check the core's golden files")
    parser.add_argument("--write", action="store_true", help="re-record them (on purpose)")
    args = parser.parse_args(argv)
    GOLDEN.mkdir(exist_ok=True)
    differ = []
    for name, make in golden_files().items():
        text = make()
        path = GOLDEN / name
        if args.write:
            path.write_text(text)
            print(f"wrote {path} ({len(text.splitlines())} lines)")
        elif not path.exists() or path.read_text() != text:
            differ.append(name)
    if differ:
        print("differ from the golden files: " + ", ".join(differ), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
