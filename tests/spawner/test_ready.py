"""``spawner.ready.answering``: start() returns as soon as the new server answers, not at the
hub's next backoff step, and gives up at once when the server is gone."""

from __future__ import annotations

import asyncio
import socket
import time

from tornado.httpserver import HTTPServer
from tornado.web import Application, RequestHandler

from spawner.ready import EVERY, answering


class Api(RequestHandler):
    def get(self) -> None:
        self.set_status(403)  # any answer will do: the hub's own check takes any status
        self.finish("no")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_a_server_that_comes_up_late_is_found_within_a_check_of_it() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/user/ann/api"
    server = HTTPServer(Application([(r"/user/ann/api", Api)]))
    up_at: list[float] = []

    async def come_up() -> None:
        await asyncio.sleep(1.3)  # the hub's backoff would next look between 1.4 and 3.0 s
        server.listen(port, "127.0.0.1")
        up_at.append(time.monotonic())

    later = asyncio.ensure_future(come_up())
    try:
        assert await answering(url, lambda: True, timeout=20)
        found = time.monotonic()
    finally:
        await later
        server.stop()
    assert found - up_at[0] < EVERY + 0.25, found - up_at[0]


async def test_a_server_that_is_gone_is_given_up_at_once() -> None:
    url = f"http://127.0.0.1:{free_port()}/user/ann/api"
    t0 = time.monotonic()
    assert not await answering(url, lambda: False, timeout=20)
    assert time.monotonic() - t0 < 2


async def test_a_server_that_never_answers_is_given_up_at_the_timeout() -> None:
    url = f"http://127.0.0.1:{free_port()}/user/ann/api"
    t0 = time.monotonic()
    assert not await answering(url, lambda: True, timeout=0.5)
    assert 0.5 <= time.monotonic() - t0 < 3
