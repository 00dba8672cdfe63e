"""Phase 2, reject: jobs that can never run as asked (docs/scheduling.md "Admission 3").

A job is rejected when its leaf cannot exist (``PlanIndex.leaf_of`` says why), or its minimum
gang is over the limit of a plan on its path, over the instance (capacity cut by quota), has a
worker larger than the largest node, or cannot be placed even on the empty nodes. The answers
depend on the plan tree and the instance only, so they are kept with the index: per leaf and
shape (``PlanNode.answers``) and, for the instance part, per shape (``PlanIndex.too_big``).
"""

from __future__ import annotations

from . import messages
from .index import PlanNode
from .model import Job
from .placement import max_workers_on
from .resources import RESOURCES
from .state import CycleState


def impossible(state: CycleState, job: Job, leaf: PlanNode | None = None) -> str | None:
    """Why ``job`` can never run as asked, or None."""
    if leaf is None:
        leaf, problem = state.index.leaf_of(job)
        if problem:
            return problem
    w, n = job.per_worker, job.min_workers
    key = (w, n)
    cache = leaf.answers
    if key in cache:
        return cache[key]
    answer = _over_a_plan_limit(state, leaf, w, n)
    cache[key] = answer or _too_big(state, w, n)
    return cache[key]


def _over_a_plan_limit(state: CycleState, leaf: PlanNode, w: tuple, n: int) -> str | None:
    req = [w[r] * n for r in range(3)]
    for p in leaf.limited:
        if p is state.index.root:
            continue  # the quota is the instance's part, below
        for r, name in enumerate(RESOURCES):
            if req[r] > p.limit[r]:
                return messages.over_plan_limit(p.path, name, p.limit[r], req[r], w, n)
    return None


def _too_big(state: CycleState, w: tuple, n: int) -> str | None:
    """The instance part, which depends on the shape only (cached by it)."""
    key = (w, n)
    cache = state.index.too_big
    if key in cache:
        return cache[key]
    nodes = state.nodes
    total = nodes.total
    answer = None
    for r, name in enumerate(RESOURCES):
        if w[r] * n > total[r]:
            answer = messages.over_instance(name, total[r], w[r] * n, w, n)
            break
    if answer is None:
        for r, name in enumerate(RESOURCES):
            if w[r] > nodes.largest[r]:
                answer = messages.worker_too_big(name, w[r], nodes.largest[r])
                break
    if answer is None:
        most = max_workers_on(nodes.capacity, w)  # the empty nodes; once per shape (cached)
        if most < n:
            answer = messages.cannot_place(w, n, most)
    cache[key] = answer
    return answer
