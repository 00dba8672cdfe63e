"""What ``wmla`` prints, against a scripted stand-in for the service (no hub: fast).

``FakeClient`` answers ``job()`` with the next of a list of job states and ``metrics()`` with
the lines reported so far; ``extension.cli_client.WmlaClient`` is replaced by it, so the commands
run through ``extension.cli.main`` exactly as typed. tests/cli/test_cli.py runs the same commands
against a real hub.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from extension import cli, cli_client
from extension.client import WmlaError

NOW = time.time()
BASE = {
    "id": "j1",
    "name": "pytorch_mnist-main",
    "user": "user1",
    "plan": "/project1/dev-team",
    "kind": "train",
    "state": "PENDING",
    "reason": "",
    "workers": {"min": 2, "max": 2, "running": 0},
    "resources": {"gpu": 1, "cpu": 250, "memory": 0},
    "placement": [],
    "submitted": NOW - 60,
    "started": None,
    "ended": None,
    "exit_code": None,
    "command": ["python", "main.py"],
    "workdir": "/s/user1/.wmla/jobs/j1",
}
RUNNING = {
    "state": "RUNNING",
    "workers": {"min": 2, "max": 2, "running": 2},
    "placement": [{"node": "node-0", "devices": [0]}, {"node": "node-0", "devices": [1]}],
}
TIME = re.compile(r"\d\d:\d\d:\d\d ")


class FakeClient:
    """The service as a script: ``states[i]`` is what the i-th ``job()`` answers, and
    ``metrics[i]`` the lines the job has reported by then."""

    def __init__(self, states: list[dict], metrics: list[list[dict]] | None = None) -> None:
        self.states = [{**BASE, **s} for s in states]
        self.reported = metrics or [[] for _ in states]
        self.polls = 0
        self.calls: list[tuple] = []

    def submit(self, body: dict) -> dict:
        self.calls.append(("submit", body))
        return self.states[0]

    def job(self, job_id: str) -> dict:
        self.polls = min(self.polls + 1, len(self.states) - 1)
        return self.states[self.polls]

    def metrics(self, job_id: str, since: int = 0) -> tuple[list[dict], int]:
        lines = self.reported[self.polls]
        return lines[since:], len(lines)

    def jobs(self, states=None, user=None) -> list[dict]:
        self.calls.append(("jobs", states, user))
        return self.states

    def cancel(self, job_id: str) -> dict:
        return self.states[0]

    def usage(self, **params) -> dict:
        self.calls.append(("usage", params))
        return USAGE


USAGE = {
    "plan": "/project1/dev-team",
    "user": None,
    "start": 1_767_225_600.0,  # 2026-01-01 00:00:00 UTC
    "end": 1_767_312_000.0,
    "step": 300.0,
    "totals": {"gpu_hours": 1.5, "cpu_hours": 0.25},
    "children": [
        {"path": "/project1/dev-team/user1", "totals": {"gpu_hours": 1.5, "cpu_hours": 0.25}}
    ],
}


@pytest.fixture
def wmla(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture):
    """``wmla(fake, *argv)`` -> (exit code, stdout, stderr), the service being ``fake``."""
    monkeypatch.setattr(cli_client, "POLL", 0, raising=False)

    def run(fake: FakeClient, *argv: str) -> tuple[int, str, str]:
        monkeypatch.setattr(cli_client, "WmlaClient", lambda **kwargs: fake)
        capsys.readouterr()
        try:
            code = cli.main(list(argv))
        except SystemExit as exc:  # argparse's refusals
            code = exc.code
        out, err = capsys.readouterr()
        return code, out, err

    return run


START = ["exec-start", "PyTorch", "--consumer", "/project1/dev-team", "--workerDeviceNum", "2",
         "--model-dir", "models/pytorch_mnist", "--model-main", "main.py", "--wait"]  # fmt: skip


def lines(text: str) -> list[str]:
    """The lines without their ``HH:MM:SS`` stamps (every line has one)."""
    rows = text.splitlines()
    assert all(TIME.match(row) for row in rows), rows
    return [TIME.sub("", row, count=1) for row in rows]


def test_wait_prints_each_state_change_and_the_latest_metrics(wmla) -> None:
    m1 = {"step": 10, "epoch": 1, "time": 1.0, "rank": 0, "loss": 0.912345, "accuracy": 0.5}
    m2 = {"step": 20, "epoch": 1, "time": 2.0, "rank": 0, "loss": 0.5}
    m3 = {"step": 30, "epoch": 2, "time": 3.0, "rank": 0, "loss": 0.25}
    fake = FakeClient(
        [
            {},
            {"reason": "/project1/dev-team at its gpu limit: 4 of 4 in use"},
            {"reason": "/project1/dev-team at its gpu limit: 4 of 4 in use"},  # no change
            RUNNING,
            RUNNING,  # a new metrics line only
            RUNNING,  # nothing new: nothing printed
            {"state": "FINISHED", "exit_code": 0, "ended": NOW},
        ],
        [[], [], [], [m1], [m1, m2], [m1, m2], [m1, m2, m3]],
    )
    code, out, err = wmla(fake, *START)
    assert (code, err) == (0, "")
    assert lines(out) == [
        "job j1 (pytorch_mnist-main) submitted to /project1/dev-team",
        "job j1 PENDING",
        "job j1 PENDING: /project1/dev-team at its gpu limit: 4 of 4 in use",
        "job j1 RUNNING: 2 of 2 workers running (1 gpu, 250m cpu each); "
        "ranks on node-0[0], node-0[1]",
        "step 10  epoch 1  loss 0.9123  accuracy 0.5",
        "step 20  epoch 1  loss 0.5",
        "step 30  epoch 2  loss 0.25",
        "job j1 FINISHED (exit code 0)",
    ]


@pytest.mark.parametrize(
    ("end", "code", "last"),
    [
        ({"state": "FAILED", "exit_code": 1, "reason": "worker 0 exited with 1"}, 1,
         "job j1 FAILED (exit code 1): worker 0 exited with 1"),
        ({"state": "CANCELLED", "reason": "cancelled by user1"}, 1,
         "job j1 CANCELLED: cancelled by user1"),
    ],
    ids=["failed", "cancelled"],
)  # fmt: skip
def test_wait_exits_1_when_the_job_did_not_finish(wmla, end, code, last) -> None:
    got, out, err = wmla(FakeClient([{}, RUNNING, end]), *START)
    assert (got, err) == (code, "")
    assert lines(out)[-1] == last


def test_wait_with_json_keeps_stdout_json_and_the_progress_on_stderr(wmla) -> None:
    fake = FakeClient([{}, RUNNING, {"state": "FINISHED", "exit_code": 0}])
    code, out, err = wmla(fake, *START, "--json")
    assert code == 0 and json.loads(out)["state"] == "FINISHED"
    assert lines(err)[-1] == "job j1 FINISHED (exit code 0)"


def test_wait_writes_each_line_as_it_happens() -> None:
    """Every line is flushed before the next poll (a pipe or a notebook cell sees it live)."""
    import io

    seen: list[str] = []

    class Stream(io.StringIO):
        def flush(self) -> None:
            seen.append(self.getvalue())

    fake = FakeClient([{}, RUNNING, {"state": "FINISHED", "exit_code": 0}])
    out = Stream()
    cli_client.watch(fake, fake.states[0], out, poll=0)
    assert [len(s.splitlines()) for s in seen] == [1, 2, 3]


def test_metrics_that_cannot_be_read_do_not_stop_the_wait(wmla) -> None:
    class NoMetrics(FakeClient):
        def metrics(self, job_id: str, since: int = 0):
            raise WmlaError("not found: no metrics", 404)

    fake = NoMetrics([{}, RUNNING, {"state": "FINISHED", "exit_code": 0}])
    code, out, _ = wmla(fake, *START)
    assert code == 0 and lines(out)[-1] == "job j1 FINISHED (exit code 0)"


def test_exec_get_shows_notebook_servers_as_notebooks(wmla) -> None:
    ended = NOW - 30
    fake = FakeClient(
        [
            {"id": "n1", "name": "notebook", "kind": "notebook", "state": "CANCELLED",
             "reason": "cancelled by wmla-spawner", "ended": ended,
             "workers": {"min": 1, "max": 1, "running": 0}},
            {"id": "n2", "name": "notebook", "kind": "notebook", **RUNNING,
             "workers": {"min": 1, "max": 1, "running": 1}},
            {"id": "j3", "state": "CANCELLED", "reason": "cancelled by user1", "ended": ended},
        ]
    )  # fmt: skip
    code, out, _ = wmla(fake, "exec-get")
    assert code == 0
    header, _, *rows = out.splitlines()
    assert header.split() == ["JOB", "USER", "NAME", "STATE", "PLAN", "WORKERS", "SUBMITTED",
                              "ENDED", "REASON"]  # fmt: skip
    row = {r.split()[0]: r for r in rows}
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ended))
    assert "notebook (ended)" in row["n1"] and stamp in row["n1"] and "CANCELLED" not in row["n1"]
    assert row["n1"].endswith("server stopped")
    assert "notebook (running)" in row["n2"]
    assert "CANCELLED" in row["j3"] and stamp in row["j3"] and "cancelled by user1" in row["j3"]


def test_exec_get_one_notebook_says_its_kind() -> None:
    job = {**BASE, "kind": "notebook", "state": "CANCELLED", "ended": NOW}
    text = cli_client.job_details(job)
    assert "kind:        notebook" in text and "state:       notebook (ended)" in text
    assert "kind:        train" in cli_client.job_details(BASE)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--hours", "0"], "--hours: give the hours to look back, more than 0"),
        (["--hours", "-1"], "got '-1'"),
        (["--hours", "nan"], "more than 0 and at most 9600 (400 days)"),
        (["--hours", "9601"], "at most 9600"),
        (["--hours", "a day"], "e.g. --hours 24; got 'a day'"),
        (["--step", "0"], "--step: give the seconds between points, at least 1"),
    ],
    ids=["zero", "negative", "nan", "over-400-days", "words", "step-0"],
)
def test_usage_refuses_a_meaningless_range(wmla, argv, message) -> None:
    fake = FakeClient([{}])
    code, out, err = wmla(fake, "usage", *argv)
    assert code == 2 and out == "" and message in err
    assert fake.calls == []  # nothing sent


def test_usage_prints_readable_times_and_asks_from_the_services_now(wmla) -> None:
    fake = FakeClient([{}])
    code, out, err = wmla(fake, "usage", "--plan", "/project1/dev-team", "--hours", "1.5")
    assert code == 0, err
    assert fake.calls == [("usage", {"plan": "/project1/dev-team", "user": None,
                                     "start": "now-5400.000s", "step": None})]  # fmt: skip
    title, header, _, *rows = out.splitlines()
    start = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(USAGE["start"]))
    end = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(USAGE["end"]))
    assert title == f"usage of /project1/dev-team from {start} to {end} (points every 5m)"
    assert not re.search(r"\d{9,}", out)  # no epoch seconds anywhere
    assert header.split() == ["CHILD", "GPU-HOURS", "CPU-HOURS"]
    assert rows[-1].split() == ["total", "1.500", "0.250"]


# -- at admin scale (issue 38) -------------------------------------------------------------------
OOM = (
    "the kernel killed worker 0 for memory (its limit is 512Mi):\n"
    "[worker-0] Killed process 4242 (python) total-vm:2097152kB, anon-rss:524288kB\n"
    "[worker-0] oom_reaper: reaped process 4242 (python)"
)


def test_exec_get_lists_newest_first_with_users_and_one_line_reasons(wmla) -> None:
    fake = FakeClient(
        [
            {"id": "old", "user": "ann", "submitted": NOW - 300, "state": "FAILED", "reason": OOM},
            {"id": "new", "user": "bob", "submitted": NOW - 10},
            {"id": "mid", "user": "ann", "submitted": NOW - 100, "reason": "x" * 300},
        ]
    )
    code, out, _ = wmla(fake, "exec-get", "--user", "ann", "--state", "failed,pending")
    assert code == 0 and fake.calls == [("jobs", ["FAILED", "PENDING"], "ann")]
    header, _, *rows = out.splitlines()
    assert header.split()[:2] == ["JOB", "USER"]
    assert [r.split()[:2] for r in rows] == [["new", "bob"], ["mid", "ann"], ["old", "ann"]]
    assert len(rows) == 3 and max(map(len, out.splitlines())) < 200  # one line each, not 400
    assert rows[2].endswith("the kernel killed worker 0 for memory (its limit is 512Mi...")
    assert rows[1].endswith("x" * 57 + "...")
    code, out, _ = wmla(FakeClient([{"id": "old", "reason": OOM}]), "exec-get", "old")
    assert "oom_reaper: reaped process 4242" in out  # the whole reason, in the job's own view


@pytest.mark.parametrize(
    ("job", "said"),
    [
        ({**RUNNING, "cancel_requested": True, "terminating": True, "reason": "cancelled by user1"},
         "job j1: cancelling (`wmla exec-get j1` shows when it has stopped)"),
        ({"state": "CANCELLED", "reason": "cancelled by user1"}, "job j1 is CANCELLED"),
    ],
    ids=["running", "pending"],
)  # fmt: skip
def test_exec_stop_says_cancelling_once(wmla, job, said) -> None:
    code, out, err = wmla(FakeClient([job]), "exec-stop", "j1")
    assert (code, out, err) == (0, said + "\n", "")


@pytest.mark.parametrize(
    ("word", "command"),
    [
        ("submit", "wmla exec-start PyTorch --plan PLAN"),
        ("sbatch", "wmla exec-start PyTorch --plan PLAN"),
        ("list", "wmla exec-get --state PENDING,RUNNING"),
        ("squeue", "wmla exec-get --state PENDING,RUNNING"),
        ("sacct", "wmla exec-get (newest first"),
        ("cancel", "wmla exec-stop JOB"),
        ("scancel", "wmla exec-stop JOB"),
        ("sshare", "wmla shares"),
    ],
)
def test_slurm_words_name_the_wmla_command(wmla, word, command) -> None:
    code, out, err = wmla(FakeClient([{}]), word, "123")
    assert code == 2 and out == ""
    assert err == f"wmla: {word!r} is not a wmla command; use: " + err.split("use: ", 1)[1]
    assert command in err and "invalid choice" not in err


@pytest.mark.parametrize("argv", [["exec-start", "--help"], ["exec-start", "PyTorch", "-h"]])
def test_exec_start_help_is_plain_text(wmla, argv) -> None:
    code, out, _ = wmla(FakeClient([{}]), *argv)
    assert code == 0 and "--plan (--consumer)" in out and "--runtime-limit DURATION" in out
    assert "``" not in out and "====" not in out
