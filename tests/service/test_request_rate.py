"""Each user's requests bounded (c.RequestRate, extension/service/request_rate.py): one tenant
flooding the API gets its burst and its rate, answered 429 with ``Retry-After`` and a message
past them, while another user and the hub's own services go on; the buckets' arithmetic with a
clock of the test's; bad settings refused naming the setting.

The hub is the real one (hub, proxy, service) with ``per_second`` 0.5 and ``burst`` 5, so a
burst of requests meets the limit within the test's first second whatever the machine's load."""

from __future__ import annotations

import concurrent.futures
import logging
import time

import pytest
import requests
from traitlets import TraitError

from extension.service.request_rate import RequestRate, UserBuckets

from .hub import PROXY, Client, Hub

BURST = 5
RATE = 0.5


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_gives_its_burst_then_its_rate_per_user() -> None:
    clock = Clock()
    buckets = UserBuckets(2.0, 3, clock)
    assert [buckets.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert buckets.take("a") == pytest.approx(0.5)  # one token back in half a second
    assert buckets.take("b") == 0.0  # another user's bucket is full
    clock.now += 0.5
    assert buckets.take("a") == 0.0 and buckets.take("a") == pytest.approx(0.5)
    clock.now += 60
    assert [buckets.take("a") for _ in range(4)][-1] > 0  # refilled to the burst, no more
    message = buckets.message("a", 0.5)
    assert "more than 3 requests at once" in message and "c.RequestRate" in message


def test_refusals_are_logged_as_a_count_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    buckets = UserBuckets(1.0, 1, clock, logging.getLogger("t-rate"))
    with caplog.at_level(logging.WARNING, "t-rate"):
        for _ in range(1000):
            buckets.take("mallory")
        assert not caplog.records  # not a line a refusal
        clock.now += 61
        buckets.take("mallory")
        buckets.take("mallory")
    assert len(caplog.records) == 1
    assert "in the last 61 s: mallory 1000" in caplog.records[0].getMessage()


def test_a_refused_request_costs_nothing_more() -> None:
    """Refusals spend no token: a client that keeps knocking is let in as soon as one is back."""
    clock = Clock()
    buckets = UserBuckets(1.0, 1, clock)
    assert buckets.take("a") == 0.0
    for _ in range(100):
        assert buckets.take("a") > 0
    clock.now += 1.0
    assert buckets.take("a") == 0.0


@pytest.mark.parametrize(
    "values, message",
    [
        ({"per_second": -1.0}, "c.RequestRate.per_second must be 0 (no limit) or a positive"),
        ({"per_second": float("nan")}, "c.RequestRate.per_second must be 0"),
        ({"per_second": float("inf")}, "c.RequestRate.per_second must be 0"),
        ({"burst": 0}, "c.RequestRate.burst must be 1 or more"),
    ],
)
def test_bad_settings_are_refused_naming_them(values: dict, message: str) -> None:
    with pytest.raises(TraitError, match=message.replace("(", r"\(").replace(")", r"\)")):
        RequestRate(**values)


def test_no_limit_is_no_buckets() -> None:
    assert RequestRate(per_second=0).buckets() is None
    assert isinstance(RequestRate().buckets(), UserBuckets)


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory):
    if not PROXY.exists():
        pytest.skip("configurable-http-proxy is missing: run `make install`")
    sections = {"RequestRate": {"per_second": RATE, "burst": BURST}}
    hub = Hub(tmp_path_factory.mktemp("rate-hub"), {"tick": 1}, sections)
    try:
        hub.start()
        yield hub
    finally:
        hub.stop()


def test_a_flooding_user_gets_its_burst_and_429s_while_another_goes_on(hub: Hub) -> None:
    flooder = Client(hub, hub.user_token("user1"))
    other = Client(hub, hub.user_token("user2"))
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: flooder.get("/jobs"), range(40)))
    elapsed = time.monotonic() - start
    codes = [r.status_code for r in answers]
    assert set(codes) <= {200, 429}, codes
    allowed = BURST + int(elapsed * RATE) + 1
    assert BURST <= codes.count(200) <= allowed, (codes, elapsed)
    refused = next(r for r in answers if r.status_code == 429)
    body = refused.json()
    assert body["status"] == 429 and body["retry_after"] >= 1
    assert int(refused.headers["Retry-After"]) == body["retry_after"]
    assert "user1 made more than 5 requests at once" in body["error"]
    assert "c.RequestRate" in body["error"]
    # the other tenant is not held by user1's flood
    assert [other.get("/jobs").status_code for _ in range(BURST)] == [200] * BURST
    # the wait it was told is enough
    again = flooder.get("/jobs")
    if again.status_code == 429:
        time.sleep(int(again.headers["Retry-After"]))
    assert flooder.get("/jobs").status_code == 200


def test_the_admin_page_says_429_in_html(hub: Hub) -> None:
    """Sent at once (a page may take seconds to render on a loaded machine, and a token comes
    back every two seconds, so requests one after another might never meet the limit)."""
    token = hub.user_token("padmin")
    headers = {"Authorization": f"token {token}"}
    url = f"{hub.url}/services/wmla/admin/instance"
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(
            pool.map(
                lambda _: requests.get(url, headers=headers, timeout=60, allow_redirects=False),
                range(4 * BURST),
            )
        )
    codes = [r.status_code for r in answers]
    assert set(codes) <= {200, 429} and 429 in codes, codes
    r = next(r for r in answers if r.status_code == 429)
    assert r.headers["Retry-After"].isdigit() and "text/html" in r.headers["Content-Type"]
    assert "padmin made more than 5 requests at once" in r.text
    assert "Traceback" not in hub.log()
