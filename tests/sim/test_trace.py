"""Reading traces, shares files and node layouts: the mapping to plans, leaves and gangs, and
every bad input refused with a message that names the line and column."""

from pathlib import Path

import pytest

from extension.scheduler import Resources
from extension.sim.trace import (
    TraceError,
    parse_nodes,
    read_shares,
    read_trace,
    trace_scenario,
)

TRACES = Path(__file__).parent / "traces"
HEADER = "job_id,submit_s,duration_s,gpus,team,user,status\n"


def write(tmp_path: Path, text: str, name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_teams_become_plans_users_become_leaves_and_big_jobs_whole_node_gangs():
    rows = read_trace(TRACES / "gangs_users.csv")
    scenario = trace_scenario(rows, parse_nodes(2, 8))
    assert sorted(p.path for p in scenario.plans) == ["/nlp", "/vision"]
    assert all(p.share == 1.0 for p in scenario.plans)
    jobs = {j.id: j for j in scenario.jobs}
    # 12 GPUs on 8-GPU nodes: a gang of 2 whole nodes
    assert (jobs["g1"].min_workers, jobs["g1"].max_workers) == (2, 2)
    assert jobs["g1"].per_worker == Resources(8, 0, 0)
    assert (jobs["g1"].plan, jobs["g1"].user) == ("/vision", "alice")
    # no user: charged to the team's anonymous leaf; at most a node: one worker
    assert (jobs["s1"].plan, jobs["s1"].user) == ("/vision", "anonymous")
    assert (jobs["s2"].min_workers, jobs["s2"].per_worker) == (1, Resources(3, 0, 0))
    assert jobs["s2"].at == 5 and jobs["s2"].duration == 50


def test_rows_without_a_team_go_to_unassigned_and_jobs_are_in_submission_order(tmp_path):
    path = write(tmp_path, HEADER + "b,20,5,1,,,\na,10,5,1,x,u1,\n")
    scenario = trace_scenario(read_trace(path), parse_nodes(1, 4))
    assert [j.id for j in scenario.jobs] == ["a", "b"]
    assert [j.plan for j in scenario.jobs] == ["/x", "/unassigned"]


def test_the_real_philly_header_and_first_rows_read():
    rows = read_trace(Path("/work/shared/data/traces/philly_vc_2017-10.csv"))
    assert len(rows) == 47192
    assert rows[0].job_id == "philly-000000" and rows[0].user == "anonymous"


def test_shares_file_sets_shares_and_limits(tmp_path):
    shares = write(tmp_path, "vision: 3\nnlp: {share: 1, limit: 8}\n", "s.yaml")
    scenario = trace_scenario(
        read_trace(TRACES / "gangs_users.csv"), parse_nodes(2, 8), read_shares(shares)
    )
    plans = {p.path: p for p in scenario.plans}
    assert plans["/vision"].share == 3.0 and plans["/nlp"].share == 1.0
    assert plans["/nlp"].limit.gpu == 8


@pytest.mark.parametrize(
    "nodes, per_node, gpus",
    [(3, 8, [8, 8, 8]), ("2x8,1x2", None, [8, 8, 2]), ("1x4", None, [4])],
    ids=["count", "layout", "one"],
)
def test_node_layouts(nodes, per_node, gpus):
    assert [n.capacity.gpu for n in parse_nodes(nodes, per_node)] == gpus


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", "the file is empty"),
        ("job_id,submit_s,gpus\n", "missing column(s) duration_s, team, user, status"),
        (HEADER, "has a header but no jobs"),
        (HEADER + "a,x,5,1,t,,\n", "line 2: column submit_s: must be a number, got 'x'"),
        (HEADER + "a,0,0,1,t,,\n", "line 2: column duration_s: must be above 0"),
        (HEADER + "a,-1,5,1,t,,\n", "column submit_s: must be a finite number of at least 0"),
        (HEADER + "a,0,5,1.5,t,,\n", "column gpus: must be a whole number of at least 1"),
        (HEADER + "a,0,5,0,t,,\n", "column gpus: must be a whole number of at least 1"),
        (HEADER + "a,0,5,1,t,,\na,1,5,1,t,,\n", "line 3: column job_id: 'a' is used twice"),
        (HEADER + ",0,5,1,t,,\n", "column job_id: is empty"),
        (HEADER + "a,0,5,1,a/b,,\n", "column team: 'a/b' cannot name a plan"),
        (HEADER + "a,0,5,1,t,x y,\n", "column user: 'x y' cannot name a user leaf"),
        (HEADER + "a,0,5\n", "line 2: 3 fields, the header has 7"),
        (HEADER + "a,nan,5,1,t,,\n", "column submit_s: must be a finite number"),
    ],
    ids=[
        "empty",
        "missing-columns",
        "no-rows",
        "bad-number",
        "zero-duration",
        "negative-submit",
        "fractional-gpus",
        "zero-gpus",
        "duplicate-id",
        "empty-id",
        "bad-team",
        "bad-user",
        "short-row",
        "nan",
    ],
)
def test_bad_traces_are_refused_with_line_and_column(tmp_path, text, expected):
    with pytest.raises(TraceError) as err:
        read_trace(write(tmp_path, text))
    assert expected in str(err.value)


def test_a_missing_trace_file_is_refused(tmp_path):
    with pytest.raises(TraceError, match="cannot read the trace"):
        read_trace(tmp_path / "nope.csv")


@pytest.mark.parametrize(
    "nodes, per_node, expected",
    [
        (4, None, "a node count needs --gpus-per-node"),
        ("2x8", 8, "a layout already says the GPUs per node"),
        ("eight", None, "expected a count (311) or a layout"),
        (0, 8, "the node count must be at least 1"),
        (2, 0, "--gpus-per-node: must be at least 1"),
    ],
    ids=["count-without-size", "layout-and-size", "words", "zero-nodes", "zero-gpus"],
)
def test_bad_node_layouts(nodes, per_node, expected):
    with pytest.raises(TraceError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        parse_nodes(nodes, per_node)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("- a\n- b\n", "must map team names to shares"),
        ("vision: 0\n", "share must be a number above 0"),
        ("vision: {share: 1, quota: 3}\n", "unknown key 'quota'"),
        ("vision: {limit: -1}\n", "limit must be a number of GPUs of at least 0"),
        ("vision: [1\n", "not valid YAML or JSON"),
    ],
    ids=["list", "zero-share", "unknown-key", "negative-limit", "broken-yaml"],
)
def test_bad_shares_files(tmp_path, text, expected):
    with pytest.raises(TraceError, match=expected):
        read_shares(write(tmp_path, text, "s.yaml"))


def test_a_shares_file_naming_a_team_not_in_the_trace_is_refused(tmp_path):
    rows = read_trace(TRACES / "gangs_users.csv")
    with pytest.raises(TraceError, match="team 'visoin' is not in the trace; the teams are nlp"):
        trace_scenario(rows, parse_nodes(2, 8), {"visoin": {"share": 2.0, "limit": 1.0}})
