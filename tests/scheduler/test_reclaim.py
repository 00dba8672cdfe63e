"""Reclaim (docs/scheduling.md "Reclaim"): borrowers only, elastic shrink first, whole gangs, grace,
min_runtime, victims chosen to lose the least."""

from extension.scheduler import Preempt, Shrink, Start

from .builders import nodes, pending, run_cycle, running, starts, tree, waits

ONE_PLAN = {"/p": (1, None)}


def test_s4_elastic_victim_shrinks_to_its_deserved_share():
    jobs = [
        running("u1-job", "/p", ("n1",) * 4, user="user1", workers=(1, 4), started=0),
        pending("u2-job", "/p", user="user2", workers=(1, 4)),
    ]
    result = run_cycle(tree(ONE_PLAN), nodes(1, gpu=4), jobs, grace=30)
    (shrink,) = result.of(Shrink)
    assert (shrink.job_id, shrink.workers, shrink.release, shrink.grace) == (
        "u1-job",
        2,
        ("n1", "n1"),
        30,
    )
    assert "reclaimed by /p/user2 for job u2-job" in shrink.reason
    assert not result.of(Preempt)
    assert "reclaiming from u1-job" in waits(result)["u2-job"]


def test_s4_rigid_gang_over_its_deserved_share_waits_and_nothing_is_killed():
    jobs = [
        running("u1-job", "/p", ("n1",) * 4, user="user1", started=0),
        pending("u2-job", "/p", user="user2", workers=4),
    ]
    result = run_cycle(tree(ONE_PLAN), nodes(1, gpu=4), jobs)
    assert not result.of(Preempt) and not result.of(Shrink)


def test_whole_rigid_gangs_are_stopped_never_in_part():
    plans = tree({"/a": (1, None), "/b": (1, None)})
    jobs = [
        running("a-gang", "/a", ("n1",) * 4, started=0),
        pending("b-job", "/b", workers=2),
    ]
    result = run_cycle(plans, nodes(1, gpu=4), jobs, grace=10)
    (preempt,) = result.of(Preempt)
    assert (preempt.job_id, preempt.grace, preempt.for_job) == ("a-gang", 10, "b-job")
    assert not result.of(Shrink)


def test_elastic_jobs_shrink_before_any_rigid_gang_is_stopped():
    plans = tree({"/a": (1, None), "/b": (1, None)})
    jobs = [
        running("rigid", "/a", ("n1",) * 2, started=50),
        running("elastic", "/a", ("n1",) * 2, workers=(1, 2), started=0),
        pending("b-job", "/b"),
    ]
    result = run_cycle(plans, nodes(1, gpu=4), jobs)
    assert [(s.job_id, s.workers) for s in result.of(Shrink)] == [("elastic", 1)]
    assert not result.of(Preempt)


def test_victims_are_borrowers_only():
    plans = tree({"/a": (1, None), "/b": (1, None), "/c": (1, None)})
    # /a holds exactly its deserved 2 of 6 (demand 2); /b borrows 4 (deserved 2); /c reclaims 2
    jobs = [
        running("a-job", "/a", ("n1",) * 2, started=99),
        running("b-1", "/b", ("n1",) * 2, started=0),
        running("b-2", "/b", ("n1",) * 2, started=1),
        pending("c-job", "/c", workers=2),
    ]
    result = run_cycle(plans, nodes(1, gpu=6), jobs)
    assert [p.job_id for p in result.of(Preempt)] == ["b-2"]  # most recently started


def test_lower_priority_victims_go_first_then_the_most_recently_started():
    plans = tree({"/a": (1, None), "/b": (1, None)})
    jobs = [
        running("old-low", "/a", ("n1",), started=0, priority=-1),
        running("new-high", "/a", ("n1",), started=90, priority=5),
        running("new-low", "/a", ("n1",), started=80, priority=-1),
        running("mid", "/a", ("n1",), started=50),
        pending("b-job", "/b"),
    ]
    result = run_cycle(plans, nodes(1, gpu=4), jobs)
    assert [p.job_id for p in result.of(Preempt)] == ["new-low"]


def test_fewest_resources_that_cover_the_need():
    plans = tree({"/a": (1, None), "/b": (1, None)})
    jobs = [
        running("small", "/a", ("n1",), started=90),  # newest, but 1 GPU does not cover 2
        running("pair", "/a", ("n1",) * 2, started=10),
        running("big", "/a", ("n1",) * 5, started=5),
        pending("b-job", "/b", workers=2),
    ]
    result = run_cycle(plans, nodes(1), jobs)
    # greedy in order takes small then pair; pruning drops small, which is not needed
    assert [p.job_id for p in result.of(Preempt)] == ["pair"]


def test_young_jobs_are_not_victims_under_min_runtime():
    plans = tree({"/a": (1, None), "/b": (1, None)})
    jobs = [running("young", "/a", ("n1",) * 4, started=90), pending("b-job", "/b")]
    result = run_cycle(plans, nodes(1, gpu=4), jobs, now=100, min_runtime=60)
    assert not result.of(Preempt)
    result = run_cycle(plans, nodes(1, gpu=4), jobs, now=200, min_runtime=60)
    assert [p.job_id for p in result.of(Preempt)] == ["young"]


def test_non_preemptible_notebooks_are_never_victims():
    plans = tree({"/a": (1, None), "/b": (1, None)})
    jobs = [
        running("nb", "/a", ("n1",) * 4, preemptible=False),
        pending("b-job", "/b"),
    ]
    result = run_cycle(plans, nodes(1, gpu=4), jobs)
    assert not result.of(Preempt)


def test_no_preemption_when_the_victims_cannot_make_the_gang_fit():
    plans = tree({"/a": (1, None), "/b": (1, None)})
    # the borrower's GPUs are on n1, but the gang needs 4 on one node and n1 has 4 in all;
    # /b's own job holds 1 of n1... reclaiming /a frees only 3 there: never preempt for nothing
    jobs = [
        running("a-job", "/a", ("n1",) * 3, started=0),
        running("b-own", "/b", ("n1",), user="u2", started=0),
        pending("b-job", "/b", gpu=4),
    ]
    result = run_cycle(plans, nodes(1, gpu=4), jobs)
    assert not result.of(Preempt)


def test_reclaimer_takes_back_up_to_its_deserved_share_even_below_the_victims():
    # seed 000: the reclaimer does not care if the victim falls below its own deserved share,
    # but victims that stay at or above theirs are preferred.
    plans = tree({"/a": (1, None), "/b": (1, None)})
    jobs = [
        running("a-1", "/a", ("n1",) * 2, started=0),
        running("a-2", "/a", ("n1",) * 2, started=1),
        pending("b-job", "/b", workers=2),
    ]
    result = run_cycle(plans, nodes(1, gpu=4), jobs)
    assert [p.job_id for p in result.of(Preempt)] == ["a-2"]


def test_preempted_resources_in_grace_are_waited_for_not_preempted_twice():
    plans = tree({"/a": (1, None), "/b": (1, None)})
    jobs = [
        running("a-1", "/a", ("n1",) * 2, started=0),
        running("a-2", "/a", ("n1",) * 2, started=1, terminating=True),
        pending("b-job", "/b", workers=2),
    ]
    result = run_cycle(plans, nodes(1, gpu=4), jobs)
    assert not result.of(Preempt)
    assert "being released" in waits(result)["b-job"]


def test_a_user_never_reclaims_from_their_own_leaf():
    jobs = [
        running("mine", "/p", ("n1",) * 4, started=0),
        pending("also-mine", "/p"),
    ]
    result = run_cycle(tree(ONE_PLAN), nodes(1, gpu=4), jobs)
    assert not result.of(Preempt)


def test_reclaim_happens_at_the_level_where_the_borrowing_happened():
    plans = tree({"/x": (1, None), "/x/t1": (1, None), "/x/t2": (1, None), "/y": (1, None)})
    # 8 GPUs. /y holds its 2 (demand 2); /x deserves the other 6, held by /x/t2 (deserves 4).
    # /x/t1 asks for 2: within its own share (2) but /x would hold 8 > 6, so the reclaim stays
    # inside /x: /x/t2 (the borrower there) gives back, /y is not touched.
    jobs = [
        running("y-1", "/y", ("n1",) * 2, started=5),
        running("t2-a", "/x/t2", ("n1",) * 2, user="u2", started=0),
        running("t2-b", "/x/t2", ("n1",) * 2, user="u2", started=1),
        running("t2-c", "/x/t2", ("n1",) * 2, user="u2", started=2),
        pending("t1-1", "/x/t1", workers=2),
    ]
    result = run_cycle(plans, nodes(1), jobs)
    assert result.plans["/x"].deserved.gpu == 6
    assert [(p.job_id, p.for_job) for p in result.of(Preempt)] == [("t2-c", "t1-1")]
    assert not starts(result)
    assert not [d for d in result.decisions if isinstance(d, Start)]


def test_released_capacity_claimed_by_one_reclaimer_is_not_promised_to_the_next():
    # c-1 is on its way out (2 GPUs of n1): a-job, first in the fair order, claims them; b-job
    # is owed its share too and must get it from a victim, not from the same released GPUs
    plans = tree({"/a": (1, None), "/b": (1, None), "/c": (1, None)})
    jobs = [
        running("c-1", "/c", ("n1",) * 2, started=0, terminating=True),
        running("c-2", "/c", ("n1",) * 2, started=2),
        running("c-3", "/c", ("n2",) * 4, started=1),
        pending("a-job", "/a", workers=2),
        pending("b-job", "/b", workers=2),
    ]
    result = run_cycle(plans, nodes(2, gpu=4), jobs)
    assert "being released" in waits(result)["a-job"]
    assert [(p.job_id, p.for_job) for p in result.of(Preempt)] == [("c-2", "b-job")]
    assert "reclaiming from c-2" in waits(result)["b-job"]
