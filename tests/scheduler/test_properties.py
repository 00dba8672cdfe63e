"""Invariants of SCHEDULING.md over random plan trees, nodes and job streams (hypothesis)."""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extension.scheduler import (
    Grow,
    Instance,
    Job,
    JobState,
    Node,
    PlanTree,
    Preempt,
    Resources,
    SchedulerConfig,
    Shrink,
    Snapshot,
    Start,
    schedule,
)
from extension.scheduler.placement import FitIndex, place_gang
from extension.scheduler.resources import UNLIMITED


@st.composite
def plan_trees(draw) -> PlanTree:
    tree = PlanTree()
    paths = []
    for i in range(draw(st.integers(1, 3))):
        top = f"/t{i}"
        tree.add(top, draw(st.sampled_from([1, 2, 4])), _gpu_limit(draw, None))
        paths.append(top)
        for j in range(draw(st.integers(0, 3))):
            child = f"{top}/c{j}"
            parent_limit = tree.get(top).limit.gpu
            tree.add(child, draw(st.sampled_from([1, 2, 3])), _gpu_limit(draw, parent_limit))
            paths.append(child)
    return tree


def _gpu_limit(draw, parent: float | None) -> Resources:
    options = [UNLIMITED, 2, 4, 8, 16]
    if parent is not None and parent != UNLIMITED:
        options = [v for v in options if v == UNLIMITED or v <= parent]
    return Resources(draw(st.sampled_from(options)), UNLIMITED, UNLIMITED)


@st.composite
def worlds(draw):
    tree = draw(plan_trees())
    node_count = draw(st.integers(1, 4))
    per_node = draw(st.sampled_from([2, 4, 8]))
    nodes = tuple(Node(f"n{i}", Resources(per_node, 32_000, 2**38)) for i in range(node_count))
    plans = [p.path for p in tree]
    jobs = []
    for k in range(draw(st.integers(1, 25))):
        low = draw(st.integers(1, 3))
        high = low + draw(st.sampled_from([0, 0, 2]))
        jobs.append(
            Job(
                id=f"j{k:02d}",
                user=draw(st.sampled_from(["u1", "u2", "u3"])),
                plan=draw(st.sampled_from(plans)),
                per_worker=Resources(draw(st.sampled_from([0, 1, 1, 2])), 1000, 2**30),
                min_workers=low,
                max_workers=high,
                priority=draw(st.integers(0, 1)),
                submitted=float(draw(st.integers(0, 5))),
                preemptible=draw(st.booleans()),
            )
        )
    return tree, nodes, jobs


def check_invariants(tree, nodes, jobs, result) -> None:
    by_id = {j.id: j for j in jobs}
    names = [n.name for n in nodes]
    used = {n.name: [0, 0, 0] for n in nodes}
    per_plan: dict[str, list] = {}
    for job in jobs:
        if job.state is not JobState.RUNNING:
            continue
        # every running job holds its whole gang (elastic: at least min), never more than max
        assert job.min_workers <= job.workers <= job.max_workers, job
        for node in job.placement:
            for r in range(3):
                used[node][r] += job.per_worker[r]
        chain = job.leaf.split("/")
        for depth in range(2, len(chain) + 1):
            path = "/".join(chain[:depth])
            acc = per_plan.setdefault(path, [0, 0, 0])
            for r in range(3):
                acc[r] += job.per_worker[r] * job.workers
    for node in nodes:  # allocated <= capacity, node by node
        assert all(used[node.name][r] <= node.capacity[r] for r in range(3)), node
    for plan in tree:  # allocated(plan) <= limit(plan)
        held = per_plan.get(plan.path, [0, 0, 0])
        assert all(held[r] <= plan.limit[r] for r in range(3)), plan
    # work conservation, reservations and reclaims aside: a job waiting for capacity does not
    # fit in what is free
    quiet = not any(isinstance(d, (Preempt, Shrink)) for d in result.decisions)
    reasons = list(result.waiting.values())
    if quiet and not any("reservation" in r or "releas" in r for r in reasons):
        free = [[n.capacity[r] - used[n.name][r] for r in range(3)] for n in nodes]
        for job_id, reason in result.waiting.items():
            if reason.startswith("waiting for capacity"):
                job = by_id[job_id]
                assert place_gang(free, names, job.per_worker, job.min_workers) is None, job_id


def apply(jobs: list[Job], result, now: float) -> None:
    by_id = {j.id: j for j in jobs}
    for d in result.decisions:
        job = by_id.get(d.job_id)
        if isinstance(d, Start):
            job.state, job.placement, job.started = JobState.RUNNING, d.placement, now
        elif isinstance(d, Grow):
            job.placement = job.placement + d.add
        elif isinstance(d, (Shrink, Preempt)):
            job.terminating = True


def settle(jobs: list[Job], result) -> None:
    """The grace periods end: victims let go before the next cycle."""
    by_id = {j.id: j for j in jobs}
    for d in result.decisions:
        job = by_id.get(d.job_id)
        if isinstance(d, Shrink):
            keep = list(job.placement)
            for node in d.release:
                keep.remove(node)
            job.placement, job.terminating = tuple(keep), False
        elif isinstance(d, Preempt):
            job.state, job.placement, job.started, job.terminating = (
                JobState.PENDING,
                (),
                None,
                False,
            )


def run_stream(world, finish_picks, fresh_index: bool) -> list[tuple]:
    """Cycles over a job stream, checking the invariants after each; with ``fresh_index`` every
    cycle sees a copy of the tree, so the core builds its plan index anew each time instead of
    keeping it between cycles. Returns what every cycle decided."""
    tree, nodes, jobs = world
    live = copy.deepcopy(jobs)
    seen = []
    for step, pick in enumerate(finish_picks):
        now = 100.0 * (step + 1)
        plans = tree.copy() if fresh_index else tree
        snap = Snapshot(plans, Instance(nodes), live, SchedulerConfig(grace=0))
        result = schedule(snap, now)
        seen.append((result.decisions, result.waiting, result.plans, result.reserved))
        rejected = {d.job_id for d in result.decisions if d.__class__.__name__ == "Reject"}
        live = [j for j in live if j.id not in rejected]
        apply(live, result, now)
        check_invariants(tree, nodes, live, result)
        settle(live, result)
        runners = [j for j in live if j.state is JobState.RUNNING and not j.terminating]
        if runners:  # one job finishes: demand changes, the next cycle must still hold
            done = runners[pick % len(runners)]
            live = [j for j in live if j is not done]
    return seen


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds(), st.lists(st.integers(0, 30), min_size=1, max_size=6))
def test_invariants_hold_over_a_random_job_stream(world, finish_picks):
    kept = run_stream(world, finish_picks, fresh_index=False)
    # the plan index kept between cycles decides exactly as one built for every cycle
    assert kept == run_stream(world, finish_picks, fresh_index=True)


@settings(max_examples=150, deadline=None)
@given(plan_trees(), st.integers(1, 4), st.data())
def test_steady_demand_converges_to_deserved_within_one_gang(tree, node_count, data):
    """One-GPU rigid jobs, more demand than capacity everywhere: after one cycle each plan
    holds its deserved share within one gang's size (1 GPU)."""
    nodes = tuple(Node(f"n{i}", Resources(8, 64_000, 2**38)) for i in range(node_count))
    leaves = [p.path for p in tree if not tree.children(p.path)]
    jobs = [
        Job(f"{leaf}-{k}", data.draw(st.sampled_from(["a", "b"])), leaf, Resources(1, 0, 0))
        for leaf in leaves
        for k in range(40)
    ]
    result = schedule(Snapshot(tree, Instance(nodes), jobs), 0.0)
    for path, figures in result.plans.items():
        gap = abs(figures.allocated.gpu - figures.deserved.gpu)
        assert gap <= 1 + 1e-9, (
            path,
            figures,
            [p.to_dict() for p in tree],
            sorted((p, f.allocated.gpu, round(f.deserved.gpu, 2)) for p, f in result.plans.items()),
        )


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds(), st.lists(st.integers(0, 30), min_size=1, max_size=4))
def test_admission_through_the_fit_index_places_as_a_full_pass_over_the_nodes(world, finish_picks):
    fast = run_stream(world, finish_picks, fresh_index=True)

    def full_pass(self: FitIndex, count: int) -> list[int] | None:
        return place_gang(self.free, self.names, (self.w0, self.w1, self.w2), count)

    with pytest.MonkeyPatch.context() as patch:  # every gang placed by place_gang's full pass
        patch.setattr(FitIndex, "place", full_pass)
        slow = run_stream(world, finish_picks, fresh_index=True)
    assert fast == slow
