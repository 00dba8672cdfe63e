"""Every plan's GPU demand and deserved share as the leaves' demand changes, recomputed only
where it can have changed.

``metrics.plan_demand`` and ``metrics.deserved_gpus`` pass over the whole plan tree; a replay
needs them after every instant at which a job arrived or ended, and such an instant changes the
demand of one or two leaves. A plan's demand depends only on its children's, so only the plans
above a changed leaf are summed again (bottom up); a plan's children's shares depend only on
what the plan gets and their demands, so only the plans whose share or children's demand
changed hand out theirs again (top down); a plan whose children's demand fit in its share
last time and fits again changes only the shares of the children whose demand changed. Each
figure is computed by the same arithmetic as the full pass (``plan_total``'s sum of the
children in their order, ``split``) from the same inputs, so the numbers are the same to the
last bit (tests/sim/test_incremental.py).
"""

from __future__ import annotations

from .metrics import PlanShape, split


class DeservedNow:
    """``demand`` (``plan_demand``'s answer) and ``deserved`` (``deserved_gpus``'s), kept up
    to date by ``update`` from the leaves ``touch`` was told of."""

    def __init__(self, shape: PlanShape, leaf_demand: dict[str, float], capacity: float) -> None:
        self.shape = shape
        self.leaf_demand = leaf_demand  # the caller's, changed in place
        self.capacity = capacity
        self.demand: dict[str, float] = {}
        self.deserved: dict[str, float] = {}
        self.touched: set[str] = set()  # leaves whose demand changed since the last update
        self.fresh = False  # every plan was computed once
        # a plan's children's demand summed (before its limit), as ``split`` sums it
        self.kid_sum: dict[str, float] = {}
        # plans whose last hand-out gave every child its demand (the sum fit in the share): the
        # next such hand-out changes only the children whose demand changed
        self.easy: set[str] = set()

    def touch(self, leaf: str) -> None:
        self.touched.add(leaf)

    def update(self) -> tuple[set[str], set[str]]:
        """Bring both up to date; returns the plans whose demand changed and those whose
        deserved share changed (a plan new to them counts as changed)."""
        every = not self.fresh  # the first time, every plan, as the full passes
        self.fresh = True
        if every:
            self.touched.clear()
            dirty = self.shape.bottom_up()
        else:
            dirty = self._above_touched()
        wanted, moved = self._sum_up(dirty, every)
        return wanted, self._hand_down(moved, every)

    def _above_touched(self) -> list[str]:
        """The touched leaves and every plan above them, children before parents."""
        touched, parent = self.touched, self.shape.parent
        if len(touched) == 1:  # the common instant: one leaf's jobs came or went
            path = touched.pop()
            line = [path]
            while path != "/":
                path = parent[path]
                line.append(path)
            return line
        seen: set[str] = set()
        for leaf in touched:
            path = leaf
            while path not in seen:
                seen.add(path)
                if path == "/":
                    break
                path = parent[path]
        touched.clear()
        return sorted(seen, key=_depth, reverse=True)

    def _sum_up(self, dirty: list[str], every: bool) -> tuple[set[str], dict[str, list[str]]]:
        """Demand of the plans in ``dirty`` (children first) that can have changed: a touched
        leaf, or a plan one of whose children's changed (``plan_total``'s expressions).
        Returns the plans whose demand changed and, per parent, its children among them."""
        shape, demand, leaf_demand = self.shape, self.demand, self.leaf_demand
        parent, children, limit = shape.parent, shape.children, shape.limit
        changed: set[str] = set()
        moved: dict[str, list[str]] = {}  # in the order found: the deepest parents first
        for path in dirty:
            kids = children.get(path)
            if kids:
                if not every and path not in moved:
                    continue  # none of its children's demand changed
                total = self.kid_sum[path] = sum(map(demand.__getitem__, kids))
            else:
                total = leaf_demand.get(path, 0.0)
            if path != "/":
                total = min(total, limit[path])
            if path not in demand or demand[path] != total:
                changed.add(path)
                if path != "/":
                    moved.setdefault(parent[path], []).append(path)
            demand[path] = total
        return changed, moved

    def _hand_down(self, moved: dict[str, list[str]], every: bool) -> set[str]:
        """Deserved shares from the root down, handed out again by the plans whose share or
        one of whose children's demand (``moved``) changed: elsewhere the inputs, hence the
        answers, are what they were. Returns the plans whose share changed."""
        shape, demand, deserved = self.shape, self.demand, self.deserved
        children = shape.children
        changed: set[str] = set()
        root = min(demand["/"], self.capacity)
        if deserved.get("/") != root or "/" not in deserved:
            changed.add("/")
        deserved["/"] = root
        again = set(moved)  # plans to hand out again
        # the shallowest last, to be taken first: a parent hands out before its children
        stack = sorted(again, key=_depth, reverse=True) if every else list(moved)
        while stack:
            path = stack.pop()
            kids, amount = children[path], deserved[path]
            if self.kid_sum[path] <= amount:  # ``split`` gives each child its demand
                todo = kids if every or path not in self.easy else moved.get(path, ())
                got = map(demand.__getitem__, todo)
                self.easy.add(path)
            else:
                todo, got = kids, split(shape, kids, amount, demand)
                self.easy.discard(path)
            for kid, share in zip(todo, got):
                if kid not in deserved or deserved[kid] != share:
                    changed.add(kid)
                    if children.get(kid) and kid not in again:
                        again.add(kid)
                        stack.append(kid)
                deserved[kid] = share
        return changed


def _depth(path: str) -> int:
    return 0 if path == "/" else path.count("/")
