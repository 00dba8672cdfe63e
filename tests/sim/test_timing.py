"""The service model (docs/simulate.md "The service model"): cycles only when the service runs
one, victims that leave after their SIGTERM checkpoint, events seen late, workers coming up
late; and the default timing left as it was. The workload is test_churn.py's: a1 (preemptible)
and a2 hold the two 4-GPU nodes of /a from 0 and 5; b1 and b2 of /b (2 GPUs, 40 s) come at 50;
min_runtime 60 keeps a1 from being reclaimed before 60."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from extension.cli import main
from extension.sim import policies
from extension.sim.engine import simulate
from extension.sim.policies import Wmla, make_policy
from extension.sim.replay import Replay
from extension.sim.scenario import ScenarioError, parse_scenario
from extension.sim.timing import PRESETS, Timing
from extension.sim.trace import TraceOptions, parse_nodes, read_trace, trace_scenario

from .test_churn import workload

TRACES = Path(__file__).parent / "traces"


def run(timing: object = None, policy: object = None) -> tuple[list, Replay]:
    """The replay, and (time, decision kinds) of every core cycle it ran."""
    cycles: list[tuple[float, list[str]]] = []
    real = policies.schedule

    def record(snapshot, now, cache=None):
        result = real(snapshot, now, cache)
        cycles.append((now, [f"{d.kind} {d.job_id}" for d in result.decisions]))
        return result

    policies.schedule = record
    try:
        r = Replay(parse_scenario(workload(timing=timing)), policy or Wmla(aggregate=False))
        r.run()
    finally:
        policies.schedule = real
    return cycles, r


def preempted_at(cycles: list) -> list[float]:
    return [t for t, kinds in cycles if any(k.startswith("preempt") for k in kinds)]


def test_default_timing_cycles_at_every_event_and_min_runtime():
    cycles, r = run()
    # arrivals at 0, 5 and 50; a1's min_runtime runs out at 60 (a cycle of its own)
    assert [t for t, _ in cycles][:4] == [0, 5, 50, 60]
    assert preempted_at(cycles) == [60]
    assert r.jobs["b1"].first_start == 70  # a1 holds its GPUs through the 10 s grace


def test_service_cycles_wait_for_the_tick():
    cycles, r = run({"cycles": "service", "tick": 7})
    times = [t for t, _ in cycles]
    # nothing happens after the arrivals at 50: the ticks at 57 and 64 run cycles anyway, and
    # the one at 64 is the first to see a1 past its min_runtime (the service has no timer for
    # it); the tick at 71 finds b1 and b2 still waiting for a1's grace
    assert times[:6] == [0, 5, 50, 57, 64, 71]
    assert preempted_at(cycles) == [64]
    # released at the end of the grace (74): a cycle on it, and one on b1's and b2's running
    # report at once (a1 waits); then a tick every 7 s until a2's finish at 105
    assert cycles[6:] == [
        (74, ["start b1", "start b2"]),
        (74, []),
        (81, []),
        (88, []),
        (95, []),
        (102, []),
        (105, ["start a1"]),
    ]
    assert r.jobs["b1"].first_start == 74


def test_service_ticks_stop_when_nothing_waits():
    cycles, r = run({"cycles": "service", "tick": 7})
    # a1 restarts at 105 when a2 ends; from then on nothing is pending: no tick, and the
    # cycles on a1's running report (105), b1's and b2's finish (114) and a1's (170) cannot
    # decide anything, so they are skipped
    assert [t for t, _ in cycles if t >= 105] == [105]
    assert r.jobs["a1"].ended == 170 and r.jobs["b1"].ended == 114


def test_the_service_preset():
    cycles, r = run("service")
    preset = PRESETS["service"]
    assert (preset.tick, preset.exit_after_term, preset.checkpoint_on_sigterm) == (5, 1, True)
    # ticks at 55 and 60 after the arrivals at 50; a1 reclaimed at 60
    assert preempted_at(cycles) == [60]
    jobs = r.jobs
    # a1 writes its checkpoint and leaves 1 s after SIGTERM, not at the end of the grace
    # (70); the service sees the release 0.05 s later and starts b1 and b2 at once
    assert jobs["b1"].first_start == pytest.approx(61.05)
    # their workers come up at 61.15 and end at 101.15: the end is stamped then, and seen
    # 0.1 s later, when a1 starts again; it resumes where SIGTERM stopped it (59.9 s of work
    # from 0.1): 40.1 s more once its workers are up at 101.35
    assert jobs["b1"].ended == pytest.approx(101.15)
    assert jobs["a1"].ended == pytest.approx(101.25 + 0.1 + 40.1)
    assert jobs["a2"].ended == pytest.approx(105.1)  # 5.1 + 100
    # a cycle on the running report at 61.15 (a1 waits), then ticks from there
    times = [t for t, _ in cycles]
    assert times[:7] == pytest.approx([0, 5, 50, 55, 60, 61.05, 61.15])
    assert times[7:9] == pytest.approx([66.15, 71.15])
    churn = r.churn.to_json()
    # nothing lost; at the decision 60 - 35.1 s since the checkpoint were at risk
    assert churn["lost_gpu_s"] == 0
    assert churn["at_risk_gpu_s"] == pytest.approx(4 * (60 - 35.1), abs=1e-3)


def test_the_default_is_the_old_model():
    assert parse_scenario(workload()).timing == Timing() == PRESETS["instant"]
    t = Timing()
    assert (t.cycles, t.start_delay, t.finish_seen_after, t.release_seen_after) == (
        "instant",
        0,
        0,
        0,
    )
    assert t.exit_after_term is None and t.checkpoint_on_sigterm is False
    assert t.report_checkpoints is False


def test_the_scenario_runner_runs_the_service_model_too():
    service = simulate(parse_scenario(workload(timing="service")))
    _, replayed = run("service")
    # the runner cycles whenever the service would, the replay skips only empty cycles
    for job_id, job in replayed.jobs.items():
        other = service.jobs[job_id]
        assert (other.first_start, other.ended) == (job.first_start, job.ended), job_id
    assert service.summary()["churn"] == replayed.churn.to_json()


@pytest.mark.parametrize(
    "spec, key, message",
    [
        ("weekly", "config.timing", "unknown preset 'weekly'"),
        ({"cycles": "hourly"}, "config.timing.cycles", "must be one of instant, service"),
        ({"tick": -1}, "config.timing.tick", "must not be negative"),
        ({"tick": "5s"}, "config.timing.tick", "must be a number of seconds"),
        ({"checkpoint_on_sigterm": "yes"}, "config.timing.checkpoint_on_sigterm", "true or"),
        ({"colour": 1}, "config.timing.colour", "unknown key"),
        ({"preset": "x"}, "config.timing.preset", "unknown preset 'x'"),
        (5, "config.timing", "must be a preset name"),
    ],
)
def test_bad_timing_is_refused_naming_the_key(spec, key, message):
    with pytest.raises(ScenarioError) as err:
        parse_scenario(workload(timing=spec), "w.yaml")
    assert f"w.yaml: {key}: " in str(err.value) and message in str(err.value)


def test_timing_fields_start_from_a_preset():
    timing = parse_scenario(workload(timing={"preset": "service", "tick": 2})).timing
    assert timing == replace(PRESETS["service"], tick=2)
    timing = parse_scenario(workload(timing={"exit_after_term": None, "tick": 1})).timing
    assert timing == Timing(tick=1)


def test_a_trace_replays_under_the_service_timing_and_ends():
    options = TraceOptions(timing=PRESETS["service"])
    rows = read_trace(TRACES / "fifo_one_team.csv")
    scenario = trace_scenario(rows, parse_nodes("1x4", None), options=options)
    p = Replay(scenario, make_policy("wmla")).run().to_json()
    assert p["jobs"]["finished"] == 3
    # j1 (0-100 s of work) is up at 0.1 and ends at 100.1, seen at 100.2: j2 and j3 start then
    assert p["queueing_delay_s"]["overall"]["p90"] == pytest.approx(100.2 - 10, abs=1e-3)
    with pytest.raises(ValueError, match="cycle interval"):
        Replay(scenario, make_policy("wmla"), interval=60)


def test_the_command_line_takes_the_timing(tmp_path, capsys):
    path = tmp_path / "w.json"
    path.write_text(json.dumps(workload()))
    argv = ["simulate", "--scenario", str(path), "--policy", "wmla", "--json", "--quiet"]
    assert main(argv + ["--timing", "service"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["input"]["timing"]["cycles"] == "service"
    assert out["policies"]["wmla"]["churn"]["lost_gpu_s"] == 0
    assert main(argv + ["--timing", "service", "--cycle-interval", "60"]) == 2
    assert "--cycle-interval" in capsys.readouterr().err
    assert main(["simulate", "--scenario", str(path), "--timing", "service", "--json"]) == 0
    runner = json.loads(capsys.readouterr().out)
    assert runner["jobs"]["b1"]["started"] == pytest.approx(61.05)


def test_service_timing_is_deterministic_and_aggregation_changes_nothing(tmp_path):
    lines = Path("/work/shared/data/traces/philly_vc_2017-10.csv").read_text().splitlines()
    path = tmp_path / "philly_head.csv"
    path.write_text("\n".join(lines[:151]) + "\n")  # 150 jobs on 10 GPUs: a busy slice
    options = TraceOptions(timing=PRESETS["service"], min_runtime=60)
    scenario = trace_scenario(read_trace(path), parse_nodes("1x8,1x2", None), options=options)
    outputs = []
    for aggregate in (True, False, True):
        figures = Replay(scenario, Wmla(aggregate=aggregate)).run().to_json()
        assert figures["churn"]["preemptions"] > 0 and figures["jobs"]["finished"] == 150
        figures.pop("sim_wall_s")
        figures.pop("core_cycles_full_snapshot")
        outputs.append(json.dumps(figures, sort_keys=True))
    assert outputs[0] == outputs[1] == outputs[2]


@pytest.mark.parametrize("name", ["gang-fifo", "pod-fifo"])
def test_the_baselines_replay_under_the_service_timing(name):
    # the workers-up hook (Policy.running) was shadowed by the baselines' own dict of running
    # jobs: under the service timing they crashed at the first start
    replay = Replay(parse_scenario(workload(timing="service")), make_policy(name))
    summary = replay.run().to_json()
    assert summary["churn"]["preemptions"] == 0
    assert {j.state for j in replay.jobs.values()} == {"FINISHED"}
