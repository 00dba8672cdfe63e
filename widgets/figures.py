"""Pure functions from API answers to plotly figure dicts and display texts.

No widgets, no network: the job monitor and the metering widget call these and assign the
results, and tests compare them with literal values. Figures are plain dicts
(``{"data": [...], "layout": {...}}``) that ``plotly.graph_objects.FigureWidget`` accepts.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

# Keys of a runtime.report() line that are bookkeeping, not metrics to plot (a script may report
# the totals it runs to, ``epochs=`` or ``total_steps=``, for the progress bar).
BOOKKEEPING = frozenset(
    {"step", "time", "rank", "epoch", "world_size", "progress", "epochs", "total_epochs",
     "total_steps"}
)  # fmt: skip
FINAL = frozenset({"FINISHED", "FAILED", "CANCELLED", "REJECTED"})
STATE_COLOURS = {
    "PENDING": "#b58900",
    "RUNNING": "#268bd2",
    "FINISHED": "#2e7d32",
    "FAILED": "#c62828",
    "REJECTED": "#c62828",
    "CANCELLED": "#6c757d",
}


# -- job monitor -------------------------------------------------------------------------------
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


def epochs_from_args(args: Sequence[str]) -> int | None:
    """``--epochs N`` (or ``--epochs=N``) among the script's arguments."""
    args = list(args)
    for i, arg in enumerate(args):
        value = None
        if arg == "--epochs" and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("--epochs="):
            value = arg.split("=", 1)[1]
        if value is not None and value.isdigit() and int(value) > 0:
            return int(value)
    return None


def progress_fraction(
    job: Mapping[str, Any], metrics: Sequence[Mapping[str, Any]], epochs: int | None
) -> float:
    """0..1: 1 when FINISHED; else the runtime's ``progress`` if reported, else the steps done
    of the ``total_steps`` reported, else epochs done of ``epochs`` (within an epoch by its
    steps once one epoch has shown how many it has). Below 1 until the job has finished."""
    if job.get("state") == "FINISHED":
        return 1.0
    for line in reversed(metrics):
        value = line.get("progress")
        if _is_number(value):
            return _below_one(float(value))
    step, total_steps = latest_step(metrics), _latest(metrics, ("total_steps",))
    if step is not None and total_steps:
        return _below_one(step / total_steps)
    done = epochs_done(metrics)
    if not epochs or done is None:
        return 0.0
    fraction = done / epochs
    per_epoch = steps_per_epoch(metrics)
    if per_epoch and step is not None:
        fraction = max(fraction, step / (per_epoch * epochs))
    return _below_one(fraction)


def progress_phase(job: Mapping[str, Any], metrics: Sequence[Mapping[str, Any]]) -> dict:
    """What the job is doing, for the progress bar: ``{"text", "fraction"}``.

    waiting (with the service's reason) -> starting workers (RUNNING, no metrics yet) -> first
    step -> epoch k of N (or step s [of M]) -> done. ``fraction`` is None while nothing says how
    far the job is (the bar then shows 0 and the text says why).
    """
    state = job.get("state")
    epochs = total_epochs(job, metrics)
    fraction = progress_fraction(job, metrics, epochs)
    known = bool(metrics) and (
        epochs is not None or _latest(metrics, ("total_steps", "progress")) is not None
    )
    if state in FINAL:
        return {"text": _ended_text(job), "fraction": fraction}
    if state != "RUNNING":  # a preempted job waits again with the progress it had
        reason = job.get("reason")
        text = f"waiting: {reason}" if reason else "waiting"
        return {"text": text, "fraction": fraction if known else None}
    if not metrics:
        workers = job.get("workers") or {}
        up, wanted = workers.get("running", 0), workers.get("min", 1)
        return {
            "text": f"starting workers ({up} of {wanted} up), waiting for the first step",
            "fraction": None,
        }
    parts = ["first step done"] if _first_step(metrics) else []
    parts.append(_where(metrics, epochs, latest_step(metrics)))
    return {"text": ", ".join(p for p in parts if p), "fraction": fraction if known else None}


def _where(metrics: Sequence[Mapping[str, Any]], epochs: int | None, step: int | None) -> str:
    """``epoch 2 of 4, step 120``, ``step 37 of 500`` or ``step 37``."""
    at_step = f"step {step}" if step is not None else ""
    total_steps = _latest(metrics, ("total_steps",))
    if total_steps and at_step:
        at_step += f" of {total_steps}"
    done = epochs_done(metrics)
    if done is None:
        return at_step
    if epochs and done >= epochs:  # the last epoch reported done: final evaluation, saving
        return f"all {epochs} epochs done, finishing"
    of = f" of {epochs}" if epochs else ""
    return ", ".join(p for p in (f"epoch {done + 1}{of}", at_step) if p)


def _ended_text(job: Mapping[str, Any]) -> str:
    state = job.get("state")
    if state == "FINISHED":
        return "done"
    text = str(state).lower()
    if job.get("exit_code") not in (None, 0):
        text += f" (exit code {job['exit_code']})"
    return text


def _first_step(metrics: Sequence[Mapping[str, Any]]) -> bool:
    steps = {line.get("step") for line in metrics if _is_number(line.get("step"))}
    return len(steps) <= 1


def total_epochs(job: Mapping[str, Any], metrics: Sequence[Mapping[str, Any]]) -> int | None:
    """The epochs the script runs: what it reported (``epochs=``/``total_epochs=``, which also
    covers its own default), else its ``--epochs`` argument."""
    reported = _latest(metrics, ("total_epochs", "epochs"))
    if reported and reported > 0:
        return int(reported)
    return epochs_from_args(script_args(job))


def epochs_done(metrics: Sequence[Mapping[str, Any]]) -> int | None:
    """Epochs done: the largest ``epoch`` reported (examples/pytorch_mnist reports the epoch
    it is in, counted from 0, with every step, and the epochs done after each)."""
    done = [int(line["epoch"]) for line in metrics if _is_number(line.get("epoch"))]
    return max(done) if done else None


def latest_step(metrics: Sequence[Mapping[str, Any]]) -> int | None:
    steps = [int(line["step"]) for line in metrics if _is_number(line.get("step"))]
    return max(steps) if steps else None


def steps_per_epoch(metrics: Sequence[Mapping[str, Any]]) -> float | None:
    """Steps of one epoch, from the first line of a later epoch (None during the first)."""
    for line in metrics:
        epoch, step = line.get("epoch"), line.get("step")
        if _is_number(epoch) and epoch >= 1 and _is_number(step) and step > 0:
            return step / epoch
    return None


def _latest(metrics: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> float | None:
    for line in reversed(metrics):
        for key in keys:
            if _is_number(line.get(key)):
                return line[key]
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _below_one(fraction: float) -> float:
    """Never 100% before the service says FINISHED (the last epoch may still be saving)."""
    return max(0.0, min(0.99, fraction))


def script_args(job: Mapping[str, Any]) -> list[str]:
    """The script's own arguments from the job's command (``python main.py args...``)."""
    command = list(job.get("command") or [])
    for i, part in enumerate(command):
        if str(part).endswith(".py"):
            return [str(a) for a in command[i + 1 :]]
    return []


def queue_position(job: Mapping[str, Any], jobs: Sequence[Mapping[str, Any]]) -> int | None:
    """1-based place of a PENDING job among the visible pending jobs of its plan, in the order
    the core considers them (higher priority first, then earlier submission, then id)."""
    if job.get("state") != "PENDING":
        return None
    pending = [j for j in jobs if j.get("state") == "PENDING" and j.get("plan") == job.get("plan")]
    if not any(j.get("id") == job.get("id") for j in pending):
        pending.append(dict(job))
    pending.sort(key=lambda j: (-(j.get("priority") or 0), j.get("submitted") or 0, j.get("id")))
    for i, j in enumerate(pending):
        if j.get("id") == job.get("id"):
            return i + 1
    return None  # pragma: no cover - the job was added above


def state_html(job: Mapping[str, Any], position: int | None = None) -> str:
    state = str(job.get("state", "?"))
    colour = STATE_COLOURS.get(state, "#333")
    parts = [f'<b style="color:{colour}">{html.escape(state)}</b>']
    if position is not None:
        parts.append(f"#{position} in the queue of {html.escape(str(job.get('plan', '')))}")
    reason = job.get("reason")
    if reason:
        parts.append(html.escape(str(reason)))
    if job.get("exit_code") not in (None, 0):
        parts.append(f"exit code {job['exit_code']}")
    if job.get("preemptions"):
        parts.append(f"preempted {job['preemptions']}x (resumes from its checkpoint)")
    return " &mdash; ".join(parts)


def cancel_button_state(job: Mapping[str, Any]) -> dict[str, Any]:
    """``disabled``, ``description`` and ``tooltip`` of the monitor's cancel button.

    Active only while the job is known to be PENDING or RUNNING without a cancel already asked:
    before the first read of the job it stays off, so a monitor opened on an ended job never
    offers a cancel the service would refuse.
    """
    state = job.get("state")
    if state in FINAL:
        return {
            "disabled": True,
            "description": f"Job {state.lower()}",
            "tooltip": f"the job is {state}: a job that has ended cannot be cancelled",
        }
    if job.get("cancel_requested"):
        return {
            "disabled": True,
            "description": "Cancelling",
            "tooltip": "cancel requested: the workers are being stopped",
        }
    if state not in ("PENDING", "RUNNING"):
        return {
            "disabled": True,
            "description": "Cancel job",
            "tooltip": "reading the job's state",
        }
    return {"disabled": False, "description": "Cancel job", "tooltip": f"cancel this {state} job"}


def workers_text(job: Mapping[str, Any]) -> str:
    """``2 of 2 workers running, 1 gpu 500m cpu 1Gi each; ranks on node-0, node-0``."""
    workers = job.get("workers") or {}
    lo, hi, running = workers.get("min", 1), workers.get("max", 1), workers.get("running", 0)
    wanted = f"{lo}" if lo == hi else f"{lo}-{hi}"
    res = job.get("resources") or {}
    each = ", ".join(
        p for p in (_gpu(res.get("gpu")), _cpu(res.get("cpu")), _mem(res.get("memory"))) if p
    )
    text = f"{running} of {wanted} workers running"
    if each:
        text += f" ({each} each)"
    placement = job.get("placement") or []
    if placement:
        text += "; ranks on " + ", ".join(_node(p) for p in placement)
    return text


def _node(place: Any) -> str:
    if isinstance(place, Mapping):
        node = place.get("node", "?")
        devices = place.get("devices")
        return f"{node}{devices}" if devices else str(node)
    return str(place)


def _gpu(v: Any) -> str:
    return f"{_num(v)} gpu" if isinstance(v, (int, float)) else ""


def _cpu(v: Any) -> str:
    if not isinstance(v, (int, float)):
        return ""
    return f"{_num(v / 1000)} cpu" if v % 100 == 0 else f"{_num(v)}m cpu"


def _mem(v: Any) -> str:
    if not isinstance(v, (int, float)) or v <= 0:
        return ""
    for suffix, unit in (("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if v >= unit:
            return f"{_num(v / unit)}{suffix} memory"
    return f"{_num(v)} bytes memory"


def _num(v: float) -> float:
    return int(v) if float(v).is_integer() else round(v, 2)


# -- metering ----------------------------------------------------------------------------------
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
            t = _first(point, ("t", "time", "at", "start"))
            if t is None:
                continue
            out["t"].append(t)
            for kind in ("requested", "used"):
                values = point.get(kind) or {}
                for r in RESOURCES:
                    out[kind][r].append(_number(values.get(r)))
    elif isinstance(series, Mapping):
        times = _first(series, ("t", "time", "times", "at", "start")) or []
        out["t"] = list(times)
        for kind in ("requested", "used"):
            values = series.get(kind) or {}
            for r in RESOURCES:
                column = list(values.get(r) or [])
                column += [0.0] * (len(times) - len(column))
                out[kind][r] = [_number(v) for v in column[: len(times)]]
    out["changes"] = _change_points(answer.get("changes"))
    out["end"] = _range_end(answer)
    out["children"] = _children(answer.get("children"))
    totals = answer.get("totals") or {}
    out["totals"] = {
        "gpu_hours": _number(totals.get("gpu_hours")),
        "cpu_hours": _number(totals.get("cpu_hours")),
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
            out[kind][r] = [_number(v) for v in column[: len(times)]]
    return out


def _range_end(answer: Mapping[str, Any]) -> float | None:
    """Where the last step ends: the range's end, but the figures stop at ``now``."""
    ends = [v for v in (answer.get("end"), answer.get("now")) if _is_number(v)]
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
        name = _first(child, ("path", "name", "user", "leaf")) or "?"
        rows.append(
            {
                "name": str(name),
                "gpu_hours": _number(totals.get("gpu_hours")),
                "cpu_hours": _number(totals.get("cpu_hours")),
            }
        )
    rows.sort(key=lambda r: (-r["gpu_hours"], r["name"]))
    return rows


def _first(mapping: Mapping[str, Any], keys: Sequence[str]) -> Any:
    for key in keys:
        if mapping.get(key) is not None:
            return mapping[key]
    return None


def _number(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return 0.0
    return float(v)


def _when(t: Any) -> str:
    if isinstance(t, (int, float)) and not isinstance(t, bool):
        return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    return str(t)


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
                    "x": [_when(t) for t in xs],
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
    last = end if _is_number(end) and _is_number(times[-1]) and end > times[-1] else times[-1]
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


RECENT_DAYS = 7  # jobs submitted within this count as recent for the usage widget's defaults
RECENT_JOBS = 5


def recent_jobs(jobs: Sequence[Mapping[str, Any]], now: float) -> list[Mapping[str, Any]]:
    """The latest few jobs submitted in the last week, newest first."""
    since = now - RECENT_DAYS * 86400
    mine = [j for j in jobs if _is_number(j.get("submitted")) and j["submitted"] >= since]
    mine.sort(key=lambda j: j["submitted"], reverse=True)
    return mine[:RECENT_JOBS]


def common_plan(plans: Iterable[str]) -> str | None:
    """The deepest plan holding every one of ``plans`` (``/a/x``, ``/a/y`` -> ``/a``)."""
    parts = [[p for p in str(plan).split("/") if p] for plan in plans]
    if not parts:
        return None
    shared: list[str] = []
    for names in zip(*parts):
        if any(n != names[0] for n in names):
            break
        shared.append(names[0])
    return "/" + "/".join(shared)


def recent_window(jobs: Sequence[Mapping[str, Any]], now: float) -> tuple[float, float] | None:
    """A range that shows the recent jobs' runs whole: from a little before the first of them
    started (or was submitted) to now, at least 10 minutes so a short run is not a wall."""
    starts = [
        j.get("started") if _is_number(j.get("started")) else j.get("submitted") for j in jobs
    ]
    starts = [t for t in starts if _is_number(t)]
    if not starts:
        return None
    span = max(600.0, (now - min(starts)) * 1.1)
    return now - span, now


def fine_step(span: float, points: int = 3600) -> float:
    """The finest whole-second step giving at most ``points`` steps: at 1 s (an hour) the
    averages per step are the metering's exact amounts, but for a second at a change."""
    return float(max(1, math.ceil(span / points)))


def plan_options(tree: Mapping[str, Any]) -> list[str]:
    """Plan paths from ``GET /plans`` for a picker (user leaves included, sorted)."""
    return sorted(p["path"] for p in tree.get("plans", []) if isinstance(p, Mapping))
