"""The usage chart's step function, from the metering's own change points to the figure.

``extension.metering.usage.usage`` answers ``changes``: the amount from each time on, at the
range's start and at every change before min(end, now). The usage figure draws those instead of
per-step averages. Checked on real ledgers: a user's leaves summed, the downsampled history
(bucket averages before ``exact_from``), the cap beyond which the figure falls back to the
averages, and the step function integrating to the answer's totals.
"""

from __future__ import annotations

import pytest

from extension.metering import usage as metering
from extension.metering.accounting import Fact, Ledger
from widgets import figures

NOW = 1_800_000_000.0  # a whole hour
GIB = 2**30


def run(ledger: Ledger, job: str, leaf: str, start: float, end: float, gpus: int) -> None:
    """A job of ``gpus`` one-GPU workers, running from ``start`` to ``end``."""
    user = leaf.rsplit("/", 1)[1]
    for at, state, held in ((start, "RUNNING", gpus), (end, "FINISHED", 0)):
        ledger.apply(Fact(at, job, leaf, user, state.lower(), state, held, gpus, 1, 250, GIB))


def test_a_users_leaves_are_summed_at_every_change() -> None:
    ledger = Ledger()
    run(ledger, "a", "/p/x/alice", NOW - 600, NOW - 300, 2)
    run(ledger, "b", "/p/y/alice", NOW - 400, NOW - 100, 1)
    run(ledger, "c", "/p/y/bob", NOW - 500, NOW - 50, 4)  # not alice's
    answer = metering.usage(ledger, "/p", NOW - 3600, NOW, 3600, NOW, user="alice")
    changes = answer["changes"]
    assert changes["t"] == [NOW - 3600, NOW - 600, NOW - 400, NOW - 300, NOW - 100]
    assert changes["used"]["gpu"] == [0.0, 2.0, 3.0, 1.0, 0.0]
    assert changes["used"]["cpu"] == [0.0, 500.0, 750.0, 250.0, 0.0]  # millicores
    assert answer["series"]["used"]["gpu"] == [0.25]  # one 1 h step: 900 GPU-seconds
    fig = figures.usage_figure(figures.normalise_usage(answer))
    used = next(t for t in fig["data"] if t["name"] == "GPU used")
    assert used["y"] == [0.0, 2.0, 3.0, 1.0, 0.0, 0.0]


def test_the_step_function_integrates_to_the_totals_and_stops_at_now() -> None:
    ledger = Ledger()
    run(ledger, "a", "/p/alice", NOW - 7000, NOW - 10, 3)
    run(ledger, "b", "/p/bob", NOW - 50, NOW + 500, 1)  # still running at now
    answer = metering.usage(ledger, "/p", NOW - 7200, NOW + 3600, 60, NOW)
    changes = answer["changes"]
    assert changes["t"][-1] < NOW  # nothing after now; the chart holds the last value to it
    ends = [*changes["t"][1:], NOW]
    gpu_hours = (
        sum(g * (b - a) for g, a, b in zip(changes["used"]["gpu"], changes["t"], ends)) / 3600
    )
    assert gpu_hours == pytest.approx(answer["totals"]["gpu_hours"], rel=1e-12)
    norm = figures.normalise_usage(answer)
    assert norm["end"] == NOW


def test_before_the_horizon_the_steps_are_bucket_averages() -> None:
    ledger = Ledger(bucket_seconds=3600, full_resolution_seconds=86400)
    old = NOW - 3 * 86400
    run(ledger, "old", "/p/alice", old + 600, old + 2400, 2)  # 30 min of 2 GPUs in one bucket
    run(ledger, "new", "/p/alice", NOW - 1200, NOW - 600, 2)
    ledger.compact(NOW)
    answer = metering.usage(ledger, "/p", NOW - 4 * 86400, NOW, 3600, NOW)
    assert answer["exact_from"] == NOW - 86400
    changes = answer["changes"]
    by_time = dict(zip(changes["t"], changes["used"]["gpu"]))
    assert by_time[old] == 1.0  # the bucket's average: 2 GPUs for half of it
    assert by_time[NOW - 1200] == 2.0 and by_time[NOW - 600] == 0.0  # exact after the horizon


def test_beyond_the_cap_the_figure_draws_the_averages(monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = Ledger()
    for i in range(6):
        run(ledger, f"j{i}", "/p/alice", NOW - 3000 + 400 * i, NOW - 2900 + 400 * i, 1)
    monkeypatch.setattr(metering, "MAX_CHANGES", 5)
    answer = metering.usage(ledger, "/p", NOW - 3600, NOW, 1800, NOW)
    assert answer["changes"] is None
    norm = figures.normalise_usage(answer)
    assert norm["changes"] is None
    used = next(t for t in figures.usage_figure(norm)["data"] if t["name"] == "GPU used")
    assert used["y"] == [pytest.approx(300 / 1800)] * 2  # three 100 s runs in each 30 min step
