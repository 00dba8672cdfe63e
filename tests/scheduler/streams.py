"""Random job streams over random plan trees and nodes: what the property tests draw with
hypothesis and the golden files draw with a seeded ``random.Random``, through one ``pick``.

``pick(options)`` returns one of ``options`` (a sequence); hypothesis gives
``lambda o: draw(st.sampled_from(o))``, the golden files ``random.Random(seed).choice``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

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
from extension.scheduler.placement import place_gang
from extension.scheduler.resources import UNLIMITED

Pick = Callable[[Sequence], object]


def plan_tree(pick: Pick) -> PlanTree:
    tree = PlanTree()
    for i in range(pick(range(1, 4))):
        top = f"/t{i}"
        tree.add(top, pick([1, 2, 4]), _gpu_limit(pick, None))
        for j in range(pick(range(0, 4))):
            parent_limit = tree.get(top).limit.gpu
            tree.add(f"{top}/c{j}", pick([1, 2, 3]), _gpu_limit(pick, parent_limit))
    return tree


def _gpu_limit(pick: Pick, parent: float | None) -> Resources:
    options = [UNLIMITED, 2, 4, 8, 16]
    if parent is not None and parent != UNLIMITED:
        options = [v for v in options if v == UNLIMITED or v <= parent]
    return Resources(pick(options), UNLIMITED, UNLIMITED)


def world(pick: Pick) -> tuple[PlanTree, tuple[Node, ...], list[Job]]:
    """A plan tree, 1-4 nodes of 2, 4 or 8 GPUs, and 1-25 pending jobs (rigid or elastic)."""
    tree = plan_tree(pick)
    node_count = pick(range(1, 5))
    per_node = pick([2, 4, 8])
    nodes = tuple(Node(f"n{i}", Resources(per_node, 32_000, 2**38)) for i in range(node_count))
    plans = [p.path for p in tree]
    jobs = []
    for k in range(pick(range(1, 26))):
        low = pick(range(1, 4))
        high = low + pick([0, 0, 2])
        jobs.append(
            Job(
                id=f"j{k:02d}",
                user=pick(["u1", "u2", "u3"]),
                plan=pick(plans),
                per_worker=Resources(pick([0, 1, 1, 2]), 1000, 2**30),
                min_workers=low,
                max_workers=high,
                priority=pick([0, 1]),
                submitted=float(pick(range(0, 6))),
                preemptible=pick([False, True]),
            )
        )
    return tree, nodes, jobs


def check_invariants(tree, nodes, jobs, result) -> None:
    """docs/scheduling.md "Invariants, tested with hypothesis", after one cycle was carried out."""
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


def run_stream(
    world, finish_picks, fresh_index: bool, check: bool = True, staggered: bool = False
) -> list[tuple]:
    """Cycles over a job stream, checking the invariants after each; with ``fresh_index`` every
    cycle sees a copy of the tree, so the core builds its plan index anew each time instead of
    keeping it between cycles. ``staggered``: a job submitted at time s arrives at cycle s (so
    plans borrow first and reclaim later) instead of all at the first. Returns (now, result) of
    every cycle."""
    tree, nodes, jobs = world
    live = copy.deepcopy(jobs)
    later = []
    if staggered:
        later = [j for j in live if j.submitted > 0]
        live = [j for j in live if j.submitted == 0]
    seen = []
    for step, pick in enumerate(finish_picks):
        now = 100.0 * (step + 1)
        live += [j for j in later if j.submitted == step]
        plans = tree.copy() if fresh_index else tree
        snap = Snapshot(plans, Instance(nodes), live, SchedulerConfig(grace=0))
        result = schedule(snap, now)
        seen.append((now, result))
        rejected = {d.job_id for d in result.decisions if d.__class__.__name__ == "Reject"}
        live = [j for j in live if j.id not in rejected]
        apply(live, result, now)
        if check:
            check_invariants(tree, nodes, live, result)
        settle(live, result)
        runners = [j for j in live if j.state is JobState.RUNNING and not j.terminating]
        if runners:  # one job finishes: demand changes, the next cycle must still hold
            done = runners[pick % len(runners)]
            live = [j for j in live if j is not done]
    return seen


def outcome(result) -> tuple:
    """What a cycle decided, comparable with ==."""
    return result.decisions, result.waiting, result.plans, result.reserved
