"""The ledger's memory is flat in the number of jobs it has seen (issue 31): full-resolution
points are sealed into compressed chunks, and every reading of a sealed series is the same as
of one kept whole (property test against a series that never seals).
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extension.metering import series as series_module
from extension.metering.accounting import Fact, Ledger
from extension.metering.blocks import BLOCK
from extension.metering.series import StepSeries

T0 = 1_800_000_000.0  # a whole hour in epoch seconds
BUCKET = 1000  # ms, small so that compaction has work to do


@contextmanager
def sealing(hot: int, chunk: int) -> Iterator[None]:
    """Seal after ``hot + chunk`` points, ``chunk`` at a time, for the calls inside."""
    saved = series_module.HOT, series_module.CHUNK
    series_module.HOT, series_module.CHUNK = hot, chunk
    try:
        yield
    finally:
        series_module.HOT, series_module.CHUNK = saved


def _both(sealed: StepSeries, whole: StepSeries, call: Callable[[StepSeries], object]) -> None:
    with sealing(2, 3):
        call(sealed)
    with sealing(10**9, 1):
        call(whole)


OPS = st.lists(
    st.one_of(
        # (t ms, delta): times mostly ascending, some late
        st.tuples(st.integers(0, 40_000), st.integers(-3, 3), st.integers(-2, 2)),
        st.integers(1, 40).map(lambda b: b * BUCKET),  # compact at a horizon
    ),
    min_size=1,
    max_size=120,
)


PROBES = st.lists(st.integers(-1000, 45_000), min_size=1, max_size=30)
# memory in bytes: small, integrals past 64 bits, values past 64 bits (never sealed)
SIZES = st.sampled_from([1, 2**50, 2**62])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS, PROBES, SIZES)
def test_a_sealed_series_reads_as_one_kept_whole(ops, probes, size) -> None:
    sealed, whole = StepSeries(BUCKET), StepSeries(BUCKET)
    for op in ops:
        if isinstance(op, int):
            _both(sealed, whole, lambda s, h=op: s.compact(h))
        else:
            t, g, m = op
            _both(sealed, whole, lambda s, t=t, d=(g, 10 * g, m * size): s.add_delta(t, d))
    assert whole.sealed == []
    bounds = sorted(probes)
    assert sealed.integrals(bounds) == whole.integrals(bounds)
    assert [sealed.integral_to(t) for t in bounds] == [whole.integral_to(t) for t in bounds]
    assert sealed.values_at(bounds) == whole.values_at(bounds)
    assert sealed.current() == whole.current()
    assert sealed.horizon == whole.horizon
    assert (sealed.otimes, sealed.orates, sealed.ocum) == (whole.otimes, whole.orates, whole.ocum)
    for lo, hi in zip(bounds, bounds[1:]):
        assert sealed.times_between(lo, hi) == whole.times_between(lo, hi)
        assert sealed.count_between(lo, hi) == whole.count_between(lo, hi)
    assert len(sealed.times) <= 2 + 3 or not sealed.sealed


def _history(jobs: int, users: int = 10) -> list[Fact]:
    """bench_service's history: one-GPU jobs submitted, started and finished, a few ms apart,
    by ``users`` users in one plan, in time order."""
    facts = []
    for k in range(jobs):
        user = f"u{k % users}"
        at = T0 + k * 0.002
        for dt, state, workers in ((0.0, "PENDING", 0), (0.05, "RUNNING", 1), (0.1, "FINISHED", 0)):
            fact = Fact(
                at + dt, f"j{k}", f"/p/t/{user}", user, "x", state, workers, 1, 1, 10, 2**24
            )
            facts.append(fact)
    return sorted(facts, key=lambda f: f.at)


def test_the_ledger_keeps_no_memory_per_job() -> None:
    """Folding 12,000 jobs past the first 3,000 costs under 200 bytes a job, every change at a
    time of its own (the whole series kept as Python tuples cost 3 KB a job here, and 1.7 KB a
    job of bench_service's history: its RSS growth, issue 31)."""
    ledger = Ledger()
    facts = _history(15_000, users=2)
    first, rest = facts[: 3 * 3_000], facts[3 * 3_000 :]
    for fact in first:
        ledger.apply(fact)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for fact in rest:
            ledger.apply(fact)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown / 12_000 < 200, f"{grown / 12_000:.0f} bytes a job"
    chunks = []
    for node in ledger.nodes.values():
        for s in (node.requested, node.used):
            assert len(s.times) <= series_module.HOT + series_module.CHUNK
            chunks += s.sealed
    # their bytes share a few long-lived blocks, not an allocation each (the C heap's pages
    # around many small long-lived ones stay partly used: never given back)
    blocks = {id(chunk.block) for chunk in chunks}
    assert len(chunks) > 100 and len(blocks) <= 2 + sum(c.size for c in chunks) // BLOCK
