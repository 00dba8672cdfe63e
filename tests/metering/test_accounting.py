"""The ledger: exact resource-hours from a scripted history written through the real store
(SQLite and PostgreSQL), and leaves adding up to their parents over random histories (property
test), downsampling included.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extension.metering.accounting import ROOT, Fact, Ledger, ancestors
from extension.metering.meter import Metering
from extension.metering.series import StepSeries
from extension.metering.transitions import Transition
from extension.metering.usage import usage, usage_csv
from extension.service.records import StoreChange
from extension.service.rows import JobRow
from extension.service.store import Store

T0 = 1_800_000_000.0  # a whole hour in epoch seconds, so buckets line up with the script
GIB = 2**30


def hours(gpu_seconds: int) -> float:
    return float(Fraction(gpu_seconds, 3600))


# -- a scripted history, written the way the scheduling loop writes it ---------------------------
def _job(job_id: str, user: str, plan: str, workers: tuple[int, int], at: float) -> JobRow:
    return JobRow(
        id=job_id,
        user=user,
        plan=plan,
        leaf=f"{plan}/{user}",
        kind="train",
        state="PENDING",
        gpu=1,
        cpu=500,
        memory=GIB,
        limits={},
        min_workers=workers[0],
        max_workers=workers[1],
        priority=0,
        preemptible=True,
        command=[],
        request={},
        workdir="/nowhere",
        env={},
        name=job_id,
        submitted=at,
        placement=[],
        terminating=False,
        cancel_requested=False,
        reason="",
        preemptions=0,
    )


def _change(store: Store, job: str, at: float, event: str, workers: int, state: str) -> None:
    values = {"state": state, "placement": ["n"] * workers}
    store.update_jobs([StoreChange(job, values, Transition(event))], T0 + at)


def write_script(store: Store, after=lambda: None) -> None:
    """Job A (user1, rigid 2 x 1 GPU): waits 600 s, runs 5400 s.
    Job B (user2, elastic 1..4): starts with 2 at 1800, grows to 4 at 3600, shrinks to 2 at 5430
    (asked at 5400: it holds 4 until resized), preempted at 7200 (released at 7230), waits,
    cancelled at 9000.  Job C (user1, qa-team): rejected at once.  ``after`` runs after each
    write."""
    store.add_job(_job("A", "user1", "/project1/dev-team", (2, 2), T0), T0)
    after()
    store.add_job(_job("B", "user2", "/project1/dev-team", (1, 4), T0), T0)
    after()
    store.add_job(_job("C", "user1", "/project1/qa-team", (1, 1), T0 + 100), T0 + 100)
    after()
    for job, at, event, workers, state in [
        ("C", 100, "rejected", 0, "REJECTED"),
        ("A", 600, "started", 2, "RUNNING"),
        ("A", 601, "running", 2, "RUNNING"),
        ("B", 1800, "started", 2, "RUNNING"),
        ("B", 3600, "grown", 4, "RUNNING"),
        ("B", 5400, "shrinking", 4, "RUNNING"),
        ("B", 5430, "resized", 2, "RUNNING"),
        ("A", 6000, "finished", 0, "FINISHED"),
        ("B", 7200, "preempting", 2, "RUNNING"),
        ("B", 7230, "released", 0, "PENDING"),
        ("B", 9000, "cancelled", 0, "CANCELLED"),
    ]:
        _change(store, job, at, event, workers, state)
        after()


@pytest.fixture
def scripted(store_url: str) -> Store:
    store = Store.open(store_url)
    write_script(store)
    yield store
    store.close()


USED_A = 2 * 5400
USED_B = 2 * 1800 + 4 * 1830 + 2 * 1800
REQ_A = 2 * 6000
REQ_B = 4 * 9000


def test_scripted_history_gives_exact_gpu_hours_per_leaf_and_parent(scripted: Store) -> None:
    meter = Metering(store=scripted, clock=lambda: T0 + 20_000)
    assert meter.ledger.facts == 14
    answer = usage(meter.ledger, "/project1/dev-team", T0, T0 + 10_800, 3600, T0 + 20_000)
    rows = {c["path"]: c["totals"] for c in answer["children"]}
    assert set(rows) == {"/project1/dev-team/user1", "/project1/dev-team/user2"}
    user1, user2 = rows["/project1/dev-team/user1"], rows["/project1/dev-team/user2"]
    assert user1["used"]["gpu_hours"] == hours(USED_A) == 3.0
    assert user2["used"]["gpu_hours"] == hours(USED_B)
    assert user1["requested"]["gpu_hours"] == hours(REQ_A)
    assert user2["requested"]["gpu_hours"] == hours(REQ_B) == 10.0
    assert user1["gpu_hours"] == user1["used"]["gpu_hours"]  # the flat figure is the charged one
    # cpu: 500 millicores per worker -> half a core-hour per GPU-hour here
    assert user2["used"]["cpu_hours"] == float(Fraction(USED_B, 2 * 3600))
    assert user2["used"]["memory_gib_hours"] == hours(USED_B)
    totals = answer["totals"]
    assert totals["used"]["gpu_hours"] == hours(USED_A + USED_B)
    assert totals["requested"]["gpu_hours"] == hours(REQ_A + REQ_B)
    top = usage(meter.ledger, "/project1", T0, T0 + 10_800, 3600, T0 + 20_000)
    assert {c["path"] for c in top["children"]} == {"/project1/dev-team", "/project1/qa-team"}
    qa = next(c for c in top["children"] if c["path"] == "/project1/qa-team")
    assert qa["totals"]["used"]["gpu_hours"] == 0 and qa["totals"]["requested"]["gpu_hours"] == 0
    assert top["totals"] == totals  # qa-team adds nothing: the rejected job never counted
    # hourly steps: averages in devices; the step series integrate back to the totals
    used = answer["series"]["used"]["gpu"]
    assert used == [
        float(Fraction(2 * 3000 + 2 * 1800, 3600)),  # A from 600; B 2 from 1800
        float(Fraction(2 * 2400 + 4 * 1830 + 2 * 1770, 3600)),  # A to 6000; B 4, then 2
        float(Fraction(2 * 30, 3600)),  # B holds 2 until released at 7230
    ]
    assert answer["series"]["t"] == [T0, T0 + 3600, T0 + 7200]
    assert meter.ledger.nodes["/project1/dev-team/user2"].preemptions == 1
    assert meter.ledger.nodes[ROOT].preemptions == 1


def test_user_sees_only_their_leaves_and_csv_adds_up(scripted: Store) -> None:
    meter = Metering(store=scripted, clock=lambda: T0 + 20_000)
    mine = usage(meter.ledger, "/project1", T0, T0 + 10_800, 900, T0 + 20_000, user="user1")
    assert [c["path"] for c in mine["children"]] == [
        "/project1/dev-team/user1",
        "/project1/qa-team/user1",
    ]
    assert mine["totals"]["used"]["gpu_hours"] == 3.0
    text = usage_csv(meter.ledger, "/project1/dev-team", T0, T0 + 10_800, 3600, T0 + 20_000)
    lines = text.strip().split("\n")
    header = lines[0].split(",")
    assert header[:3] == ["plan", "start", "end"] and "used_gpu_hours" in header
    col = header.index("used_gpu_hours")
    by_leaf: dict[str, float] = {}
    for line in lines[1:]:
        cells = line.split(",")
        by_leaf[cells[0]] = by_leaf.get(cells[0], 0) + float(cells[col])
    assert by_leaf["/project1/dev-team/user1"] == pytest.approx(3.0, abs=1e-12)
    assert by_leaf["/project1/dev-team/user2"] == pytest.approx(hours(USED_B), abs=1e-12)
    assert len(lines) == 1 + 2 * 3  # two leaves, three hourly steps


def test_figures_stop_at_now_and_reading_again_adds_only_new_rows(scripted: Store) -> None:
    now = [T0 + 3600]
    meter = Metering(store=scripted, clock=lambda: now[0])
    early = usage(meter.ledger, "/project1/dev-team", T0, T0 + 7200, 3600, now[0])
    # after now nothing is extrapolated: the second hour is empty
    assert early["series"]["used"]["gpu"][1] == 0.0
    assert meter.refresh() == 0
    scripted.add_job(_job("D", "user1", "/project1/dev-team", (1, 1), T0 + 10_000), T0 + 10_000)
    assert meter.refresh() == 1
    assert meter.ledger.current("/project1/dev-team/user1", "requested") == (1000, 500, GIB)


def test_downsampled_history_stays_exact_on_bucket_boundaries(scripted: Store) -> None:
    later = T0 + 30 * 86400
    meter = Metering(store=scripted, clock=lambda: later, full_resolution=86400, bucket=3600)
    assert meter.ledger.horizon == (later - 86400) * 1000  # compacted up to a day ago
    series = meter.ledger.nodes["/project1/dev-team"].used
    assert series.times[0] == meter.ledger.horizon and len(series.times) == 1
    # three busy hours then 29 idle days: a handful of bucket runs, not 700 buckets
    assert len(series.otimes) <= 5 and series.orates[-1] == (0, 0, 0)
    answer = usage(meter.ledger, "/project1/dev-team", T0, T0 + 10_800, 3600, later)
    assert answer["totals"]["used"]["gpu_hours"] == hours(USED_A + USED_B)
    assert answer["exact_from"] == later - 86400
    # inside an old bucket the split is linear: still exact in total, approximate in between
    halves = usage(meter.ledger, "/project1/dev-team", T0, T0 + 10_800, 1800, later)
    assert sum(halves["series"]["used"]["gpu"]) * 0.5 == pytest.approx(hours(USED_A + USED_B))


def test_retention_forgets_older_history_and_says_so(scripted: Store) -> None:
    later = T0 + 30 * 86400
    meter = Metering(
        store=scripted, clock=lambda: later, full_resolution=86400, retention=10 * 86400
    )
    answer = usage(meter.ledger, "/project1", T0 - 86400, later, 86400, later)
    assert answer["kept_from"] == later - 10 * 86400
    assert answer["totals"]["requested"]["gpu_hours"] == 0  # all of it was 30 days ago
    kept = meter.ledger.nodes["/project1"].used
    assert kept.otimes == [(later - 10 * 86400) * 1000]  # one idle run left, from the cutoff
    with pytest.raises(ValueError, match="at least the full-resolution"):
        Ledger(full_resolution_seconds=86400, retention_seconds=3600)


# -- property: leaves add up to their parents, and match a naive integration ------------------
LEAVES = ["/a/x/u1", "/a/x/u2", "/a/y/u1", "/b/u3", "/b/z/w/u4"]
EVENTS = st.lists(
    st.tuples(
        st.integers(0, 5),  # job
        st.sampled_from(LEAVES),
        st.integers(0, 40_000),  # seconds after T0
        st.sampled_from(["PENDING", "RUNNING", "RUNNING", "FINISHED"]),
        st.integers(0, 4),  # workers held
        st.integers(1, 4),  # gpu per worker
    ),
    max_size=40,
)


def _naive(facts: list[Fact], leaf_filter, a: int, b: int) -> Fraction:
    """GPU milli-device x ms over [a, b) by walking every job's own history (no ledger)."""
    total = Fraction(0)
    jobs: dict[str, list[tuple[int, int]]] = {}
    last: dict[str, int] = {}
    for f in facts:
        if not leaf_filter(f.leaf):
            continue
        t = max(round(f.at * 1000), last.get(f.job_id, -(10**18)))
        last[f.job_id] = t
        jobs.setdefault(f.job_id, []).append((t, round(f.gpu * 1000) * f.workers))
    for points in jobs.values():
        for i, (t, v) in enumerate(points):
            end = points[i + 1][0] if i + 1 < len(points) else 10**18
            lo, hi = max(t, a), min(end, b)
            if hi > lo:
                total += v * (hi - lo)
    return total


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(EVENTS, st.integers(0, 50_000), st.integers(1, 20_000), st.integers(-1, 40))
def test_leaves_add_up_to_parents_over_random_histories(events, a, span, compact_at) -> None:
    ledger = Ledger(3600, full_resolution_seconds=2 * 3600, retention_seconds=5 * 3600)
    facts: list[Fact] = []
    leaf_of: dict[int, str] = {}
    ended: set[int] = set()
    for i, (job, leaf, at, state, workers, gpu) in enumerate(events):
        if i == compact_at:  # downsample part-way: later rows may then be older than the horizon
            ledger.compact(T0 + 30_000)
        if job in ended:
            continue  # an ended job never comes back
        ended |= {job} if state == "FINISHED" else set()
        leaf = leaf_of.setdefault(job, leaf)  # a job stays in its leaf
        held = workers if state == "RUNNING" else 0
        fact = Fact(
            T0 + at, f"j{job}", leaf, leaf.rsplit("/", 1)[1], "x", state, held, 4, gpu, 0, 0
        )
        facts.append(fact)
        ledger.apply(fact)  # arrival order: times go back and forth across jobs
    late = 0 <= compact_at < len(events)  # rows arrived after a downsampling
    if compact_at >= len(events):
        ledger.compact(T0 + 30_000)
    lo, hi = round((T0 + a) * 1000), round((T0 + a + span) * 1000)
    for path, node in ledger.nodes.items():
        if not node.children:
            continue
        for kind in ("requested", "used"):
            whole = ledger.integrals(path, kind, [lo, hi])
            parts = [ledger.integrals(c, kind, [lo, hi]) for c in node.children]
            for i in range(2):
                assert whole[i] == tuple(sum(p[i][r] for p in parts) for r in range(3))
            now = ledger.current(path, kind)
            assert now == tuple(
                sum(ledger.current(c, kind)[r] for c in node.children) for r in range(3)
            )
    # against a walk over the raw history, wherever full resolution is kept
    start = max(lo, ledger.horizon)
    if hi > start:
        for path in ("/a", "/a/x/u1", "/b", ROOT):
            got = ledger.integrals(path, "used", [start, hi])
            if not late:  # else rows older than the horizon were moved to it (documented)
                want = _naive(facts, lambda leaf, p=path: p in ancestors(leaf), start, hi)
                assert got[1][0] - got[0][0] == want


def test_series_keeps_late_changes_and_refuses_bad_input() -> None:
    s = StepSeries(1000)
    s.add_delta(5000, (1, 0, 0))
    s.add_delta(2000, (1, 0, 0))  # late: inserted before
    assert s.integrals([0, 2000, 5000, 6000]) == [(0, 0, 0), (0, 0, 0), (3000, 0, 0), (5000, 0, 0)]
    with pytest.raises(ValueError, match="bucket grid"):
        s.compact(1500)
    with pytest.raises(ValueError, match="bucket"):
        StepSeries(0)
    with pytest.raises(ValueError, match="bucket"):
        Ledger(bucket_seconds=0)


def test_reading_as_rows_arrive_equals_rebuilding_after_a_restart(store_url: str) -> None:
    store = Store.open(store_url)
    try:
        live = Metering(store=store, clock=lambda: T0 + 20_000)
        write_script(store, after=live.refresh)
        rebuilt = Metering(store=store, clock=lambda: T0 + 20_000)
        args = ("/project1", T0 - 3600, T0 + 14_400, 900, T0 + 20_000)
        assert usage(live.ledger, *args) == usage(rebuilt.ledger, *args)
        assert live.last_id == rebuilt.last_id == 14
    finally:
        store.close()
