"""A pending job's place in line, why it waits and when it may start, in words.

Every surface a user waits at reads the ``queue`` object of a job's JSON (docs/service.md "Why
a job waits, and until when") through this one module: the spawn page (spawner/mixin), the job
monitor (widgets), ``wmla exec-get`` (extension/tables.py) and the admin page. So the same job
reads the same everywhere, and the defensive reading is written once: the producer may leave any
field out or null (``estimate`` is null before the first forward run, ``estimate.start`` beyond
its horizon, ``position`` for a job submitted since; a job that is not pending has no
``queue``), and none of that may break a surface. What is missing is left out of the words.

Pure: no network, no clock (an answer's own ``text`` says how far off a start is).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Waiting:
    """The ``queue`` object, read: 1-based places (None: not placed yet), the plan they count
    in, the reason and the estimate (``when`` is the service's words, ``""`` when none)."""

    plan: str = ""
    leaf: int | None = None  # among the user's own pending jobs in the plan
    in_plan: int | None = None
    instance: int | None = None
    reason: str = ""
    estimated: bool = False  # an estimate was made (its start may still be beyond reach)
    start: float | None = None  # epoch seconds
    when: str = ""  # "in about 12 minutes", "no start in sight: ..."
    assumption: str = ""
    exact: bool = False


def waiting(job: Mapping[str, Any] | None) -> Waiting | None:
    """The job's ``queue`` read defensively; None when it has none (not pending, or a service
    that does not send it)."""
    if not isinstance(job, Mapping):
        return None
    queue = job.get("queue")
    if not isinstance(queue, Mapping):
        return None
    position = queue.get("position")
    position = position if isinstance(position, Mapping) else {}
    estimate = queue.get("estimate")
    estimate = estimate if isinstance(estimate, Mapping) else None
    start = estimate.get("start") if estimate else None
    return Waiting(
        plan=_text(queue.get("plan")) or _text(job.get("plan")),
        leaf=_place(position.get("leaf")),
        in_plan=_place(position.get("plan")),
        instance=_place(position.get("instance")),
        reason=_text(queue.get("reason")),
        estimated=estimate is not None,
        start=float(start) if _number(start) else None,
        when=_text(estimate.get("text")) if estimate else "",
        assumption=_text(estimate.get("assumption")) if estimate else "",
        exact=bool(estimate.get("exact")) if estimate else False,
    )


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 12th, 13th, 21st, 112th."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def place_text(
    w: Waiting, *, line: str = "in line in", yours: str = "of yours", overall: bool = True
) -> str:
    """``3rd in line in /project1/qa-team (1st of yours, 12th overall)``; ``""`` before the job
    has a place. ``line`` is the words between the place and the plan (the CLI says ``in``),
    ``yours`` those after the user's own place (the spawn page says ``for you``)."""
    if w.in_plan is None:
        return ""
    text = f"{ordinal(w.in_plan)} {line} {w.plan}"
    more = []
    if w.leaf is not None:
        more.append(f"{ordinal(w.leaf)} {yours}")
    if overall and w.instance is not None:
        more.append(f"{ordinal(w.instance)} overall")
    return f"{text} ({', '.join(more)})" if more else text


def reason_text(w: Waiting) -> str:
    """The reason without its opening ``3rd in line in <plan>``, which a surface that shows
    the place already says (the service's reason starts with it so that it reads alone)."""
    reason = w.reason
    if w.in_plan is not None:
        said = f"{ordinal(w.in_plan)} in line in {w.plan}"
        if reason == said:
            return ""
        if reason.startswith(said + "; "):
            return reason[len(said) + 2 :]
    return reason


def starts_text(w: Waiting) -> str:
    """``starts in about 12 minutes``, ``starts within a minute``, ``no start in sight: ...``
    (no start), ``""`` when nothing was estimated yet."""
    if not w.when:
        return ""
    if w.start is None:
        return w.when  # "no start in sight: ...": no verb reads right before it
    return f"starts {w.when}"


def utc_minute(t: float | None) -> str:
    """``2026-12-02 12:30 UTC``; ``""`` for no time."""
    if not _number(t):
        return ""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))


def estimate_text(w: Waiting) -> str:
    """``2026-12-02 12:30 UTC (in about 12 minutes; assumes ...)``, ``no start in sight: ...
    (assumes ...)``, ``not estimated yet``: the CLI's ``estimated start`` line."""
    if not w.estimated:
        return "not estimated yet"
    head = utc_minute(w.start) if w.start is not None else (w.when or "not known")
    notes = [w.when] if w.start is not None and w.when else []
    if w.assumption:
        notes.append(f"assumes {w.assumption}")
    return f"{head} ({'; '.join(notes)})" if notes else head


# The spawn page shows each line as one entry of its event log: a line longer than this wraps
# into a paragraph that hides the place and the start, which are what the user waits on.
SPAWN_LINE_MAX = 160


def spawn_line(w: Waiting, fallback: str = "") -> str:
    """One short line for the spawn page's progress: ``2nd in line in /project1/dev-team (1st
    for you) — starts in about 12 minutes (estimated) — dev-team holds 2 of its 2 deserved
    GPUs; ...``: the place, the start and as many of the reason's clauses as fit in
    ``SPAWN_LINE_MAX`` characters (at least its first, cut if need be); the parts not known yet
    are left out, and with none of them, ``fallback`` (the job's own reason), shortened the same
    way. The estimate's assumptions are the job monitor's and ``wmla exec-get``'s to show."""
    head = []
    place = place_text(w, yours="for you", overall=False)
    if place:
        head.append(place)
    if w.when:
        # "no start in sight: <why>": the why is an assumption's, too long for this line
        head.append(
            f"starts {w.when} (estimated)" if w.start is not None else first_clause(w.when, ":")
        )
    reason = reason_text(w) if place else w.reason
    if not head and not reason:
        reason = fallback
    return fit(head, reason)


def fit(head: list[str], reason: str, limit: int = SPAWN_LINE_MAX) -> str:
    """``head`` and the reason's clauses joined while the line stays within ``limit``: whole
    clauses, the service's most particular first; the first one always, shortened if need
    be."""
    clauses = [c.strip() for c in reason.split("; ") if c.strip()]
    kept: list[str] = clauses[:1]
    for clause in clauses[1:]:
        if len(" — ".join([*head, "; ".join([*kept, clause])])) > limit:
            break
        kept.append(clause)
    return shorten(" — ".join([*head, "; ".join(kept)] if kept else head), limit)


def first_clause(text: str, separator: str = "; ") -> str:
    """The text up to its first ``separator``."""
    return text.split(separator, 1)[0].strip()


def shorten(text: str, limit: int = SPAWN_LINE_MAX) -> str:
    """``text`` cut at a word before ``limit`` characters, with an ellipsis when cut."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1].rsplit(" ", 1)[0].rstrip(" ,;:—")
    return cut + "…"


def _place(value: Any) -> int | None:
    """A 1-based place, or None for anything else (null, 0, a string, a bool)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return None
    return value


def _number(value: Any) -> bool:
    # a bool is an int to Python, and NaN or infinity is no time anyone can read
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""
