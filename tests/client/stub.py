"""A small real HTTP server (tornado, on a thread) that plays the wmla service and the hub's proxy
while the service restarts, for the client's retry tests (tests/client, tests/cli, tests/magics).

Each request takes the next step of ``stub.script`` (an empty script answers normally):

``"html502"``, ``"html503"``, ``"html504"``
    the proxy's HTML page with that status (the service is down or restarting);
``"json503"``, ``"json503:N"``
    the service's own 503 JSON ``{"error", "retry_after"}`` with ``Retry-After: N`` (default 1);
``"body503:N"``
    the same with ``retry_after`` in the body only;
``"json429:N"``
    the service's refusal for the user's request rate: 429 JSON with ``Retry-After: N``;
``"cap429"``
    the pending-jobs cap's 429 (no ``Retry-After``: final);
``"drop"``
    reads the request, acts on it (a POST /jobs is stored) and closes the connection without an
    answer: the job was stored but the client lost the answer;
``"400"``, ``"422"``
    a JSON refusal;
``"ok"``
    the normal answer.

The normal answers: ``POST jobs`` stores a job (201), or with an ``Idempotency-Key`` it has
seen from the same token answers the job it stored for it (200; another body with that key is
a 422 naming the header, as the service does); ``GET jobs``, ``GET jobs/<id>`` (and its
``metrics``, ``logs``), ``DELETE jobs/<id>``, ``GET`` the API root (who am I), ``GET plans``.
``stub.state`` (when set) is the state a ``GET jobs/<id>`` finds the job in.
``stub.seen`` keeps ``(method, path, Idempotency-Key)`` of every request received.
``stub.down()`` stops listening (connections are refused) and ``stub.up()`` listens again on
the same port.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import tornado.httpserver
import tornado.netutil
import tornado.web

API = "/services/wmla/api/v1/"
PROXY_PAGE = (
    "<!DOCTYPE HTML>\n<html><head><title>{status} Service Unavailable</title></head>\n"
    "<body><h1>{status}</h1><p>The service wmla is not running. It may be restarting.</p>"
    "</body></html>\n"
)


class Stub:
    def __init__(self) -> None:
        self.script: list[str] = []
        self.seen: list[tuple[str, str, str | None]] = []
        self.jobs: dict[str, dict] = {}
        self.state: str | None = None
        self.keys: dict[tuple[str, str], tuple[str, Any]] = {}  # (token, key) -> (id, body)
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: tornado.httpserver.HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- life ------------------------------------------------------------------------------------
    def start(self) -> Stub:
        self._thread = threading.Thread(target=self._run, name="wmla-stub", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the stub server did not start")
        return self

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        app = tornado.web.Application(
            [(r"/services/wmla/api/v1/(.*)", Handler, {"stub": self})],
            log_function=lambda handler: None,  # no access log in the test output
        )
        self._server = tornado.httpserver.HTTPServer(app)
        sockets = tornado.netutil.bind_sockets(0, "127.0.0.1")
        self.port = sockets[0].getsockname()[1]
        self._server.add_sockets(sockets)
        self._loop.call_soon(self._ready.set)
        self._loop.run_forever()
        self._loop.close()

    def _on_loop(self, fn: Any) -> None:
        assert self._loop is not None
        done = threading.Event()

        def call() -> None:
            try:
                fn()
            finally:
                done.set()

        self._loop.call_soon_threadsafe(call)
        done.wait(10)

    def down(self) -> None:
        """Stop listening: new connections are refused."""
        self._on_loop(lambda: self._server.stop())

    def up(self) -> None:
        """Listen again on the same port."""

        def listen() -> None:
            self._server.add_sockets(tornado.netutil.bind_sockets(self.port, "127.0.0.1"))

        self._on_loop(listen)

    def stop(self) -> None:
        if self._loop is None:
            return

        def close() -> None:
            self._server.stop()
            self._loop.stop()

        self._loop.call_soon_threadsafe(close)
        if self._thread is not None:
            self._thread.join(10)

    # -- the service -----------------------------------------------------------------------------
    def submissions(self) -> int:
        return sum(1 for method, path, _ in self.seen if (method, path) == ("POST", "jobs"))

    def keys_sent(self) -> list[str | None]:
        return [key for method, path, key in self.seen if (method, path) == ("POST", "jobs")]


def job_model(job_id: str, body: dict, user: str = "alice") -> dict:
    return {
        "id": job_id,
        "name": body.get("name") or "stub-main",
        "user": user,
        "plan": body.get("plan", "/p"),
        "kind": "train",
        "state": "PENDING",
        "reason": "",
        "workers": {"min": 1, "max": 1, "running": 0},
        "resources": {"gpu": 0, "cpu": 100, "memory": 0},
        "placement": [],
        "submitted": time.time(),
        "started": None,
        "ended": None,
        "exit_code": None,
        "command": ["python", "main.py"],
        "workdir": f"/s/{user}/.wmla/jobs/{job_id}",
    }


class Handler(tornado.web.RequestHandler):
    def initialize(self, stub: Stub) -> None:
        self.stub = stub

    def _json(self, status: int, data: Any) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data))

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"error": message, "status": status})

    def _handle(self, path: str) -> None:
        stub = self.stub
        key = self.request.headers.get("Idempotency-Key")
        stub.seen.append((self.request.method, path, key))
        step = stub.script.pop(0) if stub.script else "ok"
        kind, _, arg = step.partition(":")
        if kind.startswith("html"):
            status = int(kind[4:])
            self.set_status(status)
            self.set_header("Content-Type", "text/html")
            self.finish(PROXY_PAGE.format(status=status))
        elif kind in ("json503", "body503"):
            after = int(arg or 1)
            if kind == "json503":
                self.set_header("Retry-After", str(after))
            self._json(503, {"error": "the store is unavailable (database is locked); try "
                             "again shortly", "status": 503, "retry_after": after})  # fmt: skip
        elif kind == "json429":
            self.set_header("Retry-After", arg or "1")
            self._json(429, {"error": "alice made more than 200 requests at once (c.RequestRate)",
                             "status": 429, "retry_after": int(arg or 1)})  # fmt: skip
        elif kind == "cap429":
            self._error(429, "you have 1000 pending jobs, the most this instance queues per user")
        elif kind in ("400", "422"):
            self._error(int(kind), "workers: must be at least 1" if kind == "400" else
                        "rejected: /p allows 2 gpu; the job asks for 4 gpu")  # fmt: skip
        elif kind == "drop":
            self._normal(path, key, answer=False)
            self.detach().close()  # the request was acted on; its answer never leaves
        else:
            self._normal(path, key)

    def _normal(self, path: str, key: str | None, answer: bool = True) -> None:
        stub = self.stub
        method = self.request.method
        token = self.request.headers.get("Authorization", "")
        reply = self._json if answer else (lambda status, data: None)
        if method == "POST" and path == "jobs":
            body = json.loads(self.request.body or b"{}")
            if key is not None and (token, key) in stub.keys:
                job_id, first = stub.keys[(token, key)]
                if first != body:
                    reply(422, {"error": "Idempotency-Key: this key was used for another job "
                                "body; use a new key", "status": 422})  # fmt: skip
                    return
                reply(200, stub.jobs[job_id])
                return
            job_id = f"j{len(stub.jobs) + 1}"
            stub.jobs[job_id] = job_model(job_id, body)
            if key is not None:
                stub.keys[(token, key)] = (job_id, body)
            reply(201, stub.jobs[job_id])
        elif method == "GET" and path == "":
            reply(200, {"name": "alice", "storage": "/nonexistent/alice", "plans": ["/p"]})
        elif method == "GET" and path == "plans":
            reply(200, {"plans": [{"path": "/p", "share": 1, "running": 0, "pending": 0}]})
        elif method == "GET" and path == "jobs":
            reply(200, {"jobs": list(stub.jobs.values())})
        elif path.startswith("jobs/"):
            job_id, _, rest = path[len("jobs/") :].partition("/")
            job = stub.jobs.get(job_id)
            if job is None:
                reply(404, {"error": f"no job {job_id} of yours", "status": 404})
            elif method == "DELETE":
                job.update(state="CANCELLED", reason="cancelled by alice")
                reply(200, job)
            elif rest == "metrics":
                reply(200, {"metrics": [], "next": 0})
            elif rest == "logs":
                reply(200, {"logs": ""})
            elif rest == "history":
                reply(200, {"transitions": []})
            else:
                if stub.state and job["state"] != stub.state:
                    job.update(state=stub.state, reason="", exit_code=0, ended=time.time())
                reply(200, job)
        else:
            reply(404, {"error": f"no {path}", "status": 404})

    def get(self, path: str) -> None:
        self._handle(path)

    def post(self, path: str) -> None:
        self._handle(path)

    def delete(self, path: str) -> None:
        self._handle(path)

    def log_exception(self, *args: Any) -> None:  # a dropped connection is the point
        pass
