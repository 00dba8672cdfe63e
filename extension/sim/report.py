"""The ``--report`` page: one self-contained HTML file that works offline.

plotly.js is inlined from the installed plotly package (``plotly.offline.get_plotlyjs``), never
fetched from a CDN; figures are built by pure functions from the replay's results, so tests can
check their data. Long timelines are resampled to at most ``MAX_POINTS`` time buckets
(time-weighted means), so a month of trace stays a page a browser opens at once.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import plotly.graph_objects as go

from .files import atomic_write
from .summary import ReplaySummary

MAX_POINTS = 1500
CDF_POINTS = 600
HOUR = 3600.0


def resample(
    timeline: Sequence[tuple], end: float, points: int = MAX_POINTS
) -> tuple[list[float], list[list[float]], list[float]]:
    """Step series (t, per-team tuple, demand) -> bucket starts, per-team means, demand means.

    With no more entries than ``points`` the steps are returned as they are (each value holds
    from its time to the next); otherwise the span is cut into ``points`` equal buckets and
    each bucket gets the time-weighted mean of the steps inside it.
    """
    if not timeline:
        return [], [], []
    teams = len(timeline[0][1])
    if len(timeline) <= points:
        ts = [t for t, _, _ in timeline]
        per = [[row[i] for _, row, _ in timeline] for i in range(teams)]
        return ts, per, [d for _, _, d in timeline]
    start = timeline[0][0]
    span = max(end - start, 1e-9)
    width = span / points
    sums = [[0.0] * points for _ in range(teams)]
    dsum = [0.0] * points
    for n, (t, row, demand) in enumerate(timeline):
        t_next = timeline[n + 1][0] if n + 1 < len(timeline) else end
        a = t
        while a < t_next:
            k = min(int((a - start) / width), points - 1)
            b_end = start + (k + 1) * width if k < points - 1 else t_next
            piece = min(t_next, b_end) - a
            if piece <= 0:  # float edge at a bucket boundary: the rest goes to the next one
                k = min(k + 1, points - 1)
                b_end = start + (k + 1) * width if k < points - 1 else t_next
                piece = min(t_next, b_end) - a
                if piece <= 0:
                    piece = t_next - a
            for i in range(teams):
                sums[i][k] += row[i] * piece
            dsum[k] += demand * piece
            a += piece
    ts = [start + k * width for k in range(points)]
    per = [[v / width for v in col] for col in sums]
    return ts, per, [v / width for v in dsum]


def allocation_figure(name: str, summary: ReplaySummary) -> go.Figure:
    """GPUs held per team over time, stacked, against the capacity and the demand."""
    rec = summary.replay.recorder
    ts, per, demand = resample(rec.timeline, rec.last_t)
    hours = [t / HOUR for t in ts]
    fig = go.Figure()
    for team, values in zip(rec.teams, per):
        fig.add_trace(
            go.Scatter(
                x=hours,
                y=values,
                name=team,
                mode="lines",
                stackgroup="held",
                line={"width": 0, "shape": "hv"},
            )
        )
    capacity = rec.capacity
    if hours:
        fig.add_trace(
            go.Scatter(
                x=[hours[0], hours[-1]],
                y=[capacity, capacity],
                name="capacity",
                mode="lines",
                line={"color": "black", "dash": "dash"},
            )
        )
        fig.add_trace(
            go.Scatter(
                x=hours,
                y=[min(d, capacity * 1.5) for d in demand],
                name="demand (capped at 1.5 x capacity)",
                mode="lines",
                line={"color": "firebrick", "width": 1, "shape": "hv"},
                visible="legendonly",
            )
        )
    fig.update_layout(
        title=f"{name}: GPUs held per team",
        xaxis_title="simulated hours",
        yaxis_title="GPUs",
        template="plotly_white",
        height=420,
        legend={"orientation": "v"},
    )
    return fig


def cdf_points(values: Sequence[float], points: int = CDF_POINTS) -> tuple[list, list]:
    """Empirical CDF (x sorted, y = share of values <= x), thinned to about ``points``."""
    data = sorted(values)
    n = len(data)
    if not n:
        return [], []
    step = max(1, n // points)
    idx = list(range(0, n, step))
    if idx[-1] != n - 1:
        idx.append(n - 1)
    return [data[i] for i in idx], [(i + 1) / n for i in idx]


def delay_cdf_figure(summaries: Mapping[str, ReplaySummary], team: str = "*") -> go.Figure:
    """CDF of queueing delay per policy (all jobs, or one team). Delays below one second sit at
    one second so that the log axis can show them."""
    fig = go.Figure()
    for name, summary in summaries.items():
        delays = summary.queueing_delays().get(team, [])
        xs, ys = cdf_points([max(d, 1.0) / 60.0 for d in delays])
        fig.add_trace(go.Scatter(x=xs, y=ys, name=name, mode="lines", line={"shape": "hv"}))
    label = "all jobs" if team == "*" else f"team {team}"
    fig.update_layout(
        title=f"Queueing delay, {label} (CDF; under 1 s shown at 1 s)",
        xaxis={"title": "minutes from submission to start", "type": "log"},
        yaxis={"title": "share of jobs started", "range": [0, 1.02]},
        template="plotly_white",
        height=380,
    )
    return fig


def team_delay_figure(name: str, summary: ReplaySummary) -> go.Figure:
    fig = go.Figure()
    delays = summary.queueing_delays()
    for team in sorted(k for k in delays if k != "*"):
        xs, ys = cdf_points([max(d, 1.0) / 60.0 for d in delays[team]])
        fig.add_trace(go.Scatter(x=xs, y=ys, name=team, mode="lines", line={"shape": "hv"}))
    fig.update_layout(
        title=f"{name}: queueing delay per team (CDF)",
        xaxis={"title": "minutes from submission to start", "type": "log"},
        yaxis={"title": "share of the team's jobs started", "range": [0, 1.02]},
        template="plotly_white",
        height=380,
    )
    return fig


def _table(result: dict) -> str:
    names = list(result["policies"])
    rows = [
        ("jobs finished", lambda p: p["jobs"]["finished"]),
        ("jobs unfinished", lambda p: p["jobs"]["unfinished"]),
        ("GPU held while contended", lambda p: p["gpu_allocation"]["held_while_contended"]),
        ("GPU busy while contended", lambda p: p["gpu_allocation"]["busy_while_contended"]),
        ("contended hours", lambda p: round(p["gpu_allocation"]["contended_s"] / HOUR, 2)),
        ("queueing delay p50 / p90 / p99 (s)", lambda p: _triple(p["queueing_delay_s"])),
        ("JCT p50 / p90 / p99 (s)", lambda p: _triple(p["jct_s"])),
        ("team share deviation, contended (GPUs)", lambda p: _dev(p, "1")),
        ("user-leaf share deviation, contended (GPUs)", lambda p: _dev(p, "2")),
        ("share deviation, plans with demand (GPUs)", lambda p: _deviation(p)),
        ("GPU utilization (held over capacity)", lambda p: p["gpu_utilization"]),
        ("preemptions", lambda p: p["preemptions"]),
        ("jobs preempted", lambda p: p["churn"]["jobs_preempted"]),
        ("steady-state preemptions", lambda p: p["churn"]["steady_state_preemptions"]),
        ("preempted / lost GPU-hours", lambda p: _churn_hours(p["churn"])),
        ("broken gangs", lambda p: p["broken_gangs"]),
        ("deadlocked GPU-hours", lambda p: p["deadlocked_gpu_hours"]),
        ("simulation wall time (s)", lambda p: p["sim_wall_s"]),
    ]
    head = "".join(f"<th>{html.escape(n)}</th>" for n in names)
    body = []
    for label, get in rows:
        cells = "".join(
            f"<td>{html.escape(str(_safe(get, result['policies'][n])))}</td>" for n in names
        )
        body.append(f"<tr><th>{html.escape(label)}</th>{cells}</tr>")
    return f"<table><tr><th></th>{head}</tr>{''.join(body)}</table>"


def _safe(get, policy: dict):
    try:
        value = get(policy)
    except (KeyError, TypeError):
        return "-"
    return "-" if value is None else value


def _deviation(p: dict) -> object:
    return p["share_deviation"]["mean_abs_dev_gpu"]


def _churn_hours(churn: dict) -> str:
    held, lost = churn["preempted_gpu_s"] / HOUR, churn["lost_gpu_s"] / HOUR
    return f"{held:.3f} / {lost:.3f}"


def _triple(block: dict) -> str:
    o = block["overall"]
    return f"{o['p50']} / {o['p90']} / {o['p99']}"


def _dev(p: dict, level: str) -> object:
    figures = p["fairness"].get(level)
    return figures["contended"]["mean_abs_dev_gpu"] if figures else None


def build_html(result: dict, summaries: Mapping[str, ReplaySummary]) -> str:
    """The whole page as a string (plotly.js inlined)."""
    from plotly.offline import get_plotlyjs

    figures: list[tuple[str, go.Figure]] = []
    for name, summary in summaries.items():
        figures.append((f"alloc-{name}", allocation_figure(name, summary)))
    figures.append(("delay-all", delay_cdf_figure(summaries)))
    for name, summary in summaries.items():
        figures.append((f"delay-teams-{name}", team_delay_figure(name, summary)))
    divs = [
        fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id)
        for div_id, fig in figures
    ]
    meta = html.escape(json.dumps(result["input"], sort_keys=True))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>wmla simulate: trace replay report</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
th, td {{ border: 1px solid #ccc; padding: 0.3em 0.7em; text-align: right; }}
tr th:first-child {{ text-align: left; }}
code {{ background: #f4f4f4; padding: 0 0.2em; }}
</style>
<script type="text/javascript">{get_plotlyjs()}</script>
</head><body>
<h1>Trace replay: {html.escape(", ".join(summaries))}</h1>
<p>Input: <code>{meta}</code></p>
<p>"Contended" means the GPU demand of pending and running jobs exceeds the capacity;
share deviation is the time-averaged |held - deserved| GPUs per plan, deserved computed by
water-filling over the plan tree (docs/simulate.md).</p>
{_table(result)}
{"".join(divs)}
</body></html>
"""


def write_report(path: Path, result: dict, summaries: Mapping[str, ReplaySummary]) -> None:
    """Build the page, then write it atomically (never a half-written report)."""
    atomic_write(Path(path), build_html(result, summaries))
