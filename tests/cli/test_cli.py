"""``wmla`` against a real JupyterHub, configurable-http-proxy and wmla service (LocalBackend).

The hub comes from tests/service/hub.py. ``wmla`` runs in-process (``extension.cli.main``) with
the environment or the logon file a user would have; one call runs the installed command as a
subprocess. The example (examples/pytorch_mnist) trains with 2 DDP workers on CPU; the seed's
S2 runs through dlicmd's spellings: qa-team's 4 workers are refused with the limit message,
dev-team's finish.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
import requests

from extension import cli, cli_client
from tests.service.hub import PROXY, REPO, Client, Hub

pytestmark = pytest.mark.skipif(
    not PROXY.exists(), reason="configurable-http-proxy is missing: run `make install`"
)
WAIT = 240.0  # a guard against hangs, not a timing assertion
EXAMPLE = REPO / "examples" / "pytorch_mnist" / "main.py"
SLEEPER = "import sys, time\nprint('sleeping', flush=True)\ntime.sleep(float(sys.argv[1]))\n"
REPORTER = """import time
from extension import runtime
for step in range(1, 4):
    runtime.report(step=step, epoch=1, loss=1 / step)
    time.sleep(0.6)
"""
CLEAN = ("WMLA_URL", "WMLA_TOKEN", "WMLA_CONFIG", "WMLA_PLAN", "WMLA_USER_DIR",
         "JUPYTERHUB_API_TOKEN", "JUPYTERHUB_API_URL", "JUPYTERHUB_PUBLIC_HUB_URL",
         "JUPYTERHUB_PUBLIC_URL")  # fmt: skip


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("clihub")
    hub = Hub(tmp, {"tick": 1, "grace": 2, "device_layout": "1x4", "cpu_oversubscription": 2})
    try:
        hub.start()
        hub.tokens = {name: hub.user_token(name) for name in ("padmin", "user1", "user2")}
        admin = Client(hub, hub.tokens["padmin"])
        for path, body in (
            ("/project1", {"share": 1}),
            ("/project1/dev-team", {"share": 4, "limit": {"gpu": 4}}),
            ("/project1/qa-team", {"share": 2, "limit": {"gpu": 2}}),
        ):
            r = admin.post("/plans", json={"path": path, **body})
            assert r.status_code == 201, r.text
        for user in ("user1", "user2"):
            code = hub.storage / user / "models"
            (code / "pytorch_mnist").mkdir(parents=True, exist_ok=True)
            shutil.copy(EXAMPLE, code / "pytorch_mnist" / "main.py")
            (code / "sleeper").mkdir(exist_ok=True)
            (code / "sleeper" / "main.py").write_text(SLEEPER)
            (code / "reporter").mkdir(exist_ok=True)
            (code / "reporter" / "main.py").write_text(REPORTER)
        yield hub
    finally:
        hub.stop()


@pytest.fixture
def as_user(hub: Hub, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture):
    """Run ``wmla ARGS`` as a user (WMLA_URL + WMLA_TOKEN): (exit code, stdout, stderr)."""
    for name in CLEAN:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WMLA_CONFIG", str(hub.tmp / "no-logon.json"))

    def run(user: str, *argv: str) -> tuple[int, str, str]:
        monkeypatch.setenv("WMLA_URL", hub.url)
        monkeypatch.setenv("WMLA_TOKEN", hub.tokens[user])
        capsys.readouterr()
        try:
            code = cli.main(list(argv))
        except SystemExit as exc:  # argparse's own refusals
            code = exc.code
        out, err = capsys.readouterr()
        return code, out, err

    return run


def wait_for(run, user: str, job_id: str, states: set[str]) -> dict:
    deadline = time.monotonic() + WAIT
    job: dict = {}
    while time.monotonic() < deadline:
        code, out, err = run(user, "exec-get", job_id, "--json")
        assert code == 0, err
        job = json.loads(out)
        if job["state"] in states:
            return job
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} never reached {states}: {job}")


TRAIN = ["--model-dir", "models/pytorch_mnist", "--model-main", "main.py"]


def test_exec_start_trains_the_example_on_two_workers(hub: Hub, as_user) -> None:
    code, out, err = as_user(
        "user1", "exec-start", "PyTorch", "--consumer", "/project1/dev-team",
        "--workerDeviceNum", "2", "--cpus", "250m", *TRAIN, "--json",
        "--", "--batch-size", "64", "--epochs", "1",
    )  # fmt: skip
    assert code == 0, err
    job = json.loads(out)
    assert job["plan"] == "/project1/dev-team" and job["workers"]["min"] == 2
    assert job["command"][-4:] == ["--batch-size", "64", "--epochs", "1"]
    job = wait_for(as_user, "user1", job["id"], {"FINISHED", "FAILED"})
    assert job["state"] == "FINISHED", job
    workdir = Path(job["workdir"])
    assert (workdir / "model.pt").stat().st_size > 0
    assert json.loads((workdir / "result.json").read_text())["world_size"] == 2

    code, out, err = as_user("user1", "exec-outLogs", job["id"])
    assert code == 0 and "[worker-0]" in out and "[worker-1]" in out
    assert "final test accuracy" in out
    code, out, _ = as_user("user1", "exec-get")
    row = next(line for line in out.splitlines() if line.startswith(job["id"]))
    assert "FINISHED" in row and "/project1/dev-team" in row and "0/2" in row
    code, out, _ = as_user("user1", "exec-get", job["id"])
    assert "state:       FINISHED" in out and f"job folder:  {workdir}" in out
    hub.mnist = job["id"]


def test_s2_through_dlicmd_spellings(hub: Hub, as_user) -> None:
    sleeper = ["--model-dir", "models/sleeper", "--model-main", "main.py", "--", "0"]
    code, out, err = as_user(
        "user1", "--exec-start", "PyTorch", "--consumer", "/project1/qa-team",
        "--workerDeviceNum", "4", "--gpus-per-worker", "1", "--cpus", "100m", *sleeper,
    )  # fmt: skip
    assert code == 1 and out == ""
    assert "job rejected" in err and "/project1/qa-team" in err and "limit of 2 gpu" in err
    code, out, err = as_user(
        "user1", "--exec-start", "PyTorch", "--consumer", "/project1/dev-team",
        "--workerDeviceNum", "4", "--gpus-per-worker", "1", "--cpus", "100m", "--wait",
        "--json", *sleeper,
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["state"] == "FINISHED"


def test_exec_start_wait_prints_the_progress_as_it_goes(
    hub: Hub, as_user, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli_client, "POLL", 0.2)
    code, out, err = as_user(
        "user1", "exec-start", "PyTorch", "--consumer", "/project1/dev-team", "--cpus", "100m",
        "--model-dir", "models/reporter", "--model-main", "main.py", "--wait",
    )  # fmt: skip
    assert code == 0, err
    rows = [line.split(" ", 1)[1] for line in out.splitlines()]  # without the HH:MM:SS stamps
    job_id = rows[0].split()[1]
    assert rows[0] == f"job {job_id} (reporter-main) submitted to /project1/dev-team"  # its name
    assert any(r.startswith(f"job {job_id} RUNNING: 1 of 1 workers running") for r in rows), out
    assert "step 3  epoch 1  loss 0.3333" in rows, out
    assert rows[-1] == f"job {job_id} FINISHED (exit code 0)"
    assert rows.index("step 3  epoch 1  loss 0.3333") < len(rows) - 1


def test_exec_get_shows_a_notebook_server_as_a_notebook(hub: Hub, as_user) -> None:
    admin = Client(hub, hub.tokens["padmin"])  # as the spawner: a plan admin for the user
    body = {"plan": "/sample-project/notebooks", "kind": "notebook", "user": "user1",
            "preemptible": False, "resources": {"cpu": "100m"}}  # fmt: skip
    r = admin.post("/jobs", json=body)
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    admin.wait_state(job_id, {"RUNNING"})
    code, out, _ = as_user("user1", "exec-get")
    row = next(line for line in out.splitlines() if line.startswith(job_id))
    assert "notebook (running)" in row and row.split()[1:3] == ["user1", "notebook"]  # its name
    assert admin.delete(f"/jobs/{job_id}").status_code == 200  # the server stopped
    code, out, _ = as_user("user1", "exec-get")
    row = next(line for line in out.splitlines() if line.startswith(job_id))
    ended = as_user("user1", "exec-get", job_id, "--json")[1]
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(json.loads(ended)["ended"]))
    assert "notebook (ended)" in row and stamp in row and "CANCELLED" not in row, out
    code, out, _ = as_user("user1", "exec-get", job_id)
    assert "kind:        notebook" in out and "state:       notebook (ended)" in out


def test_exec_stop_cancels_a_running_job(hub: Hub, as_user) -> None:
    code, out, err = as_user(
        "user1", "exec-start", "pytorch", "--plan", "/sample-project/training", "--cpus",
        "100m", "--model-dir", "models/sleeper", "--model-main", "main.py", "--json", "--", "120",
    )  # fmt: skip
    assert code == 0, err
    job_id = json.loads(out)["id"]
    wait_for(as_user, "user1", job_id, {"RUNNING"})
    code, out, err = as_user("user1", "--exec-stop", job_id)
    # said once: its workers are being stopped (they get their grace to checkpoint)
    assert code == 0 and out.startswith(f"job {job_id}: cancelling"), (out, err)
    assert (out + err).count("cancelling") == 1 and "RUNNING" not in out + err
    assert wait_for(as_user, "user1", job_id, {"CANCELLED", "FAILED"})["state"] == "CANCELLED"
    code, _, err = as_user("user1", "exec-stop", job_id)
    assert code == 1 and "refused" in err and "already CANCELLED" in err


def test_a_plan_admin_lists_everyones_jobs_with_their_users_and_filters(as_user) -> None:
    for user in ("user1", "user2"):
        code, out, err = as_user(
            user, "exec-start", "PyTorch", "--plan", "/sample-project/training", "--cpus", "100m",
            "--model-dir", "models/sleeper", "--model-main", "main.py", "--json", "--", "0",
        )  # fmt: skip
        assert code == 0, err
    code, out, err = as_user("padmin", "exec-get")
    header, _, *rows = out.splitlines()
    assert code == 0 and header.split()[:2] == ["JOB", "USER"], err
    assert {r.split()[1] for r in rows} >= {"user1", "user2"}
    code, out, _ = as_user(
        "padmin", "exec-get", "--user", "user2", "--state", "PENDING,RUNNING,FINISHED"
    )
    assert code == 0 and {r.split()[1] for r in out.splitlines()[2:]} == {"user2"}, out
    code, out, err = as_user("user1", "exec-get", "--user", "user2")
    assert code == 1 and out == "" and "only plan admins may list other users' jobs" in err


def test_a_user_cannot_see_another_users_job(hub: Hub, as_user) -> None:
    job_id = hub.mnist
    for argv in (["exec-get", job_id], ["exec-stop", job_id], ["exec-outLogs", job_id]):
        code, out, err = as_user("user2", *argv)
        assert (code, out) == (1, ""), argv
        assert "not found" in err and job_id in err
    code, out, _ = as_user("user2", "exec-get", "--json")
    assert code == 0 and job_id not in out


def test_plans_table_and_json(as_user) -> None:
    code, out, _ = as_user("user1", "plans")
    assert code == 0 and out.splitlines()[0].split()[:2] == ["PLAN", "SHARE"]
    dev = next(line.split() for line in out.splitlines() if line.startswith("/project1/dev-team "))
    assert dev[1:3] == ["4", "4"]  # share 4, GPU limit 4
    code, out, _ = as_user("user1", "plans", "--json")
    paths = {p["path"] for p in json.loads(out)["plans"]}
    assert {"/project1/qa-team", "/sample-project/training"} <= paths


def test_usage_shows_the_gpu_hours_of_the_training(hub: Hub, as_user) -> None:
    code, out, err = as_user("user1", "usage", "--plan", "/project1/dev-team", "--hours", "1")
    assert code == 0, err
    title, header, _, *rows = out.splitlines()
    assert title.startswith("usage of /project1/dev-team for user1 from 20") and " to 20" in title
    assert header.split() == ["CHILD", "GPU-HOURS", "CPU-HOURS"]
    cells = {row.split()[0]: row.split()[1:] for row in rows}
    assert float(cells["/project1/dev-team/user1"][0]) > 0  # the 2-worker example's GPUs
    assert cells["total"] == cells["/project1/dev-team/user1"]
    code, out, err = as_user("user1", "usage", "--plan", "/project1/dev-team", "--json")
    assert code == 0 and json.loads(out)["totals"]["gpu_hours"] > 0
    code, out, err = as_user("user1", "usage", "--plan", "/project1", "--step", "1")
    assert code == 1 and "points" in err  # the service's message: too many points
    code, out, err = as_user("user1", "usage", "--hours", "0")
    assert (code, out) == (2, "") and "--hours: give the hours to look back, more than 0" in err


def test_shares_without_the_usage_history_say_it_is_off(as_user) -> None:
    """This hub keeps no usage history (fair_share_half_life 0): every factor is 1, and the
    first line says why and what to set (tests/cli/test_shares.py: with the history on)."""
    code, out, err = as_user("user1", "shares")
    assert code == 0, err
    first, header, _, *rows = out.splitlines()
    assert first.startswith("the usage history is off (c.WmlaService.fair_share_half_life is 0)")
    assert header.split()[:2] == ["Plan", "RawShares"]
    dev = next(r.split() for r in rows if r.startswith("/project1/dev-team "))
    assert dev[1:] == ["4", "0.666667", "0", "0.000000", "1.000000"]  # 4 of 4:2, no usage
    code, out, _ = as_user("user1", "shares", "--json")
    assert code == 0 and json.loads(out)["history"] is False
    code, out, err = as_user("padmin", "shares", "--reset")
    assert (code, out) == (1, "") and "refused: nothing to reset: the usage history is off" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        pytest.param(["exec-start", "PyTorch", "--consumer", "/p", "--workers", "0"],
                     "--workers takes a whole number >= 1", id="workers-0"),
        pytest.param(["exec-start", "PyTorch", "--consumer", "/p"],
                     "--model-dir and --model-main are required", id="no-code"),
        pytest.param(["exec-start", "--consumer", "/p"], "say the framework first",
                     id="no-framework"),
        pytest.param(["exec-start", "Caffe", "--consumer", "/p"], "not supported", id="caffe"),
        pytest.param(["exec-start", "PyTorch", "--consumer", "/p", "--epochs", "2"],
                     "go after `--`", id="script-flag"),
        pytest.param(["exec-get", "--bogus"], "unrecognized arguments: --bogus", id="argparse"),
        pytest.param(["exec-stop"], "required: job", id="missing-job"),
    ],
)  # fmt: skip
def test_bad_flags_exit_2_with_a_message(as_user, argv, message) -> None:
    code, out, err = as_user("user1", *argv)
    assert code == 2 and out == ""
    assert message in err


def test_exec_start_help_lists_the_options_and_their_dlicmd_aliases(as_user) -> None:
    code, out, _ = as_user("user1", "exec-start", "PyTorch", "--help")
    assert code == 0 and "--plan (--consumer)" in out and "--workerDeviceNum" in out
    assert "``" not in out and "====" not in out  # reST's markup, not for a terminal


def test_a_bad_model_dir_is_the_services_message(as_user) -> None:
    code, _, err = as_user(
        "user1", "exec-start", "PyTorch", "--consumer", "/project1/dev-team",
        "--model-dir", "../user2/models/sleeper", "--model-main", "main.py",
    )  # fmt: skip
    assert code == 1 and "outside your folder" in err


def newest_logon_token_ends(hub: Hub, config: Path) -> float:
    """When the newest token wmla logon made expires, as the hub says (epoch seconds)."""
    saved = json.loads(config.read_text())["token"]
    r = requests.get(
        f"{hub.url}/hub/api/users/user2/tokens",
        headers={"Authorization": f"token {saved}"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    ours = [t for t in r.json()["api_tokens"] if t.get("note") == "wmla logon"]
    newest = max(ours, key=lambda t: t["created"])
    assert newest["expires_at"], newest  # never "never"
    return datetime.fromisoformat(newest["expires_at"].replace("Z", "+00:00")).timestamp()


def test_logon_then_the_installed_command_uses_the_saved_token(hub: Hub, as_user) -> None:
    password = hub.password_of("user2")
    config = hub.tmp / "logon" / "config.json"
    os.environ["WMLA_CONFIG"] = str(config)  # as_user restores it afterwards
    code, out, err = as_user(
        "user2", "logon", "--url", hub.url, "--username", "user2", "--password", "wrong"
    )
    assert code == 1 and "refused user 'user2' or the password" in err and not config.exists()
    code, out, err = as_user(
        "user2", "--logon", "--url", hub.url, "--username", "user2", f"--password={password}"
    )
    assert code == 0 and out.startswith("logged on as user2 at "), err
    assert config.stat().st_mode & 0o777 == 0o600
    # the saved token expires: in --days (default 30), at most the hub's maximum (30 days,
    # jupyterhub_config.py), which a longer ask is cut to; the CLI says when
    assert "; the token expires 20" in out and "UTC)" in out, out
    assert abs(newest_logon_token_ends(hub, config) - (time.time() + 30 * 86400)) < 3600
    for days, lasts in (("1", 86400), ("60", 30 * 86400)):
        code, out, err = as_user(
            "user2", "logon", "--url", hub.url, "--username", "user2", "--password", password,
            "--days", days,
        )  # fmt: skip
        assert code == 0, err
        assert abs(newest_logon_token_ends(hub, config) - (time.time() + lasts)) < 3600, days
    env = {k: v for k, v in os.environ.items() if k not in CLEAN}
    env["WMLA_CONFIG"] = str(config)
    # the console script of the project's environment, exactly as a user runs it
    wmla = Path(sys.executable).with_name("wmla")
    command = [str(wmla)] if wmla.exists() else [sys.executable, "-m", "extension.cli"]
    done = subprocess.run(
        [*command, "exec-get", "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    jobs = json.loads(done.stdout)["jobs"]
    assert {j["user"] for j in jobs} <= {"user2"}  # user2's own only (user1's are hidden)


def test_a_notebook_environment_with_the_hub_api_through_the_proxy(
    hub: Hub, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """No WMLA_URL: a server whose JUPYTERHUB_API_URL goes through the proxy (hub_connect_url)."""
    for name in CLEAN:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WMLA_CONFIG", str(hub.tmp / "no-logon.json"))
    monkeypatch.setenv("JUPYTERHUB_API_URL", f"{hub.url}/hub/api")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", hub.tokens["user1"])
    assert cli.main(["exec-get", hub.mnist, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "FINISHED"
