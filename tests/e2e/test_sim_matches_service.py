"""The simulator predicts the service (issue 18): one short contended workload through the real
service in real time and through ``extension.sim`` with the service's timing model; they must
agree within 20 % on preemptions and within 2 % on each plan's held GPU-seconds.

The workload (``contended_workload.csv``, 30 jobs over 37 s) runs on 2 x 4 virtual GPUs: team
``c`` floods 1-GPU jobs and borrows what teams ``a`` (share 2) and ``b`` (share 1) leave idle,
and their 2- and 4-GPU gangs take it back (``c`` has share 1). The service is the repository's
jupyterhub_config.py with JupyterHub, configurable-http-proxy and SQLite
(benchmarks/fairness_harness.py over tests/service/hub.py), its backend
benchmarks/timed_backend.py: jobs that run for their ``--seconds``, checkpoint every 5 s and on
SIGTERM and exit 1 s after it. Every job is submitted at its time through the proxy with its
user's own token, and read back from ``GET /jobs`` and each job's history. Compressed timing:
tick 0.25 s, grace 5 s, min_runtime 4 s. About 110 s of real time, plus the hub's start. The
simulator replays the jobs at the times the service stamped them and with the service's median
start lag as its event delay (``as_submitted``, ``as_measured``).

The workload was picked so that no stall of a busy machine can decide the comparison: the last
test checks that jittered replays agree with the plain one, and so do replays with any one
submission or any one backend event half a second late (``fairness_harness.moved_by``). It is
seed 5065 of benchmarks/pick_contended_workload.py, 8 reclaims in the simulator. The one before
it (tick 1 s) moved by a reclaim when one of many events came half a second late: a reclaim
held back by ``min_runtime`` waits for the next tick, and one late cycle moves every later tick.
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest

from benchmarks.fairness_harness import (
    Outcome,
    Setup,
    figures,
    gaps,
    held_gap,
    moved_by,
    predicted,
    read_workload,
    run_service,
    run_sim,
    timeline,
)
from tests.service.hub import PROXY, REPO

WORKLOAD = Path(__file__).with_name("contended_workload.csv")
SETUP = Setup(
    {"a": 2, "b": 1, "c": 1},
    layout="2x4",
    tick=0.25,
    grace=5.0,
    min_runtime=4.0,
    checkpoint_every=5.0,
    exit_after_term=1.0,
)
PREEMPTIONS, HELD = 0.20, 0.02  # the agreement issue 18 asks for

ARTIFACTS = REPO / "test-artifacts"
needs_proxy = pytest.mark.skipif(not PROXY.exists(), reason="configurable-http-proxy is missing")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    workload = read_workload(WORKLOAD)
    service = run_service(workload, SETUP, tmp_path_factory.mktemp("service"), timeout=240)
    sim = predicted(service, SETUP)
    instant = run_sim(workload, SETUP, "wmla", "instant", nodes=service.nodes)
    return {
        "service": figures(service, SETUP),
        "sim": figures(sim, SETUP),
        "instant": figures(instant, SETUP),
        "notes": {"service": service.notes, "sim": sim.notes},
        "reclaimed": keep_timelines("sim-matches-service", service, sim),
    }


def keep_timelines(name: str, service: Outcome, sim: Outcome) -> str:
    """Both runs job by job in test-artifacts/<name>.json; the jobs reclaimed a different number
    of times in each, for a failure's message."""
    ARTIFACTS.mkdir(exist_ok=True)
    runs = {"service": timeline(service), "sim": timeline(sim)}
    (ARTIFACTS / f"{name}.json").write_text(json.dumps(runs, indent=1))
    apart = [
        f"{a['name']} ({a['team']}): {a['preemptions']} in the service, {b['preemptions']} in sim"
        for a, b in zip(runs["service"], runs["sim"])
        if a["preemptions"] != b["preemptions"]
    ]
    return "; ".join(apart) or "every job reclaimed as often in both"


def said(runs: dict) -> str:
    keys = ("preemptions", "preempted_jobs", "held_gpu_s", "makespan_s", "lost_gpu_s")
    return (
        "\n".join(
            f"{name}: {dict((k, runs[name][k]) for k in keys)}" for name in ("service", "sim")
        )
        + f"\nnotes: {runs['notes']}\nreclaimed apart: {runs['reclaimed']}"
    )


@needs_proxy
def test_the_workload_is_contended_and_every_job_finishes(runs: dict) -> None:
    service, sim = runs["service"], runs["sim"]
    assert service["finished"] == service["jobs"] == 30, said(runs)
    assert sim["finished"] == sim["jobs"] == 30, said(runs)
    # reclaims happen, so the count below compares something
    assert service["preemptions"] >= 5, said(runs)
    assert service["contended_s"] >= 30, said(runs)


@needs_proxy
def test_preemptions_agree_within_20_percent(runs: dict) -> None:
    gap = gaps(runs["sim"], runs["service"])["preemptions"]
    assert gap <= PREEMPTIONS, f"preemptions {100 * gap:.0f}% apart\n{said(runs)}"


@needs_proxy
def test_each_plans_held_gpu_seconds_agree_within_2_percent(runs: dict) -> None:
    gap = gaps(runs["sim"], runs["service"])
    worst = max((k for k in gap if k.startswith("held")), key=gap.get)
    assert gap[worst] <= HELD, f"{worst} {100 * gap[worst]:.1f}% apart\n{said(runs)}"


@needs_proxy
def test_the_comparison_can_fail(runs: dict) -> None:
    """The simulator's old instant model (victims hold their devices through the whole grace
    period and lose what they did since their last periodic checkpoint) misses the service's
    held GPU-seconds by far more than 2 %: the comparison tells the models apart."""
    gap = gaps(runs["instant"], runs["service"])
    assert held_gap(gap) > 5 * HELD, f"the instant model agrees too: {gap}"


def test_the_workload_does_not_hinge_on_milliseconds() -> None:
    """Replays with every submission 4-30 ms late and events folded 1-20 ms after they happen
    (what the service's HTTP path and loop add) agree with the plain replay within half the
    tolerances above; replays with the event delay at 2 or 30 ms, or with any one submission or
    any one backend event half a second late (a busy machine's loop stalls), within half the
    held GPU-seconds' and the preemptions' own tolerance (one reclaim of 8 moves under a few
    such stalls): the service's own jitter cannot decide the comparison."""
    workload = read_workload(WORKLOAD)
    base = figures(run_sim(workload, SETUP, "wmla", "service"), SETUP)
    rnd = random.Random(7)
    for _ in range(12):
        late = [dataclasses.replace(j, at=j.at + rnd.uniform(0.004, 0.03)) for j in workload]
        setup = dataclasses.replace(SETUP, event_delay=rnd.uniform(0.001, 0.02))
        gap = gaps(figures(run_sim(late, setup, "wmla", "service"), setup), base)
        assert gap["preemptions"] <= PREEMPTIONS / 2, gap
        assert held_gap(gap) <= HELD / 2, gap
    assert moved_by(workload, SETUP, HELD / 2, PREEMPTIONS) == []
