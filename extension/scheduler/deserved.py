"""Phases 3 and 4: each plan's demand, then its deserved share (docs/scheduling.md "Words":
demand; "Deserved share").

Demand of a plan is the sum over its subtree's pending and running jobs of their max request,
capped by the plan's limit at every level; jobs rejected this cycle add none. The root's
amount is the instance capacity, capped by total demand, and every plan hands its amount to its
children by weighted water-filling (``shares.water_fill``), per resource, top-down.
"""

from __future__ import annotations

from itertools import chain
from operator import attrgetter

from .history import tree_standings
from .index import PlanNode
from .ledger import EPS
from .shares import dominant_ratio, water_fill
from .state import CycleState

_demand_of, _deserved_of = attrgetter("demand"), attrgetter("deserved")


def compute_demand(state: CycleState) -> None:
    """Leaves add up their running jobs and pending buckets; then bottom-up, each plan's
    demand is capped by its limit and handed to its parent together with what it holds."""
    for job, leaf in zip(state.running, state.running_leaves):
        w, most = job.per_worker, job.max_workers
        d = leaf.demand
        d[0] += w[0] * most
        d[1] += w[1] * most
        d[2] += w[2] * most
    bottom_up = state.bottom_up = state.index.bottom_up()
    for plan in bottom_up:
        d, lim = plan.demand, plan.limit
        if plan.pending:
            for (w, _, most), jobs in plan.buckets.items():
                if jobs:
                    k = most * len(jobs)
                    d[0] += w[0] * k
                    d[1] += w[1] * k
                    d[2] += w[2] * k
        if d[0] > lim[0]:
            d[0] = lim[0]
        if d[1] > lim[1]:
            d[1] = lim[1]
        if d[2] > lim[2]:
            d[2] = lim[2]
        parent = plan.parent
        if parent is not None:
            pd, pa, a = parent.demand, parent.alloc, plan.alloc
            pd[0] += d[0]
            pd[1] += d[1]
            pd[2] += d[2]
            pa[0] += a[0]
            pa[1] += a[1]
            pa[2] += a[2]
    rd, total = state.index.root.demand, state.nodes.total
    for r in range(3):
        rd[r] = min(rd[r], total[r])


def compute_deserved(state: CycleState) -> None:
    """Top-down water-filling per resource, parents before children; then every plan's
    dominant ratio and its tie-break weight for the fair order (Admission 1)."""
    root, bottom_up = state.index.root, state.bottom_up
    root.deserved[:] = root.demand
    weigh = None
    if state.config.fair_share_half_life > 0 and state.snapshot.usage:
        state.standing = tree_standings(state.bottom_up, state.snapshot.usage)
        standing = state.standing
        weigh = {p: s.weight for p, s in standing.items()}  # Deserved share 2
    # every plan's demand, flat: what the kept shares are of, and the next cycle's key
    demand = None if weigh is not None else list(chain.from_iterable(map(_demand_of, bottom_up)))
    if demand is None or not _kept_shares(state, demand):
        if weigh is not None:
            _reclaim_lines(state, weigh)
        else:
            for plan in reversed(bottom_up):  # parents before their children
                if plan.children:
                    _hand_out(plan, None)
            state.index.shares_kept = SharesKept(bottom_up, demand)
    if weigh is None and state.index.split_lines:
        for plan in bottom_up:  # history off again: reclaim's lines are the deserved share
            plan.floor = plan.ceiling = plan.deserved
        state.index.split_lines = False
    c0, c1, c2 = state.nodes.total
    for plan in state.bottom_up:
        a, d = plan.alloc, plan.deserved
        if a[0] > 0 or a[1] > 0 or a[2] > 0:  # else the ratio stays the reset's 0
            plan.ratio = dominant_ratio(a, d)
        if d[0] or d[1] or d[2]:
            plan.weight = -(
                (d[0] / c0 if c0 > 0 else 0)
                + (d[1] / c1 if c1 > 0 else 0)
                + (d[2] / c2 if c2 > 0 else 0)
            )


class SharesKept:
    """Every plan's demand and deserved share after one cycle's water-filling, kept on the
    index (docs/scheduling.md "Cost"): the shares depend only on the tree and the demands, so
    a cycle whose every demand is the same takes them from here. Flat columns, three numbers
    a plan, nothing for the garbage collector to walk."""

    __slots__ = ("plans", "demand", "deserved")

    def __init__(self, plans: list[PlanNode], demand: list) -> None:
        """``demand``: every plan's demand, flat, as the shares were handed out for it."""
        self.plans = plans
        self.demand = demand
        self.deserved = list(chain.from_iterable(map(_deserved_of, plans)))


def _reclaim_lines(state: CycleState, weigh: dict[str, float]) -> None:
    """Deserved share 2: hand out by share alone, then by ``weigh`` (share times fair-share
    factor) into ``deserved``, which orders admission and borrowing; each plan's ``floor``
    and ``ceiling`` are the lower and the higher of the two, what reclaim reads (Reclaim 1
    and 3), so usage history never makes a reclaim that the share-only rule would not."""
    bottom_up = state.bottom_up
    for plan in reversed(bottom_up):
        if plan.children:
            _hand_out(plan, None)
    by_share = [tuple(plan.deserved) for plan in bottom_up]
    for plan in reversed(bottom_up):
        if plan.children:
            _hand_out(plan, weigh)
    for plan, plain in zip(bottom_up, by_share):
        d = plan.deserved
        plan.floor = [min(plain[r], d[r]) for r in range(3)]
        plan.ceiling = [max(plain[r], d[r]) for r in range(3)]
    state.index.split_lines = True


def _kept_shares(state: CycleState, demand: list) -> bool:
    """Set every plan's deserved share as the last cycle had it, when nothing it depends on
    changed: the same plans (``bottom_up`` is rebuilt when one is added) and every demand the
    same (``demand``, flat); the caller asks only when no usage history weighs the shares."""
    kept, plans = state.index.shares_kept, state.bottom_up
    if not isinstance(kept, SharesKept) or kept.plans is not plans or demand != kept.demand:
        return False
    deserved = kept.deserved
    for n, plan in enumerate(plans):
        plan.deserved[:] = deserved[3 * n : 3 * n + 3]
    return True


def _hand_out(plan, weigh: dict[str, float] | None) -> None:
    """``plan``'s deserved amount to its children by ``water_fill``, per resource. A plan with
    nothing of a resource leaves its children at zero. Where every child's demand fits (below
    the contended levels of the tree) each gets its demand: water_fill's own first case,
    asked here without building its lists (most plans are the one parent of a user leaf).
    ``weigh``: each plan's share times its fair-share factor (Deserved share 2), or None to
    weigh by share alone."""
    kids, have = plan.children, plan.deserved
    if len(kids) == 1:
        kid = kids[0]
        for r in range(3):
            amount, cap = have[r], kid.demand[r]
            if amount:
                kid.deserved[r] = (
                    float(cap) if cap <= amount else water_fill(amount, [cap], [kid.share])[0]
                )
        return
    weights = None
    for r in range(3):
        amount = have[r]
        if not amount:
            continue
        caps = [k.demand[r] for k in kids]
        if sum(caps) <= amount:
            for kid, cap in zip(kids, caps):
                kid.deserved[r] = float(cap)
            continue
        if weights is None:
            if weigh is None:
                weights = [k.share for k in kids]
            else:
                weights = [weigh[k.path] for k in kids]
        for kid, got in zip(kids, water_fill(amount, caps, weights)):
            kid.deserved[r] = got


def within_deserved(
    promised: dict, leaf: PlanNode, w: tuple, low: int, high: int, floor: bool = False
) -> tuple[int, int]:
    """Reclaim 1: (the most workers k in [low, high] the job may run within its deserved
    share, the height of its chain that stays within it with k running): the leaf, and each
    ancestor up to that height, holds at most its deserved share of every resource the job
    asks for, counting what this cycle promised. (0, 0) when even the minimum gang would make
    its leaf a borrower: on a busy cluster most blocked leaves stop here. ``floor``: test
    against each plan's ``floor`` (reclaim: within both deserved shares, Deserved share 2)
    instead of its ``deserved`` (admission)."""
    w0, w1, w2 = w
    for k in range(high, low - 1, -1):
        height = 0
        for p in leaf.chain:
            if p.parent is None:
                break  # the root is the instance, not a share
            a, d = p.alloc, (p.floor if floor else p.deserved)
            change = promised.get(p.path)
            if change:
                a = (a[0] + change[0], a[1] + change[1], a[2] + change[2])
            if (
                (w0 and a[0] + w0 * k > d[0] + EPS)
                or (w1 and a[1] + w1 * k > d[1] + EPS)
                or (w2 and a[2] + w2 * k > d[2] + EPS)
            ):
                break
            height += 1
        if height:
            return k, height
    return 0, 0
