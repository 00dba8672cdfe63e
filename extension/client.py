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
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

import requests

API_PATH = "api/v1"
DEFAULT_SERVICE = "wmla"
TIMEOUT = 30.0


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


class WmlaClient:
    """Blocking calls to ``/services/wmla/api/v1``; each returns the decoded JSON."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        env: Mapping[str, str] | None = None,
        timeout: float = TIMEOUT,
        session: requests.Session | None = None,
    ) -> None:
        self.url, self.token = resolve(url, token, env)
        self.timeout = timeout
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
    ) -> Any:
        url = self.url + path.lstrip("/")
        try:
            r = self.session.request(
                method,
                url,
                params={k: v for k, v in (params or {}).items() if v is not None},
                json=body,
                timeout=self.timeout,
            )
        except requests.ConnectionError:
            raise WmlaError(
                f"cannot reach the wmla service at {self.url}: is the hub running, and is this "
                f"its address? (set WMLA_URL or run `wmla logon --url ...`)"
            ) from None
        except requests.Timeout:
            raise WmlaError(
                f"the wmla service at {self.url} did not answer within {self.timeout:g}s; "
                f"try again in a moment"
            ) from None
        except requests.RequestException as err:
            raise WmlaError(f"calling the wmla service failed: {err}") from None
        if r.status_code == 204:
            return None
        try:
            data = r.json()
        except ValueError:
            data = None
        if r.status_code >= 400:
            if isinstance(data, dict) and "error" in data:
                raise WmlaError(explain(r.status_code, str(data["error"]), what), r.status_code)
            if r.status_code in (502, 503, 404) and not isinstance(data, dict):
                raise WmlaError(
                    f"the wmla service is not running behind {self.url} (HTTP {r.status_code} "
                    f"from the hub's proxy); ask your administrator to start it",
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

    def submit(self, body: Mapping[str, Any]) -> dict:
        return self.request("POST", "jobs", body=dict(body), what="job")

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


FINAL_STATES = frozenset({"FINISHED", "FAILED", "CANCELLED", "REJECTED"})


def _job(job_id: str) -> str:
    if not isinstance(job_id, str) or not job_id.strip() or "/" in job_id:
        raise WmlaError(f"{job_id!r} is not a job id; list yours with `wmla exec-get`")
    return quote(job_id.strip(), safe="")


def _plan_path(path: str) -> str:
    if not isinstance(path, str) or not path.startswith("/"):
        raise WmlaError(f"{path!r} is not a plan path; plans look like /project1/dev-team")
    return quote(path, safe="/")
