"""Admission (docs/scheduling.md "Admission 1" to "Admission 5"): fair order, gangs, limits,
rejection, reservation, elastic growth."""

import pytest

from extension.scheduler import Grow, Reject, Resources, Start, Wait
from extension.scheduler.resources import UNLIMITED

from .builders import gpus, nodes, pending, run_cycle, running, starts, tree, waits

TEAMS = {"/p": (1, None), "/p/dev": (4, 4), "/p/qa": (2, 2), "/p/support": (2, 2)}


def test_s1_settles_at_4_2_2_in_one_cycle():
    jobs = [pending(f"{t}{i}", f"/p/{t}") for t in ("dev", "qa", "support") for i in range(8)]
    result = run_cycle(tree(TEAMS), nodes(1), jobs)
    held = {p: result.plans[p].allocated.gpu for p in ("/p/dev", "/p/qa", "/p/support")}
    assert held == {"/p/dev": 4, "/p/qa": 2, "/p/support": 2}


def test_fair_order_takes_the_lowest_dominant_ratio_first():
    plans = tree({"/a": (1, None), "/b": (1, None)})
    # /a already holds 3 of the 4 GPUs; /b holds none: /b's job goes first and takes the last
    jobs = [
        running("ra", "/a", ("n1", "n1", "n1")),
        pending("a1", "/a", submitted=0),
        pending("b1", "/b", submitted=5),
    ]
    result = run_cycle(plans, nodes(1, gpu=4), jobs)
    assert starts(result) == {"b1": ("n1",)}
    assert "a1" in waits(result)


def test_tie_break_is_the_plan_path_then_inside_a_leaf_priority_then_time_then_id():
    plans = tree({"/a": (1, None), "/b": (1, None)})
    jobs = [
        pending("b-first", "/b", submitted=0),
        pending("a-late", "/a", submitted=9),
        pending("a-early", "/a", submitted=1),
        pending("a-urgent", "/a", submitted=10, priority=5),
    ]
    result = run_cycle(plans, nodes(1, gpu=2), jobs)
    # equal ratios: /a before /b by path; in /a/u1, priority first; then /b (ratio 0 < 0.x)
    assert list(starts(result)) == ["a-urgent", "b-first"]


def test_a_gang_starts_whole_or_not_at_all():
    plans = tree({"/p": (1, None)})
    jobs = [running("r", "/p", ("n1",) * 6), pending("gang", "/p", workers=4)]
    result = run_cycle(plans, nodes(1), jobs)
    assert starts(result) == {}
    assert "room now for 2" in waits(result)["gang"]


def test_a_gang_of_two_8_gpu_workers_needs_two_free_nodes_not_16_scattered_gpus():
    plans = tree({"/p": (1, None)})
    busy = [running(f"r{i}", "/p", (f"n{i + 1}",) * 4) for i in range(4)]
    big = pending("big", "/p", workers=2, gpu=8)
    result = run_cycle(plans, nodes(4), [*busy, big])  # 16 GPUs free, 4 on each node
    assert "big" not in starts(result)
    result = run_cycle(plans, nodes(4), [*busy[:2], big])  # n3 and n4 empty
    assert starts(result) == {"big": ("n3", "n4")}


def test_limits_make_a_job_wait_and_say_which_plan_and_limit():
    jobs = [running("r", "/p/qa", ("n1", "n1")), pending("q", "/p/qa")]
    result = run_cycle(tree(TEAMS), nodes(1), jobs)
    assert waits(result)["q"] == (
        "waiting: /p/qa at its gpu limit: 2 of 2 in use, this job needs 1 more"
    )


@pytest.mark.parametrize(
    "job, message",
    [
        (
            pending("q", "/p/qa", workers=4),
            "rejected: plan /p/qa has a gpu limit of 2 gpu and this job asks for 4 gpu "
            "(4 workers x 1 gpu); ask for at most 2 gpu or submit to a plan with a higher limit",
        ),
        (pending("x", "/p/dev", workers=3, gpu=4), "plan /p/dev has a gpu limit of 4 gpu"),
        (pending("y", "/free", workers=3, gpu=8), "the instance has 16 gpu in all"),
        (pending("z", "/free", gpu=9), "one worker asks for 9 gpu but the largest node has 8 gpu"),
        (pending("w", "/free", workers=3, gpu=5), "the nodes hold at most 2 such workers"),
        (pending("n", "/nowhere"), "there is no plan '/nowhere'"),
    ],
    ids=["plan-limit", "dev-limit", "instance", "node-too-small", "unplaceable", "unknown-plan"],
)
def test_submit_time_rejection_names_plan_resource_limit_and_request(job, message):
    plans = tree({**TEAMS, "/free": (1, None)})
    result = run_cycle(plans, nodes(2), [job])
    (reject,) = result.of(Reject)
    assert reject.job_id == job.id and message in reject.reason
    assert not result.of(Start)


def test_instance_quota_cuts_capacity_and_max_jobs_bounds_running_jobs():
    plans = tree({"/p": (1, None)})
    quota = Resources(2, UNLIMITED, UNLIMITED)
    result = run_cycle(plans, nodes(1), [pending("big", "/p", workers=3)], quota=quota)
    assert "the instance has 2 gpu" in result.of(Reject)[0].reason
    jobs = [pending(f"j{i}", "/p", gpu=0) for i in range(5)]
    result = run_cycle(plans, nodes(1), jobs, max_jobs=3)
    assert len(starts(result)) == 3
    assert "at most 3 jobs at once" in waits(result)["j3"]


def test_reservation_keeps_small_jobs_from_starving_a_big_gang():
    plans = tree({"/big": (1, None), "/small": (1, None)})
    # n1 has 4 GPUs free; the big gang (1 x 8) is first in the fair order and cannot start.
    jobs = [
        running("r", "/small", ("n1",) * 4),  # same leaf as s1: no reclaim within a user
        pending("big", "/big", gpu=8, submitted=0),
        pending("s1", "/small", submitted=1),
    ]
    result = run_cycle(plans, nodes(1), jobs)
    assert starts(result) == {}  # the 4 free GPUs are held for the gang
    assert "holds the reservation" in waits(result)["big"]
    assert "room now for 0" in waits(result)["s1"]


def test_the_reservation_holder_is_tried_before_the_fair_order_next_cycle():
    # /a-small and /z-big deserve 4 each and hold nothing: the tie goes to /a-small by path
    plans = tree({"/a-small": (1, None), "/z-big": (1, None)})
    small = [pending(f"s{i}", "/a-small", submitted=i) for i in range(8)]
    jobs = [pending("big", "/z-big", gpu=8, submitted=0), *small]
    fresh = run_cycle(plans, nodes(1), jobs)
    assert "s0" in starts(fresh) and "big" not in starts(fresh)
    assert fresh.reserved == "big"  # first blocked by capacity in the fair order
    # next cycle, with all 8 free again: what was freed since it blocked goes to it first
    # (the gang borrows 4: min_runtime keeps the next cycle's reclaim from undoing its start;
    # with min_runtime 0 it would take its turn in the fair order, tests/scheduler/test_churn.py)
    held = run_cycle(plans, nodes(1), jobs, reserved="big", min_runtime=60)
    assert starts(held) == {"big": ("n1",)}
    assert held.reserved == "s0"  # now the first blocked: it holds the next reservation
    busy = [running("r", "/a-small", ("n1",)), *jobs]
    still = run_cycle(plans, nodes(1), busy, reserved="big", min_runtime=60)
    assert starts(still) == {} and still.reserved == "big"


def test_a_job_blocked_by_its_limit_holds_no_reservation():
    plans = tree({"/a": (1, 1), "/b": (1, None)})
    jobs = [running("ra", "/a", ("n1",)), pending("a2", "/a"), pending("b1", "/b")]
    result = run_cycle(plans, nodes(1, gpu=2), jobs)
    assert starts(result) == {"b1": ("n1",)}


def test_elastic_jobs_start_at_min_and_grow_toward_max_fairly():
    plans = tree({"/p": (1, None)})
    jobs = [
        pending("e1", "/p", user="u1", workers=(1, 4), submitted=0),
        pending("e2", "/p", user="u2", workers=(1, 4), submitted=1),
    ]
    result = run_cycle(plans, nodes(1, gpu=6), jobs)
    assert {j: len(p) for j, p in starts(result).items()} == {"e1": 3, "e2": 3}


def test_running_elastic_job_grows_into_free_capacity_but_not_over_its_limit():
    plans = tree({"/p": (1, 3)})
    jobs = [running("e", "/p", ("n1",), workers=(1, 8))]
    result = run_cycle(plans, nodes(1), jobs)
    (grow,) = result.of(Grow)
    assert (grow.job_id, grow.add, grow.workers) == ("e", ("n1", "n1"), 3)


def test_growth_does_not_take_reserved_capacity():
    plans = tree({"/a": (1, None), "/b": (1, None)})
    jobs = [
        running("e", "/a", ("n1",) * 2, workers=(1, 8)),
        running("r", "/b", ("n1",) * 2, user="x"),
        pending("g", "/b", gpu=8),
    ]
    result = run_cycle(plans, nodes(1), jobs)
    assert not result.of(Grow)


def test_the_same_snapshot_gives_the_same_decisions():
    jobs = [pending(f"{t}{i}", f"/p/{t}", workers=(1, 3)) for t in ("dev", "qa") for i in range(4)]
    a = run_cycle(tree(TEAMS), nodes(2), jobs)
    b = run_cycle(tree(TEAMS), nodes(2), jobs)
    assert a.decisions == b.decisions


def test_notebooks_are_ordinary_one_worker_jobs_charged_to_the_user_leaf():
    plans = tree({"/sample-project": (1, None), "/sample-project/notebooks": (1, None)})
    nb = pending("nb-alice", "/sample-project/notebooks", user="alice", preemptible=False)
    result = run_cycle(plans, nodes(1), [nb])
    assert starts(result) == {"nb-alice": ("n1",)}
    assert result.plans["/sample-project/notebooks/alice"].allocated == gpus(1)


def test_wait_decisions_cover_every_pending_job_not_started():
    jobs = [pending(f"d{i}", "/p/dev") for i in range(6)]
    result = run_cycle(tree(TEAMS), nodes(1), jobs)
    assert set(starts(result)) | {d.job_id for d in result.of(Wait)} == {j.id for j in jobs}
