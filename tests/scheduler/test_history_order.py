"""Usage history orders admission and borrowing, reclaim keeps the share-only rule (issue 41;
docs/scheduling.md "Deserved share 2: usage history"), over random cases (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from extension.scheduler import Instance, Preempt, SchedulerConfig, Snapshot, Start, schedule
from extension.scheduler.index import IndexCache

from .builders import nodes, pending, running, tree

WEEK = 7 * 86400.0
TEAMS = ("/a", "/b", "/c")


@settings(max_examples=60, deadline=None)
@given(
    share=st.integers(1, 3),
    held=st.integers(0, 3),
    used=st.floats(1.0, 1e7),
    user_of_a=st.booleans(),
    min_runtime=st.sampled_from([0.0, 600.0]),
)
def test_a_plan_with_no_usage_never_waits_behind_one_with_usage_for_a_borrowable_gpu(
    share: int, held: int, used: float, user_of_a: bool, min_runtime: float
) -> None:
    """Two siblings at the same share holding the same GPUs, one free GPU, a 1-GPU job
    pending in each: the one that used nothing starts, whichever path it has."""
    plans = tree({"/a": (share, None), "/b": (share, None)})
    jobs = [running(f"a{i}", "/a", ("n1",), user="ua") for i in range(held)]
    jobs += [running(f"b{i}", "/b", ("n1",), user="ub") for i in range(held)]
    jobs += [pending("a-next", "/a", user="ua"), pending("b-next", "/b", user="ub")]
    usage = {"/a/ua": used} if user_of_a else {"/b/ub": used}
    config = SchedulerConfig(fair_share_half_life=WEEK, min_runtime=min_runtime)
    snapshot = Snapshot(plans, Instance(nodes(1, gpu=2 * held + 1)), jobs, config, usage=usage)
    started = {d.job_id for d in schedule(snapshot, 1000.0, IndexCache()).of(Start)}
    assert started == ({"b-next"} if user_of_a else {"a-next"})


@st.composite
def contended(draw: st.DrawFn) -> tuple:
    """Three teams on 2 nodes of 4 GPUs: each runs some 1- or 2-GPU jobs (long enough past
    min_runtime to be victims) and has some pending; random usage per team."""
    jobs, free = [], {"n1": 4, "n2": 4}
    for team in TEAMS:
        user = f"u{team[1:]}"
        for i in range(draw(st.integers(0, 3))):
            gpu = draw(st.sampled_from([1, 2]))
            node = next((n for n, f in free.items() if f >= gpu), None)
            if node is None:
                break
            free[node] -= gpu
            jobs.append(running(f"{team[1:]}r{i}", team, (node,), user=user, gpu=gpu))
        for i in range(draw(st.integers(0, 3))):
            gpu = draw(st.sampled_from([1, 2, 4]))
            jobs.append(pending(f"{team[1:]}p{i}", team, user=user, gpu=gpu, submitted=i))
    usage = {
        f"{team}/u{team[1:]}": draw(st.floats(0.0, 1e6)) for team in TEAMS if draw(st.booleans())
    }
    return jobs, {k: v for k, v in usage.items() if v > 0}


def _snapshot(jobs: list, usage: dict, half_life: float) -> Snapshot:
    plans = tree({team: (1 + i, None) for i, team in enumerate(TEAMS)})
    config = SchedulerConfig(fair_share_half_life=half_life, min_runtime=0.0)
    return Snapshot(plans, Instance(nodes(2, gpu=4)), jobs, config, usage=usage)


@settings(max_examples=80, deadline=None)
@given(case=contended())
def test_history_preempts_only_from_a_team_above_its_share_only_deserved_share(case) -> None:
    """Every victim with history on is a job of a team holding more than the share-only rule
    gives it (the deserved shares of the same cycle with history off): history moves the
    order, never the line reclaim acts on."""
    jobs, usage = case
    off = schedule(_snapshot(jobs, usage, 0.0), 1000.0, IndexCache())
    on = schedule(_snapshot(jobs, usage, WEEK), 1000.0, IndexCache())
    plan_of = {j.id: j.plan for j in jobs}
    held = {
        team: sum(
            j.per_worker[0] * j.workers for j in jobs if j.plan == team and j.started is not None
        )
        for team in TEAMS
    }
    for victim in on.of(Preempt):
        team = plan_of[victim.job_id]
        assert held[team] > off.plans[team].deserved.gpu + 1e-9


@settings(max_examples=40, deadline=None)
@given(case=contended())
def test_the_order_is_deterministic(case) -> None:
    """The same snapshot decides the same, on a fresh index and on a kept one."""
    jobs, usage = case
    snapshot = _snapshot(jobs, usage, WEEK)
    kept = IndexCache()
    first = schedule(snapshot, 1000.0, IndexCache())
    again = [schedule(snapshot, 1000.0, kept) for _ in range(2)]
    for other in again:
        assert other.decisions == first.decisions
        assert other.waiting == first.waiting


@settings(max_examples=40, deadline=None)
@given(case=contended())
def test_history_off_reads_no_usage(case) -> None:
    """Half-life 0: the usage in the snapshot changes nothing (today's rule, byte for byte)."""
    jobs, usage = case
    bare = schedule(_snapshot(jobs, {}, 0.0), 1000.0, IndexCache())
    given_usage = schedule(_snapshot(jobs, usage, 0.0), 1000.0, IndexCache())
    assert given_usage.decisions == bare.decisions
    assert given_usage.waiting == bare.waiting
    assert given_usage.plans == bare.plans
