"""``wmla exec-get JOB`` of a pending job: its place in line, reason and estimated start, from
the job's ``queue`` object (docs/service.md "Why a job waits, and until when") as literal dicts,
through ``extension.cli.main`` as typed (the scripted service of test_output.py)."""

from __future__ import annotations

import pytest

from extension.queue_text import ordinal

from . import test_output
from .test_output import FakeClient

wmla = test_output.wmla  # the scripted service's fixture, shared

QA = "/project1/qa-team"
ASSUMES = (
    "running jobs end at their runtime limits (2 have none: their end is estimated from their "
    "users' finished jobs); no new submissions"
)
QUEUE = {
    "position": {"leaf": 1, "plan": 3, "instance": 12},
    "plan": QA,
    "reason": f"3rd in line in {QA}; qa-team holds 8 of its 8 deserved GPUs; waiting for "
    "capacity: needs 1 worker x 4 gpu, each worker on one node; room now for 0",
    "estimate": {
        "start": 1796214600.0,  # 2026-12-02 12:30 UTC
        "in_seconds": 720,
        "text": "in about 12 minutes",
        "assumption": ASSUMES,
        "exact": False,
    },
    "updated": 1796213880.0,
}
REASON = (
    "qa-team holds 8 of its 8 deserved GPUs; waiting for capacity: needs 1 worker x 4 gpu, "
    "each worker on one node; room now for 0"
)


def lines_of(out: str) -> dict[str, str]:
    rows = [line.split(":", 1) for line in out.splitlines()]
    return {k: v.strip() for k, v in rows}


def test_exec_get_of_a_pending_job_says_its_place_reason_and_estimated_start(wmla) -> None:
    fake = FakeClient([{"plan": QA, "reason": "waiting for capacity", "queue": QUEUE}])
    code, out, err = wmla(fake, "exec-get", "j1")
    assert code == 0, err
    assert "queue:           3rd in /project1/qa-team (1st of yours, 12th overall)\n" in out
    assert f"\nreason:          {REASON}\n" in out
    assert (
        f"\nestimated start: 2026-12-02 12:30 UTC (in about 12 minutes; assumes {ASSUMES})\n" in out
    )
    assert "\nstate:           PENDING\n" in out  # every line aligned to the widest key


@pytest.mark.parametrize(
    ("queue", "expected"),
    [
        (
            {**QUEUE, "estimate": None},
            {"queue": "3rd in /project1/qa-team (1st of yours, 12th overall)",
             "estimated start": "not estimated yet"},
        ),
        (
            {**QUEUE, "estimate": {"start": None, "text": "no start in sight",
                                   "assumption": "no new submissions"}},
            {"estimated start": "no start in sight (assumes no new submissions)"},
        ),
        (
            {"position": None, "plan": QA, "reason": "waiting for capacity", "estimate": None},
            {"queue": f"not placed in line in {QA} yet", "reason": "waiting for capacity",
             "estimated start": "not estimated yet"},
        ),
        (
            {"position": {"plan": "3"}, "estimate": {"start": float("nan")}},
            {"queue": f"not placed in line in {QA} yet", "reason": "the job's own reason",
             "estimated start": "not known"},
        ),
        (
            {**QUEUE, "position": {"plan": 2}},  # no leaf, no instance place
            {"queue": f"2nd in {QA}", "reason": QUEUE["reason"]},  # not the 2nd's prefix
        ),
    ],
    ids=["not-estimated-yet", "beyond-the-horizon", "not-placed-yet", "unreadable-fields",
         "plan-place-only"],
)  # fmt: skip
def test_exec_get_says_what_the_service_has_not_worked_out(wmla, queue, expected) -> None:
    fake = FakeClient([{"plan": QA, "reason": "the job's own reason", "queue": queue}])
    code, out, err = wmla(fake, "exec-get", "j1")
    assert code == 0, err
    rows = lines_of(out)
    assert {k: rows[k] for k in expected} == expected


@pytest.mark.parametrize(
    "job",
    [
        {"state": "PENDING", "reason": "waiting for capacity"},  # an older service: no queue
        {"state": "RUNNING", "reason": "", "queue": None},
    ],
    ids=["older-service", "running"],
)
def test_exec_get_of_a_job_without_a_queue_is_as_before(wmla, job) -> None:
    code, out, err = wmla(FakeClient([job]), "exec-get", "j1")
    assert code == 0, err
    assert "queue:" not in out and "estimated start" not in out
    assert f"\nreason:      {job['reason']}".rstrip() in out  # the old 13-wide alignment


def test_exec_get_json_carries_the_queue_object_as_sent(wmla) -> None:
    import json

    code, out, _ = wmla(FakeClient([{"queue": QUEUE}]), "exec-get", "j1", "--json")
    assert code == 0 and json.loads(out)["queue"] == QUEUE


@pytest.mark.parametrize(
    ("n", "text"),
    [(1, "1st"), (2, "2nd"), (3, "3rd"), (4, "4th"), (11, "11th"), (12, "12th"), (13, "13th"),
     (21, "21st"), (102, "102nd"), (112, "112th")],
)  # fmt: skip
def test_ordinals(n: int, text: str) -> None:
    assert ordinal(n) == text


def test_the_wait_lines_of_exec_start_carry_the_place_and_the_estimate() -> None:
    from extension.tables import state_line

    job = {**test_output.BASE, "plan": QA, "reason": "waiting for capacity", "queue": QUEUE}
    assert state_line(job) == (
        f"job j1 PENDING: 3rd in {QA} (1st of yours, 12th overall) — starts in about 12 "
        f"minutes — {REASON}"
    )
    not_placed = {**job, "queue": {"position": None, "reason": "waiting for capacity"}}
    assert state_line(not_placed) == "job j1 PENDING: waiting for capacity"
    assert state_line({**job, "queue": {}}) == "job j1 PENDING: waiting for capacity"
