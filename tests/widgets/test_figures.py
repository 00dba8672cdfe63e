"""Figure and text functions on fixed inputs, compared through their dict output."""

from __future__ import annotations

import pytest

from widgets import figures

METRICS = [
    {"step": 1, "time": 1.0, "rank": 0, "epoch": 0, "loss": 2.0, "world_size": 2},
    {"step": 2, "time": 2.0, "rank": 0, "epoch": 0, "loss": None, "world_size": 2},
    {"step": 3, "time": 3.0, "rank": 0, "epoch": 0, "loss": 1.0, "world_size": 2},
    {"step": 3, "time": 3.5, "rank": 0, "epoch": 1, "train_loss": 1.5, "test_accuracy": 0.8},
]


def test_metrics_figure_plots_losses_left_and_accuracy_right() -> None:
    fig = figures.metrics_figure(METRICS, title="mnist")
    assert [(t["name"], t["x"], t["y"], t["yaxis"]) for t in fig["data"]] == [
        ("loss", [1, 3], [2.0, 1.0], "y"),  # the diverged (null) step is left out
        ("train_loss", [3], [1.5], "y"),
        ("test_accuracy", [3], [0.8], "y2"),
    ]
    assert fig["layout"]["title"]["text"] == "mnist"
    assert fig["layout"]["yaxis"] == {"title": {"text": "loss"}, "side": "left"}  # its own range
    assert fig["layout"]["yaxis2"] == {
        "title": {"text": "accuracy"}, "overlaying": "y", "side": "right", "tickmode": "auto",
        "showgrid": False, "range": [0.78, 0.82],  # one value: 2% of the 0..1 scale around it
    }  # fmt: skip


@pytest.mark.parametrize(
    ("accuracy", "title", "expected"),
    [
        ([0.62, 0.71, 0.82], "accuracy", [0.6, 0.84]),  # a fraction: its span, not 0..1
        ([62.0, 81.0, 91.5], "accuracy (%)", [59.05, 94.45]),  # a percentage, not cut at 1
        ([90.0, 100.0], "accuracy (%)", [88.0, 102.0]),  # a value on the edge stays inside
        ([0.0, 1.0], "accuracy", [-0.1, 1.1]),
        ([0.97, 0.99], "accuracy", [0.95, 1.0]),  # padded, but not past the fraction's 1
    ],
    ids=["fraction", "percentage", "percentage-at-100", "whole-fraction", "near-1"],
)
def test_the_accuracy_axis_fits_its_values_and_loss_keeps_its_own(
    accuracy, title, expected
) -> None:
    lines = [{"step": i + 1, "loss": 3.0 - i, "val_accuracy": a} for i, a in enumerate(accuracy)]
    layout = figures.metrics_figure(lines)["layout"]
    right, left = layout["yaxis2"], layout["yaxis"]
    assert right["title"]["text"] == title
    assert right["range"] == pytest.approx(expected)
    assert right["range"][0] <= min(accuracy) and max(accuracy) <= right["range"][1]
    assert (right["side"], right["overlaying"]) == ("right", "y")
    assert left["side"] == "left" and "range" not in left  # loss: plotly fits it on the left


def test_an_empty_figure_has_no_traces_and_no_second_axis() -> None:
    fig = figures.metrics_figure([])
    assert fig["data"] == [] and "yaxis2" not in fig["layout"]


@pytest.mark.parametrize(
    "job, metrics, epochs, expected",
    [
        pytest.param({"state": "FINISHED"}, [], None, 1.0, id="finished-is-100"),
        pytest.param({"state": "RUNNING"}, METRICS, 4, 0.25, id="epochs-done"),
        pytest.param({"state": "RUNNING"}, METRICS, None, 0.0, id="unknown-total"),
        pytest.param({"state": "RUNNING"}, [{"progress": 0.5}], 4, 0.5, id="reported-progress"),
        pytest.param({"state": "RUNNING"}, [{"epoch": 9}], 4, 0.99, id="never-100-before-end"),
        pytest.param({"state": "PENDING"}, [], 4, 0.0, id="pending"),
    ],
)
def test_progress(job, metrics, epochs, expected) -> None:
    assert figures.progress_fraction(job, metrics, epochs) == expected


@pytest.mark.parametrize(
    "args, epochs",
    [
        (["--batch-size", "64", "--epochs", "4"], 4),
        (["--epochs=3"], 3),
        (["--epochs"], None),
        (["--epochs", "x"], None),
        ([], None),
    ],
)
def test_epochs_from_the_scripts_arguments(args, epochs) -> None:
    assert figures.epochs_from_args(args) == epochs


def test_script_args_follow_the_script_in_the_command() -> None:
    job = {"command": ["/venv/bin/python", "/s/u/m/main.py", "--epochs", "2"]}
    assert figures.script_args(job) == ["--epochs", "2"]


def test_state_and_workers_texts() -> None:
    job = {
        "state": "PENDING",
        "plan": "/project1/dev-team",
        "reason": "/project1/dev-team at its gpu limit: 2 of 2 in use",
        "workers": {"min": 2, "max": 4, "running": 0},
        "resources": {"gpu": 1, "cpu": 500, "memory": 1 << 30},
        "placement": [],
    }
    assert figures.state_html(job) == (  # no queue object: the reason alone
        '<b style="color:#b58900">PENDING</b> &mdash; '
        "/project1/dev-team at its gpu limit: 2 of 2 in use"
    )
    assert figures.workers_text(job) == "0 of 2-4 workers running (1 gpu, 0.5 cpu, 1Gi memory each)"
    running = {**job, "workers": {"min": 2, "max": 2, "running": 2}, "placement": ["n0", "n0"]}
    assert figures.workers_text(running).endswith("2 of 2 workers running (1 gpu, 0.5 cpu, "
                                                 "1Gi memory each); ranks on n0, n0")  # fmt: skip
    failed = {"state": "FAILED", "reason": "<worker 1> exit", "exit_code": 3}
    assert figures.state_html(failed) == (
        '<b style="color:#c62828">FAILED</b> &mdash; &lt;worker 1&gt; exit &mdash; exit code 3'
    )


POINTS = {
    "plan": "/project1",
    "series": [
        {"t": 0, "requested": {"gpu": 4, "cpu": 2000}, "used": {"gpu": 2, "cpu": 1000}},
        {"t": 3600, "requested": {"gpu": 2, "cpu": 500}, "used": {"gpu": 2, "cpu": 500}},
    ],
    "children": [
        {"path": "/project1/qa-team", "gpu_hours": 1.0, "cpu_hours": 0.5},
        {"path": "/project1/dev-team", "totals": {"gpu_hours": 3.0, "cpu_hours": 1.5}},
    ],
    "totals": {"gpu_hours": 4.0, "cpu_hours": 2.0},
}
COLUMNS = {  # the shape extension/metering/usage.py answers
    "plan": "/project1", "user": None, "start": 0.0, "end": 7200.0, "step": 3600.0,
    "series": {
        "t": [0, 3600],
        "requested": {"gpu": [4, 2], "cpu": [2000, 500], "memory": [0, 0]},
        "used": {"gpu": [2, 2], "cpu": [1000], "memory": [0, 0]},  # short: padded with zeros
    },
    "totals": {"gpu_hours": 4.0, "cpu_hours": 2.0, "memory_gib_hours": 0.0,
               "requested": {"gpu_hours": 6.0}, "used": {"gpu_hours": 4.0}},
    "children": [
        {"path": "/project1/qa-team", "user_leaf": False, "series": {},
         "totals": {"gpu_hours": 1.0, "cpu_hours": 0.5, "used": {"gpu_hours": 1.0}}},
        {"path": "/project1/dev-team", "user_leaf": False, "series": {},
         "totals": {"gpu_hours": 3.0, "cpu_hours": 1.5}},
    ],
}  # fmt: skip


@pytest.mark.parametrize("answer", [POINTS, COLUMNS], ids=["points", "columns"])
def test_usage_answers_normalise_to_one_shape(answer) -> None:
    norm = figures.normalise_usage(answer)
    assert norm["t"] == [0, 3600]
    assert norm["requested"] == {"gpu": [4.0, 2.0], "cpu": [2000.0, 500.0]}
    assert norm["used"]["gpu"] == [2.0, 2.0]
    assert norm["children"] == [
        {"name": "/project1/dev-team", "gpu_hours": 3.0, "cpu_hours": 1.5},
        {"name": "/project1/qa-team", "gpu_hours": 1.0, "cpu_hours": 0.5},
    ]
    assert norm["totals"] == {"gpu_hours": 4.0, "cpu_hours": 2.0}


def test_usage_figure_requested_vs_used_gpu_and_cpu_cores() -> None:
    fig = figures.usage_figure(POINTS, title="/project1")
    assert [(t["name"], t["y"], t["yaxis"], t["line"]["dash"]) for t in fig["data"]] == [
        ("GPU requested", [4.0, 2.0], "y", "dash"),
        ("GPU used", [2.0, 2.0], "y", "solid"),
        ("CPU requested", [2.0, 0.5], "y2", "dash"),
        ("CPU used", [1.0, 0.5], "y2", "solid"),
    ]
    assert fig["data"][0]["x"] == ["1970-01-01 00:00:00", "1970-01-01 01:00:00"]
    assert all(t["line"]["shape"] == "hv" for t in fig["data"])  # step functions, as metered
    assert fig["layout"]["title"]["text"] == "/project1"


def test_hours_table_lists_children_then_the_total() -> None:
    text = figures.hours_table_html(POINTS)
    assert text.index("/project1/dev-team</td><td>3.000") < text.index("/project1/qa-team")
    assert "<b>total</b></td><td><b>4.000</b></td><td><b>2.000</b>" in text


def test_children_may_be_a_mapping_of_name_to_totals() -> None:
    norm = figures.normalise_usage({"children": {"/a": {"gpu_hours": 1}, "/b": {"gpu_hours": 2}}})
    assert [c["name"] for c in norm["children"]] == ["/b", "/a"]


def test_an_empty_or_odd_usage_answer_gives_an_empty_chart() -> None:
    norm = figures.normalise_usage({"series": [{"nope": 1}, 3], "children": [7]})
    assert norm["t"] == [] and norm["children"] == []
    assert all(t["x"] == [] for t in figures.usage_figure(norm)["data"])


def test_plan_options_are_sorted_paths() -> None:
    tree = {"plans": [{"path": "/b"}, {"path": "/a"}, {"path": "/a/x"}]}
    assert figures.plan_options(tree) == ["/a", "/a/x", "/b"]


def test_every_state_a_job_can_be_in_has_a_colour() -> None:
    """A new state (TIMEOUT came with runtime limits) is drawn in its own colour, not missing."""
    from extension.scheduler import JobState
    from widgets.figures.common import STATE_COLOURS

    assert set(STATE_COLOURS) == {state.value for state in JobState}
    assert len(set(STATE_COLOURS.values())) >= len(STATE_COLOURS) - 1  # FAILED ~ REJECTED
