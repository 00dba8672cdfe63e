"""Figures of a replay, the same for every policy (docs/simulate.md "Metrics").

- ``percentiles``: nearest rank (the smallest value with at least q of the values at or below
  it), so every reported figure is a value that really occurred.
- ``deserved_gpus``: the deserved share of every plan from the GPU demand, by the core's own
  hierarchical weighted water-filling (docs/scheduling.md "Deserved share"), computed outside the
  policy so that baselines that know nothing of shares are measured against the same yardstick.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from extension.scheduler.shares import water_fill

QUANTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
# simulated times and GPU sums are floats: two within EPS are the same instant or amount
EPS = 1e-9


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest rank: the ceil(q*n)-th smallest value (1-based); needs a sorted, non-empty list."""
    rank = max(1, math.ceil(q * len(sorted_values) - 1e-9))
    return sorted_values[rank - 1]


def percentiles(values: Iterable[float]) -> dict:
    """``{count, mean, p50, p90, p99}`` (seconds, rounded to 3 places); figures are None when
    there is no value."""
    data = sorted(values)
    if not data:
        return {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None}
    out: dict = {"count": len(data), "mean": num(sum(data) / len(data))}
    for name, q in QUANTILES:
        out[name] = num(percentile(data, q))
    return out


def num(value: float | None) -> float | int | None:
    """Plain JSON numbers: ints where whole, else 3 decimals."""
    if value is None:
        return None
    value = round(value, 3)
    return int(value) if value == int(value) else value


class PlanShape:
    """The plan tree as the metrics see it: paths, parents, shares, GPU limits, depth."""

    def __init__(self, plans: Iterable[tuple[str, float, float]]) -> None:
        """``plans``: (path, share, gpu limit) for every plan and user leaf."""
        self.paths: list[str] = []
        self.share: dict[str, float] = {}
        self.limit: dict[str, float] = {}
        self.children: dict[str, list[str]] = {"/": []}
        self.parent: dict[str, str] = {}
        self._order: list[str] | None = None
        for path, share, limit in sorted(plans, key=lambda p: (p[0].count("/"), p[0])):
            self.add(path, share, limit)

    def add(self, path: str, share: float = 1.0, limit: float = math.inf) -> None:
        if path in self.share:
            return
        parent = path.rsplit("/", 1)[0] or "/"
        if parent not in self.children:
            self.add(parent)
        self.paths.append(path)
        self.parent[path] = parent
        self.share[path] = share
        self.limit[path] = limit
        self.children.setdefault(path, [])
        self.children[parent].append(path)
        self._order: list[str] | None = None

    def bottom_up(self) -> list[str]:
        """Every plan, children before parents (the root last)."""
        if self._order is None:
            order: list[str] = []
            stack = [("/", False)]
            while stack:
                path, done = stack.pop()
                if done:
                    order.append(path)
                    continue
                stack.append((path, True))
                stack.extend((kid, False) for kid in self.children.get(path, ()))
            self._order = order
        return self._order

    def depth(self, path: str) -> int:
        return path.count("/")


def plan_demand(shape: PlanShape, leaf_demand: dict[str, float]) -> dict[str, float]:
    """GPU demand of every plan: its leaves' summed up, each plan's capped by its limit."""
    demand: dict[str, float] = {}
    for path in shape.bottom_up():
        demand[path] = plan_total(shape, path, leaf_demand, demand)
    return demand


def plan_total(
    shape: PlanShape, path: str, leaf_demand: dict[str, float], demand: dict[str, float]
) -> float:
    """One plan's figure of ``plan_demand`` from its children's (already in ``demand``)."""
    kids = shape.children.get(path, ())
    total = leaf_demand.get(path, 0.0) if not kids else sum(demand[k] for k in kids)
    if path != "/":
        total = min(total, shape.limit[path])
    return total


def deserved_gpus(
    shape: PlanShape,
    leaf_demand: dict[str, float],
    capacity: float,
    demand: dict[str, float] | None = None,
) -> dict:
    """Deserved GPUs of every plan given the GPU demand of the leaves (capped by limits);
    ``demand``: ``plan_demand``'s answer when the caller has it already."""
    if demand is None:
        demand = plan_demand(shape, leaf_demand)
    root = min(demand["/"], capacity)
    out = {"/": root}
    stack = ["/"]
    while stack:
        path = stack.pop()
        kids = shape.children.get(path, ())
        if not kids:
            continue
        for kid, amount in zip(kids, split(shape, kids, out[path], demand)):
            out[kid] = amount
        stack.extend(kids)
    return out


def split(
    shape: PlanShape, kids: list[str], amount: float, demand: dict[str, float]
) -> list[float]:
    """What a plan's ``amount`` gives each of its children ``kids`` (``deserved_gpus``'s step)."""
    wants = [demand[k] for k in kids]
    if sum(wants) <= amount:  # enough for all: water-filling gives each its demand
        return wants
    return water_fill(amount, wants, [shape.share[k] for k in kids])
