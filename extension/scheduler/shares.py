"""Sharing arithmetic (docs/scheduling.md "Deserved share"): water-filling and dominant ratios."""

from __future__ import annotations

from collections.abc import Sequence

INF = float("inf")


def water_fill(amount: float, caps: Sequence[float], weights: Sequence[float]) -> list[float]:
    """Hand ``amount`` to children by weight, none above its cap; what a capped child leaves is
    handed round again. Children with cap 0 (no demand) get nothing and take no weight.

    Children are settled in increasing cap/weight: once one's cap is above its fair part, every
    later one's is too, so all the rest get their fair part of what remains.
    """
    if sum(caps) <= amount:  # enough for every cap: nothing to share out (the common case
        return [float(c) for c in caps]  # below the contended levels of the tree)
    out = [0.0] * len(caps)
    order = sorted(
        (i for i in range(len(caps)) if caps[i] > 0), key=lambda i: (caps[i] / weights[i], i)
    )
    remaining = float(amount)
    weight = sum(weights[i] for i in order)
    for i in order:
        fair = remaining * weights[i] / weight
        give = caps[i] if caps[i] <= fair else fair
        out[i] = give
        remaining -= give
        weight -= weights[i]
    return out


def dominant_ratio(allocated: Sequence[float], deserved: Sequence[float]) -> float:
    """max over resources of allocated/deserved; holding what one does not deserve is infinite.
    The three resources written out: every plan's ratio is asked for every cycle."""
    a0, a1, a2 = allocated
    d0, d1, d2 = deserved
    worst = 0.0
    if a0 > 0:
        worst = a0 / d0 if d0 > 0 else INF
    if a1 > 0:
        q = a1 / d1 if d1 > 0 else INF
        if q > worst:
            worst = q
    if a2 > 0:
        q = a2 / d2 if d2 > 0 else INF
        if q > worst:
            worst = q
    return worst
