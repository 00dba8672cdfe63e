"""Fair without churn (issue 18; docs/scheduling.md "Admission 4", "Reclaim 3", "Reclaim 4",
"Reclaim 6"): the cases the real service showed, each one a world in which the core before
this change preempted and now does not, or chose the victim that lost more work."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from extension.scheduler import (
    Job,
    JobState,
    PlanFigures,
    Preempt,
    Resources,
    held_work,
    lost_work,
    within_one_gang,
)

from .builders import nodes, pending, run_cycle, running, starts, tree, waits

TWO_PLANS = {"/a": (1, None), "/b": (1, None)}


def test_a_carried_one_gpu_holder_that_would_borrow_waits_its_turn_in_the_fair_order():
    # 4 GPUs, /a and /b deserve 2 each. /a holds its 2 and its one-GPU job a3 held the
    # reservation last cycle; one GPU is free and /b (1 of 2) has a job waiting. Trying a3
    # first would make /a a borrower that /b then reclaims from: two preemptions' worth of
    # churn where starting b2 was enough (the cascade the issue measured).
    jobs = [
        running("a1", "/a", ("n1",), started=0),
        running("a2", "/a", ("n1",), started=0),
        running("b1", "/b", ("n1",), user="u2", started=0),
        pending("a3", "/a", submitted=1),
        pending("b2", "/b", user="u2", submitted=2),
    ]
    result = run_cycle(tree(TWO_PLANS), nodes(1, gpu=4), jobs, reserved="a3")
    assert starts(result) == {"b2": ("n1",)}
    assert not result.of(Preempt)


def test_a_carried_holder_within_its_share_still_goes_first():
    # the same, but /b's job is the holder: it would stay within its share, so it goes first
    # (the reservation's reason to be: what was freed since it blocked goes to it)
    jobs = [
        running("a1", "/a", ("n1",), started=0),
        running("b1", "/b", ("n1",), user="u2", started=0),
        running("b0", "/b", ("n1",), user="u2", started=0),
        pending("a2", "/a", submitted=1),
        pending("b2", "/b", user="u2", gpu=1, submitted=0),
    ]
    result = run_cycle(tree(TWO_PLANS), nodes(1, gpu=4), jobs, reserved="a2")
    assert starts(result) == {"a2": ("n1",)}


def carried_out(jobs: list[Job], result, now: float) -> list[Job]:
    """The jobs after ``result``'s starts ran at ``now`` (what the caller's next snapshot
    shows)."""
    started = starts(result)
    return [
        replace(j, state=JobState.RUNNING, placement=started[j.id], started=now)
        if j.id in started
        else j
        for j in jobs
    ]


def test_a_gang_that_would_borrow_does_not_take_the_freed_node_from_a_job_within_its_share():
    # Found on the real service: one plan on one node of 4 GPUs; user9 holds all 4 with a
    # job that cannot be preempted; user1 asks for 2, user2 for a 4-GPU gang, which gets the
    # reservation (it is larger than the smallest pending gang). When user9's job ends, the
    # core before this change started the gang first (the carried holder went before the fair
    # order) though user2's leaf then held 4 where it deserves 2, and the very next cycle
    # user1 (deserved 2, holding 0) reclaimed it: a start and a preemption where starting
    # user1's job and leaving the gang to wait for the reservation preempted nothing.
    plans = tree({"/sample-project": (1, None), "/sample-project/training": (1, None)})
    plan, four = "/sample-project/training", nodes(1, gpu=4)
    big = running("big", plan, ("n1",) * 4, user="user9", started=0, preemptible=False)
    w = pending("w", plan, user="user1", workers=2, submitted=1)
    a = pending("a", plan, user="user2", workers=4, submitted=2)
    first = run_cycle(plans, four, [big, w, a], now=5.0, grace=0.0)
    assert first.reserved == "a" and not starts(first)
    freed = run_cycle(plans, four, [w, a], now=600.0, reserved="a", grace=0.0)
    assert starts(freed) == {"w": ("n1", "n1")}
    assert freed.reserved == "a"  # the gang holds the 2 left and waits for the other 2
    jobs = carried_out([w, a], freed, 600.0)
    after = run_cycle(plans, four, jobs, now=601.0, reserved=freed.reserved, grace=0.0)
    assert not after.of(Preempt) and not starts(after)


@dataclass
class Holder:
    """A world in which ``reserved`` was carried from the cycle before (Admission 4)."""

    plans: dict
    nodes: tuple
    jobs: list
    reserved: str  # "": none
    starts: set  # the jobs the cycle starts
    reserved_after: str | None  # the holder it carries to the next cycle
    next_at: float  # when the next cycle runs: it preempts none of the jobs started
    config: dict = field(default_factory=dict)  # min_runtime, grace


ONE_PLAN = {"/p": (1, None)}
RIVALS = [  # /p's users deserve 2 GPUs each of 4; "gang" was the holder
    pending("rival", "/p", user="u1", workers=2, submitted=1),
    pending("gang", "/p", user="u2", workers=4, submitted=2),
]
NOW = 100.0
HOLDERS = {
    # Admission 4, holder re-validated: with min_runtime 0 the next cycle's reclaim would stop
    # the gang for "rival" (within its share, at a level where the gang's leaf borrows)
    "a-gang-that-would-borrow-waits-when-the-next-cycle-would-reclaim-it": Holder(
        ONE_PLAN, nodes(1, gpu=4), RIVALS, "gang", {"rival"}, "gang", NOW + 1
    ),
    # min_runtime protects the young gang: it goes first at a tie, as the reservation
    # promises a big gang (tests/scenarios/reservation_stream.yaml), and no cycle within
    # min_runtime stops it
    "with-min-runtime-the-gang-still-goes-first-at-a-tie": Holder(
        ONE_PLAN,
        nodes(1, gpu=4),
        RIVALS,
        "gang",
        {"gang"},
        "rival",
        NOW + 59,
        {"min_runtime": 60},
    ),
    # nothing would reclaim it: "rival" asks for 3, more than its deserved 2
    "a-gang-whose-rival-would-borrow-too-goes-first": Holder(
        ONE_PLAN,
        nodes(1, gpu=4),
        [pending("rival", "/p", user="u1", workers=3, submitted=1), RIVALS[1]],
        "gang",
        {"gang"},
        "rival",
        NOW + 1,
    ),
    # nothing may reclaim it: it is not preemptible
    "a-gang-that-cannot-be-preempted-goes-first": Holder(
        ONE_PLAN,
        nodes(1, gpu=4),
        [RIVALS[0], pending("gang", "/p", user="u2", workers=4, preemptible=False)],
        "gang",
        {"gang"},
        "rival",
        NOW + 1,
    ),
    # /a holds its 4 (ratio 1), /b none (ratio 0): the fair order serves /b first, so the
    # freed GPUs are not the holder's to take, min_runtime or not. Before this change the
    # gang went first and /b reclaimed it as soon as min_runtime was over.
    "a-gang-that-would-borrow-never-goes-before-a-plan-lower-in-the-fair-order": Holder(
        {"/a": (1, None), "/b": (1, None)},
        nodes(1, gpu=8),
        [
            running("a-old", "/a", ("n1",) * 4, started=0),
            pending("gang", "/a", workers=4, submitted=0),
            pending("b1", "/b", user="u2", submitted=1),
            pending("b2", "/b", user="u2", submitted=2),
        ],
        "gang",
        {"b1", "b2"},
        "gang",
        NOW + 61,
        {"min_runtime": 60},
    ),
}


@pytest.mark.parametrize("case", list(HOLDERS.values()), ids=list(HOLDERS))
def test_the_carried_holder_goes_first_only_when_no_reclaim_would_undo_it(case: Holder):
    plans = tree(case.plans)
    first = run_cycle(plans, case.nodes, case.jobs, now=NOW, reserved=case.reserved, **case.config)
    assert set(starts(first)) == case.starts
    assert first.reserved == case.reserved_after
    jobs = carried_out(case.jobs, first, NOW)
    later = run_cycle(
        plans, case.nodes, jobs, now=case.next_at, reserved=first.reserved, **case.config
    )
    assert not [p.job_id for p in later.of(Preempt) if p.job_id in case.starts]


TWO_ON_8 = [  # /a and /b deserve 4 each of 8; /a (1 of 4) is first in the fair order
    running("a1", "/a", ("n1",), started=0),
    running("b1", "/b", ("n1",) * 3, user="u2", started=0),
    pending("gang", "/a", workers=4, submitted=0),
    pending("b2", "/b", user="u2", submitted=1),
]
ROUNDS = {
    # Admission 1, within-share starts first (min_runtime 0): /a's gang would take /a to 5 of
    # its 4; before this change it took the 4 free GPUs first and the next cycle /b's b2
    # (within its share, no room) reclaimed it. Now b2 starts in the first round and the gang,
    # tried in the second, holds the reservation with the 3 left
    "a-start-that-would-borrow-waits-for-the-jobs-within-their-share": Holder(
        TWO_PLANS, nodes(1, gpu=8), TWO_ON_8, "", {"b2"}, "gang", NOW + 1
    ),
    # min_runtime shields the young borrower: one walk in fair order, as before
    "with-min-runtime-the-fair-order-stands": Holder(
        TWO_PLANS,
        nodes(1, gpu=8),
        TWO_ON_8,
        "",
        {"gang"},
        "b2",
        NOW + 59,
        {"min_runtime": 60},
    ),
    # a borrower that finds no room still holds the reservation when nothing within its
    # share is blocked (the 8-GPU gang of tests/scenarios/reservation_stream.yaml)
    "a-borrower-without-room-still-holds-the-reservation": Holder(
        TWO_PLANS,
        nodes(1, gpu=8),
        [
            running("b1", "/b", ("n1",) * 2, user="u2", started=0),
            pending("big", "/a", gpu=8, submitted=0),
        ],
        "",
        set(),
        "big",
        NOW + 1,
    ),
}


@pytest.mark.parametrize("case", list(ROUNDS.values()), ids=list(ROUNDS))
def test_with_min_runtime_0_jobs_within_their_share_start_before_borrowers(case: Holder):
    plans = tree(case.plans)
    first = run_cycle(plans, case.nodes, case.jobs, now=NOW, **case.config)
    assert set(starts(first)) == case.starts
    assert first.reserved == case.reserved_after
    jobs = carried_out(case.jobs, first, NOW)
    later = run_cycle(
        plans, case.nodes, jobs, now=case.next_at, reserved=first.reserved, **case.config
    )
    assert not [p.job_id for p in later.of(Preempt) if p.job_id in case.starts]


def test_a_start_that_would_make_its_plan_lose_a_job_in_the_same_cycle_is_held_back():
    # 8 GPUs on 2 nodes of 4; /dev and /sup deserve 4 each. /sup borrows (5: sup-a 2 on n1,
    # sup-b 2 and sup-c 1 on n2), /dev holds 1 on n1. /dev's 3-GPU worker needs a node with
    # 3 free: reclaiming sup-a makes room on n1. /sup's new 1-GPU job fits in n2's free GPU.
    # The core before this change started sup-new on n2 and preempted sup-b and sup-c there
    # in the same cycle; now /sup, which gives a job back in this cycle, starts nothing in it,
    # and one 2-GPU victim makes room.
    plans = tree({"/dev": (1, None), "/sup": (1, None)})
    jobs = [
        running("sup-a", "/sup", ("n1",), user="u2", gpu=2, started=0),
        running("sup-b", "/sup", ("n2",), user="u2", gpu=2, started=0),
        running("sup-c", "/sup", ("n2",), user="u2", started=0),
        running("dev-1", "/dev", ("n1",), user="u1", started=0),
        pending("dev-gang", "/dev", user="u1", gpu=3, submitted=1),
        pending("sup-new", "/sup", user="u2", submitted=2),
    ]
    result = run_cycle(plans, nodes(2, gpu=4), jobs, now=500.0)
    (preempt,) = result.of(Preempt)
    assert preempt.job_id in ("sup-a", "sup-b") and preempt.for_job == "dev-gang"
    assert starts(result) == {}
    assert "/sup gives resources back" in waits(result)["sup-new"]


def test_a_plan_held_back_for_nothing_starts_and_its_jobs_are_spared_in_that_cycle():
    # 8 GPUs, /dev and /sup deserve 4 each. /sup (2 of 4) goes first in the fair order and
    # its new 3-GPU job takes the 3 free GPUs, making /sup a borrower; /dev's job (3 of 4,
    # within its share) would then reclaim /sup's old job: a start and a kill of one plan in
    # one cycle (what the core did before this change). Held back, /sup would give nothing
    # back (it would not borrow), so the start stands and /sup's jobs are spared this cycle.
    plans = tree({"/dev": (1, None), "/sup": (1, None)})
    jobs = [
        *[running(f"d{i}", "/dev", ("n1",), user="u1", started=0) for i in range(3)],
        running("sup-old", "/sup", ("n1",) * 2, user="u2", started=0),
        pending("sup-new", "/sup", user="u2", gpu=3, submitted=1),
        pending("dev-job", "/dev", user="u1", submitted=2),
    ]
    result = run_cycle(plans, nodes(1), jobs, now=500.0, min_runtime=60)
    assert starts(result) == {"sup-new": ("n1",)}
    assert not result.of(Preempt)


def test_the_victim_that_loses_the_least_work_since_its_checkpoint_goes_first():
    # /a holds 3 of 4 and deserves 2 (/b asks for 2). "recent" started last (the old rule's
    # victim) but has not checkpointed: it would lose 60 GPU-s; "old" checkpointed 5 s ago.
    jobs = [
        running("old", "/a", ("n1",), started=0, checkpointed=95.0),
        running("recent", "/a", ("n1",), started=40),
        running("a3", "/a", ("n1",), started=0, checkpointed=50.0),
        pending("b-job", "/b", user="u2"),
        pending("b-two", "/b", user="u2", submitted=1),
    ]
    result = run_cycle(tree(TWO_PLANS), nodes(1, gpu=4), jobs, now=100.0)
    assert [p.job_id for p in result.of(Preempt)] == ["old"]


def test_min_runtime_never_pushes_the_choice_onto_a_job_that_would_lose_more():
    # /a borrows: "young" started 10 s ago (under min_runtime 60) and would lose 10 GPU-s;
    # "old" has run 300 s without a checkpoint. Taking "old" now would lose 300 GPU-s to spare
    # "young"; instead nothing is preempted until "young" is past min_runtime, and then it
    # is the victim (it loses 60).
    jobs = [
        running("old", "/a", ("n1",), started=0),
        running("young", "/a", ("n1",), started=290),
        running("a3", "/a", ("n1",), started=0, checkpointed=299.0),
        pending("b-job", "/b", user="u2"),
        pending("b-two", "/b", user="u2", submitted=1),
    ]
    now = run_cycle(tree(TWO_PLANS), nodes(1, gpu=4), jobs, now=300.0, min_runtime=60)
    assert [p.job_id for p in now.of(Preempt)] == ["a3"]  # 1 GPU-s lost: below young's 10
    jobs[2] = running("a3", "/a", ("n1",), started=0)
    held = run_cycle(tree(TWO_PLANS), nodes(1, gpu=4), jobs, now=300.0, min_runtime=60)
    assert not held.of(Preempt)
    assert "b-two" in waits(held)  # b-job took the free GPU; b-two is owed the next one
    later = run_cycle(tree(TWO_PLANS), nodes(1, gpu=4), jobs, now=350.0, min_runtime=60)
    assert [p.job_id for p in later.of(Preempt)] == ["young"]


def test_lost_and_held_work_are_gpu_seconds_since_the_checkpoint_and_the_start():
    gang = running("g", "/a", ("n1",) * 4, gpu=2, started=100.0)
    assert held_work(gang, 160.0) == 480.0 and lost_work(gang, 160.0) == 480.0
    gang.checkpointed = 150.0
    assert lost_work(gang, 160.0) == 80.0
    gang.checkpointed = 50.0  # before this start: it resumed from it, the run is at risk
    assert lost_work(gang, 160.0) == 480.0
    assert lost_work(pending("p", "/a"), 160.0) == 0.0


def _figures(path: str, held: float, owed: float, demand: float = 1.0) -> PlanFigures:
    r = Resources
    return PlanFigures(path, 1.0, r(), r(owed, 0, 0), r(held, 0, 0), r(demand, 0, 0), 0, 0)


def test_the_steady_state_is_every_plan_within_less_than_one_gang_of_its_share():
    plans = {"/": _figures("/", 9, 8), "/a": _figures("/a", 5, 4), "/b": _figures("/b", 3, 4)}
    assert not within_one_gang(plans, Resources(1, 0, 0))  # /b is owed a whole 1-GPU gang
    assert within_one_gang(plans, Resources(2, 0, 0))
    plans["/c"] = _figures("/c", 0, 4, demand=0)  # no demand: not counted
    assert within_one_gang(plans, Resources(2, 0, 0))


def test_a_reclaimer_whose_leaf_had_no_demand_before_is_never_steady_state():
    plans = {"/": _figures("/", 8, 8), "/a": _figures("/a", 4, 4), "/a/u": _figures("/a/u", 4, 4)}
    plans["/b"] = _figures("/b", 4, 4)
    plans["/b/v"] = _figures("/b/v", 4, 4)
    assert within_one_gang(plans, Resources(1, 0, 0), "/b/v")  # settled, and /b/v asked before
    assert not within_one_gang(plans, Resources(1, 0, 0), "/c/new")  # new demand: a reclaim
    plans["/c/idle"] = _figures("/c/idle", 0, 0, demand=0)
    assert not within_one_gang(plans, Resources(1, 0, 0), "/c/idle")
