"""The simulator's incremental figures (issue 31) against the full passes they replace: the
deserved shares kept up to date from the leaves that changed (``DeservedNow``) and the
recorder's integrals over the plans whose gap or holding is not 0 must give the same numbers to
the last bit as recomputing everything at every instant, on random plan trees with limits,
weights, contention and leaves that appear as jobs arrive."""

from __future__ import annotations

import math
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from extension.scheduler.placement import place_gang
from extension.sim.deserved import DeservedNow
from extension.sim.gang_fifo import GangFifo
from extension.sim.metrics import EPS, PlanShape, deserved_gpus, plan_demand
from extension.sim.pod_fifo import PodFifo
from extension.sim.recorder import Recorder
from extension.sim.replay import Replay
from extension.sim.trace import load_trace_scenario


def random_plans(rng: random.Random) -> list[tuple[str, float, float]]:
    plans = []
    for t in range(rng.randint(1, 4)):
        team = f"/t{t}"
        plans.append((team, rng.choice([1.0, 2.0, 0.5]), rng.choice([math.inf, 3.0, 8.0])))
        for s in range(rng.randint(0, 3)):
            sub = f"{team}/s{s}"
            plans.append((sub, rng.choice([1.0, 3.0]), rng.choice([math.inf, 2.0, 5.5])))
    return plans


def leaves_of(plans: list[tuple[str, float, float]]) -> list[str]:
    parents = [p for p, _, _ in plans]
    return [f"{p}/u{u}" for p in parents for u in range(2)]


@pytest.mark.parametrize("seed", range(40))
def test_deserved_now_is_the_full_pass(seed: int) -> None:
    rng = random.Random(seed)
    plans = random_plans(rng)
    shape = PlanShape(plans)
    leaf_demand: dict[str, float] = {}
    capacity = rng.choice([4.0, 10.0, 100.0])
    now = DeservedNow(shape, leaf_demand, capacity)
    leaves = leaves_of(plans)
    for _ in range(60):
        before_demand, before_deserved = dict(now.demand), dict(now.deserved)
        for _ in range(rng.randint(1, 3)):
            leaf = rng.choice(leaves)
            shape.add(leaf)
            amount = rng.choice([1.0, 2.0, 0.5, 4.0]) * rng.choice([1, -1])
            leaf_demand[leaf] = max(0.0, leaf_demand.get(leaf, 0.0) + amount)
            now.touch(leaf)
        wanted, deserved = now.update()
        demand = plan_demand(shape, leaf_demand)
        assert now.demand == demand
        assert now.deserved == deserved_gpus(shape, leaf_demand, capacity, demand)
        for path, value in now.demand.items():
            if before_demand.get(path) != value:
                assert path in wanted
        for path, value in now.deserved.items():
            if before_deserved.get(path) != value:
                assert path in deserved


class FullPass:
    """The recorder's integrals as they were computed before issue 31: every plan at every
    span, the deserved shares by the full pass."""

    def __init__(self, shape: PlanShape, capacity: float) -> None:
        self.shape, self.capacity = shape, capacity
        self.leaf_demand: dict[str, float] = {}
        self.held: dict[str, float] = {}
        self.deserved: dict[str, float] = {}
        self.with_demand: list[str] = []
        self.dev_all: dict[str, float] = {}
        self.held_gs: dict[str, float] = {}
        self.dev_demand_gs = 0.0
        self.demand_s = 0.0

    def observe(self) -> None:
        demand = plan_demand(self.shape, self.leaf_demand)
        self.deserved = deserved_gpus(self.shape, self.leaf_demand, self.capacity, demand)
        self.with_demand = [p for p in self.shape.paths if demand.get(p, 0.0) > EPS]

    def integrate(self, dt: float) -> None:
        held, deserved = self.held, self.deserved
        for path in self.shape.paths:
            gap = abs(held.get(path, 0.0) - deserved.get(path, 0.0)) * dt
            if gap:
                self.dev_all[path] = self.dev_all.get(path, 0.0) + gap
        for path, gpus in held.items():
            if gpus:
                self.held_gs[path] = self.held_gs.get(path, 0.0) + gpus * dt
        if self.with_demand:
            gaps = sum(abs(held.get(p, 0.0) - deserved.get(p, 0.0)) for p in self.with_demand)
            self.dev_demand_gs += gaps / len(self.with_demand) * dt
            self.demand_s += dt


def fake_job(leaf: str, gpu: float, workers: int) -> SimpleNamespace:
    core = SimpleNamespace(max_workers=workers)
    return SimpleNamespace(leaf=leaf, team=leaf.split("/")[1], gpu=gpu, core=core)


@pytest.mark.parametrize("seed", range(25))
def test_recorder_integrals_are_the_full_pass(seed: int) -> None:
    rng = random.Random(seed)
    plans = random_plans(rng)
    capacity = rng.choice([4.0, 12.0])
    scenario = SimpleNamespace(
        plans=[SimpleNamespace(path=p, share=s, limit=SimpleNamespace(gpu=g)) for p, s, g in plans]
    )
    rec = Recorder(scenario, capacity)
    ref = FullPass(PlanShape(plans), capacity)
    leaves = leaves_of(plans)
    live: list[tuple[SimpleNamespace, float]] = []  # job, GPUs it holds
    t, last = 0.0, None
    for _ in range(150):
        t += rng.choice([0.5, 1.0, 3.25, 7.0])
        rec.advance(t)
        if last is not None:
            ref.integrate(t - last)
        last = t
        for _ in range(rng.randint(1, 3)):
            if live and rng.random() < 0.4:  # a job ends or lets go of some of its GPUs
                n = rng.randrange(len(live))
                job, held = live[n]
                drop = held if rng.random() < 0.7 else held / 2
                rec.change(job, -drop, 0.0)
                _hold(ref, job.leaf, -drop)
                if drop == held:
                    del live[n]
                    rec.add_demand(job, -1)
                    _want(ref, job, -1)
                else:
                    live[n] = (job, held - drop)
            else:
                job = fake_job(rng.choice(leaves), rng.choice([1.0, 0.5, 2.0]), rng.randint(1, 3))
                ref.shape.add(job.leaf)
                rec.add_demand(job, +1)
                _want(ref, job, +1)
                if rng.random() < 0.8:
                    held = job.gpu * job.core.max_workers
                    rec.change(job, held, held)
                    _hold(ref, job.leaf, held)
                    live.append((job, held))
        rec.observe(t)
        ref.observe()
    assert rec.dev_all == ref.dev_all
    assert rec.held_gs == ref.held_gs
    assert (rec.dev_demand_gs, rec.demand_s) == (ref.dev_demand_gs, ref.demand_s)


def _want(ref: FullPass, job: SimpleNamespace, sign: int) -> None:
    amount = sign * job.gpu * job.core.max_workers
    ref.leaf_demand[job.leaf] = ref.leaf_demand.get(job.leaf, 0.0) + amount


def _hold(ref: FullPass, leaf: str, gpus: float) -> None:
    path = leaf
    while path != "/":
        ref.held[path] = ref.held.get(path, 0.0) + gpus
        path = path.rsplit("/", 1)[0] or "/"


def checked(base: type) -> type:
    """``base`` (gang-fifo or pod-fifo) whose every placement from its kept indexes is checked
    against a pass of ``place_gang`` over the free rows as they are then."""

    def _place(self, w: tuple, count: int) -> list[int] | None:
        got = base._place(self, w, count)
        assert got == place_gang(self.free, self.names, w, count)
        self.checked += 1
        return got

    return type(f"Checked{base.__name__}", (base,), {"checked": 0, "_place": _place})


CheckedGangFifo = checked(GangFifo)
CheckedPodFifo = checked(PodFifo)


@pytest.mark.parametrize("policy", [CheckedGangFifo, CheckedPodFifo])
def test_baselines_place_as_place_gang_does(policy: type, tmp_path: Path) -> None:
    rng = random.Random(7)
    rows = ["job_id,submit_s,duration_s,gpus,team,user,status"]
    for n in range(300):
        gpus = rng.choice([1, 1, 1, 2, 3, 4, 8, 12, 16])
        rows.append(f"j{n},{n * 30},{rng.randint(60, 4000)},{gpus},vc{n % 3},u{n % 5},Pass")
    path = tmp_path / "mixed.csv"
    path.write_text("\n".join(rows) + "\n")
    scenario = load_trace_scenario(path, "3x8,2x4,1x2", None)
    chosen = policy()
    summary = Replay(scenario, chosen).run().to_json()
    assert summary["jobs"]["finished"] + summary["jobs"]["rejected"] == 300
    assert chosen.checked > 300
