"""Every job of a ``GET /jobs`` listing, page after page (the API answers one page at a time)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

Get = Callable[..., Awaitable[dict[str, Any]]]


async def every_job(get: Get, url: str, token: str, **params: str) -> list[dict[str, Any]]:
    """``get(url, token, **params)`` for each page, following ``next``, at the largest pages."""
    jobs: list[dict[str, Any]] = []
    params = {"limit": "500", **params}
    while True:
        page = await get(url, token, **params)
        jobs += page["jobs"]
        if not page["next"]:
            return jobs
        params["after"] = page["next"]
