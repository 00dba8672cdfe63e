"""The policies on hand-made traces whose every figure is worked out by hand (the comments give
the working), the seed 002 deadlock, the wmla policy against the scenario runner, and
determinism."""

import json
from pathlib import Path

import pytest

from extension.sim.engine import simulate
from extension.sim.metrics import percentile, percentiles
from extension.sim.policies import PodFifo, Wmla, expand_policies, make_policy
from extension.sim.replay import Replay
from extension.sim.scenario import load_scenario
from extension.sim.trace import parse_nodes, read_trace, trace_scenario

HERE = Path(__file__).parent
TRACES = HERE / "traces"
SCENARIOS = HERE.parent / "scenarios"
SEED_002 = SCENARIOS / "s5_no_deadlock.yaml"


def run_trace(name: str, nodes: str, policy: str, timeout: float = 1800, interval: float = 0):
    scenario = trace_scenario(read_trace(TRACES / name), parse_nodes(nodes, None))
    return Replay(scenario, make_policy(policy, timeout), interval=interval).run().to_json()


def overall(p: dict, what: str) -> tuple:
    o = p[what]["overall"]
    return o["p50"], o["p90"], o["p99"]


# -- percentiles ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "values, q, expected",
    [
        ([5], 0.5, 5),
        ([1, 2, 3, 4], 0.5, 2),
        ([1, 2, 3, 4], 0.9, 4),
        (list(range(1, 101)), 0.99, 99),
    ],
    ids=["one", "even-median-lower", "p90-of-four", "p99-of-hundred"],
)
def test_nearest_rank_percentile(values, q, expected):
    assert percentile(sorted(values), q) == expected


def test_percentiles_of_nothing_are_none():
    assert percentiles([]) == {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None}


# -- one team, FIFO: j1 4 GPUs 0-100; j2 (2 GPUs, t=10) and j3 (2 GPUs, t=20) start at 100 ----
@pytest.mark.parametrize("policy", ["wmla", "gang-fifo", "pod-fifo"])
def test_fifo_one_team_known_answers(policy):
    p = run_trace("fifo_one_team.csv", "1x4", policy)
    assert p["jobs"]["finished"] == 3 and p["jobs"]["unfinished"] == 0
    # delays 0, 90, 80 -> nearest rank p50 = 2nd of [0, 80, 90], p90 = p99 = 3rd
    assert overall(p, "queueing_delay_s") == (80, 90, 90)
    assert p["queueing_delay_s"]["overall"]["mean"] == pytest.approx(56.667)
    # JCT 100, 140, 130
    assert overall(p, "jct_s") == (130, 140, 140)
    assert p["queueing_delay_s"]["per_team"]["t"]["p90"] == 90
    g = p["gpu_allocation"]
    # demand 6 > 4 from t=10 (j2) to t=100 (j1 ends): 90 s, all 4 GPUs held and busy
    assert g["contended_s"] == 90
    assert g["held_while_contended"] == 1.0 and g["busy_while_contended"] == 1.0
    # 4 x 100 + 4 x 50 GPU-seconds of work
    assert g["busy_gpu_hours"] == pytest.approx(600 / 3600, abs=1e-3)
    assert p["span_s"] == 150 and p["end_s"] == 150
    assert p["preemptions"] == 0 and p["broken_gangs"] == 0 and p["deadlocked_gpu_hours"] == 0


# -- two teams at equal shares on 4 GPUs: a1 (4 GPUs, 1000 s) at 0, b1 (2 GPUs, 100 s) at 100 ---
def test_wmla_reclaims_for_the_team_within_its_share():
    p = run_trace("preempt_two_teams.csv", "1x4", "wmla")
    # b deserves 2 of 4: a1 (a borrower at 4) is preempted at 100, lets go at 130 (grace 30),
    # b1 runs 130-230; a1 (lost its 100 s: no checkpoint before 600 s) runs again 230-1230
    assert p["preemptions"] == 1
    assert overall(p, "queueing_delay_s") == (0, 30, 30)
    assert p["queueing_delay_s"]["per_team"]["b"]["p50"] == 30
    assert overall(p, "jct_s") == (130, 1230, 1230)
    g = p["gpu_allocation"]
    # contended while both are in (demand 6): 100-230 = 130 s; held 4 (terminating) for 30 s
    # then 2 for 100 s: 520 GPU-s possible, 320 held, 200 busy
    assert g["contended_s"] == 130
    assert g["held_while_contended"] == pytest.approx(320 / 520, abs=1e-4)
    assert g["busy_while_contended"] == pytest.approx(200 / 520, abs=1e-4)
    assert g["held_idle_gpu_hours"] == pytest.approx(4 * 30 / 3600, abs=1e-3)
    # deserved 2/2 while contended; a is 2 off all along, b 2 off for the 30 s grace
    teams = p["fairness"]["1"]["contended"]
    assert teams["plans"] == {"/a": 2, "/b": pytest.approx(60 / 130, abs=1e-3)}
    assert teams["mean_abs_dev_gpu"] == pytest.approx((2 + 60 / 130) / 2, abs=1e-3)
    assert teams["worst_plan"] == "/a"
    leaves = p["fairness"]["2"]["contended"]["plans"]
    assert leaves == {"/a/anonymous": 2, "/b/anonymous": pytest.approx(60 / 130, abs=1e-3)}


@pytest.mark.parametrize("policy", ["gang-fifo", "pod-fifo"])
def test_baselines_ignore_shares(policy):
    p = run_trace("preempt_two_teams.csv", "1x4", policy)
    # a1 keeps all 4 GPUs 0-1000; b1 waits 900 s; contended 100-1000, a and b each 2 off
    assert p["preemptions"] == 0
    assert overall(p, "queueing_delay_s") == (0, 900, 900)
    assert p["gpu_allocation"]["contended_s"] == 900
    teams = p["fairness"]["1"]["contended"]
    assert teams["plans"] == {"/a": 2, "/b": 2} and teams["mean_abs_dev_gpu"] == 2
    assert teams["mean_abs_dev_share"] == 0.5  # 2 GPUs of 4
    # over the whole replay (0-1100): 2 GPUs off for 900 of 1100 s
    assert p["fairness"]["1"]["whole"]["plans"]["/a"] == pytest.approx(2 * 900 / 1100, abs=1e-3)


# -- 2 nodes x 4 GPUs: j1 4 GPUs 0-100, j2 8 GPUs (a 2-node gang) at 1, j3 4 GPUs at 2 ----------
def test_gang_fifo_passes_a_big_gang_over_wmla_reserves_for_it():
    fifo = run_trace("reservation_vs_skip.csv", "2x4", "gang-fifo")
    # gang-fifo: j2 does not fit, j3 does (0 s); j2 waits for j1 and j3: starts at 102
    assert fifo["queueing_delay_s"]["overall"]["count"] == 3
    assert overall(fifo, "queueing_delay_s") == (0, 101, 101)
    wmla = run_trace("reservation_vs_skip.csv", "2x4", "wmla")
    # wmla: j2 holds the reservation, j3 waits; j2 runs 100-200, j3 200-300
    assert overall(wmla, "queueing_delay_s") == (99, 198, 198)
    assert wmla["broken_gangs"] == 0 and fifo["broken_gangs"] == 0


def test_pod_fifo_holds_part_of_a_gang_without_deadlock():
    p = run_trace("reservation_vs_skip.csv", "2x4", "pod-fifo")
    # j2's first pod binds node2 at 1 and holds 4 GPUs idle until j1 ends at 100
    assert p["broken_gangs"] == 1
    assert p["gpu_allocation"]["held_idle_gpu_hours"] == pytest.approx(4 * 99 / 3600, abs=1e-3)
    assert p["deadlocks"]["detected"] == 0 and p["deadlocked_gpu_hours"] == 0
    assert overall(p, "queueing_delay_s") == (99, 198, 198)


def test_a_gang_larger_than_the_cluster_is_rejected_by_every_policy():
    for policy in ("wmla", "gang-fifo", "pod-fifo"):
        p = run_trace("gangs_users.csv", "2x4", policy)  # g1: 12 GPUs -> 3 x 4 on 8 GPUs
        assert p["jobs"]["rejected"] == 1 and p["jobs"]["finished"] == 2, policy


# -- seed 002: six 2-worker jobs of 1 GPU on a 4-GPU node, submitted at once -------------------
def seed_002(policy):
    return Replay(load_scenario(SEED_002), policy).run().to_json()


@pytest.mark.parametrize("policy", [Wmla, lambda: make_policy("gang-fifo")], ids=["wmla", "gang"])
def test_seed_002_gang_policies_finish_all_six_without_partial_holds(policy):
    p = seed_002(policy())
    assert p["jobs"]["finished"] == 6
    assert p["broken_gangs"] == 0 and p["deadlocked_gpu_hours"] == 0
    assert p["gpu_allocation"]["held_idle_gpu_hours"] == 0
    assert overall(p, "jct_s") == (240, 360, 360)  # three waves of two jobs, 120 s each


def test_seed_002_pod_fifo_deadlocks_and_the_operator_breaks_it_by_timeout():
    p = seed_002(PodFifo(timeout=1800))
    # the first pod of jobs 1-4 takes the 4 GPUs: no job can ever complete its gang
    d = p["deadlocks"]
    assert d["detected"] == 1 and d["most_jobs_deadlocked"] == 4
    # deleting job 1 at 1800 lets job 5's first pod in, job 2 at 3600 job 6's; job 3 at 5400
    # frees the GPU job 4's second pod needs: 4 GPUs deadlocked for 5400 s = 6 GPU-hours
    assert d["broken_by_timeout"] == 3 and d["deadlocked_at_end"] == 0
    assert p["deadlocked_gpu_hours"] == 6
    assert p["jobs"]["finished"] == 6
    assert p["broken_gangs"] == 6
    assert p["end_s"] == 5880  # then 4; 5 and 6; 1 and 2; 3, 120 s each from 5400
    assert p["gpu_allocation"]["busy_while_contended"] < 0.1


def test_seed_002_pod_fifo_without_an_operator_stays_deadlocked():
    p = seed_002(PodFifo(timeout=None))
    assert p["jobs"]["finished"] == 0 and p["jobs"]["unfinished"] == 6
    assert p["deadlocks"]["deadlocked_at_end"] == 4
    # the scenario runs until 10,000 s: 4 GPUs x 10,000 s
    assert p["deadlocked_gpu_hours"] == pytest.approx(4 * 10_000 / 3600, abs=1e-3)


# -- the replay's wmla decides as the scenario runner's cycle at every instant -----------------
@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.yaml")), ids=lambda p: p.stem)
def test_wmla_replay_matches_the_scenario_runner(path):
    engine = simulate(load_scenario(path))
    replay = Replay(load_scenario(path), Wmla()).run().replay
    expected = {k: (j.state, j.first_start, j.ended, j.preemptions) for k, j in engine.jobs.items()}
    got = {k: (j.state, j.first_start, j.ended, j.preemptions) for k, j in replay.jobs.items()}
    assert got == expected
    assert replay.policy.cycles <= engine.cycles


# -- periodic decisions --------------------------------------------------------------------------
def test_cycle_interval_delays_decisions_to_the_next_multiple():
    p = run_trace("fifo_one_team.csv", "1x4", "gang-fifo", interval=30)
    # j1 at 0 (a multiple); j1 ends at 100, next decision at 120: j2 waits 110, j3 100
    assert overall(p, "queueing_delay_s") == (100, 110, 110)


# -- determinism ---------------------------------------------------------------------------------
def test_same_input_same_output(tmp_path):
    lines = Path("/work/shared/data/traces/philly_vc_2017-10.csv").read_text().splitlines()
    path = tmp_path / "philly_head.csv"
    path.write_text("\n".join(lines[:401]) + "\n")  # 400 jobs, the first ~30 hours
    outputs = []
    for _ in range(2):
        scenario = trace_scenario(read_trace(path), parse_nodes("4x8,2x2", None))
        run = {}
        for name in ("wmla", "gang-fifo", "pod-fifo"):
            figures = Replay(scenario, make_policy(name)).run().to_json()
            figures.pop("sim_wall_s")
            run[name] = figures
        outputs.append(json.dumps(run, sort_keys=True))
    assert outputs[0] == outputs[1]
    first = json.loads(outputs[0])
    assert first["wmla"]["gpu_allocation"]["contended_s"] > 0  # the slice is a busy one
    assert all(first[n]["jobs"]["finished"] == 400 for n in first)


def test_policy_names():
    assert expand_policies(None) == ["wmla"]
    assert expand_policies(["all"]) == ["wmla", "gang-fifo", "pod-fifo"]
    assert expand_policies(["pod-fifo", "wmla,pod-fifo"]) == ["pod-fifo", "wmla"]
    with pytest.raises(ValueError, match="'fifo' is not a policy"):
        expand_policies(["fifo"])


# -- aggregated snapshots give the same replay as full ones --------------------------------------
@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.yaml")), ids=lambda p: p.stem)
def test_aggregated_snapshots_replay_scenarios_exactly(path):
    full = Replay(load_scenario(path), Wmla(aggregate=False)).run().replay
    fast = Replay(load_scenario(path), Wmla(aggregate=True)).run().replay
    timeline = [(k, j.state, j.first_start, j.ended, j.preemptions) for k, j in full.jobs.items()]
    assert [(k, j.state, j.first_start, j.ended, j.preemptions) for k, j in fast.jobs.items()] == (
        timeline
    )


def test_aggregated_snapshots_replay_a_contended_trace_exactly(tmp_path):
    lines = Path("/work/shared/data/traces/philly_vc_2017-10.csv").read_text().splitlines()
    path = tmp_path / "philly_head.csv"
    path.write_text("\n".join(lines[:401]) + "\n")
    scenario = trace_scenario(read_trace(path), parse_nodes("4x8,2x2", None))
    full = Replay(scenario, Wmla(aggregate=False)).run().to_json()
    fast = Replay(scenario, Wmla(aggregate=True)).run().to_json()
    assert fast["preemptions"] > 0  # reclaim happens: the full snapshot was needed then
    assert 0 < fast["core_cycles_full_snapshot"] < fast["core_cycles"]
    for figures in (full, fast):
        figures.pop("sim_wall_s")
        figures.pop("core_cycles_full_snapshot")
    assert fast == full


def test_pod_fifo_gang_bound_whole_in_one_instant_is_not_broken(tmp_path):
    path = tmp_path / "one_gang.csv"
    path.write_text("job_id,submit_s,duration_s,gpus,team,user,status\ng,0,60,8,t,,\n")
    scenario = trace_scenario(read_trace(path), parse_nodes("2x4", None))
    p = Replay(scenario, make_policy("pod-fifo")).run().to_json()
    # both pods bind in the same pass: never seen partial, nothing held idle
    assert p["broken_gangs"] == 0 and p["gpu_allocation"]["held_idle_gpu_hours"] == 0
    assert p["jobs"]["finished"] == 1
