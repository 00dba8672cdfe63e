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
        dirty = self._above_touched()
        return self._sum_up(dirty), self._hand_down(dirty)

    def _above_touched(self) -> list[str]:
        """The touched leaves and every plan above them, children before parents."""
        parent = self.shape.parent
        seen: set[str] = set()
        for leaf in self.touched:
            path = leaf
            while path not in seen:
                seen.add(path)
                if path == "/":
                    break
                path = parent[path]
        self.touched.clear()
        return sorted(seen, key=lambda p: -1 if p == "/" else p.count("/"), reverse=True)

    def _sum_up(self, dirty: list[str]) -> set[str]:
        demand, changed = self.demand, set()
        for path in dirty:
            total = plan_total(self.shape, path, self.leaf_demand, demand)
            if path not in demand or demand[path] != total:
                changed.add(path)
            demand[path] = total
        return changed

    def _hand_down(self, dirty: list[str]) -> set[str]:
        """Deserved shares from the root down, into the plans on a dirty path or whose share
        changed: elsewhere the inputs, hence the answers, are what they were."""
        shape, demand, deserved = self.shape, self.demand, self.deserved
        on_path = set(dirty)
        changed: set[str] = set()
        root = min(demand["/"], self.capacity)
        if deserved.get("/") != root:
            changed.add("/")
        deserved["/"] = root
        stack = ["/"]
        while stack:
            path = stack.pop()
            kids = shape.children.get(path, ())
            if not kids or (path not in on_path and path not in changed):
                continue
            for kid, amount in zip(kids, split(shape, kids, deserved[path], demand)):
                if kid not in deserved or deserved[kid] != amount:
                    changed.add(kid)
                deserved[kid] = amount
                if kid in on_path or kid in changed:
                    stack.append(kid)
        return changed
