"""Usage queries over the ledger: series and totals per child of a plan, JSON and CSV.

``usage(ledger, plan, start, end, step, now, user=None)``: for each child of ``plan`` (or, with
``user``, for each of that user's leaves under ``plan``) the average requested and used amount
in every step, and the totals over the range in resource-hours. Figures stop at ``now``: a step
that reaches past it counts only up to ``now`` (nothing is extrapolated).
"""

from __future__ import annotations

import csv
import io
import math
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
    children = []
    for paths in members:
        integrals = _row(ledger, paths, bounds, clamped)
        children.append(
            {
                "path": paths[0],
                "user_leaf": paths[0] in ledger.owners,
                "series": _series(integrals, bounds),
                "totals": _totals(integrals),
                "_integrals": integrals,
            }
        )
    if user is None:
        total_integrals = _row(ledger, total_paths, bounds, clamped)
    else:  # exactly the sum of the rows shown
        total_integrals = {
            kind: [
                (
                    sum((c["_integrals"][kind][i][0] for c in children), 0),
                    sum((c["_integrals"][kind][i][1] for c in children), 0),
                    sum((c["_integrals"][kind][i][2] for c in children), 0),
                )
                for i in range(len(bounds))
            ]
            for kind in KINDS
        }
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
        "totals": _totals(total_integrals),
        "children": children,
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
