"""The REST client: where it finds the service and the token, and the messages its errors get.

Error answers come from a real HTTP server on a free port (http.server in a thread) that
answers each path with a fixed status and body, as the wmla service or the hub's proxy would.
"""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from extension.client import WmlaClient, WmlaError
from extension.clientconfig import api_url, load_config, resolve, save_config

ANSWERS = {
    "/services/wmla/api/v1/jobs/j404": (404, {"error": "no job j404 of yours", "status": 404}),
    "/services/wmla/api/v1/jobs": (
        422,
        {"error": "/project1/qa-team allows 2 gpu; the job asks for 4 gpu (4 workers x 1 gpu); "
         "ask for at most 2 workers", "status": 422},
    ),
    "/services/wmla/api/v1/plans": (
        403,
        {"error": "not authenticated: send a hub API token", "status": 403},
    ),
    "/services/wmla/api/v1/instance": (500, {"error": "internal error", "status": 500}),
    "/services/wmla/api/v1/": (200, {"name": "alice", "storage": "/s/alice"}),
    "/services/wmla/api/v1/jobs/j1/logs": (200, {"logs": "[worker-0] hi\n"}),
    "/services/wmla/api/v1/jobs/j1": (409, {"error": "job j1 already ended", "status": 409}),
    "/services/wmla/api/v1/usage": (502, "<html>Bad gateway</html>"),
}  # fmt: skip


class Handler(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        # recorded before the answer goes out: the client may look as soon as it has it
        self.server.seen.append((self.command, self.path, self.headers.get("Authorization")))
        path = self.path.split("?", 1)[0]
        status, body = ANSWERS.get(path, (404, "<html>not here</html>"))
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(status)
        ctype = "text/html" if isinstance(body, str) else "application/json"
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, *args) -> None:  # keep test output clean
        pass


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.seen = []
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def client(server) -> WmlaClient:
    host, port = server.server_address
    # one try: the retries while the service restarts are tests/client/test_retry.py's
    return WmlaClient(url=f"http://{host}:{port}", token="t0k", env={}, retry_seconds=0)


@pytest.mark.parametrize(
    "call, status, message",
    [
        pytest.param(lambda c: c.job("j404"), 404, "not found: no job j404 of yours", id="404"),
        pytest.param(
            lambda c: c.submit({"plan": "/project1/qa-team"}),
            422,
            "job rejected: /project1/qa-team allows 2 gpu",
            id="422-names-plan-and-limit",
        ),
        pytest.param(lambda c: c.plans(), 403, "refused your credentials", id="403-token"),
        pytest.param(lambda c: c.plans(), 403, "wmla logon", id="403-says-what-to-do"),
        pytest.param(lambda c: c.instance(), 500, "ask your administrator", id="500"),
        pytest.param(
            lambda c: c.cancel("j1"),
            409,
            "cancelling job j1 refused: job j1 already ended",
            id="409",
        ),  # fmt: skip
        pytest.param(
            lambda c: c.usage(plan="/p"),
            502,
            "unavailable (HTTP 502 from the hub's proxy)",
            id="proxy-502",
        ),
        pytest.param(lambda c: c.job("nope"), 404, "not running behind", id="proxy-html-404"),
        pytest.param(lambda c: c.job("a/b"), 0, "'a/b' is not a job id", id="bad-job-id"),
        pytest.param(
            lambda c: c.plan("dev"), 0, "plans look like /project1/dev-team", id="bad-plan-path"
        ),  # fmt: skip
    ],
)
def test_errors_become_sentences(client: WmlaClient, call, status: int, message: str) -> None:
    with pytest.raises(WmlaError) as err:
        call(client)
    assert err.value.status == status
    assert message in str(err.value)


def test_the_cores_rejection_wording_is_not_doubled() -> None:
    from extension.clienterrors import explain

    message = "rejected: plan /q has a gpu limit of 2 gpu and this job asks for 4 gpu"
    assert explain(422, message, "job") == (
        "job rejected: plan /q has a gpu limit of 2 gpu and this job asks for 4 gpu"
    )


def test_answers_and_the_token_travel(client: WmlaClient, server) -> None:
    assert client.whoami()["name"] == "alice"
    assert client.logs("j1", tail=5) == "[worker-0] hi\n"
    method, path, auth = server.seen[-1]
    assert (method, path, auth) == ("GET", "/services/wmla/api/v1/jobs/j1/logs?tail=5", "token t0k")


def test_an_unreachable_service_says_where_it_looked() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once we leave: nothing listens there
    c = WmlaClient(url=f"http://127.0.0.1:{port}", token="x", env={}, retry_seconds=0)
    with pytest.raises(
        WmlaError, match=f"cannot reach the wmla service at http://127.0.0.1:{port}"
    ):
        c.plans()


@pytest.mark.parametrize(
    "given, expected",
    [
        ("http://h:8000", "http://h:8000/services/wmla/api/v1/"),
        ("http://h:8000/", "http://h:8000/services/wmla/api/v1/"),
        ("http://h:8000/hub/api", "http://h:8000/services/wmla/api/v1/"),
        ("https://h/prefix/hub/", "https://h/prefix/services/wmla/api/v1/"),
        ("http://h:8000/services/wmla", "http://h:8000/services/wmla/api/v1/"),
        ("http://h:8000/services/wmla/api/v1", "http://h:8000/services/wmla/api/v1/"),
    ],
)
def test_api_url_accepts_hub_service_or_api_addresses(given: str, expected: str) -> None:
    assert api_url(given) == expected


@pytest.mark.parametrize(
    "env, config, url, token",
    [
        pytest.param({"WMLA_URL": "http://a:1", "WMLA_TOKEN": "w", "JUPYTERHUB_API_TOKEN": "j"},
                     {"url": "http://c:3", "token": "c"}, "http://a:1", "w", id="wmla-env-first"),
        pytest.param({"JUPYTERHUB_API_TOKEN": "j", "JUPYTERHUB_API_URL": "http://b:2/hub/api"},
                     {"url": "http://c:3", "token": "c"}, "http://c:3", "c", id="logon-file-next"),
        pytest.param({"JUPYTERHUB_API_TOKEN": "j", "JUPYTERHUB_PUBLIC_HUB_URL": "https://p/hub/",
                      "JUPYTERHUB_API_URL": "http://127.0.0.1:9/hub/api"},
                     {}, "https://p", "j", id="spawned-server-public-url"),
        pytest.param({"JUPYTERHUB_API_URL": "http://127.0.0.1:9/hub/api",
                      "JUPYTERHUB_API_TOKEN": "j", "WMLA_SERVICE_NAME": "train"},
                     {}, "http://127.0.0.1:9/services/train", "j", id="spawned-server-api-url"),
    ],
)  # fmt: skip
def test_where_the_url_and_token_come_from(env, config, url, token) -> None:
    got_url, got_token = resolve(env=env, config=config)
    assert got_url.startswith(url + "/") and got_url.endswith("/api/v1/")
    assert got_token == token


@pytest.mark.parametrize(
    "env, message",
    [
        pytest.param({}, "where is the wmla service", id="nothing"),
        pytest.param({"WMLA_URL": "http://a:1"}, "no token", id="no-token"),
        pytest.param({"WMLA_URL": "a:1", "WMLA_TOKEN": "x"}, "not an http(s) address", id="url"),
    ],
)
def test_missing_settings_say_how_to_fix_them(env, message) -> None:
    with pytest.raises(WmlaError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve(env=env, config={})


def test_the_logon_file_is_private(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "cfg" / "config.json"
    monkeypatch.setenv("WMLA_CONFIG", str(path))
    save_config({"url": "http://h/services/wmla/api/v1/", "token": "s3cret"})
    assert path.stat().st_mode & 0o777 == 0o600
    assert load_config() == {"url": "http://h/services/wmla/api/v1/", "token": "s3cret"}
    path.write_text("{not json")
    with pytest.raises(WmlaError, match="run `wmla logon` again"):
        load_config()
