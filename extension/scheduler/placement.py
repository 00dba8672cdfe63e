"""Placing a gang's workers on nodes: each worker whole on one node (docs/scheduling.md
"Admission 2").

``free`` is a list of mutable ``[gpu, cpu, memory]`` rows, one per node, in the order of
``names``. Functions here never change ``free``; the caller commits a placement only when the
whole gang fits (the tentative-then-commit pattern of Volcano's statement).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

INF = float("inf")


def fit_count(row: Sequence[float], worker: Sequence[float]) -> float:
    """How many workers of this size fit in ``row`` (infinite for a worker that asks nothing)."""
    w0, w1, w2 = worker
    return _fit(row, w0, w1, w2)


def _fit(row: Sequence[float], w0: float, w1: float, w2: float) -> float:
    """fit_count with the worker's three amounts unpacked (what the per-node loops call)."""
    n = INF
    if w0 > 0:
        n = row[0] // w0
    if w1 > 0:
        k = row[1] // w1
        if k < n:
            n = k
    if w2 > 0:
        k = row[2] // w2
        if k < n:
            n = k
    return n


def place_gang(
    free: Sequence[Sequence[float]],
    names: Sequence[str],
    worker: Sequence[float],
    count: int,
    prefer: frozenset[int] = frozenset(),
) -> list[int] | None:
    """Node indexes for ``count`` workers, or None when the gang does not fit whole.

    Policy (ties broken by node name, so the result is deterministic):
    1. nodes in ``prefer`` (where the job already runs) first, tightest first;
    2. if one node can take the whole rest of the gang, the tightest such node (best fit keeps
       big holes open for big gangs);
    3. otherwise the nodes that take the most workers first (fewest nodes per gang).
    """
    placed: list[int] = []
    fits = []
    w0, w1, w2 = worker
    for i, row in enumerate(free):
        if row[0] < w0 or row[1] < w1 or row[2] < w2:
            continue  # not even one worker: the common case on a busy cluster, kept cheap
        fits.append((_fit(row, w0, w1, w2), i))
    if sum(min(n, count) for n, _ in fits) < count:
        return None
    if prefer:
        for n, i in sorted((f for f in fits if f[1] in prefer), key=lambda f: (f[0], names[f[1]])):
            take = min(n, count - len(placed))
            placed.extend([i] * int(take))
            if len(placed) == count:
                return placed
        fits = [f for f in fits if f[1] not in prefer]
    rest = count - len(placed)
    whole = [f for f in fits if f[0] >= rest]
    if whole:
        _, i = min(whole, key=lambda f: (f[0], names[f[1]]))
        return placed + [i] * rest
    for n, i in sorted(fits, key=lambda f: (-f[0], names[f[1]])):
        take = min(n, count - len(placed))
        placed.extend([i] * int(take))
        if len(placed) == count:
            return placed
    return None  # pragma: no cover - the sum check above makes this unreachable


def gang_room(free: Sequence[Sequence[float]], worker: Sequence[float], count: int) -> float:
    """How many of a gang's ``count`` workers fit at once (place_gang succeeds iff >= count)."""
    w0, w1, w2 = worker
    room = 0.0
    for row in free:
        if row[0] >= w0 and row[1] >= w1 and row[2] >= w2:
            k = _fit(row, w0, w1, w2)
            room += k if k < count else count
    return room


def max_workers_on(capacity: Sequence[Sequence[float]], worker: Sequence[float]) -> float:
    """How many workers of this size the nodes could hold if they were empty."""
    return sum(fit_count(row, worker) for row in capacity)


class FitIndex:
    """The nodes that hold at least one worker of one shape, sorted by (how many they hold,
    name), kept in step with ``free`` by ``update(i)`` after node ``i`` changed.

    ``place(count)`` then answers exactly what ``place_gang`` does for a gang that prefers no
    node, without a pass over every node: the tightest node that takes the gang whole is one
    bisection away (every one-worker job, most small gangs), and a gang spread over nodes
    walks them from the roomiest down only as far as it needs. A stream of admissions into a
    large idle cluster then costs O(log nodes) each instead of O(nodes).
    """

    def __init__(
        self, free: Sequence[Sequence[float]], names: Sequence[str], worker: Sequence[float]
    ) -> None:
        self.free, self.names = free, names
        self.w0, self.w1, self.w2 = worker
        self.fit: dict[int, float] = {}
        order = []
        for i, row in enumerate(free):
            k = self._fit_of(row)
            if k >= 1:
                self.fit[i] = k
                order.append((k, names[i], i))
        order.sort()
        self.order = order

    def copy(self) -> FitIndex:
        """An index of the same rows, kept in step apart from this one (C-level copies)."""
        twin = FitIndex.__new__(FitIndex)
        twin.free, twin.names = self.free, self.names
        twin.w0, twin.w1, twin.w2 = self.w0, self.w1, self.w2
        twin.fit, twin.order = dict(self.fit), self.order[:]
        return twin

    def _fit_of(self, row: Sequence[float]) -> float:
        w0, w1, w2 = self.w0, self.w1, self.w2
        if row[0] < w0 or row[1] < w1 or row[2] < w2:
            return 0
        return _fit(row, w0, w1, w2)

    def update(self, i: int) -> None:
        old = self.fit.get(i)
        new = self._fit_of(self.free[i])
        if old == new:
            return
        name = self.names[i]
        if old is not None:
            del self.order[bisect.bisect_left(self.order, (old, name, i))]
            del self.fit[i]
        if new >= 1:
            bisect.insort(self.order, (new, name, i))
            self.fit[i] = new

    def tightest(self, count: int) -> int | None:
        """The node ``place_gang`` would give a whole ``count``-worker gang, or None when no
        node can take it whole (then ``place_gang`` decides, across nodes)."""
        j = bisect.bisect_left(self.order, (count,))  # (count,) sorts before (count, name, i)
        return self.order[j][2] if j < len(self.order) else None

    def spread(self, count: int) -> list[int] | None:
        """``place_gang``'s answer for a gang no node takes whole: the nodes that hold the most
        workers first (name order among equals), or None when they cannot hold all of it."""
        order, placed = self.order, []
        end = len(order)
        while end:
            most = order[end - 1][0]
            start = bisect.bisect_left(order, (most,), 0, end)  # the nodes holding ``most``
            for fit, _, i in order[start:end]:
                take = min(fit, count - len(placed))
                placed.extend([i] * int(take))
                if len(placed) == count:
                    return placed
            end = start
        return None

    def place(self, count: int) -> list[int] | None:
        """What ``place_gang(free, names, worker, count)`` gives, from the index."""
        node = self.tightest(count)
        return [node] * count if node is not None else self.spread(count)
