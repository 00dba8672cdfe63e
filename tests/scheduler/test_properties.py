"""Invariants of docs/scheduling.md over random plan trees, nodes and job streams (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extension.scheduler import Instance, Job, Node, PlanTree, Resources, Snapshot, schedule
from extension.scheduler.placement import FitIndex, place_gang

from . import streams
from .streams import outcome


def _picker(draw):
    return lambda options: draw(st.sampled_from(list(options)))


@st.composite
def plan_trees(draw) -> PlanTree:
    return streams.plan_tree(_picker(draw))


@st.composite
def worlds(draw):
    return streams.world(_picker(draw))


def run_stream(world, finish_picks, fresh_index: bool, staggered: bool = False) -> list[tuple]:
    """Every cycle's outcome over a stream, the invariants checked after each."""
    runs = streams.run_stream(world, finish_picks, fresh_index, staggered=staggered)
    return [outcome(r) for _, r in runs]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds(), st.lists(st.integers(0, 30), min_size=1, max_size=6), st.booleans())
def test_invariants_hold_over_a_random_job_stream(world, finish_picks, staggered):
    kept = run_stream(world, finish_picks, fresh_index=False, staggered=staggered)
    # the plan index kept between cycles decides exactly as one built for every cycle
    assert kept == run_stream(world, finish_picks, fresh_index=True, staggered=staggered)


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
