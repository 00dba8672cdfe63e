"""Fair over days when the cluster is oversubscribed (issue 41), at a size the suite affords:
``benchmarks/bench_fairness_days.py``'s synthetic workload (the first team alone on day 1,
then three teams asking for LOAD times the capacity for two days) on 4 x 8 GPUs with a
one-minute tick (the benchmark's is 5 s), history off against ``7d`` with ``max_gang_wait``
the runtime limit. The benchmark's goals (docs/simulate.md "Fairness over days benchmark"):
the cumulative deviation at most half of off's, preemptions no more than off's + 10 %,
utilization at most 0.01 lower. This workload at three times the capacity (the 3x case;
the benchmark's own, Philly on 8 x 8 GPUs, takes minutes and halves it: 0.024 against 0.106)
loses 46 % of its deviation, not half: pinned as measured, so a change that loses it shows.
"""

from __future__ import annotations

import argparse

import pytest

from benchmarks.bench_fairness_days import (
    DAY,
    SYNTHETIC,
    Config,
    no_wait,
    run_one,
    synthetic,
)
from extension.sim.fairshare import FairShare

LIMIT = 12 * 3600.0
TEAMS = tuple(mix.team for mix in SYNTHETIC)


def measure(load: float, config: Config) -> dict:
    rows = synthetic(3, load, 32, LIMIT, seed=41)
    args = argparse.Namespace(nodes="4x8", days=3, tick=60.0, teams=TEAMS)
    return run_one(rows, args, config, no_wait(rows, TEAMS, 3))


@pytest.mark.parametrize(
    ("load", "part"),
    [
        (2.4, 0.5),  # measured 0.073 against 0.166
        (3.0, 0.6),  # measured 0.097 against 0.180: the goal's half is missed here
    ],
)
def test_history_repays_an_oversubscribed_queue(load: float, part: float) -> None:
    off = measure(load, Config("off", "wmla", FairShare()))
    on = measure(load, Config("7d", "wmla", FairShare(7 * DAY, LIMIT)))
    said = {k: (off[k], on[k]) for k in ("deviation", "preemptions", "utilization")}
    assert on["deviation"]["final"] <= off["deviation"]["final"] * part, said
    assert on["preemptions"] <= 1.1 * off["preemptions"], said
    assert on["utilization"] >= off["utilization"] - 0.01, said
