"""What the spawner's real-hub tests share: the hub API as a user, a user's server, waiting."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import requests

from tests.service.hub import Hub


def hub_request(hub: Hub, method: str, path: str, user: str, **kwargs: Any) -> requests.Response:
    token = hub.clients[user].headers["Authorization"]
    return requests.request(
        method, f"{hub.url}/hub/api{path}", headers={"Authorization": token}, timeout=30, **kwargs
    )


def server_model(hub: Hub, user: str) -> dict | None:
    r = hub_request(hub, "GET", f"/users/{user}", user)
    assert r.status_code == 200, r.text
    return r.json()["servers"].get("")


def notebook_jobs(hub: Hub, user: str, states: str = "RUNNING,PENDING") -> list[dict]:
    r = hub.clients["admin"].get("/jobs", params={"user": user, "state": states})
    assert r.status_code == 200, r.text
    return [j for j in r.json()["jobs"] if j.get("kind", "notebook") == "notebook"]


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 30, hub: Hub | None = None):
    """The first truthy value of ``predicate()`` within ``timeout`` s (the hub's log if not)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}" + (f"\n{hub.log()}" if hub else ""))
