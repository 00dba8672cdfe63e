"""One REST client for the wmla service, shared by the notebook magics, the widgets and the CLI.

:class:`WmlaClient` makes blocking calls to ``/services/wmla/api/v1``; each returns the decoded
JSON. Its parts live beside it, each in a module named for what it does:

- :mod:`extension.clientconfig`: where the service is and who is calling (arguments,
  ``$WMLA_URL``/``$WMLA_TOKEN``, the ``wmla logon`` file, a notebook's JupyterHub environment);
- :mod:`extension.retry`: the retries while the service restarts (which failures, how long to
  wait, ``Retry-After``, ``Idempotency-Key``, the error when giving up);
- :mod:`extension.clienterrors`: :class:`WmlaError`, whose message says what went wrong and what
  to do (``status`` keeps the HTTP status, 0 when the service could not be reached).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

import requests

from extension.clientconfig import (
    resolve,
)
from extension.clienterrors import WmlaError, explain
from extension.retry import (
    BACKOFF,
    IDEMPOTENT_METHODS,
    MAX_BACKOFF,
    RETRY_STATUSES,
    Failure,
    Retrying,
    backoff_delay,
    give_up,
    idempotency_headers,
    new_idempotency_key,
    retry_seconds_from,
    status_failure,
    throttled_failure,
    transport_failure,
)
from extension.scheduler import FINAL_STATES

TIMEOUT = 30.0
# on_retry's default: a warning on this logger (``extension.client``, which callers configure)
log = logging.getLogger(__name__)


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
        """One call, tried again while the service is unavailable (see :mod:`extension.retry`).

        A ``POST jobs`` without ``idempotency_key`` gets a fresh one, the same on every try."""
        method = method.upper()
        url = self.url + path.lstrip("/")
        submission = method == "POST" and path.strip("/") == "jobs"
        if idempotency_key is None and submission:
            idempotency_key = new_idempotency_key()
        headers = idempotency_headers(idempotency_key)
        # a repeat is harmless when the method is idempotent or the key lets the service see it
        safe = method in IDEMPOTENT_METHODS or idempotency_key is not None
        params = {k: v for k, v in (params or {}).items() if v is not None}
        start = time.monotonic()
        attempt, maybe_stored = 0, False
        while True:
            attempt += 1
            outcome = self._try(method, url, params, body, headers, what)
            if not isinstance(outcome, Failure):
                return outcome
            failure = outcome
            maybe_stored = maybe_stored or failure.stored
            left = self.retry_seconds - (time.monotonic() - start)
            may_retry = failure.retryable and (safe or not failure.sent)
            if not may_retry or left <= 0:
                elapsed = time.monotonic() - start
                stored = maybe_stored and submission
                raise give_up(failure, attempt, elapsed, may_retry, stored, self.retry_seconds)
            wait = backoff_delay(attempt, failure.retry_after, self.backoff, self.max_backoff)
            delay = min(wait, left)
            self._tell(Retrying(failure.reason, failure.status, delay, attempt, left, method, url))
            self.sleep(delay)

    def _try(
        self,
        method: str,
        url: str,
        params: Mapping[str, Any],
        body: Any,
        headers: Mapping[str, str],
        what: str,
    ) -> Any:
        """One try: the decoded answer, or the :class:`Failure` that may be worth another try
        (a final error such as a 422 is raised as a :class:`WmlaError`)."""
        try:
            r = self.session.request(
                method, url, params=params, json=body, headers=headers, timeout=self.timeout
            )
        except requests.RequestException as err:
            return transport_failure(err, self.url, self.timeout)
        if r.status_code == 429 and "Retry-After" in r.headers:
            return throttled_failure(r, _json(r), self.url)
        if r.status_code not in RETRY_STATUSES:
            return self._answer(r, what)
        return status_failure(r, _json(r), self.url)

    def _tell(self, notice: Retrying) -> None:
        if self.on_retry is not None:
            self.on_retry(notice)
        else:
            log.warning("%s", notice)

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
        """Every job listed, oldest first, page after page (the service answers a page)."""
        params = {"state": ",".join(states) if states else None, "user": user}
        jobs: list[dict] = []
        while True:
            page = self.request("GET", "jobs", params=params, what="listing jobs")
            jobs += page["jobs"]
            if not page.get("next"):
                return jobs
            params["after"] = page["next"]

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

    def shares(self, plan: str | None = None) -> dict:
        """Every plan's fair-share row under ``plan`` (sshare's columns; ``wmla shares``)."""
        return self.request("GET", "shares", params={"plan": plan}, what="fair shares")

    def storage(self, user: str | None = None) -> dict:
        """Storage quotas (``wmla quota``): the caller's, or everyone's for a plan admin."""
        return self.request("GET", "storage", params={"user": user}, what="storage quotas")

    def reset_shares(self) -> dict:
        """Forget all usage (plan admins): the rows after the reset."""
        return self.request("POST", "shares/reset", what="resetting the usage history")

    def wait(
        self,
        job_id: str,
        states: frozenset[str] = FINAL_STATES,  # TIMEOUT too: every state a job ends in
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
