"""The training chart: a job's reported metrics as a plotly figure, losses on the left axis and
accuracies on their own axis on the right."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# Keys of a runtime.report() line that are bookkeeping, not metrics to plot (a script may report
# the totals it runs to, ``epochs=`` or ``total_steps=``, for the progress bar).
BOOKKEEPING = frozenset(
    {"step", "time", "rank", "epoch", "world_size", "progress", "epochs", "total_epochs",
     "total_steps"}
)  # fmt: skip


def metric_names(metrics: Iterable[Mapping[str, Any]]) -> list[str]:
    """Numeric metrics in first-seen order, losses first."""
    seen: dict[str, None] = {}
    for line in metrics:
        for key, value in line.items():
            if key in BOOKKEEPING or isinstance(value, bool):
                continue
            if isinstance(value, (int, float)):
                seen.setdefault(key, None)
    names = list(seen)
    return sorted(names, key=lambda n: (0 if "loss" in n else 1, names.index(n)))


def metric_series(
    metrics: Sequence[Mapping[str, Any]], name: str
) -> tuple[list[float], list[float]]:
    """(steps, values) of one metric; lines without it or with a null (diverged) value skipped.

    Lines without a step are numbered by their position so they still plot in order.
    """
    xs: list[float] = []
    ys: list[float] = []
    for i, line in enumerate(metrics):
        value = line.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if not math.isfinite(value):
            continue
        step = line.get("step")
        xs.append(step if isinstance(step, (int, float)) and not isinstance(step, bool) else i)
        ys.append(value)
    return xs, ys


def metrics_figure(metrics: Sequence[Mapping[str, Any]], title: str = "") -> dict:
    """Loss-like metrics on the left axis; accuracy-like ones (named ``*acc*``: a fraction or
    a percentage) on their own axis on the right, whose range fits their values
    (``accuracy_range``); the loss axis ranges on its own."""
    data = []
    accuracy: list[float] = []
    for name in metric_names(metrics):
        xs, ys = metric_series(metrics, name)
        on_right = "acc" in name.lower()
        if on_right:
            accuracy += ys
        data.append(
            {
                "type": "scatter",
                "mode": "lines+markers" if len(xs) < 30 else "lines",
                "name": name,
                "x": xs,
                "y": ys,
                "yaxis": "y2" if on_right else "y",
            }
        )
    layout: dict[str, Any] = {
        "title": {"text": title or "training metrics"},
        "height": 280,
        "margin": {"l": 50, "r": 50, "t": 40, "b": 40},
        "xaxis": {"title": {"text": "step"}},
        "yaxis": {"title": {"text": "loss"}, "side": "left"},
        "legend": {"orientation": "h"},
    }
    if any("acc" in t["name"].lower() for t in data):
        percent = any(v > 1 for v in accuracy)
        layout["yaxis2"] = {
            "title": {"text": "accuracy (%)" if percent else "accuracy"},
            "overlaying": "y",
            "side": "right",
            "tickmode": "auto",  # its own ticks, not the loss axis' positions
            "showgrid": False,
            "range": accuracy_range(accuracy),
        }
    return {"data": data, "layout": layout}


def accuracy_range(values: Sequence[float]) -> list[float]:
    """The accuracy axis' range: the values' own span, padded by a tenth of it (at least 2% of
    the scale), kept inside the scale they are on (a fraction, 0..1, when none is above 1; a
    percentage, 0..100, when none is above 100) unless a value sits on its edge. No values:
    the whole fraction scale."""
    finite = [float(v) for v in values if math.isfinite(v)]
    if not finite:
        return [0.0, 1.0]
    lo, hi = min(finite), max(finite)
    scale = 1.0 if lo >= 0 and hi <= 1 else 100.0 if lo >= 0 and hi <= 100 else None
    pad = max((hi - lo) / 10, 0.02 * (scale or max(abs(lo), abs(hi), 1.0)))
    bottom, top = lo - pad, hi + pad
    if scale is not None:
        bottom = max(bottom, 0.0) if lo > 0 else bottom
        top = min(top, scale) if hi < scale else top
    return [round(bottom, 6), round(top, 6)]
