"""The job monitor's texts: the job's state line (with its place in line, estimated start and
reason, from the job's ``queue``), its workers and what they each hold, and the cancel button's
state."""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from extension.queue_text import Waiting, place_text, reason_text, starts_text, utc_minute, waiting

from .common import ENDED_STYLES, FINAL, STATE_COLOURS


def state_html(job: Mapping[str, Any]) -> str:
    """``PENDING — 3rd in line in /p (1st of yours, 12th overall) — starts in about 12 minutes
    (2026-12-02 12:30 UTC; estimate: assumes ...) — <reason>`` from the job's ``queue``; the
    reason alone for a job without one (not pending)."""
    state = str(job.get("state", "?"))
    colour = STATE_COLOURS.get(state, "#333")
    parts = [f'<b style="color:{colour}">{html.escape(state)}</b>']
    found = waiting(job) if state == "PENDING" else None
    if found is not None:
        parts.extend(_waiting_parts(found, job))
    else:
        reason = job.get("reason")
        if reason:
            parts.append(html.escape(str(reason)))
    if job.get("exit_code") not in (None, 0):
        parts.append(f"exit code {job['exit_code']}")
    if job.get("preemptions"):
        parts.append(f"preempted {job['preemptions']}x (resumes from its checkpoint)")
    return " &mdash; ".join(parts)


def _waiting_parts(found: Waiting, job: Mapping[str, Any]) -> list[str]:
    """The place, the estimate and the reason of a waiting job, escaped; what the service has
    not worked out yet is said so rather than guessed."""
    place = place_text(found)
    parts = [html.escape(place or f"not placed in line in {found.plan} yet")]
    starts = starts_text(found)
    if starts:
        notes = [utc_minute(found.start)] if found.start is not None else []
        if found.assumption:
            notes.append(f"estimate: assumes {found.assumption}")
        note = (
            f' <span style="color:#666">({html.escape("; ".join(notes))})</span>' if notes else ""
        )
        parts.append(f'<span class="wmla-estimate">{html.escape(starts)}</span>{note}')
    else:
        parts.append("no start estimated yet")
    reason = reason_text(found) if place else found.reason
    reason = reason or str(job.get("reason") or "")
    if reason:
        parts.append(html.escape(reason))
    return parts


def cancel_button_state(job: Mapping[str, Any]) -> dict[str, Any]:
    """``disabled``, ``description``, ``tooltip`` and ``button_style`` of the monitor's cancel
    button.

    Active only while the job is known to be PENDING or RUNNING without a cancel already asked:
    before the first read of the job it stays off, so a monitor opened on an ended job never
    offers a cancel the service would refuse. Red ("danger") while it can stop the job (the
    click throws work away); once off it says how the job ended, in that end's style ("Job
    finished" is a success, not an error).
    """
    state = job.get("state")
    if state in FINAL:
        return {
            "disabled": True,
            "description": f"Job {state.lower()}",
            "tooltip": f"the job is {state}: a job that has ended cannot be cancelled",
            "button_style": ENDED_STYLES.get(state, ""),
        }
    if job.get("cancel_requested"):
        return {
            "disabled": True,
            "description": "Cancelling",
            "tooltip": "cancel requested: the workers are being stopped",
            "button_style": "warning",
        }
    if state not in ("PENDING", "RUNNING"):
        return {
            "disabled": True,
            "description": "Cancel job",
            "tooltip": "reading the job's state",
            "button_style": "",
        }
    return {
        "disabled": False,
        "description": "Cancel job",
        "tooltip": f"cancel this {state} job",
        "button_style": "danger",
    }


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
