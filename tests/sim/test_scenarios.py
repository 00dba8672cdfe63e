"""The contract's scenarios S1-S5 as data files, run through `wmla simulate --scenario`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from extension.cli import main

SCENARIOS = Path(__file__).parent.parent / "scenarios"


def simulate(name: str, capsys) -> dict:
    assert main(["simulate", "--scenario", str(SCENARIOS / name), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def held_at(out: dict, t: float) -> dict[str, int]:
    """Workers per job in the timeline entry in force at time t."""
    entry = [e for e in out["timeline"] if e["t"] <= t][-1]
    return entry["running"]


def check_job(job_id: str, job: dict, wanted: dict) -> None:
    for key, value in wanted.items():
        if key == "error_contains":
            assert all(words in job["error"] for words in value), (job_id, job["error"])
        else:
            assert job[key] == value, (job_id, key, job[key], value)


@pytest.mark.parametrize(
    "name", sorted(p.name for p in SCENARIOS.glob("*.yaml")), ids=lambda n: n.removesuffix(".yaml")
)
def test_every_scenario_gives_what_its_file_expects(name, capsys):
    """The scenario files carry their expected results as data (``expect:``): per job (``*``
    for every job), the summary, and who runs at given times."""
    expect = yaml.safe_load((SCENARIOS / name).read_text()).get("expect")
    assert expect, f"{name} has no expect: section"
    out = simulate(name, capsys)
    for job_id, wanted in (expect.get("jobs") or {}).items():
        ids = list(out["jobs"]) if job_id == "*" else [job_id]
        for one in ids:
            check_job(one, out["jobs"][one], wanted)
    for key, value in (expect.get("summary") or {}).items():
        assert out["summary"][key] == value, (key, out["summary"][key], value)
    for moment in expect.get("running_at") or []:
        assert held_at(out, moment["t"]) == moment["running"], moment


def test_s1_allocation_settles_at_4_2_2(capsys):
    out = simulate("s1_shares_4_2_2.yaml", capsys)
    first = out["timeline"][0]
    plans = first["plans"]
    assert [plans[f"/project1/{t}"]["allocated"]["gpu"] for t in ("dev-team", "qa-team")] == [4, 2]
    assert plans["/project1/support-team"]["allocated"]["gpu"] == 2
    assert plans["/project1/dev-team"]["deserved"]["gpu"] == 4
    assert all(j["state"] == "FINISHED" for j in out["jobs"].values())
    assert out["summary"]["broken_gangs"] == 0


def test_s2_over_the_limit_is_rejected_at_once_and_dev_team_finishes(capsys):
    out = simulate("s2_limits.yaml", capsys)
    qa, dev = out["jobs"]["qa-mnist"], out["jobs"]["dev-mnist"]
    assert qa["state"] == "REJECTED" and qa["ended"] == 0
    assert "/project1/qa-team" in qa["error"] and "gpu limit of 2" in qa["error"]
    assert "asks for 4 gpu" in qa["error"]
    assert (dev["state"], dev["started"], dev["ended"]) == ("FINISHED", 0, 300)


def test_s3_the_job_is_charged_to_the_user_leaf_and_metered_there(capsys):
    out = simulate("s3_user_leaf.yaml", capsys)
    assert out["jobs"]["j1"]["charged_to"] == "/project1/dev-team/user1"
    leaf = out["timeline"][0]["plans"]["/project1/dev-team/user1"]
    assert leaf["allocated"] == {"gpu": 2, "cpu": 4000, "memory": 8 * 2**30}  # millicores, bytes


def test_s4_elastic_reclaim_shrinks_user1_to_2_and_user2_runs_with_2(capsys):
    out = simulate("s4_reclaim_elastic.yaml", capsys)
    assert held_at(out, 5) == {"u1-elastic": 4}
    assert held_at(out, 10) == {"u1-elastic": 2, "u2-elastic": 2}
    assert out["jobs"]["u1-elastic"]["preemptions"] == 0  # shrunk, never stopped
    assert all(j["state"] == "FINISHED" for j in out["jobs"].values())


def test_s4_rigid_gangs_wait_and_nothing_is_killed(capsys):
    out = simulate("s4_reclaim_rigid.yaml", capsys)
    u1, u2 = out["jobs"]["u1-rigid"], out["jobs"]["u2-rigid"]
    assert u1["preemptions"] == 0 and u1["ended"] == 100
    assert u2["started"] == 100 and u2["state"] == "FINISHED"


def test_s5_six_gangs_on_four_gpus_all_finish_and_never_hold_part_of_a_gang(capsys):
    out = simulate("s5_no_deadlock.yaml", capsys)
    assert {j["state"] for j in out["jobs"].values()} == {"FINISHED"}
    for entry in out["timeline"]:  # the whole history, not only the end state
        assert all(workers == 2 for workers in entry["running"].values()), entry
        assert sum(entry["running"].values()) <= 4
    assert out["summary"]["broken_gangs"] == 0
    assert out["summary"]["gpu_allocation"] == 1.0


def test_reservation_keeps_a_stream_of_small_jobs_from_starving_a_big_gang(capsys):
    out = simulate("reservation_stream.yaml", capsys)
    big = out["jobs"]["big"]
    # small00 and small01 hold 2 GPUs when the gang arrives at 5; it holds the reservation and
    # starts when the second of them ends (34), though small jobs keep arriving every 4 s
    assert (big["started"], big["ended"], big["preemptions"]) == (34, 134, 0)
    waited = [j for j in out["jobs"].values() if j["submitted"] > 5 and j["submitted"] < 34]
    assert waited and all(j["started"] >= 34 for j in waited)
    assert {j["state"] for j in out["jobs"].values()} == {"FINISHED"}


def test_a_reclaim_does_not_thrash_the_freed_gpus_go_to_the_reclaimer(capsys):
    out = simulate("no_thrash_after_reclaim.yaml", capsys)
    big, small = out["jobs"]["big"], out["jobs"]["small"]
    assert big["preemptions"] == 1  # once, for small; never again
    assert small["started"] == 15  # at the end of big's 5 s grace, not after big restarts
    assert [e["running"] for e in out["timeline"]] == [{"big": 4}, {"small": 2}, {"big": 4}, {}]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return path


GOOD_HEAD = """format: 1
capacity: {nodes: 1, per_node: {gpu: 4}}
plans: {/p: {share: 1}}
"""


@pytest.mark.parametrize(
    "text, message",
    [
        ("format: 2\n", "format: must be 1"),
        (GOOD_HEAD + "colour: red\n", "colour: unknown key"),
        (GOOD_HEAD.replace("{gpu: 4}", "{gpu: -4}"), "must not be negative"),
        (GOOD_HEAD.replace("share: 1", "share: 0"), "share must be a number above 0"),
        (GOOD_HEAD + "jobs: [{id: a, user: u, plan: /q, duration: 5}]\n", "jobs[0].plan"),
        (GOOD_HEAD + "jobs: [{id: a, user: u, plan: /p, duration: -5}]\n", "must not be negative"),
        (GOOD_HEAD + "jobs: [{id: a, user: u, plan: /p, duration: 5, workers: '3:1'}]\n", "min"),
        (GOOD_HEAD + "jobs: [{id: a, user: u, plan: /p, duration: 5, gpus: 1}]\n", "jobs[0].gpus"),
        (GOOD_HEAD + "jobs: [{id: c, at: 1, cancel: zz}]\n", "names job 'zz'"),
        ("format: 1\nplans: {}\n", "capacity: is missing"),
        ("{{{", "not valid YAML"),
    ],
    ids=[
        "format",
        "unknown-key",
        "negative-capacity",
        "zero-share",
        "missing-plan",
        "negative-duration",
        "bad-workers",
        "unknown-job-key",
        "cancel-unknown",
        "no-capacity",
        "not-yaml",
    ],
)
def test_bad_files_exit_2_naming_the_file_key_and_problem(tmp_path, capsys, text, message):
    path = write(tmp_path, text)
    assert main(["simulate", "--scenario", str(path), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no JSON
    assert str(path) in captured.err and message in captured.err


def test_the_installed_command_runs_a_scenario():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "extension.cli",
            "simulate",
            "--scenario",
            str(SCENARIOS / "s2_limits.yaml"),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["jobs"]["qa-mnist"]["state"] == "REJECTED"


def test_same_input_same_output(capsys):
    assert simulate("s4_reclaim_elastic.yaml", capsys) == simulate(
        "s4_reclaim_elastic.yaml", capsys
    )
