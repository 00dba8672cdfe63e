"""Notebook jobs kept in step with the hub's real servers.

A notebook job holds its plan's resources for as long as its server runs; the spawner releases
it when the server stops. When that release never comes (the hub was killed, or stopped its
services before the servers, or the release call failed for good), the job would hold the
resources forever. So the service asks the hub, every ``reconcile_seconds``, which servers its
users really have, and ends the live notebook jobs that no server holds any more.

A job is held by a server of its user that the hub lists (ready or still starting) and whose
spawner state names the job (``wmla_job_id``), or, when the state does not say (another
spawner, or a spawn whose state is not saved yet), by a server of the job's name. A job younger
than ``grace`` seconds is left alone (its spawn may not be listed yet), and an unreachable hub
changes nothing: only the hub's answer that no server holds a job ends it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError

log = logging.getLogger(__name__)
Fetch = Callable[[str], Any]  # async: user name -> the hub's user model, or None (no such user)


def server_name(job_name: str) -> str:
    """The server a notebook job was made for: the spawner names it ``notebook <server>``."""
    return job_name[len("notebook ") :] if job_name.startswith("notebook ") else ""


def holds(job_id: str, job_name: str, servers: dict[str, Any]) -> bool:
    """Whether one of the user's listed servers holds the notebook job."""
    wanted = server_name(job_name)
    for name, server in servers.items():
        state = server.get("state") if isinstance(server, dict) else None
        held_by = state.get("wmla_job_id") if isinstance(state, dict) else None
        if held_by == job_id:
            return True
        if held_by is None and name == wanted:
            return True
    return False


def hub_fetch(api_url: str, token: str) -> Fetch:
    """The hub's user model through its REST API, with the service's own token."""
    client = AsyncHTTPClient()

    async def fetch(user: str) -> dict | None:
        url = f"{api_url.rstrip('/')}/users/{quote(user, safe='')}"
        try:
            r = await client.fetch(
                url, headers={"Authorization": f"token {token}"}, request_timeout=10
            )
        except HTTPClientError as err:
            if err.code == 404:
                return None
            raise
        return json.loads(r.body)

    return fetch


async def leaked_notebooks(sched: Any, fetch: Fetch, grace: float) -> list[tuple[str, str]]:
    """(job id, why) of every live notebook job no server holds; asks the hub once per user."""
    now = sched.clock()
    by_user: dict[str, list[tuple[str, str]]] = {}
    rows = await sched.db.read(sched.store.jobs_by_id, list(sched.notebook_jobs()))
    for row in rows.values():
        if now - (row.started or row.submitted) >= grace:
            by_user.setdefault(row.user, []).append((row.id, row.name))
    leaked = []
    for user, jobs in sorted(by_user.items()):
        model = await fetch(user)
        servers = (model or {}).get("servers") or {}
        if model is not None and not isinstance(servers, dict):
            continue  # not an answer we understand: leave the jobs alone
        for job_id, name in jobs:
            if model is None:
                leaked.append((job_id, f"its user {user} is no longer on the hub"))
            elif not holds(job_id, name, servers):
                what = f"server {server_name(name)!r}" if server_name(name) else "default server"
                leaked.append((job_id, f"the hub has no {what} of {user} holding it any more"))
    return leaked


async def reconcile_forever(
    sched: Any, fetch: Fetch, every: float, grace: float, stop: asyncio.Event
) -> None:
    """Until ``stop``: every ``every`` seconds, end the notebook jobs no server holds."""
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), every)
            return
        except asyncio.TimeoutError:
            pass
        try:
            for job_id, why in await leaked_notebooks(sched, fetch, grace):
                log.warning("wmla: releasing notebook job %s: %s", job_id, why)
                await sched.release_notebook(job_id, f"released: {why}")
        except Exception as err:  # the hub restarting, the store down: next round
            log.info("wmla: notebook reconciliation skipped this round: %s", err)


def hub_api_from_env() -> tuple[str, str] | None:
    """(hub API URL, token) of a hub-managed service; None when not run by a hub."""
    url, token = os.environ.get("JUPYTERHUB_API_URL"), os.environ.get("JUPYTERHUB_API_TOKEN")
    return (url, token) if url and token else None
