"""The gang-wait floor of ``benchmarks/bench_fairness_days.py`` (issue 41): the least final
deviation any schedule can have in which every gang waits at most a bound and no started gang
is stopped, and the least bound a schedule meeting a deviation can keep. It says where the
benchmark's gang wait goal and its deviation goal cannot both be met, whatever the scheduler.
"""

from __future__ import annotations

import pytest

from benchmarks.bench_fairness_days import (
    DAY,
    SYNTHETIC,
    gang_floor,
    least_gang_bound,
    synthetic,
)
from extension.sim.trace import TraceRow

H = 3600.0


def row(name: str, at: float, hours: float, gpus: int, team: str) -> TraceRow:
    return TraceRow(name, at, hours * H, gpus, team, "anonymous", "")


def test_floor_counts_what_each_gang_must_hold_by_the_end() -> None:
    """8 GPUs for two days: ``a`` alone on day 1 (8 one-GPU jobs of 24 h: 192 GPU-hours),
    then ``b``'s 8-GPU gang of 12 h at 24 h. Within 6 h it runs 12 h by the end: ``b`` holds
    at least 96 of at most 192 + 8 x 24 GPU-hours, 1/4 where its entitlement is 1/2:
    below its part, so no floor. Within 6 h of 40 h it runs 2 h by the end: 16 GPU-hours."""
    rows = [row(f"a{i}", 0.0, 24, 1, "a") for i in range(8)]
    rows += [row(f"a{i}-2", DAY, 24, 1, "a") for i in range(8)]
    rows.append(row("b", DAY, 12, 8, "b"))
    got = gang_floor(rows, ("a", "b"), 2, 8, 6 * H)
    assert got["need_gpu_h"] == {"a": 0.0, "b": 96.0}
    assert got["most_gpu_h"] == 384.0
    assert got["deviation"] == 0.0
    late = rows[:-1] + [row("b", 40 * H, 12, 8, "b")]
    assert gang_floor(late, ("a", "b"), 2, 8, 6 * H)["need_gpu_h"]["b"] == 16.0


def test_floor_of_a_team_forced_past_its_part() -> None:
    """Three 8-GPU gangs of ``b`` at 24 h, 12 h each, on 8 GPUs: within 12 h of their
    submission each runs 12 h by the end, 288 GPU-hours of the 384 the window holds, 3/4
    against an entitlement of 1/2 (deviation (1/4 + 1/4) / 2). The floor counts GPU-hours,
    not when they are free (three gangs cannot all start within 1 h on one node, and the
    floor still says 1/4: a lower bound). Within ``B`` past 12 h each runs ``24 - B`` hours:
    a deviation of 1/8 allows no bound under 14 h. Six such gangs ask for more than the
    window holds: no floor."""
    rows = [row(f"a{i}", 0.0, 24, 1, "a") for i in range(8)]
    rows += [row(f"a{i}-2", DAY, 24, 1, "a") for i in range(8)]
    gangs = [row(f"b{i}", DAY, 12, 8, "b") for i in range(6)]
    got = gang_floor(rows + gangs[:3], ("a", "b"), 2, 8, 12 * H)
    assert got["need_gpu_h"]["b"] == 288.0
    assert got["deviation"] == pytest.approx(0.25)
    assert gang_floor(rows + gangs[:3], ("a", "b"), 2, 8, 1 * H)["deviation"] == got["deviation"]
    assert least_gang_bound(rows + gangs[:3], ("a", "b"), 2, 8, 0.125) == pytest.approx(
        14 * H, abs=60
    )
    assert gang_floor(rows + gangs, ("a", "b"), 2, 8, 12 * H)["deviation"] is None


def test_synthetic_2_4x_cannot_start_every_gang_within_twice_the_limit() -> None:
    """The 2.4x workload on 4 x 8 GPUs (docs/simulate.md): the gangs' GPU-hours alone, each
    started 24 h after its submission, exceed what three days of 32 GPUs hold; at half of
    ``off``'s deviation (0.166) no bound under 52 h is attainable."""
    teams = tuple(mix.team for mix in SYNTHETIC)
    rows = synthetic(3, 2.4, 32, 12 * H, seed=41)
    assert gang_floor(rows, teams, 3, 32, 24 * H)["deviation"] is None
    assert least_gang_bound(rows, teams, 3, 32, 0.166 / 2) > 52 * H
