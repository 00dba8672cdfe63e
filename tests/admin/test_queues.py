"""The admin page's waiting lines over a real Scheduler and store (no hub): each plan's pending
jobs with their places, estimated starts and reasons, from ``sched.queue.views()`` (the queue
objects of docs/service.md "Why a job waits, and until when", as literal dicts); no section
when there is no line. tests/admin/test_admin_page.py shows it in the browser."""

from __future__ import annotations

import pytest

from extension.service.admin.handlers import _env
from extension.service.admin.queues import queue_tables
from extension.service.scheduling import Scheduler
from tests.waiting_line import Line

from . import test_views
from .test_views import job, set_live

sched = test_views.sched  # the real Scheduler and store of the view-model tests

DEV = "/project1/dev"
ASSUMES = "running jobs end at their runtime limits; no new submissions"


def queue(place: int, leaf: int, instance: int, start: float | None, text: str) -> dict:
    return {
        "position": {"leaf": leaf, "plan": place, "instance": instance},
        "plan": DEV,
        "reason": f"{place}{'st' if place == 1 else 'nd'} in line in {DEV}; dev holds 4 of its "
        "4 deserved GPUs; waiting for capacity",
        "estimate": {"start": start, "in_seconds": None, "text": text, "assumption": ASSUMES,
                     "exact": False},
        "updated": 1000.0,
    }  # fmt: skip


def with_jobs(sched: Scheduler) -> Scheduler:
    jobs = {
        "run": job("run", DEV, 4, ("n0",) * 4),
        "a": job("a", DEV, 2),
        "b": job("b", DEV, 1),
        "q": job("q", "/project1/qa", 1),
    }
    set_live(sched, jobs, kinds={"b": "notebook"})
    return sched


VIEWS = {
    "b": queue(2, 2, 3, 1796214600.0, "in about 12 minutes"),  # 2026-12-02 12:30 UTC
    "a": queue(1, 1, 1, 1796214000.0, "in about 2 minutes"),
    "q": {**queue(1, 1, 2, None, "no start in sight"), "plan": "/project1/qa"},
    "run": queue(1, 1, 1, 1.0, "within a minute"),  # started since the forward run: left out
    "gone": queue(3, 3, 4, 1.0, "within a minute"),  # ended since: left out
}


def test_each_plans_line_in_the_order_of_its_places(sched: Scheduler) -> None:
    sched.queue = Line(VIEWS)
    tables = queue_tables(with_jobs(sched))
    assert [(t["plan"], [j["id"] for j in t["jobs"]]) for t in tables] == [
        (DEV, ["a", "b"]),
        ("/project1/qa", ["q"]),
    ]
    b = tables[0]["jobs"][1]
    assert b == {
        "id": "b", "user": "alice", "kind": "notebook", "position": 2, "leaf": 2, "instance": 3,
        "start": "2026-12-02 12:30 UTC", "when": "starts in about 12 minutes",
        "assumption": ASSUMES, "reason": "dev holds 4 of its 4 deserved GPUs; waiting for capacity",
    }  # fmt: skip
    q = tables[1]["jobs"][0]
    assert (q["start"], q["when"]) == ("", "no start in sight")


@pytest.mark.parametrize(
    "line",
    [None, Line({}), Line(RuntimeError("estimator down")), Line(["not", "a", "mapping"])],
    ids=["no-line", "nothing-placed", "raises", "not-a-mapping"],
)
def test_no_line_is_no_table(sched: Scheduler, line) -> None:
    if line is not None:
        sched.queue = line
    elif hasattr(sched, "queue"):
        del sched.queue
    assert queue_tables(with_jobs(sched)) == []
    assert "queues" not in _env.get_template("_queues.html").render(queues=[])


def test_a_queue_object_with_missing_fields_still_lists_the_job(sched: Scheduler) -> None:
    sched.queue = Line({"a": {"plan": DEV}, "b": {"position": {"plan": 1}, "estimate": "x"}})
    (table,) = queue_tables(with_jobs(sched))
    assert [(j["id"], j["position"], j["when"]) for j in table["jobs"]] == [
        ("b", 1, "not estimated yet"),
        ("a", None, "not estimated yet"),  # not placed yet: after the placed ones
    ]


def test_the_section_renders_each_plan_as_a_table(sched: Scheduler) -> None:
    sched.queue = Line(VIEWS)
    page = _env.get_template("_queues.html").render(queues=queue_tables(with_jobs(sched)))
    assert '<section id="queues">' in page
    assert page.count('<table class="grid queue"') == 2
    assert '<tr class="queued-job" data-job="b" data-position="2">' in page
    assert '<span class="start">2026-12-02 12:30 UTC</span>' in page
    assert f'title="assumes {ASSUMES}"' in page
    assert 'data-job="run"' not in page and 'data-job="gone"' not in page
