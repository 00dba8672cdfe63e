"""Draw the contended workloads of tests/e2e/test_sim_matches_service*.py and pick one whose
schedule no stall of the service can move.

Each seed draws 30 jobs on the tests' 2 x 4 virtual GPUs: 18 one-GPU jobs of team ``c`` at
0.3-3.5 s intervals from 2 s on, running 6-18 s, and 12 gangs submitted between 5 and 37.5 s,
running 9.5-17.5 s: three in four of team ``a`` (2 workers), the rest of ``b`` (2 or 4). A seed
is kept when the simulator (service timing, the tests' setup) reclaims at least ``--at-least``
times, the instant model misses some team's held GPU-seconds by over 12 % (so the plain test
can tell the models apart), and ``fairness_harness.moved_by`` finds nothing that moves it
(event delays of 2 and 30 ms, any one submission or backend event 0.5 s late) beyond half the
tests' tolerance on held GPU-seconds or beyond their tolerance on preemptions. With
``--history`` the setup has the history test's half-life and the kept seed
must also reclaim another number of times than with the history off.

    python benchmarks/pick_contended_workload.py --from 5000 --out workload.csv

prints each seed's verdict and writes the first kept one. Few seeds pass: 5065 (plain, 8
reclaims) and 3571 (history, 5 against 10 without) are the tests' workloads.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.fairness_harness import (  # noqa: E402
    WorkJob,
    figures,
    gaps,
    held_gap,
    moved_by,
    run_sim,
    write_workload,
)
from tests.e2e.test_sim_matches_service import HELD, PREEMPTIONS, SETUP  # noqa: E402

HISTORY = dataclasses.replace(SETUP, fair_share_half_life=20.0)


def draw(seed: int) -> list[WorkJob]:
    """Seed ``seed``'s workload, in submission order."""
    rnd = random.Random(seed)
    jobs, t = [], 2.0
    for _ in range(18):
        jobs.append(("c", f"c{rnd.randint(1, 2)}", 1, round(t, 2), round(rnd.uniform(6, 18), 1)))
        t += rnd.uniform(0.3, 3.5)
    for _ in range(12):
        team = "a" if rnd.random() < 0.75 else "b"
        workers = 2 if team == "a" else rnd.choice((2, 4))
        user = f"{team}{rnd.randint(1, 2)}"
        at, seconds = round(rnd.uniform(5, 37.5), 2), round(rnd.uniform(9.5, 17.5), 1)
        jobs.append((team, user, workers, at, seconds))
    jobs.sort(key=lambda j: j[3])
    return [
        WorkJob(f"t{i:02d}", at, team, user, workers, 1, seconds)
        for i, (team, user, workers, at, seconds) in enumerate(jobs)
    ]


def verdict(workload: list[WorkJob], history: bool, at_least: int) -> str | None:
    """Why ``workload`` is not kept; None where it is."""
    setup = HISTORY if history else SETUP
    base = figures(run_sim(workload, setup), setup)
    if base["finished"] != len(workload) or base["preemptions"] < at_least:
        return f"{base['preemptions']} reclaims"
    instant = figures(run_sim(workload, setup, timing="instant"), setup)
    if not history and held_gap(gaps(instant, base)) <= 0.12:
        return "the instant model agrees"
    if history and figures(run_sim(workload, SETUP), SETUP)["preemptions"] == base["preemptions"]:
        return "the history changes no reclaim"
    moved = moved_by(workload, setup, HELD / 2, PREEMPTIONS)
    return f"moved by {moved[0]}" if moved else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from", dest="first", type=int, default=0, help="the first seed")
    parser.add_argument("--seeds", type=int, default=1000, help="how many seeds to try")
    parser.add_argument("--history", action="store_true", help="the history test's setup")
    parser.add_argument("--at-least", type=int, default=5, help="reclaims the simulator makes")
    parser.add_argument("--out", type=Path, help="write the first kept workload here (CSV)")
    args = parser.parse_args(argv)
    for seed in range(args.first, args.first + args.seeds):
        workload = draw(seed)
        why = verdict(workload, args.history, args.at_least)
        print(f"seed {seed}: {why or 'kept'}", flush=True)
        if why is None:
            if args.out:
                write_workload(workload, args.out)
            return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
