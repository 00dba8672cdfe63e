"""``wmla simulate --jobs-csv``: one row per run segment of every job, as sacct gives Slurm
users, on a small scenario with a shrink, a growth, a preemption, a job still running, one
that never started and one rejected; the same rows from the scenario runner and the replay,
and the rows add up to the GPU-seconds the replay measured."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from extension.cli import main
from extension.sim.segments import COLUMNS, End

SCENARIO = {
    "format": 1,
    "capacity": {"nodes": 1, "per_node": {"gpu": 4, "cpu": 16, "memory": "64Gi"}},
    "config": {"grace": 5, "min_runtime": 0, "checkpoint_every": 10},
    "plans": {"/a": {"share": 1}, "/b": {"share": 1}},
    "until": 400,
    "jobs": [
        {"id": "a-elastic", "at": 0, "user": "ann", "plan": "/a", "workers": "1:4",
         "per_worker": {"gpu": 1}, "duration": 100},
        {"id": "b-gang", "at": 10, "user": "bob", "plan": "/b", "workers": 2,
         "per_worker": {"gpu": 1}, "duration": 50},
        {"id": "a-rigid", "at": 100, "user": "ann", "plan": "/a", "workers": 4,
         "per_worker": {"gpu": 1}, "duration": 100},
        {"id": "b-one", "at": 150, "user": "bob", "plan": "/b", "workers": 1,
         "per_worker": {"gpu": 1}, "duration": 20},
        {"id": "b-late", "at": 160, "user": "bob", "plan": "/b", "workers": 4,
         "per_worker": {"gpu": 1}, "duration": 1000},
        {"id": "a-never", "at": 300, "user": "ann", "plan": "/a", "workers": 4,
         "per_worker": {"gpu": 1}, "duration": 10},
        {"id": "a-huge", "at": 180, "user": "ann", "plan": "/a", "workers": 1,
         "per_worker": {"gpu": 8}, "duration": 10},
    ],
}  # fmt: skip

# job_id, gpus, start_s, end_s, end: worked out from the scenario's rules (grace 5 s)
WANTED = [
    ("a-elastic", "4", "0", "15", "shrunk"),  # b-gang's 2 GPUs taken back (10 + grace)
    ("a-elastic", "2", "15", "65", "grown"),  # b-gang done: back to 4
    ("a-elastic", "4", "65", "125", "finished"),
    ("b-gang", "2", "15", "65", "finished"),
    ("a-rigid", "4", "125", "155", "preempted"),  # b-one reclaims (150 + grace)
    ("a-rigid", "4", "175", "255", "finished"),  # back in line, from its last checkpoint
    ("b-one", "1", "155", "175", "finished"),
    ("b-late", "4", "255", "", "running"),  # still running at until: no end_s
    ("a-huge", "8", "", "", "rejected"),  # a worker larger than any node: what it asked for
    ("a-never", "4", "", "", "never_started"),  # pending at until: no start_s
]


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    path = tmp_path / "segments.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    return path


def read(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == COLUMNS
        return list(reader)


def test_one_row_per_segment_and_one_per_job_that_never_ran(scenario, tmp_path, capsys):
    out = tmp_path / "jobs.csv"
    assert main(["simulate", "--scenario", str(scenario), "--jobs-csv", str(out)]) == 0
    rows = read(out)
    got = [(r["job_id"], r["gpus"], r["start_s"], r["end_s"], r["end"]) for r in rows]
    assert got == WANTED
    first = rows[0]
    assert (first["team"], first["user"], first["submit_s"]) == ("/a", "ann", "0")
    assert {r["submit_s"] for r in rows if r["job_id"] == "a-never"} == {"300"}
    assert {r["end"] for r in rows} <= {e.value for e in End}


def test_the_rows_add_up_to_the_gpu_seconds_held(scenario, tmp_path, capsys):
    out = tmp_path / "jobs.csv"
    argv = ["simulate", "--scenario", str(scenario), "--jobs-csv", str(out), "--json"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)["summary"]
    until = SCENARIO["until"]
    held: dict[str, float] = {}
    for r in read(out):
        if r["start_s"]:
            end = float(r["end_s"]) if r["end_s"] else until
            held[r["team"]] = held.get(r["team"], 0) + float(r["gpus"]) * (
                end - float(r["start_s"])
            )
    teams = {p: v for p, v in summary["held_gpu_s"]["plans"].items() if p.count("/") == 1}
    assert held == teams == {"/a": 840, "/b": 700}


def test_the_replay_writes_the_same_rows_and_one_file_per_policy(scenario, tmp_path, capsys):
    runner, replay = tmp_path / "runner.csv", tmp_path / "replay.csv"
    assert main(["simulate", "--scenario", str(scenario), "--jobs-csv", str(runner)]) == 0
    argv = ["simulate", "--scenario", str(scenario), "--policy", "wmla", "--quiet"]
    assert main(argv + ["--jobs-csv", str(replay)]) == 0
    assert replay.read_text() == runner.read_text()
    both = tmp_path / "both.csv"
    assert main(argv + ["--policy", "gang-fifo", "--jobs-csv", str(both)]) == 0
    assert (tmp_path / "both.wmla.csv").read_text() == runner.read_text()
    fifo = read(tmp_path / "both.gang-fifo.csv")
    assert {r["end"] for r in fifo} <= {"finished", "running", "never_started", "rejected"}
    assert not both.exists()


def test_a_jobs_csv_in_a_missing_folder_exits_2_before_anything_runs(scenario, tmp_path, capsys):
    out = tmp_path / "nowhere" / "jobs.csv"
    assert main(["simulate", "--scenario", str(scenario), "--jobs-csv", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--jobs-csv" in err and "does not exist" in err
