"""Fairness benchmark (issue 18): a contended multi-team slice of the Philly trace through the
real service in compressed real time on virtual nodes, and through the simulator, beside a
plain gang-FIFO baseline in the same run.

    .venv/bin/python benchmarks/bench_fairness.py [--quick] [--no-service] [--json]
        [--load 1.8] [--window-s 120] [--keep]

The workload (``philly_slice``): Philly October 2017 (shared/data/traces), submissions from
Oct 23 00:00 to Oct 25 00:00 (48 h; ``--quick``: Oct 24 21:00 to Oct 25 09:00) of three
virtual clusters, each a team under one plan ``/philly`` at shares 4:2:2 with no limits, on
4 x 8 virtual GPUs:

- ``7f04ca`` (share 4) and ``6c71a0`` (share 2): their 4- and 8-GPU jobs, gangs of 4 or 8
  one-GPU workers;
- ``11cb48`` (share 2): its 1- and 2-GPU jobs (285 and 42 of them), the flood.

Two users per team (the trace has none: a team's jobs alternate between ``<team>-1`` and
``<team>-2``), each with their own hub token. Arrivals are compressed from 48 h to
``--window-s`` seconds (120; quick: 12 h to 30 s), submissions at least 20 ms apart. Run times
keep their order: ``a * duration ** 0.5`` clipped to [3, 45] s (quick: [3, 20]), with ``a``
chosen so that the GPU-seconds asked for are ``--load`` (1.8) times what the cluster offers
over the window. Timing, compressed about 5x from the service's defaults: tick 1 s, grace
5 s, min_runtime 10 s; jobs checkpoint every 10 s and exit 1 s after SIGTERM.

Four columns, every figure computed the same way from each job's submission, end and held
GPUs (benchmarks/fairness_harness.py): the service (hub + proxy + wmla service + SQLite,
benchmarks/timed_backend.py), the simulator with the service's timing model, the simulator's
old instant model, and gang-FIFO in the simulator (the baseline). The simulator replays the
submissions at the times the service stamped them, so all four see the same input. About
4.5 minutes (quick: 1.5) of which the simulator takes a second.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.fairness_harness import (  # noqa: E402
    Outcome,
    Setup,
    WorkJob,
    figures,
    run_service,
    run_sim,
)

TRACE = REPO.parent / "shared" / "data" / "traces" / "philly_vc_2017-10.csv"
DAY = 86400
SHARES = {"7f04ca": 4.0, "6c71a0": 2.0, "11cb48": 2.0}
FLOOD = "11cb48"  # its 1- and 2-GPU jobs; the others' 4- and 8-GPU gangs
SETUP = Setup(SHARES, parent="/philly", layout="4x8")
MIN_GAP = 0.02  # seconds between two submissions
EXPONENT = 0.5
MAIN = (22 * 24, 48)  # Oct 23 00:00, 48 h: 55, 55 and 327 jobs
QUICK = (23 * 24 + 21, 12, 30.0, 20.0)  # Oct 24 21:00, 12 h in 30 s: 18, 26 and 89 jobs
AGREE = {"preemptions": 0.20, "held": 0.02}  # issue 18


def philly_slice(
    start_h: float, hours: float, window_s: float, load: float, longest: float
) -> list[WorkJob]:
    """The three teams' jobs submitted in [start_h, start_h + hours) of October, compressed."""
    lo, hi = start_h * 3600, (start_h + hours) * 3600
    rows = []
    with open(TRACE, newline="") as f:
        for r in csv.DictReader(f):
            at, gpus, team = float(r["submit_s"]), int(r["gpus"]), r["team"]
            if not lo <= at < hi or team not in SHARES:
                continue
            if gpus in ((1, 2) if team == FLOOD else (4, 8)):
                rows.append((at, team, gpus, float(r["duration_s"]), r["job_id"]))
    rows.sort()
    capacity = sum(n.capacity.gpu for n in SETUP.nodes())
    scale = _scale(rows, load * capacity * window_s, longest)
    jobs, last, count = [], -MIN_GAP, dict.fromkeys(SHARES, 0)
    for at, team, gpus, duration, job_id in rows:
        last = max((at - lo) / (hi - lo) * window_s, last + MIN_GAP)
        count[team] += 1
        user = f"{team}-{2 - count[team] % 2}"
        seconds = _seconds(duration, scale, longest)
        jobs.append(WorkJob(job_id, round(last, 3), team, user, gpus, 1, seconds))
    return jobs


def _seconds(duration: float, scale: float, longest: float) -> float:
    return round(min(longest, max(3.0, scale * duration**EXPONENT)), 2)


def _scale(rows: list[tuple], wanted: float, longest: float) -> float:
    """The factor ``a`` that makes the jobs ask for ``wanted`` GPU-seconds (bisection)."""
    low, high = 1e-6, 1e3
    for _ in range(100):
        mid = (low * high) ** 0.5
        asked = sum(g * _seconds(d, mid, longest) for _, _, g, d, _ in rows)
        low, high = (mid, high) if asked < wanted else (low, mid)
    return low


# -- output ---------------------------------------------------------------------------------
def table(columns: dict[str, dict]) -> list[tuple[str, list[str]]]:
    """(row name, one cell per column) for every figure."""

    def row(name: str, cell) -> tuple[str, list[str]]:
        return name, [cell(f) for f in columns.values()]

    def wait(team: str, key: str):
        return lambda f: _num(f["waits"][team][key])

    rows = [
        row("jobs finished", lambda f: f"{f['finished']}/{f['jobs']}"),
        row("makespan s", lambda f: _num(f["makespan_s"])),
        row("GPU utilization (held/wanted)", lambda f: f"{f['utilization']:.3f}"),
        row("mean |held-deserved| GPUs, contended", lambda f: _num(f["mean_dev_gpu"]["contended"])),
        row("mean |held-deserved| GPUs, whole run", lambda f: _num(f["mean_dev_gpu"]["whole"])),
    ]
    for team in SETUP.teams:
        rows.append(row(f"wait {team} mean / p90 s", lambda f, t=team: wait(t, "mean")(f)
                        + " / " + wait(t, "p90")(f)))  # fmt: skip
    rows += [
        row("largest gang wait s", lambda f: _num(f["largest_gang_wait_s"])),
        row("preemptions (jobs)", lambda f: f"{f['preemptions']} ({f['preempted_jobs']})"),
        # held minus useful: lost work, and the start and exit delays the backend holds for
        row("lost GPU-s (held, not useful)", lambda f: _num(f["lost_gpu_s"])),
    ]
    for team in SETUP.teams:
        rows.append(row(f"held GPU-s {team}", lambda f, t=team: _num(f["held_gpu_s"][t])))
    rows.append(row("wall s", lambda f: _num(f["wall_s"])))
    return rows


def agreement(sim: dict, service: dict) -> dict:
    """The simulator against the service, as fractions of the service's figures."""
    out = {
        "preemptions": abs(sim["preemptions"] - service["preemptions"])
        / max(1, service["preemptions"])
    }
    for team, held in service["held_gpu_s"].items():
        out[f"held {team}"] = abs(sim["held_gpu_s"][team] - held) / held if held else 0.0
    return {k: round(v, 4) for k, v in out.items()}


def print_report(columns: dict[str, dict], notes: list[str], agree: dict | None) -> None:
    rows = table(columns)
    first = max(len(name) for name, _ in rows)
    widths = [max(len(label), *(len(cells[i]) for _, cells in rows)) for i, label in
              enumerate(columns)]  # fmt: skip
    print(" " * first + "  " + "  ".join(c.rjust(w) for c, w in zip(columns, widths)))
    for name, cells in rows:
        print(name.ljust(first) + "  " + "  ".join(c.rjust(w) for c, w in zip(cells, widths)))
    for note in notes:
        print(f"  {note}")
    if agree:
        ok_p = agree["preemptions"] <= AGREE["preemptions"]
        held = {k: v for k, v in agree.items() if k.startswith("held")}
        ok_h = max(held.values()) <= AGREE["held"]
        print(
            f"simulator (service timing) vs service: preemptions {100 * agree['preemptions']:.1f}%"
            f" apart ({'within' if ok_p else 'NOT within'} 20%), held GPU-s per plan "
            + ", ".join(f"{k[5:]} {100 * v:.2f}%" for k, v in held.items())
            + f" ({'within' if ok_h else 'NOT within'} 2%)"
        )


def _num(value) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.2f}"


# -- the run --------------------------------------------------------------------------------
def run(args: argparse.Namespace, tmp: Path) -> tuple[dict[str, dict], list[str], dict | None]:
    start, hours, window, longest = QUICK if args.quick else (*MAIN, args.window_s, 45.0)
    workload = philly_slice(start, hours, window, args.load, longest)
    gpus = sum(j.width * j.seconds for j in workload)
    notes = [
        f"workload: {len(workload)} jobs over {workload[-1].at:.0f} s, "
        f"{gpus:,.0f} GPU-seconds asked ({args.load}x the capacity over the window); "
        + ", ".join(f"{t}: {sum(1 for j in workload if j.team == t)}" for t in SHARES),
        f"timing: tick {SETUP.tick} s, grace {SETUP.grace} s, min_runtime {SETUP.min_runtime}"
        f" s, checkpoint every {SETUP.checkpoint_every} s, exit {SETUP.exit_after_term} s"
        " after SIGTERM",
    ]
    columns: dict[str, dict] = {}
    received, nodes = workload, None
    if not args.no_service:
        service = run_service(workload, SETUP, tmp)
        columns["service"] = figures(service, SETUP)
        notes += service.notes
        nodes = service.nodes
        # the simulator gets the submissions as the service stamped them (5-25 ms later)
        received = [dataclasses.replace(j, at=r.submitted) for j, r in zip(workload, service.runs)]
    outcomes: list[Outcome] = [
        run_sim(received, SETUP, "wmla", "service", "sim, service timing", nodes),
        run_sim(received, SETUP, "wmla", "instant", "sim, instant timing", nodes),
        run_sim(received, SETUP, "gang-fifo", "service", "gang-fifo (sim)", nodes),
    ]
    for out in outcomes:
        columns[out.label] = figures(out, SETUP)
    notes.append(f"simulator: {outcomes[0].notes[0]}")
    notes.append("gang-fifo: under the simulator's service timing, like the wmla column")
    agree = None
    if "service" in columns:
        agree = agreement(columns["sim, service timing"], columns["service"])
    return columns, notes, agree


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="12 h of the trace in 30 s")
    parser.add_argument("--no-service", action="store_true", help="the simulator only")
    parser.add_argument("--load", type=float, default=1.8, help="demand over capacity")
    parser.add_argument("--window-s", type=float, default=120.0, help="48 h in this many s")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the run's folder (logs)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="wmla-bench-fairness-"))
    try:
        columns, notes, agree = run(args, tmp)
    finally:
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps({"columns": columns, "notes": notes, "agreement": agree}, indent=1))
    else:
        print_report(columns, notes, agree)
    return 0


if __name__ == "__main__":
    sys.exit(main())
