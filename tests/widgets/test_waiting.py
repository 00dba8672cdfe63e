"""The job monitor while a job waits: the service's place in line, estimate and reason (the
job's ``queue`` object, docs/service.md "Why a job waits, and until when"), as literal dicts."""

from __future__ import annotations

import copy

import pytest

from widgets import figures
from widgets.monitor import JobMonitor

from .test_widgets import JOB, CannedClient

QA = "/project1/qa-team"
ASSUMES = "running jobs end at their runtime limits; no new submissions"
QUEUE = {
    "position": {"leaf": 1, "plan": 3, "instance": 12},
    "plan": QA,
    "reason": f"3rd in line in {QA}; qa-team holds 8 of its 8 deserved GPUs; waiting for "
    "capacity: needs 1 worker x 4 gpu, each worker on one node; room now for 0",
    "estimate": {
        "start": 1764660000.0,  # 2025-12-02 07:20 UTC
        "in_seconds": 720,
        "text": "in about 12 minutes",
        "assumption": ASSUMES,
        "exact": False,
    },
    "updated": 1764659280.0,
}
PENDING = {"state": "PENDING", "plan": QA, "reason": "waiting for capacity", "queue": QUEUE}
PENDING_HTML = '<b style="color:#b58900">PENDING</b> &mdash; '


def with_queue(**changes) -> dict:
    return {**PENDING, "queue": {**copy.deepcopy(QUEUE), **changes}}


def test_the_state_line_says_the_place_the_estimate_and_the_reason() -> None:
    assert figures.state_html(PENDING) == (
        PENDING_HTML + f"3rd in line in {QA} (1st of yours, 12th overall) &mdash; "
        '<span class="wmla-estimate">starts in about 12 minutes</span> '
        f'<span style="color:#666">(2025-12-02 07:20 UTC; estimate: assumes {ASSUMES})</span> '
        "&mdash; qa-team holds 8 of its 8 deserved GPUs; waiting for capacity: needs 1 worker "
        "x 4 gpu, each worker on one node; room now for 0"
    )


@pytest.mark.parametrize(
    ("job", "html"),
    [
        (
            with_queue(position=None, estimate=None, reason="waiting for capacity"),
            f"not placed in line in {QA} yet &mdash; no start estimated yet &mdash; "
            "waiting for capacity",
        ),
        (
            with_queue(estimate={"start": None, "text": "no start in sight"}),
            f"3rd in line in {QA} (1st of yours, 12th overall) &mdash; "
            '<span class="wmla-estimate">no start in sight</span> &mdash; '
            "qa-team holds 8 of its 8 deserved GPUs; waiting for capacity: needs 1 worker x 4 "
            "gpu, each worker on one node; room now for 0",
        ),
        (
            {**PENDING, "queue": {"reason": "<b>why</b>"}},
            "not placed in line in /project1/qa-team yet &mdash; no start estimated yet "
            "&mdash; &lt;b&gt;why&lt;/b&gt;",
        ),
        (
            {**PENDING, "queue": {"position": [3], "estimate": "soon", "plan": 5}},
            "not placed in line in /project1/qa-team yet &mdash; no start estimated yet "
            "&mdash; waiting for capacity",
        ),
    ],
    ids=["not-placed-yet", "beyond-the-horizon", "escaped", "fields-of-the-wrong-type"],
)
def test_what_the_service_has_not_worked_out_is_said_not_guessed(job: dict, html: str) -> None:
    assert figures.state_html(job) == PENDING_HTML + html


@pytest.mark.parametrize(
    ("job", "text"),
    [
        (PENDING, "waiting: 3rd in line, starts in about 12 minutes"),
        (with_queue(estimate=None), "waiting: 3rd in line"),
        (with_queue(position=None, estimate=None), "waiting: waiting for capacity"),
        ({**PENDING, "queue": None}, "waiting: waiting for capacity"),
    ],
    ids=["placed-and-estimated", "not-estimated", "neither", "no-queue"],
)
def test_the_progress_label_of_a_waiting_job(job: dict, text: str) -> None:
    assert figures.progress_phase(job, [])["text"] == text


class QueueClient(CannedClient):
    """The service with the queue object; counts the list calls the monitor should not need."""

    def __init__(self, queue: dict | None) -> None:
        super().__init__()
        self.jobs_seen = [{**copy.deepcopy(JOB), "queue": queue}]
        self.listed = 0

    def jobs(self, states=None, user=None) -> list[dict]:
        self.listed += 1
        return super().jobs(states, user)


def test_the_monitor_shows_the_services_line_without_listing_pending_jobs() -> None:
    client = QueueClient({**copy.deepcopy(QUEUE), "plan": "/p"})
    mon = JobMonitor(client, "j1")
    mon.refresh()
    state = mon.state.get_state()["value"]
    assert "3rd in line in /p (1st of yours, 12th overall)" in state
    assert "starts in about 12 minutes" in state and "2025-12-02 07:20 UTC" in state
    assert "#2 in the queue" not in state and client.listed == 0
    assert mon.progress_label.get_state()["value"] == (
        "waiting: 3rd in line, starts in about 12 minutes · 50%"  # epoch 1 of 2 reported
    )
    client.jobs_seen.append({**client.jobs_seen[-1], "state": "RUNNING", "queue": None})
    mon.refresh()
    assert "in line" not in mon.state.value
