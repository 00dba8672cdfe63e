"""Every plan's GPU demand and deserved share as the leaves' demand changes, recomputed only
where it can have changed.

``metrics.plan_demand`` and ``metrics.deserved_gpus`` pass over the whole plan tree; a replay
needs them after every instant at which a job arrived or ended, and such an instant changes the
demand of one or two leaves. A plan's demand depends only on its children's, so only the plans
above a changed leaf are summed again (bottom up); a plan's children's shares depend only on
what the plan gets and their demands, so only the plans whose share or children's demand
changed hand out theirs again (top down). Each figure is computed by the same expressions
(``plan_total``, ``split``) from the same inputs as the full pass, so the numbers are the same
to the last bit.
"""

from __future__ import annotations

from .metrics import PlanShape, deserved_gpus, plan_demand, plan_total, split


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
        self.fresh = False  # the full pass was made

    def touch(self, leaf: str) -> None:
        self.touched.add(leaf)

    def update(self) -> tuple[set[str], set[str]]:
        """Bring both up to date; returns the plans whose demand changed and those whose
        deserved share changed (a plan new to them counts as changed)."""
        if not self.fresh:
            self.fresh = True
            self.touched.clear()
            self.demand.update(plan_demand(self.shape, self.leaf_demand))
            self.deserved.update(
                deserved_gpus(self.shape, self.leaf_demand, self.capacity, self.demand)
            )
            return set(self.demand), set(self.deserved)
        wanted = self._sum_up(self._above_touched())
        return wanted, self._hand_down(wanted)

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
        return sorted(seen, key=lambda p: -1 if p == "/" else p.count("/"), reverse=True)

    def _sum_up(self, dirty: list[str]) -> set[str]:
        """Demand of the plans in ``dirty`` (children first) that can have changed: a touched
        leaf, or a plan one of whose children's changed. Returns the plans whose changed."""
        shape, demand, leaf_demand = self.shape, self.demand, self.leaf_demand
        parent, children = shape.parent, shape.children
        changed: set[str] = set()
        moved: set[str] = set()  # plans a child of which changed
        for path in dirty:
            if children.get(path) and path not in moved:
                continue  # a plan above: none of its children's demand changed
            total = plan_total(shape, path, leaf_demand, demand)
            if path not in demand or demand[path] != total:
                changed.add(path)
                if path != "/":
                    moved.add(parent[path])
            demand[path] = total
        return changed

    def _hand_down(self, wanted: set[str]) -> set[str]:
        """Deserved shares from the root down, handed out again by the plans whose share or
        one of whose children's demand (``wanted``) changed: elsewhere the inputs, hence the
        answers, are what they were. Returns the plans whose share changed."""
        shape, demand, deserved = self.shape, self.demand, self.deserved
        parent = shape.parent
        again = {parent[p] for p in wanted if p != "/"}  # plans to hand out again
        changed: set[str] = set()
        root = min(demand["/"], self.capacity)
        if deserved.get("/") != root:
            changed.add("/")
            again.add("/")
        deserved["/"] = root
        stack = sorted(again, key=lambda p: -1 if p == "/" else p.count("/"), reverse=True)
        while stack:
            path = stack.pop()  # the shallowest first: a parent hands out before its children
            kids = shape.children[path]
            for kid, amount in zip(kids, split(shape, kids, deserved[path], demand)):
                if kid not in deserved or deserved[kid] != amount:
                    changed.add(kid)
                    if shape.children.get(kid) and kid not in again:
                        again.add(kid)
                        stack.append(kid)
                deserved[kid] = amount
        return changed
