"""Usage queries over the ledger: series and totals per child of a plan, JSON and CSV.

``usage(ledger, plan, start, end, step, now, user=None)``: for each child of ``plan`` (or, with
``user``, for each of that user's leaves under ``plan``) the average requested and used amount
in every step, and the totals over the range in resource-hours; for the plan (or the user) also
``changes``, the step function itself as its change points. Figures stop at ``now``: a step
that reaches past it counts only up to ``now`` (nothing is extrapolated).
"""

from __future__ import annotations

import csv
import io
import math
from bisect import bisect_left, bisect_right
from datetime import datetime, timezone

from .accounting import KINDS, RESOURCES, ROOT, Ledger, hours, ms
from .series import ZERO, add, sub

API_UNIT = (1000, 1, 1)  # internal -> gpu devices, cpu millicores, memory bytes


def _iso(t_ms: int) -> str:
    return datetime.fromtimestamp(t_ms / 1000, timezone.utc).isoformat().replace("+00:00", "Z")


def _bounds(start: int, end: int, step: int) -> list[int]:
    n = math.ceil((end - start) / step)
    return [min(start + i * step, end) for i in range(n + 1)]


def _clamp(bounds: list[int], now: int) -> list[int]:
    return [min(b, now) for b in bounds]


def _row(ledger: Ledger, paths: list[str], bounds: list[int], clamped: list[int]) -> dict:
    """Integrals at every bound, summed over ``paths`` (one path: that node's own series)."""
    out = {}
    for kind in KINDS:
        acc = ledger.integrals(paths[0], kind, clamped) if paths else [ZERO] * len(bounds)
        for path in paths[1:]:
            acc = [add(a, b) for a, b in zip(acc, ledger.integrals(path, kind, clamped))]
        out[kind] = acc
    return out


def _series(integrals: dict, bounds: list[int]) -> dict:
    """Per step: the average amount over the step's full length, in the API's units (gpu
    devices, cpu millicores, memory bytes, as everywhere in the service's API)."""
    spans = [b - a for a, b in zip(bounds, bounds[1:])]
    out: dict = {}
    for kind in KINDS:
        cum = integrals[kind]
        per: dict[str, list[float]] = {}
        for r, (name, unit) in enumerate(zip(RESOURCES, API_UNIT)):
            col = [c[r] for c in cum]
            # int / int is correctly rounded: exact figures give the nearest float
            per[name] = [
                float((hi - lo) / (unit * span)) if span else 0.0
                for lo, hi, span in zip(col, col[1:], spans)
            ]
        out[kind] = per
    return out


MAX_CHANGES = 5000  # more change points than a chart's pixels: "changes" is null


def _changes(ledger: Ledger, paths: list[str], t0: int, t1: int) -> dict | None:
    """The step function itself over ``[t0, t1)``, summed over ``paths``: the amount from
    each time on, at ``t0`` and at every change before ``t1`` (exact from ``exact_from``;
    before it, one average per downsampled bucket), in the API's units. None when there are
    more than MAX_CHANGES (counted first, by bisection: a busy plan costs nothing)."""
    nodes = [ledger.nodes[p] for p in paths if p in ledger.nodes]
    spans = []
    for series in (n.series(kind) for n in nodes for kind in KINDS):
        olo, ohi = bisect_right(series.otimes, t0), bisect_left(series.otimes, t1)
        spans.append((series, series.count_between(t0, t1), olo, ohi))
    if sum(n + ohi - olo for _, n, olo, ohi in spans) > MAX_CHANGES:
        return None
    moments = {t0}
    for series, _, olo, ohi in spans:
        moments.update(series.times_between(t0, t1))
        moments.update(series.otimes[olo:ohi])
    order = sorted(moments)
    columns = {}
    for kind in KINDS:
        parts = [node.series(kind).values_at(order) for node in nodes] or [[ZERO] * len(order)]
        columns[kind] = parts[0] if len(parts) == 1 else [_sum(v) for v in zip(*parts)]
    req, used = columns["requested"], columns["used"]
    keep = [0, *(i for i in range(1, len(order)) if req[i] != req[i - 1] or used[i] != used[i - 1])]
    out: dict = {"t": [order[i] / 1000 for i in keep]}
    for kind in KINDS:
        col = [columns[kind][i] for i in keep]
        out[kind] = {
            name: [v[r] / unit for v in col]
            for r, (name, unit) in enumerate(zip(RESOURCES, API_UNIT))
        }
    return out


def _sum(values: tuple) -> tuple:
    total: tuple = ZERO
    for v in values:
        total = add(total, v)
    return total


def _totals(integrals: dict) -> dict:
    """Resource-hours over the range; the flat ``gpu_hours``... are the used ones (what is
    charged), ``requested`` and ``used`` carry both."""
    both = {kind: hours(sub(integrals[kind][-1], integrals[kind][0])) for kind in KINDS}
    return {**both["used"], **both}


def usage(
    ledger: Ledger,
    plan: str,
    start: float,
    end: float,
    step: float,
    now: float,
    user: str | None = None,
) -> dict:
    """Series and totals per child of ``plan`` (or per leaf of ``user`` under ``plan``)."""
    t0, t1, dt, t_now = ms(start), ms(end), ms(step), ms(now)
    bounds = _bounds(t0, t1, dt)
    clamped = _clamp(bounds, t_now)
    if user is None:
        # a plan without children (a user leaf) is its own one row
        members = [[c] for c in ledger.children(plan)] or ([[plan]] if plan != ROOT else [])
        total_paths = [plan]
    else:
        leaves = ledger.leaves_of(plan, user)
        members = [[leaf] for leaf in leaves]
        total_paths = leaves
    children = [_child(ledger, paths, bounds, clamped) for paths in members]
    if user is None:
        total_integrals = _row(ledger, total_paths, bounds, clamped)
    else:  # exactly the sum of the rows shown
        total_integrals = _summed([c["_integrals"] for c in children], len(bounds))
    for child in children:
        del child["_integrals"]
    total_series = _series(total_integrals, bounds)
    return {
        "plan": plan,
        "user": user,
        "start": t0 / 1000,
        "end": t1 / 1000,
        "step": dt / 1000,
        "now": t_now / 1000,
        "exact_from": ledger.horizon / 1000,
        "kept_from": ledger.kept_from / 1000,
        "units": {
            "series": {"gpu": "devices", "cpu": "millicores", "memory": "bytes"},
            "totals": "gpu_hours: device-hours, cpu_hours: core-hours, memory_gib_hours",
        },
        # the plan itself (with user: the sum of that user's leaves shown below)
        "series": {"t": [b / 1000 for b in bounds[:-1]], **total_series},
        # the same as its change points, held until min(end, now): what a chart draws
        "changes": _changes(ledger, total_paths, t0, min(t1, t_now)) if t0 < t_now else None,
        "totals": _totals(total_integrals),
        "children": children,
    }


def _child(ledger: Ledger, paths: list[str], bounds: list[int], clamped: list) -> dict:
    """One row of the answer (its integrals kept aside for the user's total)."""
    integrals = _row(ledger, paths, bounds, clamped)
    return {
        "path": paths[0],
        "user_leaf": paths[0] in ledger.owners,
        "series": _series(integrals, bounds),
        "totals": _totals(integrals),
        "_integrals": integrals,
    }


def _summed(rows: list[dict], steps: int) -> dict:
    """The integrals of several rows added up, step by step."""
    return {
        kind: [
            (
                sum((r[kind][i][0] for r in rows), 0),
                sum((r[kind][i][1] for r in rows), 0),
                sum((r[kind][i][2] for r in rows), 0),
            )
            for i in range(steps)
        ]
        for kind in KINDS
    }


CSV_COLUMNS = [
    "plan",
    "start",
    "end",
    *[
        f"{kind}_{name}"
        for name in ("gpu_hours", "cpu_hours", "memory_gib_hours")
        for kind in KINDS
    ],
]


def usage_csv(
    ledger: Ledger,
    plan: str,
    start: float,
    end: float,
    step: float,
    now: float,
    user: str | None = None,
) -> str:
    """One row per child and step with resource-hours in that step (rows add up to the
    totals), for chargeback; the same choice of rows as ``usage``."""
    t0, t1, dt, t_now = ms(start), ms(end), ms(step), ms(now)
    bounds = _bounds(t0, t1, dt)
    clamped = _clamp(bounds, t_now)
    if user is None:
        paths = ledger.children(plan) or ([plan] if plan != ROOT else [])
    else:
        paths = ledger.leaves_of(plan, user)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for path in paths:
        integrals = {kind: ledger.integrals(path, kind, clamped) for kind in KINDS}
        for i in range(len(bounds) - 1):
            per = {kind: hours(sub(integrals[kind][i + 1], integrals[kind][i])) for kind in KINDS}
            writer.writerow(
                [
                    path,
                    _iso(bounds[i]),
                    _iso(bounds[i + 1]),
                    *[
                        repr(per[kind][name])
                        for name in ("gpu_hours", "cpu_hours", "memory_gib_hours")
                        for kind in KINDS
                    ],
                ]
            )
    return buf.getvalue()
