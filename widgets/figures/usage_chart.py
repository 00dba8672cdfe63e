"""The metering widget's chart and table: the usage API's answer normalised, requested vs used
GPUs and CPU cores over time as step lines, and the resource-hours per child."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from .common import first_present, is_number, number_or_zero, time_label

RESOURCES = ("gpu", "cpu")
UNIT = {"gpu": 1.0, "cpu": 1000.0}  # the API's cpu is millicores; charts show cores


def normalise_usage(answer: Mapping[str, Any]) -> dict:
    """The usage API's answer as ``{"t": [...], "requested": {"gpu": [...], "cpu": [...]},
    "used": {...}, "children": [{"name", "gpu_hours", "cpu_hours"}], "totals": {...}}``.

    Accepted series: a list of points ``{"t"|"time"|"at"|"start": s, "requested": {...},
    "used": {...}}`` or columns ``{"t"|"time": [...], "requested": {"gpu": [...]}, ...}``.
    Children: a list of ``{"path"|"name"|"user", "gpu_hours", "cpu_hours"}`` (or with the hours
    under ``totals``), or a mapping of name to such totals. CPU stays in millicores here.
    """
    series = answer.get("series") or {}
    out: dict[str, Any] = {
        "t": [],
        "requested": {r: [] for r in RESOURCES},
        "used": {r: [] for r in RESOURCES},
    }
    if isinstance(series, list):
        for point in series:
            if not isinstance(point, Mapping):
                continue
            t = first_present(point, ("t", "time", "at", "start"))
            if t is None:
                continue
            out["t"].append(t)
            for kind in ("requested", "used"):
                values = point.get(kind) or {}
                for r in RESOURCES:
                    out[kind][r].append(number_or_zero(values.get(r)))
    elif isinstance(series, Mapping):
        times = first_present(series, ("t", "time", "times", "at", "start")) or []
        out["t"] = list(times)
        for kind in ("requested", "used"):
            values = series.get(kind) or {}
            for r in RESOURCES:
                column = list(values.get(r) or [])
                column += [0.0] * (len(times) - len(column))
                out[kind][r] = [number_or_zero(v) for v in column[: len(times)]]
    out["changes"] = _change_points(answer.get("changes"))
    out["end"] = _range_end(answer)
    out["children"] = _children(answer.get("children"))
    totals = answer.get("totals") or {}
    out["totals"] = {
        "gpu_hours": number_or_zero(totals.get("gpu_hours")),
        "cpu_hours": number_or_zero(totals.get("cpu_hours")),
    }
    return out


def _change_points(changes: Any) -> dict | None:
    """The API's ``changes`` (the metering's step function: the amount from each time on) as
    ``{"t", "requested": {"gpu", "cpu"}, "used": {...}}``, or None when it sent none."""
    if not isinstance(changes, Mapping) or not isinstance(changes.get("t"), list):
        return None
    times = list(changes["t"])
    out: dict[str, Any] = {"t": times}
    for kind in ("requested", "used"):
        values = changes.get(kind) or {}
        out[kind] = {}
        for r in RESOURCES:
            column = list(values.get(r) or [])
            column += [0.0] * (len(times) - len(column))
            out[kind][r] = [number_or_zero(v) for v in column[: len(times)]]
    return out


def _range_end(answer: Mapping[str, Any]) -> float | None:
    """Where the last step ends: the range's end, but the figures stop at ``now``."""
    ends = [v for v in (answer.get("end"), answer.get("now")) if is_number(v)]
    return min(ends) if ends else None


def _children(children: Any) -> list[dict]:
    rows = []
    if isinstance(children, Mapping):
        children = [
            {"name": k, **(v if isinstance(v, Mapping) else {})} for k, v in children.items()
        ]
    for child in children or []:
        if not isinstance(child, Mapping):
            continue
        totals = child.get("totals") if isinstance(child.get("totals"), Mapping) else child
        name = first_present(child, ("path", "name", "user", "leaf")) or "?"
        rows.append(
            {
                "name": str(name),
                "gpu_hours": number_or_zero(totals.get("gpu_hours")),
                "cpu_hours": number_or_zero(totals.get("cpu_hours")),
            }
        )
    rows.sort(key=lambda r: (-r["gpu_hours"], r["name"]))
    return rows


def usage_figure(usage: Mapping[str, Any], title: str = "") -> dict:
    """Requested vs used GPU (top) and CPU cores (bottom) over time, as step lines: the
    metering's own step function (its change points, ``changes``) when the answer has it, so a
    2-GPU job draws at 2 GPUs for exactly its run whatever the range; else the per-step
    averages."""
    norm = usage if "requested" in usage and "t" in usage else normalise_usage(usage)
    steps = norm.get("changes") or norm
    data = []
    for axis, r in zip(("y", "y2"), RESOURCES):
        for kind, dash in (("requested", "dash"), ("used", "solid")):
            values = [v / UNIT[r] for v in steps[kind][r]]
            xs, ys = step_points(steps["t"], values, norm.get("end"))
            data.append(
                {
                    "type": "scatter",
                    "mode": "lines",
                    "line": {"shape": "hv", "dash": dash},
                    "name": f"{r.upper()} {kind}",
                    "x": [time_label(t) for t in xs],
                    "y": ys,
                    "xaxis": "x",
                    "yaxis": axis,
                }
            )
    layout = {
        "title": {"text": title or "requested vs used"},
        "height": 380,
        "margin": {"l": 55, "r": 20, "t": 40, "b": 40},
        "xaxis": {"type": "date", "anchor": "y2"},
        "yaxis": {"title": {"text": "GPUs"}, "domain": [0.55, 1.0], "rangemode": "tozero"},
        "yaxis2": {"title": {"text": "CPU cores"}, "domain": [0.0, 0.45], "rangemode": "tozero"},
        "legend": {"orientation": "h"},
    }
    return {"data": data, "layout": layout}


def step_points(
    times: Sequence[float], values: Sequence[float], end: float | None = None
) -> tuple[list[float], list[float]]:
    """The step function as its change points (drawn with ``line.shape`` "hv"): a run of equal
    steps is one point, and the last value is held to ``end`` (else to the last step's start)
    so the line spans the range. With steps as fine as the widget asks for, the metering's
    averages are its exact amounts, and the figure stays small."""
    xs: list[Any] = []
    ys: list[float] = []
    for t, v in zip(times, values):
        if not ys or v != ys[-1]:
            xs.append(t)
            ys.append(v)
    if not ys:
        return xs, ys
    last = end if is_number(end) and is_number(times[-1]) and end > times[-1] else times[-1]
    if last != xs[-1]:
        xs.append(last)
        ys.append(ys[-1])
    return xs, ys


def hours_table_html(usage: Mapping[str, Any]) -> str:
    """GPU-hours and CPU-hours per child, then the total."""
    norm = usage if "children" in usage and "t" in usage else normalise_usage(usage)
    rows = "".join(
        f"<tr><td>{html.escape(c['name'])}</td><td>{c['gpu_hours']:.3f}</td>"
        f"<td>{c['cpu_hours']:.3f}</td></tr>"
        for c in norm["children"]
    )
    totals = norm["totals"]
    return (
        "<table><thead><tr><th>child</th><th>GPU-hours</th><th>CPU-hours</th></tr></thead>"
        f"<tbody>{rows}<tr><td><b>total</b></td><td><b>{totals['gpu_hours']:.3f}</b></td>"
        f"<td><b>{totals['cpu_hours']:.3f}</b></td></tr></tbody></table>"
    )
