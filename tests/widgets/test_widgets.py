"""The job monitor and the metering widget through ``get_state()``.

The client here is a recorder with canned API answers (the shapes of docs/service.md), standing
in for the service at the unit layer; the notebook test (tests/magics/test_notebook.py) drives
the same widgets against a real hub and service.
"""

from __future__ import annotations

import copy
from datetime import datetime, timezone

import pytest

from extension.metering.accounting import Fact, Ledger
from extension.metering.usage import usage as metering_usage
from widgets import figures
from widgets.monitor import JobMonitor
from widgets.usage import RECENT, UsageWidget

from .live_view import LiveView, leaves

JOB = {
    "id": "j1", "name": "mnist", "user": "alice", "plan": "/p", "state": "PENDING",
    "reason": "/p at its gpu limit: 2 of 2 in use", "priority": 0, "submitted": 1.0,
    "workers": {"min": 2, "max": 2, "running": 0},
    "resources": {"gpu": 1, "cpu": 250, "memory": 512 << 20},
    "placement": [], "exit_code": None, "preemptions": 0,
    "command": ["python", "/s/alice/m/main.py", "--epochs", "2"],
}  # fmt: skip
# what the service sends with a pending job: its place in line and why it waits
QUEUE = {"position": {"leaf": 1, "plan": 2, "instance": 2}, "plan": "/p",
         "reason": "/p at its gpu limit: 2 of 2 in use", "estimate": None}  # fmt: skip


class CannedClient:
    def __init__(self) -> None:
        self.jobs_seen = [copy.deepcopy(JOB)]
        self.lines = [
            {"step": 1, "epoch": 0, "loss": 2.0},
            {"step": 2, "epoch": 1, "train_loss": 1.5, "test_accuracy": 0.7},
        ]
        self.cancelled: list[str] = []
        self.usage_calls: list[dict] = []

    def job(self, job_id: str) -> dict:
        return copy.deepcopy(self.jobs_seen[-1])

    def jobs(self, states=None, user=None) -> list[dict]:
        other = {**JOB, "id": "j0", "submitted": 0.5}
        return [other, self.jobs_seen[-1]]

    def whoami(self) -> dict:
        return {"name": "alice", "plan_admin": False}

    def metrics(self, job_id: str, since: int = 0):
        return self.lines[since:], len(self.lines)

    def logs(self, job_id: str, tail=None, worker=None) -> str:
        return "[worker-0] epoch 1: test accuracy 0.7\n"

    def cancel(self, job_id: str) -> dict:
        self.cancelled.append(job_id)
        return {**self.jobs_seen[-1], "state": "CANCELLED"}

    def plans(self) -> dict:
        return {"plans": [{"path": "/p"}, {"path": "/p/alice"}]}

    def storage(self) -> dict:
        return {"enforced": False, "users": [{"enforced": False}]}

    def usage(self, **params) -> dict:
        self.usage_calls.append(params)
        return {
            "series": [
                {"t": params["start"], "requested": {"gpu": 2, "cpu": 500},
                 "used": {"gpu": 2, "cpu": 500}},
                {"t": params["end"], "requested": {"gpu": 0, "cpu": 0},
                 "used": {"gpu": 0, "cpu": 0}},
            ],
            "children": [{"path": "/p/alice", "gpu_hours": 2.0, "cpu_hours": 0.5}],
            "totals": {"gpu_hours": 2.0, "cpu_hours": 0.5},
        }  # fmt: skip


def test_monitor_shows_queue_then_progress_chart_and_logs() -> None:
    client = CannedClient()
    client.jobs_seen[-1]["queue"] = QUEUE
    mon = JobMonitor(client, "j1")
    mon.refresh()
    assert "PENDING" in mon.state.get_state()["value"]
    assert "2nd in line in /p" in mon.state.value and "gpu limit" in mon.state.value
    assert mon.workers.value == "0 of 2 workers running (1 gpu, 250m cpu, 512Mi memory each)"
    assert mon.progress.get_state()["value"] == 50.0  # epoch 1 of --epochs 2
    traces = {t["name"]: (list(t["x"]), list(t["y"])) for t in mon.chart.to_dict()["data"]}
    assert traces == {"loss": ([1], [2.0]), "train_loss": ([2], [1.5]),
                      "test_accuracy": ([2], [0.7])}  # fmt: skip
    assert "test accuracy 0.7" in mon.logs.get_state()["value"]
    synced = mon.chart.get_state()["_widget_data"]  # what a saved notebook keeps
    assert [(t["name"], list(t["y"])) for t in synced][0] == ("loss", [2.0])

    client.jobs_seen.append({**JOB, "state": "FINISHED", "reason": "",
                             "workers": {"min": 2, "max": 2, "running": 0}})  # fmt: skip
    client.lines.append({"step": 3, "epoch": 1, "loss": 1.0})
    mon.refresh()
    assert mon.progress.get_state()["value"] == 100.0
    assert mon.progress.bar_style == "success" and mon.cancel_button.disabled
    assert mon.chart.to_dict()["data"][0]["y"] == [2.0, 1.0]  # new lines appended once


def test_cancel_button_cancels_through_the_client() -> None:
    client = CannedClient()
    mon = JobMonitor(client, "j1")
    mon.cancel_button.click()
    assert client.cancelled == ["j1"]
    assert "CANCELLED" in mon.message.value and mon.cancel_button.disabled


def test_usage_widget_charts_the_plan_and_refreshes_on_a_new_range() -> None:
    client = CannedClient()
    widget = UsageWidget(client, plan="/p", now=lambda: 7200.0, time_range="last hour")
    assert widget.plan.get_state()["_options_labels"] == ("/p", "/p/alice")
    widget.refresh()
    assert client.usage_calls[-1] == {"plan": "/p", "user": None, "start": 3600.0,
                                      "end": 7200.0, "step": 1}  # fmt: skip
    gpu = widget.chart.to_dict()["data"][1]
    assert gpu["name"] == "GPU used" and list(gpu["y"]) == [2.0, 0.0]
    assert "/p/alice</td><td>2.000" in widget.table.get_state()["value"]
    assert "2.000 GPU-hours" in widget.message.value
    widget.range.value = "last 24 hours"  # observe -> refresh with the new window
    assert client.usage_calls[-1]["start"] == 7200.0 - 86400 and len(client.usage_calls) == 2
    assert widget.quota.value == ""  # the canned client's service holds no quota


def test_usage_widget_warns_from_ninety_percent_of_the_storage_quota() -> None:
    client = CannedClient()
    mine = {"enforced": True, "folder": "/s/alice", "used_bytes": 95 * 2**20, "used_files": 9,
            "storage": 100 * 2**20, "soft_storage": 100 * 2**20, "files": 900,
            "soft_files": 900, "held_bytes": 100 * 2**20, "held_files": 900, "state": "near",
            "grace_left": None}  # fmt: skip
    client.storage = lambda: {"users": [mine]}
    widget = UsageWidget(client, plan="/p", now=lambda: 7200.0, time_range="last hour")
    widget.refresh()
    assert "holds 95 MiB of its 100 MiB quota" in widget.quota.value
    assert "(95%)" in widget.quota.value


# -- the live chart ------------------------------------------------------------------------------
def mnist_lines(epochs: int, steps_per_epoch: int) -> list[dict]:
    """What examples/pytorch_mnist reports: the loss every step, then per epoch the mean
    train_loss and the test accuracy (with the number of epochs done)."""
    lines, step = [], 0
    for epoch in range(epochs):
        for _ in range(steps_per_epoch):
            step += 1
            lines.append({"step": step, "time": float(step), "rank": 0, "epoch": epoch,
                          "loss": 2.0 / step, "world_size": 2})  # fmt: skip
        lines.append({"step": step, "time": float(step), "rank": 0, "epoch": epoch + 1,
                      "train_loss": 1.0 / (epoch + 1), "test_accuracy": 0.8 + epoch / 100,
                      "world_size": 2})  # fmt: skip
    return lines


def assert_shows(fig: dict, fresh: dict) -> None:
    """``fig`` (what a view or the saved state holds) is the fresh figure: every named series
    with all its points, on its axis, with the fresh layout; accuracy on its own side."""
    traces = {t["name"]: t for t in fig["data"]}
    assert list(traces) == [t["name"] for t in fresh["data"]]
    for want in fresh["data"]:
        got = traces[want["name"]]
        for key in ("yaxis", "mode"):
            assert got.get(key) == want[key], (want["name"], key)
        assert list(got["x"]) == want["x"] and list(got["y"]) == want["y"], want["name"]
    for key, value in leaves(fresh["layout"]).items():
        assert leaves(fig["layout"]).get(key) == value, key
    axes = {t.get("yaxis", "y") for t in fig["data"]}
    sides = [fig["layout"].get(a.replace("y", "yaxis", 1), {}).get("side", "left") for a in axes]
    assert len(sides) == len(set(sides)), f"two y-axes on one side: {axes} {sides}"
    for name, trace in traces.items():
        if "acc" in name:
            assert trace["yaxis"] == "y2" and fig["layout"]["yaxis2"]["overlaying"] == "y"


def test_the_live_chart_after_every_batch_is_the_fresh_figure() -> None:
    lines = mnist_lines(epochs=2, steps_per_epoch=20)
    lines.append({"step": 41, "epoch": 2, "val_loss": 0.4})  # a loss seen late sorts first
    batches = [lines[:5], lines[5:21], lines[21:35], lines[35:42], lines[42:]]
    client = CannedClient()
    client.lines = []
    client.jobs_seen.append({**JOB, "state": "RUNNING"})
    mon = JobMonitor(client, "j1")
    view = LiveView(mon.chart)  # opened before any metrics, as %wmla_train displays it
    for batch in batches:
        client.lines.extend(batch)
        mon.refresh()
        fresh = figures.metrics_figure(client.lines, title="mnist metrics")
        assert view.errors == []
        assert_shows(view.figure(), fresh)  # the open view, live
        assert_shows(mon.chart.to_dict(), fresh)  # the widget's own figure
        saved = {"data": mon.chart._widget_data, "layout": mon.chart._widget_layout}
        assert_shows(saved, fresh)  # what a saved notebook or a new view draws
    names = [t["name"] for t in view.data]
    assert names == ["loss", "train_loss", "val_loss", "test_accuracy"]


def test_the_live_chart_fits_a_percentage_accuracy_as_it_grows() -> None:
    """A script that reports accuracy in percent: the open view's right axis follows the
    values epoch after epoch (it was 0..1 before, with the points drawn off the chart)."""
    lines = mnist_lines(epochs=3, steps_per_epoch=5)
    for line in lines:
        if "test_accuracy" in line:
            line["test_accuracy"] = round(100 * line["test_accuracy"], 2)  # 80, 81, 82
    client = CannedClient()
    client.lines = []
    client.jobs_seen.append({**JOB, "state": "RUNNING"})
    mon = JobMonitor(client, "j1")
    view = LiveView(mon.chart)
    for end in (6, 12, 18):
        client.lines = lines[:end]
        mon.refresh()
        accuracy = [x["test_accuracy"] for x in client.lines if "test_accuracy" in x]
        axis = view.figure()["layout"]["yaxis2"]
        assert view.errors == []
        assert axis["title"]["text"] == "accuracy (%)" and axis["side"] == "right"
        assert axis["range"][0] <= min(accuracy) and max(accuracy) <= axis["range"][1]
        assert axis["range"][1] - axis["range"][0] <= 10  # fits the values, not 0..100
        assert view.figure()["layout"]["yaxis"]["side"] == "left"


# -- the cancel button ---------------------------------------------------------------------------
@pytest.mark.parametrize("state", ["FINISHED", "FAILED", "CANCELLED", "REJECTED"])
def test_a_monitor_opened_on_an_ended_job_offers_no_cancel(state: str) -> None:
    client = CannedClient()
    client.jobs_seen = [{**JOB, "state": state, "reason": ""}]
    mon = JobMonitor(client, "j1")
    assert mon.cancel_button.get_state()["disabled"]  # off until the job is read
    mon.refresh()
    button = mon.cancel_button.get_state()
    assert button["disabled"] and button["description"] == f"Job {state.lower()}"
    assert f"the job is {state}" in button["tooltip"] and "cannot be cancelled" in button["tooltip"]


def test_the_cancel_button_turns_off_with_the_reason_when_the_job_ends() -> None:
    client = CannedClient()
    client.jobs_seen = [{**JOB, "state": "RUNNING"}]
    mon = JobMonitor(client, "j1")
    mon.refresh()
    assert not mon.cancel_button.disabled and mon.cancel_button.description == "Cancel job"
    client.jobs_seen.append({**JOB, "state": "FINISHED", "reason": ""})
    mon.refresh()
    assert mon.cancel_button.disabled and mon.cancel_button.description == "Job finished"
    assert "cannot be cancelled" in mon.cancel_button.tooltip


@pytest.mark.parametrize(
    ("state", "style"),
    [("FINISHED", "success"), ("FAILED", "danger"), ("REJECTED", "danger"),
     ("CANCELLED", "warning"), ("TIMEOUT", "warning")],
)  # fmt: skip
def test_the_cancel_button_is_red_only_while_it_can_stop_the_job_or_the_job_failed(
    state: str, style: str
) -> None:
    client = CannedClient()
    client.jobs_seen = [{**JOB, "state": "RUNNING"}]
    mon = JobMonitor(client, "j1")
    assert mon.cancel_button.button_style == ""  # not read yet: nothing to say
    mon.refresh()
    assert mon.cancel_button.button_style == "danger"  # a click throws the run away
    client.jobs_seen.append({**JOB, "state": state, "reason": ""})
    mon.refresh()
    assert mon.cancel_button.button_style == style
    assert mon.progress.bar_style == style  # the bar and the button agree


def test_a_refused_cancel_of_an_ended_job_leaves_the_button_off() -> None:
    client = CannedClient()
    client.jobs_seen = [{**JOB, "state": "RUNNING"}]
    mon = JobMonitor(client, "j1")
    mon.refresh()
    client.jobs_seen.append({**JOB, "state": "FINISHED"})

    def refuse(job_id: str) -> dict:
        mon.job = client.job(job_id)  # the watch thread read the end meanwhile
        raise RuntimeError("job j1 is FINISHED; only PENDING or RUNNING jobs can be cancelled")

    client.cancel = refuse
    mon.cancel_button.click()
    assert "FINISHED" in mon.message.value and mon.cancel_button.disabled


# -- progress ------------------------------------------------------------------------------------
def test_progress_walks_through_the_phases_of_a_job() -> None:
    client = CannedClient()
    client.lines = []
    mon = JobMonitor(client, "j1")  # --epochs 2
    lines = mnist_lines(epochs=2, steps_per_epoch=4)
    running = {**JOB, "state": "RUNNING", "reason": ""}
    walk = [  # (job, metric lines so far, label, bar)
        (JOB, [], "waiting: /p at its gpu limit: 2 of 2 in use", 0.0),
        (running, [], "starting workers (0 of 2 up), waiting for the first step", 0.0),
        ({**running, "workers": {"min": 2, "max": 2, "running": 2}}, [],
         "starting workers (2 of 2 up), waiting for the first step", 0.0),
        # the first epoch: its steps are counted, of no known total yet, so no percentage
        (running, lines[:1], "first step done, epoch 1 of 2, step 1", 0.0),
        (running, lines[:3], "epoch 1 of 2, step 3", 0.0),
        (running, lines[:5], "epoch 2 of 2, step 4 · 50%", 50.0),  # epoch 1 done: 4 steps each
        (running, lines[:7], "epoch 2 of 2, step 6 · 75%", 75.0),
        (running, lines, "all 2 epochs done, finishing · 99%", 99.0),
        ({**running, "state": "FINISHED"}, lines, "done · 100%", 100.0),
    ]  # fmt: skip
    labels = []
    for job, seen, label, bar in walk:
        client.jobs_seen.append(copy.deepcopy(job))
        client.lines = list(seen)
        mon.refresh()
        assert (mon.progress_label.get_state()["value"], mon.progress.value) == (label, bar)
        labels.append(mon.progress_label.value)
    assert len(set(labels)) == len(labels)  # the text moves with the job


def test_progress_of_a_script_without_epochs_counts_steps() -> None:
    client = CannedClient()
    client.jobs_seen = [{**JOB, "state": "RUNNING", "command": ["python", "main.py"]}]
    client.lines = [{"step": s, "loss": 1.0 / s} for s in (1, 2, 3)]
    mon = JobMonitor(client, "j1")
    mon.refresh()
    assert mon.progress_label.value == "step 3" and mon.progress.value == 0.0
    client.lines.append({"step": 4, "loss": 0.2, "total_steps": 8})  # the script says its total
    mon.refresh()
    assert mon.progress_label.value == "step 4 of 8 · 50%" and mon.progress.value == 50.0


def test_no_percentage_through_the_first_epoch_until_a_total_is_known() -> None:
    """23 steps into the first of 4 epochs nothing says how many steps an epoch has: the label
    counts the steps and shows no "0%"; once an epoch is done, or the script reports
    total_steps, the percentage is true and shown."""
    client = CannedClient()
    client.jobs_seen = [{**JOB, "state": "RUNNING", "command": ["python", "m.py", "--epochs", "4"]}]
    client.lines = [{"step": s, "epoch": 0, "loss": 1.0} for s in range(1, 24)]
    mon = JobMonitor(client, "j1")
    mon.refresh()
    assert mon.progress_label.value == "epoch 1 of 4, step 23"
    assert "%" not in mon.progress_label.value and mon.progress.value == 0.0
    client.lines.append({"step": 24, "epoch": 0, "loss": 0.9, "total_steps": 96})
    mon.refresh()
    assert mon.progress_label.value == "epoch 1 of 4, step 24 of 96 · 25%"
    job = {"state": "RUNNING", "command": ["python", "m.py", "--epochs", "4"]}
    first, second = {"step": 50, "epoch": 0}, {"step": 51, "epoch": 1}
    assert figures.progress_phase(job, [first])["fraction"] is None
    assert figures.progress_phase(job, [first, second])["fraction"] == pytest.approx(51 / 204)


def test_the_epochs_a_script_reports_win_over_its_arguments() -> None:
    job = {"state": "RUNNING", "command": ["python", "main.py", "--epochs", "2"]}
    metrics = [{"step": 1, "epoch": 0, "loss": 1.0, "epochs": 5}]
    assert figures.total_epochs(job, metrics) == 5
    assert figures.progress_phase(job, metrics)["text"] == "first step done, epoch 1 of 5, step 1"
    assert "epochs" not in figures.metric_names(metrics)  # a total, not a curve


# -- the usage widget ----------------------------------------------------------------------------
NOW = 1_800_000_000.0
TRAINING = {**JOB, "plan": "/sample-project/training", "state": "FINISHED",
            "submitted": NOW - 300, "started": NOW - 295, "ended": NOW - 205,
            "workers": {"min": 2, "max": 2, "running": 0}}  # fmt: skip


class MeteredClient(CannedClient):
    """Usage from the real metering over a ledger of the given jobs' transitions."""

    def __init__(self, jobs: list[dict]) -> None:
        super().__init__()
        self.my_jobs = jobs
        self.ledger = Ledger()
        for job in jobs:
            leaf = f"{job['plan']}/alice"
            per = job["resources"]
            for at, state, held in ((job["submitted"], "PENDING", 0),
                                    (job["started"], "RUNNING", job["workers"]["max"]),
                                    (job["ended"], "FINISHED", 0)):  # fmt: skip
                self.ledger.apply(Fact(at, job["id"], leaf, "alice", state.lower(), state,
                                       held, job["workers"]["max"], per["gpu"], per["cpu"],
                                       per["memory"]))  # fmt: skip

    def jobs(self, states=None, user=None) -> list[dict]:
        assert user == "alice"  # the caller's own jobs, also for a plan admin
        return copy.deepcopy(self.my_jobs)

    def plans(self) -> dict:
        paths = ["/", "/notebooks", "/sample-project", "/sample-project/training"]
        return {"plans": [{"path": p} for p in paths]}

    def usage(self, **params) -> dict:
        self.usage_calls.append(params)
        return metering_usage(self.ledger, params["plan"], params["start"], params["end"],
                              params["step"], NOW, params["user"] or "alice")  # fmt: skip


def test_usage_defaults_to_the_plan_and_a_window_of_the_recent_training_job() -> None:
    client = MeteredClient([TRAINING])
    widget = UsageWidget(client, now=lambda: NOW)
    assert widget.plan.value == "/sample-project/training" and widget.range.value == RECENT
    widget.refresh()
    call = client.usage_calls[-1]
    assert call["plan"] == "/sample-project/training" and call["end"] == NOW
    assert call["start"] <= TRAINING["submitted"] and call["step"] == 1.0
    assert widget.usage["totals"]["gpu_hours"] == 2 * 90 / 3600  # the run is in the window


def test_usage_defaults_to_the_plan_holding_all_recent_jobs_else_the_last_day() -> None:
    other = {**TRAINING, "id": "j2", "plan": "/sample-project/eval", "submitted": NOW - 100}
    widget = UsageWidget(MeteredClient([TRAINING, other]), now=lambda: NOW)
    assert widget.plan.value == "/sample-project"
    old = {**TRAINING, "submitted": NOW - 30 * 86400}
    widget = UsageWidget(MeteredClient([old]), now=lambda: NOW)
    assert widget.range.value == "last 24 hours" and RECENT not in widget.range.options


@pytest.mark.parametrize(
    "time_range", [None, "last hour", "last 24 hours", "last 7 days", "last 30 days"]
)
def test_a_2_gpu_job_of_90_s_draws_as_a_flat_2_for_its_run(time_range) -> None:
    """The chart draws the metering's step function (the API's ``changes``), not per-step
    averages: over 30 days the steps are 720 s and a 90 s run of 2 GPUs averages 0.25 in its
    step, yet the line is 2.0 for exactly the 90 s of the run, in every range."""
    widget = UsageWidget(MeteredClient([TRAINING]), now=lambda: NOW, time_range=time_range)
    widget.refresh()
    used = next(t for t in widget.chart.to_dict()["data"] if t["name"] == "GPU used")
    assert used["line"]["shape"] == "hv"
    when = [datetime.strptime(x, "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
            for x in used["x"]]  # fmt: skip
    assert list(used["y"]) == [0.0, 2.0, 0.0, 0.0]  # idle, the run at 2 GPUs, idle to now
    assert when[1:] == [TRAINING["started"], TRAINING["ended"], NOW]  # exactly the run
    averages = widget.usage["used"]["gpu"]  # what the chart drew before: per-step averages
    if widget.window()[2] > 90:
        assert max(averages) < 2.0  # a spike below the job's 2 GPUs
    requested = next(t for t in widget.chart.to_dict()["data"] if t["name"] == "GPU requested")
    assert list(requested["y"]) == [0.0, 2.0, 0.0, 0.0]  # asked for from its submission
    assert widget.usage["totals"]["gpu_hours"] == 2 * 90 / 3600
