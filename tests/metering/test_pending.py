"""``wmla_pending_jobs`` and ``wmla_pending_estimated_wait_seconds`` in the /metrics text.

The plan figures come from the real core (``schedule`` over a tree and jobs, as a cycle makes
them) and reach metering through its cycle hook, as in the service; the waiting line is the
scheduler's ``queue.views()`` as literal queue objects (docs/service.md "Why a job waits, and
until when"). The text is what ``MetricsHandler`` serves (``generate_latest`` of the meter's
registry); tests/metering/test_api.py covers the handler itself.
"""

from __future__ import annotations

import math
import types

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from extension.metering.meter import Metering
from extension.scheduler import Instance, Snapshot, schedule
from tests.scheduler.builders import nodes, pending, running, tree
from tests.waiting_line import Line

NOW = 1000.0
QA = "/project1/qa-team"
DEV = "/project1/dev-team"


class EmptyStore:
    """The store as metering reads it, with no history (the waiting figures need none)."""

    def preemption_details(self) -> list:
        return []

    def transition_facts(self, after: int) -> list:
        return []


def estimate(start, text: str = "in about 12 minutes") -> dict:
    return {"position": {"leaf": 1, "plan": 1, "instance": 1}, "plan": QA, "reason": "r",
            "estimate": {"start": start, "in_seconds": None, "text": text,
                         "assumption": "no new submissions", "exact": False},
            "updated": NOW}  # fmt: skip


def scraped(views, metrics_user_leaves: bool = True) -> dict:
    """(metric, plan) -> value of the /metrics text after one cycle of the real core on one
    4-GPU node: qa-team runs one 2-GPU job and has three 2-GPU jobs waiting (two of alice's, one
    of bob's) for the one GPU left; dev-team runs one 1-GPU job and has one waiting behind its
    1-GPU limit."""
    plans = tree({"/project1": (1, 4), QA: (1, 2), DEV: (1, 1)})
    jobs = [
        running("r1", QA, ("n1", "n1"), user="carol", gpu=1),
        pending("a1", QA, user="alice", gpu=2, submitted=1.0),
        pending("a2", QA, user="alice", gpu=2, submitted=2.0),
        pending("b1", QA, user="bob", gpu=2, submitted=3.0),
        running("d0", DEV, ("n1",), user="dan", gpu=1),
        pending("d1", DEV, user="dan", gpu=1, submitted=4.0),
    ]
    result = schedule(Snapshot(plans, Instance(nodes(1, gpu=4)), jobs), NOW)
    assert {j.id for j in jobs if j.state.value == "PENDING"} == {"a1", "a2", "b1", "d1"}
    # the service's tree holds the user leaves the core made (metrics_user_leaves reads it)
    leaves = [types.SimpleNamespace(path=p, user_leaf=p not in plans and p != "/")
              for p in result.plans]  # fmt: skip
    sched = types.SimpleNamespace(
        jobs={j.id: j for j in jobs}, queue=Line(views), clock=lambda: NOW, plans=leaves,
        cycle_hooks=[], decision_hooks=[],
    )  # fmt: skip
    meter = Metering(store=EmptyStore(), clock=lambda: NOW, sample_interval=0)
    meter.metrics_user_leaves = metrics_user_leaves
    meter.attach(sched)
    for hook in sched.cycle_hooks:
        hook(result, NOW, 0.01)
    text = generate_latest(meter.registry).decode()
    return {
        (s.name, s.labels.get("plan")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("wmla_pending")
    }


def test_pending_jobs_per_plan_count_the_subtree() -> None:
    got = scraped({})
    pending_jobs = {plan: v for (name, plan), v in got.items() if name == "wmla_pending_jobs"}
    assert pending_jobs == {
        "/": 4, "/project1": 4, QA: 3, DEV: 1,
        f"{QA}/alice": 2, f"{QA}/bob": 1, f"{QA}/carol": 0, f"{DEV}/dan": 1,
    }  # fmt: skip
    assert not any(name == "wmla_pending_estimated_wait_seconds" for name, _ in got)


def test_the_longest_estimated_wait_per_plan() -> None:
    views = {
        "a1": estimate(NOW + 120),
        "a2": estimate(NOW + 720),
        "b1": estimate(NOW - 5, "within a minute"),  # due already: no negative wait
        "d1": {**estimate(None, "no start in sight"), "plan": DEV},
        "r1": estimate(NOW + 9999),  # started since the forward run: not waiting
        "gone": estimate(NOW + 9999),  # ended since: no live job
    }
    waits = {p: v for (n, p), v in scraped(views).items() if n.endswith("wait_seconds")}
    assert waits == {
        "/": math.inf, "/project1": math.inf, DEV: math.inf, f"{DEV}/dan": math.inf,
        QA: 720, f"{QA}/alice": 720, f"{QA}/bob": 0,
    }  # fmt: skip


def test_user_leaves_are_left_out_when_asked() -> None:
    got = scraped({"a1": estimate(NOW + 60)}, metrics_user_leaves=False)
    assert {p for _, p in got} == {"/", "/project1", QA, DEV}


@pytest.mark.parametrize(
    "views",
    [
        RuntimeError("the estimator failed"),
        ["not", "a", "mapping"],
        {"a1": None, "a2": {"estimate": None}, "b1": {"estimate": {"start": "soon"}}},
    ],
    ids=["raises", "not-a-mapping", "no-usable-estimate"],
)
def test_a_line_without_usable_estimates_leaves_only_the_counts(views) -> None:
    got = scraped(views)
    assert got[("wmla_pending_jobs", QA)] == 3
    assert not any(name.endswith("wait_seconds") for name, _ in got)
