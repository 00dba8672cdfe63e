"""``wmla`` while the service restarts: the waits on stderr, one job for a retried submission,
and a clean message when it gives up (exit 1, no traceback, no HTML).

The service and the hub's proxy are the tornado stub of tests/client/stub.py; ``wmla`` runs
in-process (``extension.cli.main``) with WMLA_URL and WMLA_TOKEN pointing at it. The first
wait without ``Retry-After`` is made short through ``extension.client.BACKOFF``.
"""

from __future__ import annotations

import json

import pytest

from extension import cli, cli_client
from extension import client as client_module
from tests.client.stub import Stub

START = ["exec-start", "PyTorch", "--consumer", "/p", "--model-dir", "models/m",
         "--model-main", "main.py"]  # fmt: skip


@pytest.fixture
def stub():
    stub = Stub().start()
    try:
        yield stub
    finally:
        stub.stop()


@pytest.fixture
def wmla(stub: Stub, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture):
    """``wmla(*argv)`` -> (exit code, stdout, stderr) against the stub."""
    for name in ("WMLA_CONFIG", "WMLA_RETRY_SECONDS", "JUPYTERHUB_API_TOKEN", "JUPYTERHUB_API_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WMLA_URL", stub.url)
    monkeypatch.setenv("WMLA_TOKEN", "t0k")
    monkeypatch.setattr(client_module, "BACKOFF", 0.01)
    monkeypatch.setattr(client_module, "MAX_BACKOFF", 0.05)

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = cli.main(list(argv))
        except SystemExit as exc:  # argparse's refusals
            code = exc.code
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_exec_start_through_a_restart_submits_one_job_and_says_it_waited(stub: Stub, wmla) -> None:
    stub.script = ["html503", "drop", "json503:0"]
    code, out, err = wmla(*START, "--json")
    assert code == 0, err
    job = json.loads(out)
    assert job["id"] == "j1" and list(stub.jobs) == ["j1"]
    keys = stub.keys_sent()
    assert len(keys) == 4 and len(set(keys)) == 1 and keys[0]
    lines = err.splitlines()
    assert len(lines) == 3
    assert lines[0].startswith(
        "wmla exec-start: the wmla service is unavailable (HTTP 503 from the hub's proxy), "
        "retrying in "
    )
    assert lines[1].startswith(
        "wmla exec-start: the connection to the wmla service was lost before its answer"
    )
    assert "HTTP 503: the store is unavailable" in lines[2]


def test_a_command_that_gives_up_exits_1_with_a_clean_message(stub: Stub, wmla) -> None:
    stub.script = ["html503"] * 1000
    code, out, err = wmla("plans", "--retry-seconds", "0.3")
    assert code == 1 and out == ""
    last = err.splitlines()[-1]
    assert last.startswith(
        f"wmla plans: the wmla service at {stub.url}/services/wmla/api/v1/ is unavailable "
        f"(HTTP 503 from the hub's proxy), tried "
    )
    assert "check it on the hub's Services page or ask your administrator" in last
    assert "(now 0.3 s)" in last
    assert all(line.startswith("wmla plans: ") for line in err.splitlines())
    assert "<" not in err and "Traceback" not in err


def test_retry_seconds_0_tries_once(stub: Stub, wmla) -> None:
    stub.script = ["html502", "ok"]
    code, _, err = wmla("exec-get", "--retry-seconds", "0")
    assert code == 1 and len(stub.seen) == 1
    assert err.startswith("wmla exec-get: the wmla service at ")
    assert err.rstrip().endswith("Retries are off (WMLA_RETRY_SECONDS is 0).")


def test_the_environment_sets_the_retry_seconds(
    stub: Stub, wmla, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WMLA_RETRY_SECONDS", "0")
    stub.script = ["html503", "ok"]
    code, _, err = wmla(*START)
    assert code == 1 and stub.submissions() == 1 and "Retries are off" in err
    monkeypatch.setenv("WMLA_RETRY_SECONDS", "later")
    code, _, err = wmla("plans")
    assert code == 1 and "WMLA_RETRY_SECONDS is how many seconds to keep retrying" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["plans", "--retry-seconds", "-1"],
        ["usage", "--retry-seconds", "soon"],
        [*START, "--retry-seconds", "inf"],
    ],
)
def test_a_bad_retry_seconds_exits_2(stub: Stub, wmla, argv: list[str]) -> None:
    code, _, err = wmla(*argv)
    assert code == 2 and "--retry-seconds takes the seconds to keep trying" in err
    assert stub.seen == []


def test_a_refusal_is_not_retried(stub: Stub, wmla) -> None:
    stub.script = ["422"]
    code, _, err = wmla(*START)
    assert code == 1 and stub.submissions() == 1
    assert err == "wmla exec-start: job rejected: /p allows 2 gpu; the job asks for 4 gpu\n"


def test_exec_start_wait_that_loses_the_service_says_the_job_keeps_running(
    stub: Stub, wmla, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli_client, "POLL", 0)
    stub.script = ["ok"] + ["html503"] * 1000
    code, out, err = wmla(*START, "--wait", "--retry-seconds", "0.2")
    assert code == 1 and "job j1 (stub-main) submitted to /p" in out
    last = err.splitlines()[-1]
    assert last.startswith(
        "wmla exec-start: stopped waiting for job j1, which keeps running (`wmla exec-get j1` "
        "once the service answers): the wmla service at "
    )
    assert "Traceback" not in err and "<" not in err


def test_a_rate_refusal_is_waited_out_and_the_submission_goes_through_once(
    stub: Stub, wmla
) -> None:
    """A 429 with Retry-After (c.RequestRate) did nothing: the call waits what it says and is
    sent again, a submission with its same key; the pending cap's 429 has none and is final."""
    stub.script = ["json429:0", "json429:0"]
    code, out, err = wmla(*START, "--json")
    assert code == 0, err
    assert list(stub.jobs) == ["j1"] and len(set(stub.keys_sent())) == 1
    lines = err.splitlines()
    assert len(lines) == 2 and all("asks to slow down (HTTP 429" in line for line in lines)
    stub.script = ["cap429"]
    code, out, err = wmla(*START, "--json")
    assert code == 1 and "1000 pending jobs" in err and "retrying" not in err
    assert list(stub.jobs) == ["j1"]
