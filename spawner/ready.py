"""Whether a new server answers HTTP yet, asked every few tens of milliseconds.

The hub asks only once ``start()`` has returned, with an exponential backoff from 0.2 s
(``jupyterhub.utils.exponential_backoff``: waits of up to 0.2, 0.4, 0.8, 1.6 s...), so a server
that came up 2 s after its start was found up to 1.6 s later (benchmarks/bench_spawn.py: the
server answered at 2.6 s, the hub saw it at 4.2 s). ``start()`` returns once it answers instead,
and the hub's first check, made at once, finds it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tornado.httpclient import AsyncHTTPClient, HTTPClientError

EVERY = 0.05  # seconds between two checks


async def answering(url: str, running: Callable[[], bool], timeout: float) -> bool:
    """Whether ``url`` gave any HTTP answer within ``timeout`` seconds; False at once when
    ``running()`` says the server is gone."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    client = AsyncHTTPClient()
    while loop.time() < deadline:
        try:
            await client.fetch(url, raise_error=False, follow_redirects=False,
                               connect_timeout=1, request_timeout=5)  # fmt: skip
            return True
        except (OSError, HTTPClientError):  # not listening yet, or not answering in time
            pass
        if not running():
            return False
        await asyncio.sleep(EVERY)
    return False
