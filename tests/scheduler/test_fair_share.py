"""Fair over days (docs/scheduling.md "Deserved share 2: usage history", "Admission 6: no
starved gang"): stories as tables, each checked against the documented formula."""

from __future__ import annotations

import math

import pytest

from extension.scheduler import (
    Instance,
    JobState,
    Preempt,
    SchedulerConfig,
    Snapshot,
    Start,
    schedule,
)
from extension.scheduler.history import UsageHistory, UsageWeights, factor, tree_standings
from extension.scheduler.index import IndexCache

from .builders import nodes, pending, tree

DAY = 86400.0
WEEK = 7 * DAY


# -- the history: decay, charge, reset ------------------------------------------------------
@pytest.mark.parametrize(
    ("held_gpus", "for_s", "then_idle_s", "half_life", "expected"),
    [
        # charged for 1 s at 8 GPUs: 8 GPU-s (the decay within one second is ~1e-5 of it)
        (8, 1, 0, WEEK, 8.0),
        # the same, a half-life later: half of it
        (8, 1, WEEK, WEEK, 4.0),
        # two half-lives: a quarter
        (8, 1, 2 * WEEK, WEEK, 2.0),
        # held for a whole half-life: the integral h / ln 2 * (1 - 1/2) per GPU
        (1, DAY, 0, DAY, DAY / math.log(2) / 2),
    ],
)
def test_usage_decays_by_half_every_half_life(held_gpus, for_s, then_idle_s, half_life, expected):
    history = UsageHistory(half_life)
    history.advance(0.0, [])
    history.advance(for_s, [("/a/u", (held_gpus, 0, 0))])
    history.advance(for_s + then_idle_s, [])
    assert history.usage["/a/u"] == pytest.approx(expected, rel=1e-4)


def test_the_reset_period_clears_the_usage_at_its_boundary():
    history = UsageHistory(WEEK, reset_period=DAY)
    history.advance(DAY - 100, [])
    history.advance(DAY - 10, [("/a/u", (2, 0, 0))])  # 90 s at 2 GPUs, before the boundary
    assert history.usage["/a/u"] == pytest.approx(180, rel=1e-4)
    history.advance(DAY + 10, [("/a/u", (2, 0, 0))])  # crosses midnight: only the 10 s after
    assert history.usage["/a/u"] == pytest.approx(20, rel=1e-4)


def test_weights_count_other_resources_and_refuse_nonsense():
    weights = UsageWeights(gpu=1, cpu=0.5, memory=0.25)
    assert weights.rate((2, 4000, 8 * 2**30)) == pytest.approx(2 + 2 + 2)
    for bad in (
        {"gpu": -1},
        {"gpu": float("nan")},
        {"gpu": 0, "cpu": 0, "memory": 0},
    ):
        with pytest.raises(ValueError, match="weight"):
            UsageWeights(**bad)
    with pytest.raises(ValueError, match="half-life"):
        UsageHistory(0)


def test_history_is_kept_and_taken_back_whole():
    history = UsageHistory(DAY)
    history.advance(0, [])
    history.advance(3600, [("/a/u", (1, 0, 0)), ("/b/v", (3, 0, 0))])
    again = UsageHistory(DAY)
    again.load(history.to_json())
    assert again.usage == history.usage and again.at == history.at


# -- the factor and the deserved share -------------------------------------------------------
@pytest.mark.parametrize(
    ("usage_a", "usage_b", "factor_a", "factor_b"),
    [
        (0, 0, 1.0, 1.0),  # no usage: today's shares
        (100, 100, 0.5, 0.5),  # each used exactly its part: same relative weights
        (100, 0, 0.25, 1.0),  # a used it all: U/S = 2
        (300, 100, 2**-1.5, 2**-0.5),
    ],
)
def test_the_factor_is_slurms_two_to_the_minus_usage_over_share(
    usage_a, usage_b, factor_a, factor_b
):
    plans = tree({"/a": (1, None), "/b": (1, None)})
    usage = {"/a/u": usage_a, "/b/u": usage_b}
    got = tree_standings(_vertices(plans), {k: v for k, v in usage.items() if v})
    assert got["/a"].factor == pytest.approx(factor_a)
    assert got["/b"].factor == pytest.approx(factor_b)
    assert factor(1e9, 0.5) > 0  # never 0: the weight stays positive


@pytest.mark.parametrize(
    ("usage_a", "deserved_a", "deserved_b"),
    [
        # both contend for 8 GPUs at shares 1:1. No history: 4 and 4
        (0.0, 4.0, 4.0),
        # a held the cluster alone yesterday: U_a = 1, S = 1/2, F_a = 1/4, F_b = 1; weights
        # F ** 3 (PAYBACK), 1/64 : 1 of 8 GPUs
        (8 * DAY, 8 * (1 / 64) / (65 / 64), 8 * 1 / (65 / 64)),
    ],
)
def test_a_team_that_used_the_cluster_alone_yesterday_deserves_less_today(
    usage_a, deserved_a, deserved_b
):
    plans = tree({"/a": (1, None), "/b": (1, None)})
    jobs = [pending(f"a{i}", "/a") for i in range(8)] + [
        pending(f"b{i}", "/b", user="u2") for i in range(8)
    ]
    config = SchedulerConfig(fair_share_half_life=WEEK)
    usage = {"/a/u1": usage_a} if usage_a else {}
    result = schedule(Snapshot(plans, Instance(nodes(1)), jobs, config, usage=usage), 0.0)
    assert result.plans["/a"].deserved.gpu == pytest.approx(deserved_a)
    assert result.plans["/b"].deserved.gpu == pytest.approx(deserved_b)
    started = {d.job_id[0] for d in result.of(Start)}
    if usage_a:  # b starts first: it owes nothing
        assert sum(d.job_id.startswith("b") for d in result.of(Start)) >= 7
        assert (
            "a used 2.0x its share over the last 7d, so it borrows after b"
            in (result.waiting["a7"])
        )
    else:
        assert started == {"a", "b"}


def test_history_off_ignores_usage_entirely():
    """Half-life 0: the usage in the snapshot changes nothing (the default is today's)."""
    plans = tree({"/a": (2, None), "/b": (1, None)})
    jobs = [pending(f"a{i}", "/a", gpu=2) for i in range(5)] + [
        pending(f"b{i}", "/b", user="u2") for i in range(9)
    ]
    off = SchedulerConfig(fair_share_half_life=0.0)
    plain = schedule(Snapshot(plans, Instance(nodes(2)), jobs, off), 5.0, IndexCache())
    told = schedule(
        Snapshot(plans, Instance(nodes(2)), jobs, off, usage={"/a/u1": 1e9}), 5.0, IndexCache()
    )
    assert told.decisions == plain.decisions and told.waiting == plain.waiting


# -- Admission 6: no starved gang ------------------------------------------------------------
def _drive(max_gang_wait: float, min_runtime: float, until: float = 400.0) -> dict:
    """One node of 4 GPUs, /a and /b at 1:1. /a's user submits one 4-GPU gang at t=5 (its
    share is 2: it can never reclaim); /b's user keeps a 1-GPU job arriving every 2 s, each
    running 10 s. Cycles every second; returns the gang's first start and its end, and the
    jobs preempted."""
    plans = tree({"/a": (1, None), "/b": (1, None)})
    inst = Instance(nodes(1, gpu=4))
    config = SchedulerConfig(grace=0, min_runtime=min_runtime, max_gang_wait=max_gang_wait)
    gang = pending("gang", "/a", workers=4, submitted=5.0)
    jobs = {}
    ends: dict[str, float] = {}
    cache, reserved, preempted, started, finished = IndexCache(), None, [], None, None
    t = 0.0
    while t <= until:
        if t == gang.submitted:
            jobs["gang"] = gang
        if int(t) % 2 == 0:
            jid = f"b{int(t)}"
            jobs[jid] = pending(jid, "/b", user="v", submitted=t)
        for jid, end in list(ends.items()):
            if end <= t:
                jobs[jid].state, jobs[jid].placement = JobState.FINISHED, ()
                del ends[jid]
                finished = t if jid == "gang" else finished
        live = [j for j in jobs.values() if not j.state.final]
        result = schedule(Snapshot(plans, inst, live, config, reserved), t, cache)
        reserved = result.reserved
        for d in result.decisions:
            job = jobs[d.job_id]
            if isinstance(d, Start):
                job.state, job.placement, job.started = JobState.RUNNING, d.placement, t
                job.aged = d.job_id == result.aged
                ends[d.job_id] = t + (60.0 if job is gang else 10.0)
                started = t if job is gang and started is None else started
            elif isinstance(d, Preempt):
                preempted.append(d.job_id)
                job.state, job.placement, job.started = JobState.PENDING, (), None
                ends.pop(d.job_id, None)
        t += 1.0
    return {"started": started, "preempted": preempted, "finished": finished}


@pytest.mark.parametrize(
    ("max_gang_wait", "min_runtime", "preemptions"),
    [
        # min_runtime 0: nothing shields a borrowing start, so the gang never started before
        # the rule; it goes first max_gang_wait after its submission, what runs drains (10 s
        # jobs) and it runs its 60 s to the end
        (60.0, 0.0, 0),
        (120.0, 0.0, 0),
        # min_runtime 30: it started at once and was stopped every 30 s before the rule; now
        # it is stopped until max_gang_wait has passed since its submission (twice), then
        # starts first as starved and is no victim
        (60.0, 30.0, 2),
    ],
)
def test_a_gang_bigger_than_its_share_starts_within_the_bound_and_ends(
    max_gang_wait, min_runtime, preemptions
):
    got = _drive(max_gang_wait, min_runtime)
    bound = 5 + max_gang_wait + 10 + 1  # submitted, the wait, the drain, one cycle
    assert got["started"] is not None and got["started"] <= bound
    assert got["preempted"].count("gang") == preemptions
    # a run under way when the bound passes may still be stopped once at its min_runtime
    assert got["finished"] is not None and got["finished"] <= bound + min_runtime + 60


def test_without_the_rule_the_same_gang_starves_or_is_stopped():
    """The story the rule is for: with max_gang_wait 0 the gang never runs to its end."""
    for min_runtime in (0.0, 30.0):
        got = _drive(0.0, min_runtime)
        assert got["finished"] is None


def _vertices(plans):
    from extension.scheduler.index import PlanIndex

    index = PlanIndex(plans, None, Instance(nodes(1)))
    return index.bottom_up()
