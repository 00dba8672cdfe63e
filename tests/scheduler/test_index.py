"""The plan index the core keeps between cycles (index.PlanIndex in an IndexCache): it follows
every change of the tree and the instance, forgets what the last cycle wrote, and is never
shared half-written."""

from __future__ import annotations

import threading

import pytest

from extension.scheduler import (
    IndexCache,
    Instance,
    Reject,
    Resources,
    Snapshot,
    Wait,
    check_submission,
    schedule,
)
from extension.scheduler import cycle as core
from extension.scheduler.resources import UNLIMITED

from .builders import nodes, pending, run_cycle, running, starts, tree, waits


def outcome(result) -> tuple:
    return result.decisions, result.waiting, result.plans, result.reserved


def test_a_plan_change_between_cycles_takes_effect():
    plans = tree({"/a": (1, None)})
    assert starts(run_cycle(plans, nodes(1), [pending("first", "/a", workers=4)]))
    plans.update("/a", limit=Resources(2, UNLIMITED, UNLIMITED))
    result = run_cycle(plans, nodes(1), [pending("second", "/a", workers=4)])
    (reject,) = result.of(Reject)
    assert "plan /a has a gpu limit of 2" in reject.reason


def test_a_plan_added_between_cycles_gets_its_share():
    plans = tree({"/a": (1, None)})
    jobs = [pending(f"a{i}", "/a") for i in range(8)]
    assert len(starts(run_cycle(plans, nodes(1, gpu=4), jobs))) == 4
    plans.add("/b", 1)
    jobs = [pending(f"a{i}", "/a") for i in range(8)] + [pending(f"b{i}", "/b") for i in range(8)]
    result = run_cycle(plans, nodes(1, gpu=4), jobs)
    assert result.plans["/b"].deserved.gpu == 2
    assert sorted(starts(result)) == ["a0", "a1", "b0", "b1"]


def test_a_node_added_between_cycles_takes_effect():
    plans = tree({"/a": (1, None)})
    (reject,) = run_cycle(plans, nodes(1, gpu=4), [pending("big", "/a", workers=8)]).of(Reject)
    assert "the instance has 4 gpu" in reject.reason
    assert starts(run_cycle(plans, nodes(2, gpu=4), [pending("big", "/a", workers=8)]))


def test_made_up_user_leaves_leave_the_figures_when_their_jobs_are_gone():
    plans = tree({"/p": (1, None)})
    first = run_cycle(plans, nodes(1), [pending("j", "/p", user="u9")])
    assert first.plans["/p/u9"].pending == 0 and first.plans["/p/u9"].running == 1
    later = run_cycle(plans, nodes(1), [pending("k", "/p", user="u7")])
    assert "/p/u9" not in later.plans and "/p/u7" in later.plans
    assert later.plans["/p"].allocated.gpu == 1


def test_the_last_cycle_leaves_nothing_behind():
    plans = tree({"/a": (1, None), "/b": (1, None)})
    busy = [running("r", "/a", ("n1",) * 8)] + [pending(f"w{i}", "/b") for i in range(5)]
    run_cycle(plans, nodes(1), busy)
    quiet = run_cycle(plans, nodes(1), [pending("only", "/b")])
    assert starts(quiet) == {"only": ("n1",)} and not quiet.waiting
    assert quiet.plans["/a"].allocated.gpu == 0 and quiet.plans["/b"].allocated.gpu == 1


def test_a_cycle_that_raises_is_not_kept(monkeypatch):
    plans = tree({"/a": (1, None), "/b": (1, None)})
    jobs = [pending(f"{p}{i}", f"/{p}") for p in "ab" for i in range(6)]
    expected = outcome(run_cycle(plans.copy(), nodes(1, gpu=4), jobs))

    real_admit = core.admit

    def broken(state):
        real_admit(state)  # the index is written all over, then the cycle fails
        raise RuntimeError("the core failed after admission")

    with monkeypatch.context() as patch:
        patch.setattr(core, "admit", broken)
        with pytest.raises(RuntimeError, match="after admission"):
            run_cycle(plans, nodes(1, gpu=4), jobs)
    assert outcome(run_cycle(plans, nodes(1, gpu=4), jobs)) == expected


def test_cycles_on_several_threads_agree_with_one():
    plans = tree({"/a": (2, None), "/b": (1, None)})
    jobs = [
        pending(f"{p}{i}", f"/{p}", user=f"u{i % 3}", workers=1 + i % 3)
        for p in "ab"
        for i in range(30)
    ]
    inst = Instance(nodes(4), Resources(UNLIMITED, UNLIMITED, UNLIMITED))
    expected = outcome(schedule(Snapshot(plans, inst, jobs), 10.0))
    got, errors = [], []

    def work() -> None:
        try:
            for _ in range(20):
                got.append(outcome(schedule(Snapshot(plans, inst, jobs), 10.0)))
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(got) == 80
    assert all(g == expected for g in got)


def test_waiting_reasons_still_come_as_wait_decisions_on_request():
    plans = tree({"/a": (1, None)})
    result = run_cycle(plans, nodes(1, gpu=2), [pending(f"j{i}", "/a") for i in range(4)])
    assert {w.job_id: w.reason for w in result.of(Wait)} == waits(result)
    assert set(waits(result)) == {"j2", "j3"}


def test_a_caller_owned_cache_keeps_its_own_index_between_cycles():
    plans = tree({"/a": (1, None), "/b": (1, None)})
    inst = Instance(nodes(1), Resources(UNLIMITED, UNLIMITED, UNLIMITED))
    jobs = [pending(f"{p}{i}", f"/{p}") for p in "ab" for i in range(6)]
    mine, other = IndexCache(), IndexCache()
    first = schedule(Snapshot(plans, inst, jobs), 1.0, mine)
    kept = mine._kept
    assert kept is not None and other._kept is None
    again = schedule(Snapshot(plans, inst, jobs), 1.0, mine)
    assert mine._kept is kept  # the same vertices served the second cycle
    assert outcome(again) == outcome(first) == outcome(schedule(Snapshot(plans, inst, jobs), 1.0))
    assert check_submission(Snapshot(plans, inst, []), pending("x", "/a"), mine) is None
    assert mine._kept is kept


def test_a_changed_tree_or_instance_gets_a_new_index():
    plans = tree({"/a": (1, None)})
    inst = Instance(nodes(1), Resources(UNLIMITED, UNLIMITED, UNLIMITED))
    cache = IndexCache()
    schedule(Snapshot(plans, inst, []), 1.0, cache)
    kept = cache._kept
    schedule(Snapshot(plans, Instance(nodes(2), inst.quota), []), 1.0, cache)
    assert cache._kept is not kept
    kept = cache._kept
    plans.add("/b")
    schedule(Snapshot(plans, Instance(nodes(2), inst.quota), []), 1.0, cache)
    assert cache._kept is not kept and "/b" in cache._kept.plans
