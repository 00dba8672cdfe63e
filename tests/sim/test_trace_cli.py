"""``wmla simulate --trace`` end to end (in process): JSON, the offline HTML report, progress,
the unchanged ``--scenario`` output, and bad input exiting 2 with no JSON and no report."""

import io
import json
from pathlib import Path

import pytest

from extension.cli import main
from extension.sim.engine import public_json, simulate
from extension.sim.policies import make_policy
from extension.sim.replay import Replay
from extension.sim.report import allocation_figure, resample
from extension.sim.scenario import load_scenario
from extension.sim.trace import parse_nodes, read_trace, trace_scenario

HERE = Path(__file__).parent
TRACES = HERE / "traces"
SEED_002 = HERE.parent / "scenarios" / "s5_no_deadlock.yaml"
FIFO = str(TRACES / "fifo_one_team.csv")


def test_trace_json_and_report(tmp_path, capsys):
    report = tmp_path / "out.html"
    argv = ["simulate", "--trace", str(TRACES / "preempt_two_teams.csv"), "--nodes", "1"]
    argv += ["--gpus-per-node", "4", "--policy", "all", "--json", "--report", str(report)]
    assert main(argv + ["--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["input"]["policies"] == ["wmla", "gang-fifo", "pod-fifo"]  # as asked
    assert set(out["policies"]) == {"wmla", "gang-fifo", "pod-fifo"}
    assert out["input"]["capacity_gpu"] == 4 and out["input"]["plans"] == ["/a", "/b"]
    assert out["policies"]["wmla"]["preemptions"] == 1
    assert out["policies"]["gang-fifo"]["queueing_delay_s"]["overall"]["p90"] == 900
    for figures in out["policies"].values():
        assert figures["sim_wall_s"] >= 0
        assert set(figures["fairness"]) == {"1", "2"}
    page = report.read_text()
    assert page.startswith("<!DOCTYPE html>")
    # offline: plotly.js inlined from the installed package, nothing fetched
    from plotly.offline import get_plotlyjs

    assert get_plotlyjs() in page
    outside = page.replace(get_plotlyjs(), "")
    assert "http" not in outside  # no CDN, no link anywhere in the page itself
    assert "Plotly.newPlot" in outside
    for div in ("alloc-wmla", "alloc-gang-fifo", "alloc-pod-fifo", "delay-all"):
        assert f'id="{div}"' in page
    assert (report.stat().st_mode & 0o777) != 0o600  # an ordinary file, not mkstemp's


def test_allocation_figure_stacks_teams_against_capacity():
    scenario = trace_scenario(read_trace(TRACES / "preempt_two_teams.csv"), parse_nodes(1, 4))
    summary = Replay(scenario, make_policy("gang-fifo")).run()
    fig = allocation_figure("gang-fifo", summary)
    a, b, capacity = fig.data[0], fig.data[1], fig.data[2]
    assert (a.name, b.name, capacity.name) == ("/a", "/b", "capacity")
    assert a.stackgroup == b.stackgroup == "held"
    # a holds 4 from 0 to 1000, then b holds 2 until 1100 (hours on the axis); a point also
    # where the demand changes (b1 submitted at 100)
    assert list(a.y) == [4, 4, 0, 0] and list(b.y) == [0, 0, 2, 0]
    assert list(a.x) == [0, 100 / 3600, 1000 / 3600, 1100 / 3600]
    assert list(capacity.y) == [4, 4]


def test_resample_takes_time_weighted_means():
    timeline = [(0, (1,), 1), (5, (3,), 3), (15, (0,), 0)]
    ts, per, demand = resample(timeline, end=20, points=2)
    assert ts == [0, 10] and per == [[2.0, 1.5]] and demand == [2.0, 1.5]
    assert resample(timeline, end=20, points=5)[1] == [[1, 3, 0]]  # short: steps as they are


def test_human_table(capsys):
    assert main(["simulate", "--trace", FIFO, "--nodes", "1x4", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "wmla" in text and "queueing delay p90 s" in text


def test_progress_goes_to_stderr():
    scenario = trace_scenario(read_trace(TRACES / "fifo_one_team.csv"), parse_nodes(1, 4))
    stream = io.StringIO()
    Replay(scenario, make_policy("wmla"), progress=stream, progress_after=0).run()
    lines = stream.getvalue().splitlines()
    assert any("% of jobs done" in line for line in lines)
    assert lines[-1].startswith("wmla: done, 3 of 3 jobs ended")


def test_scenario_output_is_unchanged(capsys):
    assert main(["simulate", "--scenario", str(SEED_002), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got == json.loads(json.dumps(public_json(simulate(load_scenario(SEED_002)))))


def test_scenario_files_can_be_compared_too(capsys):
    argv = ["simulate", "--scenario", str(SEED_002), "--policy", "all", "--json", "--quiet"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["policies"]["pod-fifo"]["deadlocks"]["detected"] == 1
    assert out["policies"]["wmla"]["jobs"]["finished"] == 6


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--trace", FIFO], "--trace needs the cluster: --nodes N --gpus-per-node G"),
        (["--trace", FIFO, "--nodes", "4"], "a node count needs --gpus-per-node"),
        (["--trace", FIFO, "--nodes", "2x8", "--gpus-per-node", "8"], "a layout already says"),
        (["--trace", FIFO, "--nodes", "1x4", "--policy", "fifo"], "'fifo' is not a policy"),
        (["--trace", "/nonexistent.csv", "--nodes", "1x4"], "cannot read the trace"),
        (["--trace", FIFO, "--nodes", "1x4", "--shares", "/nonexistent.yaml"], "cannot read"),
        (["--trace", FIFO, "--nodes", "1x4", "--deadlock-timeout", "-1"], "--deadlock-timeout"),
        (["--trace", FIFO, "--nodes", "1x4", "--cycle-interval", "-5"], "--cycle-interval"),
        (["--trace", FIFO, "--nodes", "1x4", "--grace", "-1"], "--grace must not be negative"),
        (["--scenario", str(SEED_002), "--nodes", "4"], "--nodes goes with --trace"),
        (["--scenario", str(SEED_002), "--policy", "all", "--shares", "x"], "--shares goes with"),
        (["--scenario", "/nonexistent.yaml", "--policy", "all"], "cannot read the file"),
    ],
    ids=[
        "no-nodes",
        "count-without-size",
        "layout-and-size",
        "unknown-policy",
        "missing-trace",
        "missing-shares",
        "negative-timeout",
        "negative-interval",
        "negative-grace",
        "scenario-with-nodes",
        "scenario-with-shares",
        "missing-scenario",
    ],
)
def test_bad_input_exits_2_with_a_message_no_json_no_report(tmp_path, capsys, extra, message):
    report = tmp_path / "r.html"
    assert main(["simulate", *extra, "--json", "--report", str(report), "--quiet"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert message in captured.err and captured.err.startswith("wmla simulate: ")
    assert not report.exists() and list(tmp_path.iterdir()) == []


def test_bad_trace_content_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("job_id,submit_s,duration_s,gpus,team,user,status\na,0,-5,1,t,,\n")
    assert main(["simulate", "--trace", str(bad), "--nodes", "1x4", "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "line 2: column duration_s" in captured.err


def test_report_into_a_missing_folder_is_refused_before_running(tmp_path, capsys):
    target = tmp_path / "no" / "r.html"
    argv = ["simulate", "--trace", FIFO, "--nodes", "1x4", "--report", str(target)]
    assert main(argv) == 2
    assert "does not exist" in capsys.readouterr().err


def test_trace_and_scenario_together_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as err:
        main(["simulate", "--trace", FIFO, "--scenario", str(SEED_002)])
    assert err.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


CHROMIUM = Path("/usr/bin/chromium")


@pytest.mark.skipif(
    not CHROMIUM.exists(), reason="needs /usr/bin/chromium (apt-get install chromium)"
)
def test_report_renders_in_a_browser_with_the_network_cut_off(tmp_path, capsys):
    from playwright.sync_api import sync_playwright

    report = tmp_path / "out.html"
    argv = ["simulate", "--trace", FIFO, "--nodes", "1x4", "--policy", "all", "--quiet"]
    assert main([*argv, "--report", str(report)]) == 0
    capsys.readouterr()
    asked: list[str] = []

    def refuse(route):
        asked.append(route.request.url)
        route.abort()

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.route("http*://**/*", refuse)  # offline: any network request fails
            page.goto(report.as_uri())
            for div in ("alloc-wmla", "alloc-pod-fifo", "delay-all"):
                page.wait_for_selector(f"#{div} .main-svg", timeout=30_000)
            # the stacked areas of the allocation chart were drawn
            assert page.locator("#alloc-wmla .scatterlayer .trace").count() >= 2
        finally:
            browser.close()
    assert asked == []
