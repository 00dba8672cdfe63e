"""One REST client for the wmla service, shared by the notebook magics, the widgets and the CLI.

Where the service is and who is calling, first match wins:

1. explicit ``url=`` / ``token=`` arguments;
2. ``$WMLA_URL`` and ``$WMLA_TOKEN``;
3. the file ``wmla logon`` writes (``$WMLA_CONFIG``, default ``~/.wmla/config.json``);
4. what a notebook server spawned by JupyterHub has: ``$JUPYTERHUB_API_TOKEN`` and the hub's
   address (``$JUPYTERHUB_PUBLIC_HUB_URL`` when the hub has a public URL, else
   ``$JUPYTERHUB_API_URL``, whose host serves ``/services/<name>/`` when it is the proxy; when it
   is the hub's own API port the hub is asked where the service listens).

``WMLA_URL`` may name the hub (``http://host:8000``), the service (``.../services/wmla/``) or its
API (``.../services/wmla/api/v1``). The service name is ``$WMLA_SERVICE_NAME`` (default wmla).

Every failure is a :class:`WmlaError` whose message says what went wrong and what to do, e.g.
``job rejected: /project1/qa-team allows 2 gpu ...``; ``status`` keeps the HTTP status (0 when the
service could not be reached).

Retries. While the hub restarts the service its proxy answers 502/503/504 (an HTML page), and a
connection may be refused or dropped; the service itself answers 503 JSON with ``Retry-After``
while its store is unavailable. Every call is tried again on those, for up to ``retry_seconds``
in all (argument, else ``$WMLA_RETRY_SECONDS``, else :data:`RETRY_SECONDS`; 0 tries once),
waiting what ``Retry-After`` says, else 0.5 s doubling to at most 5 s with jitter, and saying so
through ``on_retry`` (a :class:`Retrying` notice; by default a warning on this module's logger).
GET, PUT and DELETE are retried on any of them; a POST only when it carries an
``Idempotency-Key`` (every job submission does: one key per submission, the same on each try,
so the service answers a repeat with the job it already stored), else only when the request
surely never reached the server (the connection was refused). When the time is up the error says
what happened and what to do; the proxy's HTML never reaches the user.
"""

from __future__ import annotations

import email.utils
import json
import logging
import math
import os
import random
import re
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

import requests
import urllib3.exceptions

from extension.scheduler import FINAL_STATES  # noqa: F401 - the final states, one definition

API_PATH = "api/v1"
DEFAULT_SERVICE = "wmla"
TIMEOUT = 30.0
RETRY_SECONDS = 60.0  # how long a call keeps trying while the service is unavailable
MAX_RETRY_SECONDS = 24 * 3600.0
BACKOFF = 0.5  # first wait between tries without Retry-After, doubling ...
MAX_BACKOFF = 5.0  # ... up to this
RETRY_STATUSES = frozenset({502, 503, 504})  # the proxy's answers while the service restarts
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})
IDEMPOTENCY_HEADER = "Idempotency-Key"
IDEMPOTENCY_KEY = re.compile(r"[A-Za-z0-9._:-]{1,128}\Z")
log = logging.getLogger(__name__)


class WmlaError(Exception):
    """A failure with a message meant for the person at the keyboard."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.status = status

    def __str__(self) -> str:
        return self.message


def config_path() -> Path:
    """Where ``wmla logon`` keeps the URL and token."""
    return Path(os.environ.get("WMLA_CONFIG") or Path.home() / ".wmla" / "config.json")


def load_config(path: Path | None = None) -> dict:
    path = path or config_path()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        raise WmlaError(f"cannot read {path}: {err}; run `wmla logon` again") from None
    return data if isinstance(data, dict) else {}


def save_config(data: Mapping[str, Any], path: Path | None = None) -> Path:
    """Write the logon file readable by its owner only, atomically."""
    path = path or config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(dict(data), out, indent=1)
    os.replace(tmp, path)
    return path


def api_url(url: str, service: str = DEFAULT_SERVICE) -> str:
    """Normalise a hub, service or API address to the service's API base ending in ``/``.

    >>> api_url("http://h:8000")
    'http://h:8000/services/wmla/api/v1/'
    >>> api_url("http://h:8000/services/wmla/")
    'http://h:8000/services/wmla/api/v1/'
    """
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise WmlaError(
            f"{url!r} is not an http(s) address; give the hub's address such as "
            f"http://127.0.0.1:8000 (or set WMLA_URL)"
        )
    base = url.rstrip("/")
    if base.endswith("/" + API_PATH):
        return base + "/"
    if parsed.path.rstrip("/").endswith(f"/services/{service}"):
        return base + "/" + API_PATH + "/"
    if base.endswith("/hub/api"):
        base = base[: -len("/hub/api")]
    elif base.endswith("/hub"):
        base = base[: -len("/hub")]
    return f"{base}/services/{service}/{API_PATH}/"


def _from_hub_env(env: Mapping[str, str], service: str) -> str | None:
    public = env.get("JUPYTERHUB_PUBLIC_HUB_URL") or env.get("JUPYTERHUB_PUBLIC_URL")
    if public and urlparse(public).netloc:
        return api_url(public, service)
    hub_api = env.get("JUPYTERHUB_API_URL")
    if not hub_api:
        return None
    token = env.get("JUPYTERHUB_API_TOKEN")
    # The hub knows where its service listens; ask (needs read:services, which a user's token
    # may lack: then assume the API URL's host is the proxy, true when the hub was reached
    # through it).
    if token:
        try:
            r = requests.get(
                f"{hub_api.rstrip('/')}/services/{quote(service)}",
                headers={"Authorization": f"token {token}"},
                timeout=5,
            )
            if r.status_code == 200:
                model = r.json()
                if model.get("url") and model.get("prefix"):
                    return model["url"].rstrip("/") + model["prefix"].rstrip("/") + "/api/v1/"
        except (requests.RequestException, ValueError):
            pass
    return api_url(hub_api, service)


def resolve(
    url: str | None = None,
    token: str | None = None,
    env: Mapping[str, str] | None = None,
    config: Mapping[str, Any] | None = None,
) -> tuple[str, str]:
    """(API base URL, token) from arguments, environment, logon file, notebook environment."""
    env = os.environ if env is None else env
    service = env.get("WMLA_SERVICE_NAME") or DEFAULT_SERVICE
    if config is None:
        config = load_config()
    url = url or env.get("WMLA_URL") or config.get("url")
    token = token or env.get("WMLA_TOKEN") or config.get("token")
    if not url:
        url = _from_hub_env(env, service)
    else:
        url = api_url(url, service)
    token = token or env.get("JUPYTERHUB_API_TOKEN")
    if not url:
        raise WmlaError(
            "where is the wmla service? Run `wmla logon --url http://HUB:8000 --username NAME`, "
            "or set WMLA_URL (the hub's address) and WMLA_TOKEN; in a notebook spawned by "
            "JupyterHub this comes from JUPYTERHUB_API_URL"
        )
    if not token:
        raise WmlaError(
            "no token: run `wmla logon`, or set WMLA_TOKEN to a hub API token (hub page "
            "Token -> Request new API token); a notebook server has JUPYTERHUB_API_TOKEN"
        )
    return url, token


def explain(status: int, message: str, what: str) -> str:
    """Turn the service's ``{"error", "status"}`` into a sentence for a data scientist."""
    message = (message or "").strip() or "no details"
    if status == 422:
        if message.startswith("rejected: "):  # the core's own wording already says it
            message = message[len("rejected: ") :]
        return f"{what} rejected: {message}"
    if status == 403:
        if "token" in message or "authenticated" in message:
            return (
                f"the wmla service refused your credentials ({message}); run `wmla logon` "
                f"again or check WMLA_TOKEN / JUPYTERHUB_API_TOKEN"
            )
        return f"not allowed: {message}"
    if status == 404:
        return f"not found: {message}"
    if status == 409:
        return f"{what} refused: {message}"
    if status == 400:
        return f"bad request: {message}"
    if status >= 500:
        return f"the wmla service failed ({status}: {message}); ask your administrator"
    return f"{what} failed ({status}): {message}"


def new_idempotency_key() -> str:
    """A fresh ``Idempotency-Key``: one per logical submission, reused on each of its tries."""
    return uuid.uuid4().hex


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
            f"{self.reason}, retrying in {_seconds(self.delay)} "
            f"(giving up in {_seconds(self.left)}) ..."
        )


def _seconds(value: float) -> str:
    if value < 9.5:
        text = f"{value:.1f}".rstrip("0").rstrip(".")
        return f"{text or '0'} s"
    return f"{value:.0f} s"


@dataclass
class _Failure:
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


def _retry_after(r: requests.Response, data: Any) -> float | None:
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


REACH = "Is the hub running, and is this its address? (set WMLA_URL or run `wmla logon --url ...`)"
AGAIN = "Try again in a moment; if it keeps happening, ask your administrator."
DOWN = (
    "The service is stopped or restarting: check it on the hub's Services page or ask your "
    "administrator, then try again."
)


def _transport_failure(err: requests.RequestException, client: WmlaClient) -> _Failure:
    """A request that got no answer: refused (never sent), lost, timed out, ..."""
    wrapped = err.args[0] if err.args else None
    cause = getattr(wrapped, "reason", wrapped)  # MaxRetryError wraps what happened
    where = f"the wmla service at {client.url}"
    if isinstance(err, requests.exceptions.SSLError):
        return _Failure(f"TLS failed: {cause}", f"cannot talk to {where} over TLS ({cause})",
                        "Check the address's scheme (http or https) and the hub's certificate.",
                        retryable=False, sent=False)  # fmt: skip
    if isinstance(cause, urllib3.exceptions.NameResolutionError):
        host = urlparse(client.url).hostname
        return _Failure(f"{host} is not a known host name",
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
        return _Failure(reason, summary, REACH, sent=False, stored=False)
    if isinstance(err, requests.Timeout):
        return _Failure(f"no answer from the wmla service within {client.timeout:g} s",
                        f"{where} did not answer within {client.timeout:g} s", AGAIN)  # fmt: skip
    if isinstance(err, (requests.ConnectionError, requests.exceptions.ChunkedEncodingError)):
        return _Failure("the connection to the wmla service was lost before its answer",
                        f"the connection to {where} was lost before its answer", AGAIN)  # fmt: skip
    return _Failure(str(err), f"calling {where} failed ({err})", AGAIN, retryable=False)


def _status_failure(r: requests.Response, data: Any, client: WmlaClient) -> _Failure:
    """A 502/503/504: the proxy's page while the service is down, or the service's own 503."""
    status = r.status_code
    where = f"the wmla service at {client.url}"
    if isinstance(data, dict) and data.get("error") and data.get("source") != "proxy":
        error = " ".join(str(data["error"]).split())[:300]
        # the service's own answer: it is up but cannot take the request now (store down)
        return _Failure(f"the wmla service is unavailable (HTTP {status}: {error})",
                        f"{where} is unavailable (HTTP {status}: {error})", AGAIN, status,
                        stored=status != 503, retry_after=_retry_after(r, data))  # fmt: skip
    reason = {
        502: "the hub's proxy got no answer from the wmla service (HTTP 502)",
        504: "the hub's proxy timed out waiting for the wmla service (HTTP 504)",
    }.get(status, f"the wmla service is unavailable (HTTP {status} from the hub's proxy)")
    summary = f"{where} is unavailable (HTTP {status} from the hub's proxy)"
    return _Failure(reason, summary, DOWN, status, retry_after=_retry_after(r, data))


class WmlaClient:
    """Blocking calls to ``/services/wmla/api/v1``; each returns the decoded JSON.

    ``retry_seconds`` (default ``$WMLA_RETRY_SECONDS``, else 60; 0: one try) bounds how long a
    call keeps trying while the service is unavailable; ``on_retry(notice)`` hears of each wait
    (default: a warning on the ``extension.client`` logger); ``backoff``/``max_backoff`` are
    the first and the longest wait without ``Retry-After``; ``sleep`` waits (tests)."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        env: Mapping[str, str] | None = None,
        timeout: float = TIMEOUT,
        session: requests.Session | None = None,
        retry_seconds: float | None = None,
        on_retry: Callable[[Retrying], None] | None = None,
        backoff: float | None = None,
        max_backoff: float | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        env = os.environ if env is None else env
        self.url, self.token = resolve(url, token, env)
        self.timeout = timeout
        self.retry_seconds = retry_seconds_from(retry_seconds, env)
        self.on_retry = on_retry
        self.backoff = BACKOFF if backoff is None else backoff
        self.max_backoff = MAX_BACKOFF if max_backoff is None else max_backoff
        self.sleep = sleep or time.sleep
        self.session = session or requests.Session()
        self.session.headers["Authorization"] = f"token {self.token}"

    @classmethod
    def from_env(cls, **kwargs: Any) -> WmlaClient:
        return cls(**kwargs)

    def __repr__(self) -> str:
        return f"WmlaClient({self.url!r})"

    # -- transport ---------------------------------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        *,
        what: str = "request",
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        idempotency_key: str | None = None,
    ) -> Any:
        """One call, tried again while the service is unavailable (see the module's doc).

        A ``POST jobs`` without ``idempotency_key`` gets a fresh one, the same on every try."""
        method = method.upper()
        url = self.url + path.lstrip("/")
        if idempotency_key is None and method == "POST" and path.strip("/") == "jobs":
            idempotency_key = new_idempotency_key()
        headers = {}
        if idempotency_key is not None:
            if not isinstance(idempotency_key, str) or not IDEMPOTENCY_KEY.match(idempotency_key):
                raise WmlaError(
                    f"idempotency key {idempotency_key!r}: 1 to 128 letters, digits or . _ : -"
                )
            headers[IDEMPOTENCY_HEADER] = idempotency_key
        safe = method in IDEMPOTENT_METHODS or idempotency_key is not None
        submission = method == "POST" and path.strip("/") == "jobs"
        params = {k: v for k, v in (params or {}).items() if v is not None}
        start = time.monotonic()
        attempt, maybe_stored = 0, False
        while True:
            attempt += 1
            try:
                r = self.session.request(
                    method, url, params=params, json=body, headers=headers, timeout=self.timeout
                )
            except requests.RequestException as err:
                failure = _transport_failure(err, self)
            else:
                if r.status_code not in RETRY_STATUSES:
                    return self._answer(r, what)
                failure = _status_failure(r, _json(r), self)
            maybe_stored = maybe_stored or failure.stored
            left = self.retry_seconds - (time.monotonic() - start)
            may_retry = failure.retryable and (safe or not failure.sent)
            if not may_retry or left <= 0:
                elapsed = time.monotonic() - start
                stored = maybe_stored and submission
                raise self._give_up(failure, attempt, elapsed, may_retry, stored)
            delay = min(self._delay(attempt, failure.retry_after), left)
            notice = Retrying(failure.reason, failure.status, delay, attempt, left, method, url)
            if self.on_retry is not None:
                self.on_retry(notice)
            else:
                log.warning("%s", notice)
            self.sleep(delay)

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:  # as the service asks (at least ``backoff``), spread a bit
            return max(retry_after, self.backoff) * random.uniform(1.0, 1.1)
        base = min(self.max_backoff, self.backoff * 2 ** min(attempt - 1, 30))
        return min(self.max_backoff, base * random.uniform(0.75, 1.25))

    def _give_up(
        self, failure: _Failure, attempt: int, elapsed: float, out_of_time: bool, stored: bool
    ) -> WmlaError:
        """The error once no more tries are made: what happened, how long it was tried, what
        to do (never the proxy's HTML)."""
        text = failure.summary
        if attempt > 1:
            text += f", tried {attempt} times in {_seconds(elapsed)}"
        text += ". " + failure.advice
        if out_of_time:
            if self.retry_seconds:
                text += (
                    f" WMLA_RETRY_SECONDS sets how long to keep trying (now "
                    f"{_seconds(self.retry_seconds)})."
                )
            else:
                text += " Retries are off (WMLA_RETRY_SECONDS is 0)."
        if stored:
            text += (
                " The job may have been stored before an answer was lost: list your jobs "
                "(`wmla exec-get` or %wmla_jobs) before submitting it again."
            )
        return WmlaError(text, failure.status)

    def _answer(self, r: requests.Response, what: str) -> Any:
        if r.status_code == 204:
            return None
        data = _json(r)
        if r.status_code >= 400:
            if isinstance(data, dict) and "error" in data:
                raise WmlaError(explain(r.status_code, str(data["error"]), what), r.status_code)
            if r.status_code == 404:
                raise WmlaError(
                    f"the wmla service is not running behind {self.url} (HTTP 404 from the "
                    f"hub's proxy); is WMLA_URL the hub's address? Else ask your administrator "
                    f"to start the service",
                    r.status_code,
                )
            raise WmlaError(explain(r.status_code, r.reason or "", what), r.status_code)
        if data is None:
            raise WmlaError(
                f"{self.url} answered with something that is not JSON; is WMLA_URL the hub's "
                f"address?",
                r.status_code,
            )
        return data

    # -- API -----------------------------------------------------------------------------------
    def whoami(self) -> dict:
        return self.request("GET", "", what="who am I")

    def plans(self) -> dict:
        return self.request("GET", "plans", what="listing plans")

    def plan(self, path: str) -> dict:
        return self.request("GET", "plans" + _plan_path(path), what=f"plan {path}")

    def instance(self) -> dict:
        return self.request("GET", "instance", what="instance")

    def jobs(self, states: list[str] | None = None, user: str | None = None) -> list[dict]:
        params = {"state": ",".join(states) if states else None, "user": user}
        return self.request("GET", "jobs", params=params, what="listing jobs")["jobs"]

    def job(self, job_id: str) -> dict:
        return self.request("GET", f"jobs/{_job(job_id)}", what=f"job {job_id}")

    def submit(self, body: Mapping[str, Any], idempotency_key: str | None = None) -> dict:
        """Submit a job. Every try sends the same ``Idempotency-Key`` (``idempotency_key``, else
        a fresh one), so a try repeated after a lost answer returns the job already stored."""
        key = idempotency_key or new_idempotency_key()
        return self.request("POST", "jobs", body=dict(body), what="job", idempotency_key=key)

    def cancel(self, job_id: str) -> dict:
        return self.request("DELETE", f"jobs/{_job(job_id)}", what=f"cancelling job {job_id}")

    def logs(self, job_id: str, tail: int | None = None, worker: int | None = None) -> str:
        params = {"tail": tail, "worker": worker}
        data = self.request("GET", f"jobs/{_job(job_id)}/logs", params=params, what="logs")
        return data.get("logs", "")

    def metrics(self, job_id: str, since: int = 0) -> tuple[list[dict], int]:
        """(metric lines from line ``since`` on, where to continue)."""
        data = self.request(
            "GET", f"jobs/{_job(job_id)}/metrics", params={"since": since}, what="metrics"
        )
        return list(data.get("metrics", [])), int(data.get("next", since))

    def history(self, job_id: str) -> list[dict]:
        data = self.request("GET", f"jobs/{_job(job_id)}/history", what="job history")
        return data.get("transitions", [])

    def usage(
        self,
        plan: str | None = None,
        user: str | None = None,
        start: float | None = None,
        end: float | None = None,
        step: float | None = None,
    ) -> dict:
        params = {"plan": plan, "user": user, "start": start, "end": end, "step": step}
        return self.request("GET", "usage", params=params, what="usage")

    def wait(
        self,
        job_id: str,
        states: frozenset[str] = frozenset({"FINISHED", "FAILED", "CANCELLED", "REJECTED"}),
        timeout: float | None = None,
        poll: float = 1.0,
        on_update: Any = None,
    ) -> dict:
        """Poll until the job reaches one of ``states``; ``on_update(job)`` after each poll."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if on_update is not None:
                on_update(job)
            if job["state"] in states:
                return job
            if deadline is not None and time.monotonic() > deadline:
                raise WmlaError(
                    f"job {job_id} is still {job['state']} after {timeout:g}s; "
                    f"it keeps running: check it with `wmla exec-get {job_id}`"
                )
            time.sleep(poll)


def _json(r: requests.Response) -> Any:
    try:
        return r.json()
    except ValueError:
        return None


def _job(job_id: str) -> str:
    if not isinstance(job_id, str) or not job_id.strip() or "/" in job_id:
        raise WmlaError(f"{job_id!r} is not a job id; list yours with `wmla exec-get`")
    return quote(job_id.strip(), safe="")


def _plan_path(path: str) -> str:
    if not isinstance(path, str) or not path.startswith("/"):
        raise WmlaError(f"{path!r} is not a plan path; plans look like /project1/dev-team")
    return quote(path, safe="/")
