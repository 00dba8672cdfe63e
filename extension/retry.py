"""The client's retries while the wmla service is unavailable: what counts as a failure worth
another try, how long to wait, and what to say when giving up.

While the hub restarts the service its proxy answers 502/503/504 (an HTML page), and a
connection may be refused or dropped; the service itself answers 503 JSON with ``Retry-After``
while its store is unavailable. Every call is tried again on those, for up to ``retry_seconds``
in all (argument, else ``$WMLA_RETRY_SECONDS``, else :data:`RETRY_SECONDS`; 0 tries once),
waiting what ``Retry-After`` says, else 0.5 s doubling to at most 5 s with jitter, and saying so
through ``on_retry`` (a :class:`Retrying` notice; by default a warning on the
``extension.client`` logger). GET, PUT and DELETE are retried on any of them; a POST only when
it carries an ``Idempotency-Key`` (every job submission does: one key per submission, the same
on each try, so the service answers a repeat with the job it already stored), else only when
the request surely never reached the server (the connection was refused). When the time is up
the error says what happened and what to do; the proxy's HTML never reaches the user.

The loop itself is :meth:`extension.client.WmlaClient.request`; this module holds its parts,
each a plain function of what it needs, so they read (and test) one at a time.
"""

from __future__ import annotations

import email.utils
import math
import random
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import requests
import urllib3.exceptions

from extension.clienterrors import WmlaError

RETRY_SECONDS = 60.0  # how long a call keeps trying while the service is unavailable
MAX_RETRY_SECONDS = 24 * 3600.0
BACKOFF = 0.5  # first wait between tries without Retry-After, doubling ...
MAX_BACKOFF = 5.0  # ... up to this
RETRY_STATUSES = frozenset({502, 503, 504})  # the proxy's answers while the service restarts
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
IDEMPOTENCY_HEADER = "Idempotency-Key"
IDEMPOTENCY_KEY = re.compile(r"[A-Za-z0-9._:-]{1,128}\Z")

# the advice that ends an error once no more tries are made
REACH = "Is the hub running, and is this its address? (set WMLA_URL or run `wmla logon --url ...`)"
AGAIN = "Try again in a moment; if it keeps happening, ask your administrator."
DOWN = (
    "The service is stopped or restarting: check it on the hub's Services page or ask your "
    "administrator, then try again."
)


# -- the policy: which calls, how long ---------------------------------------------------------
def new_idempotency_key() -> str:
    """A fresh ``Idempotency-Key``: one per logical submission, reused on each of its tries."""
    return uuid.uuid4().hex


def idempotency_headers(key: str | None) -> dict[str, str]:
    """The request's headers for ``key`` (none without one); a malformed key is refused."""
    if key is None:
        return {}
    if not isinstance(key, str) or not IDEMPOTENCY_KEY.match(key):
        raise WmlaError(f"idempotency key {key!r}: 1 to 128 letters, digits or . _ : -")
    return {IDEMPOTENCY_HEADER: key}


def retry_seconds_from(value: float | str | None, env: Mapping[str, str]) -> float:
    """How long calls keep retrying: ``value``, else ``$WMLA_RETRY_SECONDS``, else 60 s."""
    where = "retry_seconds"
    if value is None:
        value = env.get("WMLA_RETRY_SECONDS") or None
        where = "WMLA_RETRY_SECONDS"
    if value is None:
        return RETRY_SECONDS
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if not 0 <= seconds <= MAX_RETRY_SECONDS:  # also NaN and inf
        raise WmlaError(
            f"{where} is how many seconds to keep retrying while the service is unavailable: "
            f"0 (try once) to {MAX_RETRY_SECONDS:g}, e.g. 60; got {value!r}"
        )
    return seconds


def backoff_delay(
    attempt: int, retry_after: float | None, backoff: float, max_backoff: float
) -> float:
    """Seconds to wait after try ``attempt``: what the service asks, else doubling ``backoff``."""
    if retry_after is not None:  # as the service asks (at least ``backoff``), spread a bit
        return max(retry_after, backoff) * random.uniform(1.0, 1.1)
    base = min(max_backoff, backoff * 2 ** min(attempt - 1, 30))
    return min(max_backoff, base * random.uniform(0.75, 1.25))


# -- what one failed try was -------------------------------------------------------------------
@dataclass(frozen=True)
class Retrying:
    """What ``on_retry`` is told before each wait: why the last try failed and what comes next.

    ``str()`` is the line to show, e.g. ``the wmla service is unavailable (HTTP 503 from the
    hub's proxy), retrying in 2 s (giving up in 55 s) ...``."""

    reason: str  # why the last try failed, a clause for a person
    status: int  # its HTTP status; 0 when there was no answer (connection refused, lost, ...)
    delay: float  # seconds until the next try
    attempt: int  # tries made so far
    left: float  # seconds until the client gives up
    method: str
    url: str

    def __str__(self) -> str:
        return (
            f"{self.reason}, retrying in {seconds_text(self.delay)} "
            f"(giving up in {seconds_text(self.left)}) ..."
        )


def seconds_text(value: float) -> str:
    """``0.5 s``, ``2 s``, ``55 s``: a tenth of a second only where it matters."""
    if value < 9.5:
        text = f"{value:.1f}".rstrip("0").rstrip(".")
        return f"{text or '0'} s"
    return f"{value:.0f} s"


@dataclass
class Failure:
    """One try that gave no answer to keep: ``reason`` for the progress line; ``summary`` (with
    the address) and ``advice`` for the error when no more tries are made."""

    reason: str
    summary: str
    advice: str
    status: int = 0
    retryable: bool = True  # worth another try at all
    sent: bool = True  # the request may have reached the service
    stored: bool = True  # ... and may have been acted on (the service's own 503 says not)
    retry_after: float | None = None


def retry_after(r: requests.Response, data: Any) -> float | None:
    """Seconds from ``Retry-After`` (seconds or an HTTP date), else the JSON's ``retry_after``."""
    header = r.headers.get("Retry-After")
    value: Any = header
    if header is not None:
        try:
            value = float(header)
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(header)
                value = when.timestamp() - time.time()
            except (TypeError, ValueError, IndexError, OverflowError):
                value = None
    elif isinstance(data, dict):
        value = data.get("retry_after")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return None
    return max(0.0, min(float(value), MAX_RETRY_SECONDS))


def transport_failure(err: requests.RequestException, url: str, timeout: float) -> Failure:
    """A request to the API at ``url`` that got no answer: refused (never sent), lost, timed
    out, ..."""
    wrapped = err.args[0] if err.args else None
    cause = getattr(wrapped, "reason", wrapped)  # MaxRetryError wraps what happened
    where = f"the wmla service at {url}"
    if isinstance(err, requests.exceptions.SSLError):
        return Failure(f"TLS failed: {cause}", f"cannot talk to {where} over TLS ({cause})",
                       "Check the address's scheme (http or https) and the hub's certificate.",
                       retryable=False, sent=False)  # fmt: skip
    if isinstance(cause, urllib3.exceptions.NameResolutionError):
        host = urlparse(url).hostname
        return Failure(f"{host} is not a known host name",
                       f"cannot reach {where} ({host!r} is not a known host name)", REACH,
                       retryable=False, sent=False)  # fmt: skip
    # NewConnectionError (refused, unreachable) is a ConnectTimeoutError: nothing was sent
    if isinstance(err, requests.ConnectTimeout) or isinstance(
        cause, urllib3.exceptions.ConnectTimeoutError
    ):
        text = str(cause).lower()
        what = "connection refused" if "refused" in text else "cannot connect"
        if isinstance(err, requests.ConnectTimeout) or "timed out" in text:
            what = "connection timed out"
        reason = f"cannot connect to the wmla service ({what})"
        summary = f"cannot reach {where} ({what})"
        return Failure(reason, summary, REACH, sent=False, stored=False)
    if isinstance(err, requests.Timeout):
        return Failure(f"no answer from the wmla service within {timeout:g} s",
                       f"{where} did not answer within {timeout:g} s", AGAIN)  # fmt: skip
    if isinstance(err, (requests.ConnectionError, requests.exceptions.ChunkedEncodingError)):
        return Failure("the connection to the wmla service was lost before its answer",
                       f"the connection to {where} was lost before its answer", AGAIN)  # fmt: skip
    return Failure(str(err), f"calling {where} failed ({err})", AGAIN, retryable=False)


def one_line(text: Any) -> str:
    """The service's words as one line of at most 300 characters, for a message."""
    return " ".join(str(text).split())[:300]


def status_failure(r: requests.Response, data: Any, url: str) -> Failure:
    """A 502/503/504 from the API at ``url``: the proxy's page while the service is down, or the
    service's own 503."""
    status = r.status_code
    where = f"the wmla service at {url}"
    if isinstance(data, dict) and data.get("error") and data.get("source") != "proxy":
        error = one_line(data["error"])
        # the service's own answer: it is up but cannot take the request now (store down)
        return Failure(f"the wmla service is unavailable (HTTP {status}: {error})",
                       f"{where} is unavailable (HTTP {status}: {error})", AGAIN, status,
                       stored=status != 503, retry_after=retry_after(r, data))  # fmt: skip
    reason = {
        502: "the hub's proxy got no answer from the wmla service (HTTP 502)",
        504: "the hub's proxy timed out waiting for the wmla service (HTTP 504)",
    }.get(status, f"the wmla service is unavailable (HTTP {status} from the hub's proxy)")
    summary = f"{where} is unavailable (HTTP {status} from the hub's proxy)"
    return Failure(reason, summary, DOWN, status, retry_after=retry_after(r, data))


def throttled_failure(r: requests.Response, data: Any, url: str) -> Failure:
    """A 429 with ``Retry-After``: the service refused the request for the user's request rate
    (c.RequestRate) before doing anything for it, so any method may be sent again once the wait
    is over. (The pending-jobs cap's 429 has no ``Retry-After``: it is final.)"""
    error = one_line((data.get("error") if isinstance(data, dict) else None) or "too many requests")
    return Failure(f"the wmla service asks to slow down (HTTP 429: {error})",
                   f"the wmla service at {url} refused the request for its rate ({error})",
                   "Poll less often; the limit is the administrator's c.RequestRate.", 429,
                   sent=False, stored=False, retry_after=retry_after(r, data))  # fmt: skip


# -- giving up ---------------------------------------------------------------------------------
def give_up(
    failure: Failure,
    attempt: int,
    elapsed: float,
    out_of_time: bool,
    stored: bool,
    retry_seconds: float,
) -> WmlaError:
    """The error once no more tries are made: what happened, how long it was tried, what
    to do (never the proxy's HTML)."""
    text = failure.summary
    if attempt > 1:
        text += f", tried {attempt} times in {seconds_text(elapsed)}"
    text += ". " + failure.advice
    if out_of_time:
        if retry_seconds:
            text += (
                f" WMLA_RETRY_SECONDS sets how long to keep trying (now "
                f"{seconds_text(retry_seconds)})."
            )
        else:
            text += " Retries are off (WMLA_RETRY_SECONDS is 0)."
    if stored:
        text += (
            " The job may have been stored before an answer was lost: list your jobs "
            "(`wmla exec-get` or %wmla_jobs) before submitting it again."
        )
    return WmlaError(text, failure.status)
