"""The magics while the service restarts: each wait shows in the cell's output, a retried
``%wmla_train`` makes one job, and giving up stops the cell with a clean ``UsageError`` (no
traceback, no HTML).

An in-process IPython shell with ``%load_ext extension.magics`` talks to the tornado stub of
tests/client/stub.py (WMLA_URL, WMLA_TOKEN); the first wait without ``Retry-After`` is made
short through ``extension.client.BACKOFF``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell

from extension import client as client_module
from tests.client.stub import Stub


@pytest.fixture
def stub():
    stub = Stub().start()
    try:
        yield stub
    finally:
        stub.stop()


@pytest.fixture
def shell(stub: Stub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    for name in ("WMLA_CONFIG", "WMLA_RETRY_SECONDS", "WMLA_PLAN", "JUPYTERHUB_API_TOKEN",
                 "JUPYTERHUB_API_URL"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WMLA_URL", stub.url)
    monkeypatch.setenv("WMLA_TOKEN", "t0k")
    monkeypatch.setenv("WMLA_USER_DIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "m").mkdir(parents=True)
    (tmp_path / "models" / "m" / "main.py").write_text("print('hi')\n")
    monkeypatch.setattr(client_module, "BACKOFF", 0.01)
    monkeypatch.setattr(client_module, "MAX_BACKOFF", 0.05)
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "extension.magics")
    return shell


def test_wmla_train_through_a_restart_shows_the_waits_and_makes_one_job(
    stub: Stub, shell: InteractiveShell, capsys: pytest.CaptureFixture
) -> None:
    stub.script = ["html503", "drop"]
    stub.state = "FINISHED"
    result = shell.run_cell(
        "%wmla_train --plan /p --model-dir models/m --model-main main.py --wait"
    )
    out, err = capsys.readouterr()
    assert result.success, err
    assert list(stub.jobs) == ["j1"]
    keys = stub.keys_sent()
    assert len(keys) == 3 and len(set(keys)) == 1
    lines = out.splitlines()
    assert lines[0].startswith(
        "wmla: the wmla service is unavailable (HTTP 503 from the hub's proxy), retrying in "
    )
    assert lines[1].startswith("wmla: the connection to the wmla service was lost")
    assert "job j1 submitted to /p (models/m/main.py)" in out
    assert "job j1 FINISHED" in out


def test_giving_up_stops_the_cell_with_a_clean_usage_error(
    stub: Stub, shell: InteractiveShell, capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("WMLA_RETRY_SECONDS", "0.3")
    stub.script = ["html503"] * 1000
    result = shell.run_cell("%wmla_jobs")
    out, err = capsys.readouterr()
    assert not result.success
    assert err.startswith(
        f"UsageError: the wmla service at {stub.url}/services/wmla/api/v1/ is unavailable "
        f"(HTTP 503 from the hub's proxy), tried "
    )
    assert "check it on the hub's Services page or ask your administrator" in err
    assert "Traceback" not in err + out and "<" not in err + out
    assert out.startswith("wmla: the wmla service is unavailable (HTTP 503")


def test_a_refused_submission_is_not_retried(
    stub: Stub, shell: InteractiveShell, capsys: pytest.CaptureFixture
) -> None:
    stub.script = ["422"]
    shell.run_cell("%wmla_train --plan /p --model-dir models/m --model-main main.py")
    out, err = capsys.readouterr()
    assert err == "UsageError: job rejected: /p allows 2 gpu; the job asks for 4 gpu\n"
    assert stub.submissions() == 1 and "wmla:" not in out
