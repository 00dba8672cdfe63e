"""Reclaim (docs/scheduling.md "Reclaim 1" to "Reclaim 6") as a table of named cases, grouped
by the rule each one shows (in the manner of Kueue's preemption_policy_test.go): a world, what
is preempted (in order, with the job it is for), what shrinks, and the reclaimer's reason."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from extension.scheduler import Preempt, Shrink

from .builders import nodes, pending, run_cycle, running, starts, tree, waits

ONE_PLAN = {"/p": (1, None)}
TWO_PLANS = {"/a": (1, None), "/b": (1, None)}


@dataclass
class Case:
    plans: dict
    nodes: tuple
    jobs: list
    preempt: list = field(default_factory=list)  # job ids, or (job id, for job), in order
    shrink: list = field(default_factory=list)  # (job id, workers left)
    waits: dict = field(default_factory=dict)  # job id -> part of its reason
    starts: dict | None = None  # when given: exactly these start
    deserved: dict = field(default_factory=dict)  # plan -> its deserved gpus
    config: dict = field(default_factory=dict)  # run_cycle's now, grace, min_runtime


CASES = {
    # Reclaim 1: within deserved -------------------------------------------------------------
    "s4-elastic-victim-shrinks-to-its-deserved-share": Case(
        ONE_PLAN,
        nodes(1, gpu=4),
        [
            running("u1-job", "/p", ("n1",) * 4, user="user1", workers=(1, 4), started=0),
            pending("u2-job", "/p", user="user2", workers=(1, 4)),
        ],
        shrink=[("u1-job", 2)],
        waits={"u2-job": "reclaiming from u1-job"},
    ),
    "s4-rigid-gang-over-its-deserved-share-waits-and-nothing-is-killed": Case(
        ONE_PLAN,
        nodes(1, gpu=4),
        [
            running("u1-job", "/p", ("n1",) * 4, user="user1", started=0),
            pending("u2-job", "/p", user="user2", workers=4),
        ],
    ),
    # 8 GPUs. /y holds its 2 (demand 2); /x deserves the other 6, held by /x/t2 (deserves 4).
    # /x/t1 asks for 2: within its own share (2) but /x would hold 8 > 6, so the reclaim stays
    # inside /x: /x/t2 (the borrower there) gives back, /y is not touched.
    "at-the-level-where-the-borrowing-happened": Case(
        {"/x": (1, None), "/x/t1": (1, None), "/x/t2": (1, None), "/y": (1, None)},
        nodes(1),
        [
            running("y-1", "/y", ("n1",) * 2, started=5),
            running("t2-a", "/x/t2", ("n1",) * 2, user="u2", started=0),
            running("t2-b", "/x/t2", ("n1",) * 2, user="u2", started=1),
            running("t2-c", "/x/t2", ("n1",) * 2, user="u2", started=2),
            pending("t1-1", "/x/t1", workers=2),
        ],
        preempt=[("t2-c", "t1-1")],
        starts={},
        deserved={"/x": 6, "/x/t2": 4, "/y": 2},
    ),
    # Reclaim 2: already on its way ------------------------------------------------------------
    "resources-in-grace-are-waited-for-not-preempted-twice": Case(
        TWO_PLANS,
        nodes(1, gpu=4),
        [
            running("a-1", "/a", ("n1",) * 2, started=0),
            running("a-2", "/a", ("n1",) * 2, started=1, terminating=True),
            pending("b-job", "/b", workers=2),
        ],
        waits={"b-job": "being released"},
    ),
    # c-1 is on its way out (2 GPUs of n1): a-job, first in the fair order, claims them; b-job
    # is owed its share too and must get it from a victim, not from the same released GPUs
    "released-capacity-claimed-by-one-reclaimer-is-not-promised-to-the-next": Case(
        {"/a": (1, None), "/b": (1, None), "/c": (1, None)},
        nodes(2, gpu=4),
        [
            running("c-1", "/c", ("n1",) * 2, started=0, terminating=True),
            running("c-2", "/c", ("n1",) * 2, started=2),
            running("c-3", "/c", ("n2",) * 4, started=1),
            pending("a-job", "/a", workers=2),
            pending("b-job", "/b", workers=2),
        ],
        preempt=[("c-2", "b-job")],
        waits={"a-job": "being released", "b-job": "reclaiming from c-2"},
    ),
    # Reclaim 3: borrowers only ------------------------------------------------------------------
    # /a holds exactly its deserved 2 of 6 (demand 2); /b borrows 4 (deserved 2); /c reclaims 2
    "victims-are-borrowers-only": Case(
        {"/a": (1, None), "/b": (1, None), "/c": (1, None)},
        nodes(1, gpu=6),
        [
            running("a-job", "/a", ("n1",) * 2, started=99),
            running("b-1", "/b", ("n1",) * 2, started=0),
            running("b-2", "/b", ("n1",) * 2, started=1),
            pending("c-job", "/c", workers=2),
        ],
        preempt=["b-2"],  # the most recently started
    ),
    "young-jobs-are-not-victims-under-min-runtime": Case(
        TWO_PLANS,
        nodes(1, gpu=4),
        [running("young", "/a", ("n1",) * 4, started=90), pending("b-job", "/b")],
        config={"now": 100, "min_runtime": 60},
    ),
    "a-job-past-min-runtime-is-a-victim": Case(
        TWO_PLANS,
        nodes(1, gpu=4),
        [running("young", "/a", ("n1",) * 4, started=90), pending("b-job", "/b")],
        preempt=["young"],
        config={"now": 200, "min_runtime": 60},
    ),
    "non-preemptible-notebooks-are-never-victims": Case(
        TWO_PLANS,
        nodes(1, gpu=4),
        [running("nb", "/a", ("n1",) * 4, preemptible=False), pending("b-job", "/b")],
    ),
    "a-user-never-reclaims-from-their-own-leaf": Case(
        ONE_PLAN,
        nodes(1, gpu=4),
        [running("mine", "/p", ("n1",) * 4, started=0), pending("also-mine", "/p")],
    ),
    # Reclaim 4: order of loss ------------------------------------------------------------------
    "whole-rigid-gangs-are-stopped-never-in-part": Case(
        TWO_PLANS,
        nodes(1, gpu=4),
        [running("a-gang", "/a", ("n1",) * 4, started=0), pending("b-job", "/b", workers=2)],
        preempt=[("a-gang", "b-job")],
        config={"grace": 10},
    ),
    "elastic-jobs-shrink-before-any-rigid-gang-is-stopped": Case(
        TWO_PLANS,
        nodes(1, gpu=4),
        [
            running("rigid", "/a", ("n1",) * 2, started=50),
            running("elastic", "/a", ("n1",) * 2, workers=(1, 2), started=0),
            pending("b-job", "/b"),
        ],
        shrink=[("elastic", 1)],
    ),
    "lower-priority-first-then-the-most-recently-started": Case(
        TWO_PLANS,
        nodes(1, gpu=4),
        [
            running("old-low", "/a", ("n1",), started=0, priority=-1),
            running("new-high", "/a", ("n1",), started=90, priority=5),
            running("new-low", "/a", ("n1",), started=80, priority=-1),
            running("mid", "/a", ("n1",), started=50),
            pending("b-job", "/b"),
        ],
        preempt=["new-low"],
    ),
    # seed 000: the reclaimer does not care if the victim falls below its own deserved share,
    # but victims that stay at or above theirs are preferred
    "up-to-its-deserved-share-even-below-the-victims": Case(
        TWO_PLANS,
        nodes(1, gpu=4),
        [
            running("a-1", "/a", ("n1",) * 2, started=0),
            running("a-2", "/a", ("n1",) * 2, started=1),
            pending("b-job", "/b", workers=2),
        ],
        preempt=["a-2"],
    ),
    # Reclaim 5: room search and least loss ----------------------------------------------------
    # greedy in order takes small (newest, but 1 GPU does not cover 2) then pair; least loss
    # drops small, which is not needed
    "the-fewest-resources-that-cover-the-need": Case(
        TWO_PLANS,
        nodes(1),
        [
            running("small", "/a", ("n1",), started=90),
            running("pair", "/a", ("n1",) * 2, started=10),
            running("big", "/a", ("n1",) * 5, started=5),
            pending("b-job", "/b", workers=2),
        ],
        preempt=["pair"],
    ),
    # the gang needs 4 GPUs on one node; n1 has 4 in all and /b's own job holds 1 of them:
    # reclaiming /a frees only 3 there, so nothing is preempted for nothing
    "no-preemption-when-the-victims-cannot-make-the-gang-fit": Case(
        TWO_PLANS,
        nodes(1, gpu=4),
        [
            running("a-job", "/a", ("n1",) * 3, started=0),
            running("b-own", "/b", ("n1",), user="u2", started=0),
            pending("b-job", "/b", gpu=4),
        ],
    ),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_reclaim(case: Case):
    result = run_cycle(tree(case.plans), case.nodes, case.jobs, **case.config)
    preempts = [
        p.job_id if isinstance(want, str) else (p.job_id, p.for_job)
        for p, want in zip(result.of(Preempt), case.preempt)
    ]
    assert preempts == case.preempt and len(result.of(Preempt)) == len(case.preempt)
    assert [(s.job_id, s.workers) for s in result.of(Shrink)] == case.shrink
    for job_id, part in case.waits.items():
        assert part in waits(result)[job_id]
    if case.starts is not None:
        assert starts(result) == case.starts
    for plan, gpu in case.deserved.items():
        assert result.plans[plan].deserved.gpu == gpu


def test_reclaim_6_a_shrink_says_what_it_releases_its_grace_and_for_whom():
    case = CASES["s4-elastic-victim-shrinks-to-its-deserved-share"]
    result = run_cycle(tree(case.plans), case.nodes, case.jobs, grace=30)
    (shrink,) = result.of(Shrink)
    assert (shrink.release, shrink.grace) == (("n1", "n1"), 30)
    assert "reclaimed by /p/user2 for job u2-job" in shrink.reason
    assert "(grace 30 s)" in waits(result)["u2-job"]


def test_reclaim_6_a_preempt_names_its_reclaimer_and_grace():
    case = CASES["whole-rigid-gangs-are-stopped-never-in-part"]
    result = run_cycle(tree(case.plans), case.nodes, case.jobs, grace=10)
    (preempt,) = result.of(Preempt)
    assert (preempt.grace, preempt.reason) == (10, "reclaimed by /b/u1 for job b-job")
