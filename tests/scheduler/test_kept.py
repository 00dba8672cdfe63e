"""docs/scheduling.md "Cost": what a cycle keeps on its index for the next one (intake's
answer, the buckets it sorted, the waiting reasons, the deserved shares: intake.Kept,
kept.py, deserved.SharesKept) never changes what the next cycle decides or says: a cycle run
again on the same jobs, a cycle after jobs changed in place, after a submission check and on
copies of the jobs all answer, waiting order and all, as a cycle on the same index that reads
every job does, and as a cycle on a fresh index."""

from __future__ import annotations

import copy

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extension.scheduler import (
    IndexCache,
    Instance,
    JobState,
    SchedulerConfig,
    Snapshot,
    check_submission,
    schedule,
)
from extension.scheduler.admit import in_order
from extension.scheduler.kept import SortedKept

from . import streams
from .builders import nodes, pending, running, tree


def _picker(draw):
    return lambda options: draw(st.sampled_from(list(options)))


@st.composite
def worlds(draw):
    return streams.world(_picker(draw))


def outcome(result) -> tuple:
    """What a cycle decided and said, the order of the waiting reasons too (a dict's ==
    ignores it; the golden files do not)."""
    return result.decisions, list(result.waiting.items()), result.plans, result.reserved


def _fresh(snap: Snapshot, now: float) -> tuple:
    """The same cycle on an index built for it alone. A kept index may list the waiting
    jobs of a leaf in another order of shapes (its buckets' shapes stay in the order they
    first came, over cycles), so the reasons are compared as a dict."""
    alone = Snapshot(snap.plans.copy(), snap.instance, snap.jobs, snap.config, snap.reserved)
    result = schedule(alone, now, IndexCache())
    return result.decisions, result.waiting, result.plans, result.reserved


def _read_afresh(snap: Snapshot, now: float, cache: IndexCache) -> tuple:
    """The same cycle on the same kept index, intake reading every job (the first job is an
    equal copy: intake.Kept does not take a list that starts with another object)."""
    jobs = [copy.copy(snap.jobs[0]), *snap.jobs[1:]]
    again = Snapshot(snap.plans, snap.instance, jobs, snap.config, snap.reserved)
    return outcome(schedule(again, now, cache))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds(), st.lists(st.integers(0, 30), min_size=1, max_size=6), st.booleans())
def test_what_a_cycle_keeps_decides_as_a_fresh_index(world, finish_picks, copies):
    """Every step of a stream runs twice on a kept index (the second run takes intake's kept
    answer), then on a fresh one; ``copies``: every other step on copies of the jobs."""
    plans, machines, jobs = world
    live, cache, reserved = copy.deepcopy(jobs), IndexCache(), None
    for step, pick in enumerate(finish_picks):
        now = 100.0 * (step + 1)
        if copies and step % 2:
            live = copy.deepcopy(live)
        snap = Snapshot(plans, Instance(machines), live, SchedulerConfig(grace=0), reserved)
        first = schedule(snap, now, cache)
        again = schedule(snap, now, cache)  # intake's kept answer
        if live:
            assert outcome(first) == outcome(again) == _read_afresh(snap, now, cache)
        unordered = (first.decisions, first.waiting, first.plans, first.reserved)
        assert unordered == _fresh(snap, now)
        reserved = first.reserved
        rejected = {d.job_id for d in first.decisions if d.__class__.__name__ == "Reject"}
        live = [j for j in live if j.id not in rejected]
        streams.apply(live, first, now)
        streams.settle(live, first)
        runners = [j for j in live if j.state is JobState.RUNNING and not j.terminating]
        if runners and pick % 2:  # else the next step may keep intake's answer of this one
            runners[pick % len(runners)].state = JobState.FINISHED  # in place, same list


def test_a_submission_check_between_cycles_leaves_the_next_cycle_as_it_was():
    plans = tree({"/a": (1, None), "/b": (1, None)})
    jobs = [pending(f"j{i}", "/a" if i % 2 else "/b", workers=1 + i % 3) for i in range(40)]
    snap = Snapshot(plans, Instance(nodes(2)), jobs)
    cache = IndexCache()
    before = outcome(schedule(snap, 1.0, cache))
    assert check_submission(snap, pending("new", "/a", workers=2), cache) is None
    assert outcome(schedule(snap, 1.0, cache)) == before == _read_afresh(snap, 1.0, cache)


def test_a_bucket_of_other_jobs_is_sorted_afresh():
    kept, calls = SortedKept(), []

    def order(jobs):
        calls.append(list(jobs))
        jobs.sort(key=lambda j: j.submitted)

    a, b, c = (pending(n, "/a", submitted=s) for n, s in (("a", 3.0), ("b", 1.0), ("c", 2.0)))
    bucket = [a, b, c]
    kept.sort(bucket, order)
    assert bucket == [b, c, a] and len(calls) == 1
    kept.sort(bucket, order)  # sorted already this cycle
    kept.next_cycle()
    bucket[:] = [a, b, c]
    kept.sort(bucket, order)  # the same jobs in the same order: the kept order, no sort
    assert bucket == [b, c, a] and len(calls) == 1
    kept.next_cycle()
    bucket[:] = [a, c]
    kept.sort(bucket, order)
    assert bucket == [c, a] and len(calls) == 2


def test_buckets_left_in_another_order_are_read_in_intake_order_again():
    """A cycle leaves the buckets it sorted in the order inside a leaf; the next one that keeps
    intake's answer lists a bucket it does not sort in intake order, as a fresh one does: /b
    fills the node, /a's turn finds no room for the shape, /b's bucket (sorted by the cycle
    before) is passed over whole and /b, above its share, reclaims nothing."""
    plans = tree({"/a": (1, None), "/b": (1, None)})
    machines = nodes(1)
    full = [running(f"r{i}", "/b", (machines[0].name,) * 4) for i in range(2)]
    waiting = [pending(f"{p}{i}", f"/{p}", submitted=float(-i)) for p in "ab" for i in range(5)]
    snap = Snapshot(plans, Instance(machines), full + waiting)
    cache = IndexCache()
    schedule(snap, 1.0, cache)
    index = cache.checkout(plans, snap.instance)  # as a cycle that sorted every bucket
    for plan in index.plans.values():
        for bucket in plan.buckets.values():
            in_order(bucket, index.sorted)
    cache.give_back(index)
    assert outcome(schedule(snap, 1.0, cache)) == _read_afresh(snap, 1.0, cache)
