"""Where the wmla service is and who is calling: the logon file and the address resolution.

First match wins:

1. explicit ``url=`` / ``token=`` arguments;
2. ``$WMLA_URL`` and ``$WMLA_TOKEN``;
3. the file ``wmla logon`` writes (``$WMLA_CONFIG``, default ``~/.wmla/config.json``);
4. what a notebook server spawned by JupyterHub has: ``$JUPYTERHUB_API_TOKEN`` and the hub's
   address (``$JUPYTERHUB_PUBLIC_HUB_URL`` when the hub has a public URL, else
   ``$JUPYTERHUB_API_URL``, whose host serves ``/services/<name>/`` when it is the proxy; when it
   is the hub's own API port the hub is asked where the service listens).

``WMLA_URL`` may name the hub (``http://host:8000``), the service (``.../services/wmla/``) or its
API (``.../services/wmla/api/v1``). The service name is ``$WMLA_SERVICE_NAME`` (default wmla).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

import requests

from extension.clienterrors import WmlaError

API_PATH = "api/v1"
DEFAULT_SERVICE = "wmla"


def config_path() -> Path:
    """Where ``wmla logon`` keeps the URL and token."""
    return Path(os.environ.get("WMLA_CONFIG") or Path.home() / ".wmla" / "config.json")


def load_config(path: Path | None = None) -> dict:
    """The logon file's contents; ``{}`` when there is none (or it is not a JSON object)."""
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
