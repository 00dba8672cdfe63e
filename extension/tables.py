"""Plain-text views of jobs, plans and usage, shared by the ``wmla`` CLI and the magics."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from extension.queue_text import estimate_text, place_text, reason_text, starts_text, waiting
from extension.scheduler import FINAL_STATES


def state_line(job: Mapping[str, Any]) -> str:
    """``job j1 RUNNING: 2 of 2 workers running ...; ranks on node-0[0], node-0[1]``,
    ``job j1 PENDING: /project1/dev-team at its gpu limit ...`` (with a ``queue``: ``job j1
    PENDING: 3rd in /project1/qa-team (1st of yours, 12th overall) — starts in about 12 minutes
    — <reason>``),
    ``job j1 FAILED (exit code 1): worker 0 exited with 1``."""
    from widgets.figures import workers_text

    state = job["state"]
    reason = job.get("reason") or ""
    text = f"job {job['id']} {state}"
    if state in FINAL_STATES and job.get("exit_code") is not None:
        text += f" (exit code {job['exit_code']})"
    if state == "RUNNING":
        return f"{text}: {workers_text(job)}"
    found = waiting(job) if state == "PENDING" else None
    if found is not None:  # the place in line and the estimated start, then the reason
        place = place_text(found, line="in")
        parts = [place, starts_text(found), (reason_text(found) if place else found.reason)]
        reason = " — ".join(p for p in parts if p) or reason
    return f"{text}: {reason}" if reason else text


def _number(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def metrics_text(line: Mapping[str, Any]) -> str:
    """One metrics line as ``step 120  epoch 1  loss 0.2345  accuracy 0.91`` (step, epoch and
    progress first, then losses, then the rest in the order the script reported them)."""
    first = [k for k in ("step", "epoch", "progress") if line.get(k) is not None]
    skip = {"time", "rank", "world_size", *first}
    rest = [k for k, v in line.items() if k not in skip and v is not None]
    rest.sort(key=lambda k: 0 if "loss" in k else 1)  # stable: the script's order otherwise
    return "  ".join(f"{k} {_number(line[k])}" for k in first + rest)


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(c) for c in header]] + [[("" if c is None else str(c)) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _time(t: Any) -> str:
    if not isinstance(t, (int, float)):
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _workers(job: Mapping[str, Any]) -> str:
    w = job.get("workers") or {}
    wanted = f"{w.get('min')}" if w.get("min") == w.get("max") else f"{w.get('min')}:{w.get('max')}"
    return f"{w.get('running', 0)}/{wanted}"


def state_text(job: Mapping[str, Any]) -> str:
    """The state as a person reads it: a notebook server (kind ``notebook``) is ``notebook
    (pending)``, ``notebook (running)`` or ``notebook (ended)``, not a CANCELLED job (the spawner
    cancels its job when the server stops)."""
    state = job.get("state") or ""
    if job.get("kind") != "notebook":
        return state
    return f"notebook ({'ended' if state in FINAL_STATES else state.lower()})"


def _reason(job: Mapping[str, Any]) -> str:
    reason = job.get("reason") or ""
    if job.get("kind") == "notebook" and job.get("state") in FINAL_STATES:
        if not reason or reason.startswith("cancelled by "):
            return "server stopped"
    return reason


REASON_WIDTH = 60  # a listing's reason column; the whole reason is in the job's own view


def one_line(text: str, width: int = REASON_WIDTH) -> str:
    """The first line of ``text`` cut to ``width`` characters, ``...`` saying there is more: a
    multi-line reason (a memory kill's log lines) would break a table's rows apart."""
    lines = text.strip().splitlines()
    first, more = (lines[0].strip() if lines else ""), len(lines) > 1
    if len(first) > width - 3 and (more or len(first) > width):
        first, more = first[: width - 3].rstrip(), True
    return first + "..." if more else first


def jobs_table(jobs: Sequence[Mapping[str, Any]]) -> str:
    """One line per job, newest first (by submission, then id, so the order is total), with
    its user (a plan admin lists everyone's) and its reason cut to one line."""
    if not jobs:
        return "no jobs"
    newest = sorted(jobs, key=lambda j: (j.get("submitted") or 0.0, j["id"]), reverse=True)
    rows = [
        (
            j["id"],
            j.get("user") or "",
            j.get("name") or "",
            state_text(j),
            j["plan"],
            _workers(j),
            _time(j.get("submitted")),
            _time(j.get("ended")),
            one_line(_reason(j)),
        )  # fmt: skip
        for j in newest
    ]
    header = ("JOB", "USER", "NAME", "STATE", "PLAN", "WORKERS", "SUBMITTED", "ENDED", "REASON")
    return table(header, rows)


_RULE = re.compile(r"^=+( +=+)+ *$")  # a reST simple table's border: ====  =====


def plain_text(rst: str) -> str:
    """reST as a terminal shows it (``--help``): ``literals`` without their backticks, and a
    simple two-column table without its borders, its columns aligned again."""
    lines = [_unquote(line) for line in rst.splitlines()]
    rules = [i for i, line in enumerate(lines) if _RULE.match(line)]
    if len(rules) < 2:
        return "\n".join(lines)
    first, last = rules[0], rules[-1]
    border = rst.splitlines()[first]
    col = len(border) - len(border.split(" ", 1)[1].lstrip())  # where the second column starts
    raw = rst.splitlines()[first:last]
    rows = [
        (_unquote(r[:col]).strip(), _unquote(r[col:]).strip()) for r in raw if not _RULE.match(r)
    ]
    width = max(len(left) for left, _ in rows) + 2
    table_lines = [f"{left:<{width}}{right}".rstrip() for left, right in rows]
    return "\n".join([*lines[:first], *table_lines, *lines[last + 1 :]])


def _unquote(text: str) -> str:
    return text.replace("``", "")


def job_details(job: Mapping[str, Any]) -> str:
    """``key: value`` lines; a pending job's ``reason`` line comes with its place in line and
    estimated start when the service sends a ``queue`` (``_queue_rows``)."""
    from widgets.figures import workers_text

    rows = [
        ("job", job["id"]),
        ("name", job.get("name") or ""),
        ("user", job.get("user")),
        ("plan", job.get("plan")),
        ("kind", job.get("kind") or "train"),
        ("state", state_text(job)),
        *_queue_rows(job),
        ("workers", workers_text(job)),
        ("submitted", _time(job.get("submitted"))),
        ("started", _time(job.get("started"))),
        ("ended", _time(job.get("ended"))),
        ("exit code", job.get("exit_code")),
        ("preemptions", job.get("preemptions")),
        ("command", " ".join(job.get("command") or [])),
        ("job folder", job.get("workdir")),
    ]
    width = max(13, *(len(k) + 2 for k, _ in rows))  # "estimated start:" is wider than the rest
    return "\n".join(f"{k + ':':<{width}}{'' if v is None else v}" for k, v in rows)


def _queue_rows(job: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """``queue: 3rd in /project1/qa-team (1st of yours, 12th overall)``, ``reason: ...``,
    ``estimated start: 2026-12-02 12:30 UTC (in about 12 minutes; assumes ...)`` for a pending
    job the service placed in line; only ``reason`` otherwise."""
    found = waiting(job) if job.get("state") == "PENDING" else None
    if found is None:
        return [("reason", job.get("reason") or "")]
    place = place_text(found, line="in")
    reason = (reason_text(found) if place else found.reason) or job.get("reason") or ""
    return [
        ("queue", place or f"not placed in line in {found.plan} yet"),
        ("reason", reason),
        ("estimated start", estimate_text(found)),
    ]


def _amount(res: Mapping[str, Any] | None, key: str) -> str:
    if not isinstance(res, Mapping) or key not in res:
        return "-"
    v = res[key]
    if not isinstance(v, (int, float)):
        return str(v)
    if key == "cpu":
        return f"{v / 1000:g}"
    if key == "memory":
        return f"{v / (1 << 30):.3g}Gi"
    return f"{v:g}"


def plans_table(tree: Mapping[str, Any]) -> str:
    rows = []
    for p in tree.get("plans", []):
        limit = p.get("limit") or {}
        rows.append(
            (
                p["path"] + (" (user)" if p.get("user_leaf") else ""),
                _amount({"share": p.get("share")}, "share"),
                _amount(limit, "gpu"),
                _amount(p.get("deserved"), "gpu"),
                _amount(p.get("allocated"), "gpu"),
                _amount(p.get("allocated"), "cpu"),
                p.get("running", 0),
                p.get("pending", 0),
            )
        )
    header = ("PLAN", "SHARE", "GPU LIMIT", "GPU DESERVED", "GPU USED", "CPU USED", "RUN", "PEND")
    return table(header, rows)


def usage_table(answer: Mapping[str, Any]) -> str:
    """A line that says what was measured, in local time, then a row per child and the total."""
    from widgets.figures import normalise_usage

    norm = normalise_usage(answer)
    rows = [(c["name"], f"{c['gpu_hours']:.3f}", f"{c['cpu_hours']:.3f}") for c in norm["children"]]
    rows.append(
        ("total", f"{norm['totals']['gpu_hours']:.3f}", f"{norm['totals']['cpu_hours']:.3f}")
    )
    title = f"usage of {answer.get('plan') or '/'}"
    if answer.get("user"):
        title += f" for {answer['user']}"
    title += f" from {_time(answer.get('start'))} to {_time(answer.get('end'))}"
    if isinstance(answer.get("step"), (int, float)):
        title += f" (points every {_duration(answer['step'])})"
    return title + "\n" + table(("CHILD", "GPU-HOURS", "CPU-HOURS"), rows)


def _duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def shares_table(answer: Mapping[str, Any]) -> str:
    """sshare's columns, a row per plan (``(user)`` after a user leaf), under the sentence that
    says what the figures mean (the half-life, the unit) or that the history is off."""
    rows = [
        (
            r["plan"] + (" (user)" if r.get("user_leaf") else ""),
            f"{r['share']:g}",
            f"{r['normalized_share']:.6f}",
            f"{r['raw_usage']:.0f}",
            f"{r['effective_usage']:.6f}",
            f"{r['fair_share_factor']:.6f}",
        )
        for r in answer.get("plans", [])
    ]
    header = ("Plan", "RawShares", "NormShares", "RawUsage", "EffectvUsage", "FairShare")
    lines = [answer.get("message") or "", table(header, rows) if rows else "no plans"]
    hidden = answer.get("hidden_user_leaves") or 0
    if hidden:
        lines.append(f"({hidden} other users' leaves not shown; their usage counts in their plans)")
    return "\n".join(line for line in lines if line)


def quota_table(answer: Mapping[str, Any]) -> str:
    """mmlsquota's columns, a row per user folder, and why quotas are not held if they are not."""
    rows = []
    for r in answer.get("users", []):
        if not r.get("enforced"):
            rows.append((r["user"], "-", "-", "-", "-", "-", "-", "-", r.get("reason", "")))
            continue
        left = r.get("grace_left")
        grace = "none" if left is None else ("expired" if left <= 0 else format_seconds(left))
        rows.append(
            (
                r["user"],
                size_text(r["used_bytes"]),
                size_text(r["soft_storage"]),
                size_text(r["storage"]),
                grace,
                str(r["used_files"]),
                str(r["soft_files"]),
                str(r["files"]),
                r["state"],
            )
        )
    header = ("User", "Used", "Soft", "Hard", "Grace", "Files", "Soft", "Hard", "State")
    lines = [table(header, rows) if rows else "no storage quotas"]
    if not answer.get("enforced", True):
        lines.append(f"storage quotas are not held here: {answer.get('reason')}")
    return "\n".join(lines)


def size_text(amount: int) -> str:
    """Bytes in binary units, three figures (``1.5 GiB``)."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if amount >= size:
            return f"{amount / size:.3g} {unit}"
    return f"{amount} B"


def format_seconds(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"
