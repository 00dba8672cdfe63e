"""The fair-share samples (extension/metering/shares.py) over the service's real usage history:
one per interval, a bounded ring, only the plans with usage kept, the series and the gauges.

The scheduler is a plain record of the two things the metering reads (``fair_share``, the
service's ``FairShareHistory``, and ``plans``, a real ``PlanTree``); usage is charged through the
history's own ``advance`` with what each leaf held (GPU devices, millicores, bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from extension.metering.shares import SAMPLES, ShareSamples, share_families
from extension.scheduler.plans import PlanTree
from extension.service.fair_share import FairShareHistory, FairShareSettings

PLANS = {"/a": {}, "/a/u1": {"user_leaf": True}, "/b": {}, "/b/u2": {"user_leaf": True}, "/c": {}}


@dataclass
class Sched:
    """What the metering reads of the service's scheduler."""

    fair_share: FairShareHistory
    plans: PlanTree


def sched(half_life: float) -> Sched:
    return Sched(FairShareHistory(FairShareSettings(half_life)), PlanTree.from_dict(PLANS))


def run(s: Sched, samples: ShareSamples, start: float, seconds: int, held: list) -> int:
    """A cycle a second for ``seconds``, ``held`` charged each; returns the samples taken."""
    taken = 0
    for t in range(seconds):
        assert s.fair_share.history is not None
        s.fair_share.history.advance(start + t, held)
        taken += samples.take(s, start + t)
    return taken


def test_a_sample_per_interval_and_the_ring_is_bounded() -> None:
    s = sched(half_life=SAMPLES * 2.0)  # a sample every 2 s
    samples = ShareSamples()
    assert samples.interval(SAMPLES * 2.0) == 2.0 and samples.interval(60) == 1.0
    taken = run(s, samples, 1000.0, 2 * SAMPLES + 40, [("/a/u1", (1, 0, 0))])
    assert taken == SAMPLES + 20 and len(samples.ring) == SAMPLES  # the oldest 20 dropped
    times = [x.at for x in samples.ring]
    assert times == [1040.0 + 2 * i for i in range(SAMPLES)]
    # only the plans with usage are kept, and the samples share one paths tuple
    first, last = samples.ring[0], samples.ring[-1]
    assert first.paths == ("/a", "/a/u1") and last.paths is first.paths


def test_the_series_fill_in_plans_without_usage_and_end_now() -> None:
    s = sched(half_life=360.0)  # a sample a second
    samples = ShareSamples()
    run(s, samples, 0.0, 5, [("/a/u1", (2, 0, 0))])
    run(s, samples, 5.0, 5, [("/a/u1", (2, 0, 0)), ("/b/u2", (1, 0, 0))])
    series = samples.series(["/a", "/b", "/c"])
    assert series["t"] == [float(t) for t in range(10)]
    a, b, c = series["plans"]
    assert a["plan"] == "/a" and a["raw_usage"][0] == 0.0 and a["raw_usage"][-1] > 0
    assert a["raw_usage"] == sorted(a["raw_usage"])  # it held 2 GPUs all along
    # charged for the second before each advance: b from the one up to t=5
    assert b["raw_usage"][:5] == [0.0] * 5 and 0 < b["raw_usage"][5] < b["raw_usage"][-1]
    assert b["fair_share_factor"][:5] == [1.0] * 5  # no usage: 2 ** 0
    assert c["raw_usage"] == [0.0] * 10 and c["fair_share_factor"] == [1.0] * 10
    # /a alone used it all at first (U = 1, S = 1/3): 2 ** -3; then a factor under b's
    assert a["fair_share_factor"][2] == pytest.approx(2**-3)
    assert a["fair_share_factor"][-1] < b["fair_share_factor"][-1] < 1.0
    standings = s.fair_share.standings(s.plans, 9.0)
    assert a["raw_usage"][-1] == standings["/a"].raw_usage
    assert b["fair_share_factor"][-1] == standings["/b"].factor


def test_no_samples_and_no_series_while_the_history_is_off() -> None:
    s = sched(half_life=0.0)
    samples = ShareSamples()
    assert samples.take(s, 1.0) is False and len(samples.ring) == 0
    assert all(not family.samples for family in share_families(s, 1.0, set))


def exposition(families: list) -> dict[str, dict[str, float]]:
    class Collector:
        def collect(self):
            return families

    registry = CollectorRegistry()
    registry.register(Collector())
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            out.setdefault(sample.name, {})[sample.labels["plan"]] = sample.value
    return out


def test_the_gauges_are_the_standings_of_the_plans_shown() -> None:
    s = sched(half_life=3600.0)
    run(s, ShareSamples(), 0.0, 3, [("/a/u1", (1, 0, 0)), ("/b/u2", (1, 0, 0))])
    standings = s.fair_share.standings(s.plans, 10.0)
    hide_leaves = lambda paths: {p for p in paths if p.count("/") == 1}  # noqa: E731
    shown = exposition(share_families(s, 10.0, hide_leaves))
    factors, usage = shown["wmla_plan_fair_share_factor"], shown["wmla_plan_usage"]
    assert sorted(factors) == sorted(usage) == ["/a", "/b", "/c"]
    for path in ("/a", "/b", "/c"):
        assert factors[path] == standings[path].factor
        assert usage[path] == standings[path].raw_usage
    assert factors["/a"] == factors["/b"] < factors["/c"] == 1.0
