"""The client while the service restarts: retries, the ``Idempotency-Key`` and the last word.

The service and the hub's proxy are played by a real tornado server on a free port
(tests/client/stub.py) that answers the 503 pages, the service's 503 JSON with ``Retry-After``,
drops a connection after acting on the request, refuses connections, or answers normally.
Waits are kept short with ``backoff``; ``Retry-After`` waits are recorded, not slept.
"""

from __future__ import annotations

import logging
import time

import pytest

from extension.client import WmlaClient, WmlaError
from extension.retry import IDEMPOTENCY_HEADER, Retrying
from tests.client.stub import Stub

BODY = {"plan": "/p", "workers": 1, "command": {"model_dir": "m", "model_main": "main.py"}}


@pytest.fixture
def stub():
    stub = Stub().start()
    try:
        yield stub
    finally:
        stub.stop()


class Recorder:
    """``on_retry`` and ``sleep`` for a client: what it said and how long it would wait."""

    def __init__(self) -> None:
        self.notices: list[Retrying] = []
        self.waits: list[float] = []

    def __call__(self, notice: Retrying) -> None:
        self.notices.append(notice)

    def lines(self) -> list[str]:
        return [str(n) for n in self.notices]


def client_for(stub: Stub, rec: Recorder, sleep: bool = True, **kwargs) -> WmlaClient:
    """A client of ``stub``; ``sleep=False`` records the waits instead of sleeping them."""
    kwargs.setdefault("retry_seconds", 10)
    kwargs.setdefault("backoff", 0.01)
    kwargs.setdefault("max_backoff", 0.05)
    return WmlaClient(
        url=stub.url, token="t0k", env={}, on_retry=rec,
        sleep=None if sleep else rec.waits.append, **kwargs,
    )  # fmt: skip


def test_html_503s_then_201_gives_one_job_with_one_key_on_every_try(stub: Stub) -> None:
    stub.script = ["html503", "html502", "html504", "html503"]
    rec = Recorder()
    job = client_for(stub, rec).submit(BODY)
    assert job["id"] == "j1" and list(stub.jobs) == ["j1"]
    keys = stub.keys_sent()
    assert len(keys) == 5 and len(set(keys)) == 1 and keys[0] and len(keys[0]) == 32
    lines = rec.lines()
    assert len(lines) == 4
    assert lines[0].startswith(
        "the wmla service is unavailable (HTTP 503 from the hub's proxy), retrying in "
    )
    assert "(HTTP 502)" in lines[1] and "(HTTP 504)" in lines[2]
    assert all("giving up in" in line and line.endswith("...") for line in lines)
    assert not any("<" in line for line in lines)  # no HTML reaches the user


def test_each_submission_has_its_own_key(stub: Stub) -> None:
    client = client_for(stub, Recorder())
    client.submit(BODY)
    client.submit(BODY)
    first, second = stub.keys_sent()
    assert first != second and list(stub.jobs) == ["j1", "j2"]


def test_a_chosen_key_is_sent_and_the_same_key_returns_the_same_job(stub: Stub) -> None:
    client = client_for(stub, Recorder())
    one = client.submit(BODY, idempotency_key="nb-cell:42")
    two = client.submit(BODY, idempotency_key="nb-cell:42")
    assert one["id"] == two["id"] == "j1" and len(stub.jobs) == 1
    assert stub.keys_sent() == ["nb-cell:42", "nb-cell:42"]
    with pytest.raises(WmlaError, match="idempotency key 'a b'"):
        client.submit(BODY, idempotency_key="a b")


def test_a_stored_job_whose_answer_was_lost_is_not_submitted_twice(stub: Stub) -> None:
    """The service stored the job and died before answering; the retry gets that job."""
    stub.script = ["drop", "html503"]
    rec = Recorder()
    job = client_for(stub, rec).submit(BODY)
    assert len(stub.jobs) == 1 and job == stub.jobs["j1"]
    keys = stub.keys_sent()
    assert len(keys) == 3 and len(set(keys)) == 1
    assert rec.lines()[0].startswith(
        "the connection to the wmla service was lost before its answer, retrying in"
    )


def test_retry_after_is_honoured_from_the_header_and_from_the_json(stub: Stub) -> None:
    stub.script = ["json503:3", "body503:2", "json503:0"]
    rec = Recorder()
    job = client_for(stub, rec, sleep=False, retry_seconds=60).submit(BODY)
    assert job["id"] == "j1"
    three, two, zero = rec.waits
    assert 3 <= three <= 3.3 and 2 <= two <= 2.2
    assert 0.01 <= zero <= 0.011  # "now" still waits the backoff: no busy loop
    assert [n.status for n in rec.notices] == [503, 503, 503]
    assert rec.lines()[0].startswith(
        "the wmla service is unavailable (HTTP 503: the store is unavailable (database is "
        "locked); try again shortly), retrying in 3"
    )


def test_retry_after_past_the_deadline_waits_only_until_it(stub: Stub) -> None:
    stub.script = ["json503:30", "json503:30"]
    rec = Recorder()
    with pytest.raises(WmlaError):
        client_for(stub, rec, retry_seconds=0.2).submit(BODY)
    assert len(rec.notices) == 1 and rec.notices[0].delay <= 0.2


def test_the_backoff_doubles_with_jitter_up_to_its_cap(stub: Stub) -> None:
    stub.script = ["html503"] * 7
    rec = Recorder()
    client_for(stub, rec, sleep=False, backoff=0.5, max_backoff=5.0).jobs()
    waits = rec.waits
    assert len(waits) == 7
    for i, wait in enumerate(waits):
        base = min(5.0, 0.5 * 2**i)
        assert 0.75 * base <= wait <= min(5.0, 1.25 * base), (i, waits)
    assert max(waits) <= 5.0


def test_gets_and_deletes_are_retried_too(stub: Stub) -> None:
    client = client_for(stub, Recorder())
    job = client.submit(BODY)
    stub.script = ["html503", "drop"]
    assert client.job(job["id"])["id"] == job["id"]
    stub.script = ["drop", "json503:0"]
    assert client.cancel(job["id"])["state"] == "CANCELLED"
    assert [m for m, _, _ in stub.seen] == ["POST"] + ["GET"] * 3 + ["DELETE"] * 3


def test_a_refused_connection_is_retried_until_the_service_is_back(stub: Stub) -> None:
    """The hub restarts the service: nothing listens for a while, then it answers."""
    stub.down()
    rec = Recorder()

    def on_retry(notice: Retrying) -> None:
        rec(notice)
        if len(rec.notices) == 3:
            stub.up()

    client = client_for(stub, rec)
    client.on_retry = on_retry
    job = client.submit(BODY)
    assert job["id"] == "j1" and stub.submissions() == 1  # nothing reached it while down
    assert rec.lines()[0].startswith(
        "cannot connect to the wmla service (connection refused), retrying in"
    )


@pytest.mark.parametrize(
    "step, status, message",
    [
        ("400", 400, "bad request: workers: must be at least 1"),
        ("422", 422, "job rejected: /p allows 2 gpu; the job asks for 4 gpu"),
    ],
)
def test_a_refusal_is_not_retried(stub: Stub, step: str, status: int, message: str) -> None:
    stub.script = [step]
    rec = Recorder()
    with pytest.raises(WmlaError) as err:
        client_for(stub, rec).submit(BODY)
    assert err.value.status == status and str(err.value) == message
    assert stub.submissions() == 1 and rec.notices == []


def test_a_key_reused_for_another_body_is_the_services_422(stub: Stub) -> None:
    client = client_for(stub, Recorder())
    client.submit(BODY, idempotency_key="k1")
    with pytest.raises(WmlaError, match="rejected: Idempotency-Key: this key was used") as err:
        client.submit({**BODY, "workers": 2}, idempotency_key="k1")
    assert err.value.status == 422 and stub.submissions() == 2


def test_a_post_without_a_key_is_not_retried_once_it_may_have_arrived(stub: Stub) -> None:
    client = client_for(stub, Recorder())
    for step in ("drop", "html503"):
        stub.seen.clear()
        stub.script = [step]
        with pytest.raises(WmlaError):
            client.request("POST", "plans", body={"path": "/x"})
        assert len(stub.seen) == 1, step


def test_a_post_without_a_key_is_retried_when_it_never_left(stub: Stub) -> None:
    stub.down()
    rec = Recorder()

    def on_retry(notice: Retrying) -> None:
        rec(notice)
        stub.up()

    client = client_for(stub, rec)
    client.on_retry = on_retry
    with pytest.raises(WmlaError, match="not found: no plans"):  # the stub has no POST plans
        client.request("POST", "plans", body={"path": "/x"})
    assert len(rec.notices) == 1 and len(stub.seen) == 1


def test_the_request_helper_gives_a_job_post_a_key_too(stub: Stub) -> None:
    """The spawner submits through request("POST", "jobs"): it gets a key as well."""
    stub.script = ["drop"]
    client = client_for(stub, Recorder())
    job = client.request("POST", "jobs", body=BODY)
    assert job["id"] == "j1" and len(stub.jobs) == 1
    keys = stub.keys_sent()
    assert len(keys) == 2 and keys[0] == keys[1] and keys[0]


def test_the_deadline_ends_with_a_clean_message(stub: Stub) -> None:
    stub.script = ["html503"] * 1000
    rec = Recorder()
    began = time.monotonic()
    with pytest.raises(WmlaError) as err:
        client_for(stub, rec, retry_seconds=0.4).submit(BODY)
    took = time.monotonic() - began
    assert 0.4 <= took < 3
    text = str(err.value)
    assert err.value.status == 503
    assert text.startswith(
        f"the wmla service at {stub.url}/services/wmla/api/v1/ is unavailable (HTTP 503 from "
        f"the hub's proxy), tried "
    )
    assert (
        "The service is stopped or restarting: check it on the hub's Services page or ask your "
        "administrator, then try again. WMLA_RETRY_SECONDS sets how long to keep trying (now "
        "0.4 s)." in text
    )
    assert "The job may have been stored" in text  # a proxy's 503 may follow a lost answer
    assert "<" not in text and "Traceback" not in text
    assert len(rec.notices) >= 3 and len(set(stub.keys_sent())) == 1


def test_the_deadline_for_an_unreachable_service_says_where_it_looked(stub: Stub) -> None:
    stub.down()
    rec = Recorder()
    with pytest.raises(WmlaError) as err:
        client_for(stub, rec, retry_seconds=0.2).plans()
    text = str(err.value)
    assert err.value.status == 0
    assert text.startswith(
        f"cannot reach the wmla service at {stub.url}/services/wmla/api/v1/ (connection "
        f"refused), tried "
    )
    assert "Is the hub running, and is this its address? (set WMLA_URL" in text
    assert "may have been stored" not in text and len(rec.notices) >= 2


def test_the_services_own_503_says_its_reason_and_that_nothing_was_stored(stub: Stub) -> None:
    stub.script = ["json503:0"] * 1000
    with pytest.raises(WmlaError) as err:
        client_for(stub, Recorder(), retry_seconds=0.2).submit(BODY)
    text = str(err.value)
    assert text.startswith(
        f"the wmla service at {stub.url}/services/wmla/api/v1/ is unavailable (HTTP 503: the "
        f"store is unavailable (database is locked); try again shortly), tried "
    )
    assert "may have been stored" not in text  # the service said it could not store it


def test_no_retries_with_0_seconds(stub: Stub) -> None:
    stub.script = ["html503", "html503"]
    rec = Recorder()
    with pytest.raises(WmlaError) as err:
        client_for(stub, rec, retry_seconds=0).plans()
    assert "is unavailable (HTTP 503 from the hub's proxy). The service is stopped" in str(
        err.value
    )
    assert str(err.value).endswith("Retries are off (WMLA_RETRY_SECONDS is 0).")
    assert rec.notices == [] and len(stub.seen) == 1


def test_the_retry_seconds_come_from_the_environment(stub: Stub) -> None:
    assert WmlaClient(url=stub.url, token="t", env={}).retry_seconds == 60
    env = {"WMLA_RETRY_SECONDS": "2.5"}
    assert WmlaClient(url=stub.url, token="t", env=env).retry_seconds == 2.5
    assert WmlaClient(url=stub.url, token="t", env=env, retry_seconds=0).retry_seconds == 0
    for bad in ("soon", "-1", "inf", "nan"):
        with pytest.raises(WmlaError, match=f"WMLA_RETRY_SECONDS is how many seconds.*{bad}"):
            WmlaClient(url=stub.url, token="t", env={"WMLA_RETRY_SECONDS": bad})


def test_without_a_callback_the_retries_are_logged(stub: Stub, caplog) -> None:
    stub.script = ["html503"]
    client = WmlaClient(url=stub.url, token="t", env={}, backoff=0.01)
    with caplog.at_level(logging.WARNING, logger="extension.client"):
        client.plans()
    assert "HTTP 503 from the hub's proxy), retrying in" in caplog.text


def test_the_key_header_is_named_as_the_service_expects() -> None:
    assert IDEMPOTENCY_HEADER == "Idempotency-Key"
