"""``report(step=..., **metrics)``: one JSON line per call in ``$WMLA_JOB_DIR/metrics.jsonl``.

Each line is ``{"step": .., "time": .., "rank": .., **metrics}``; the service serves the file to
the notebook, which plots it live. Only rank 0 writes unless ``all_ranks=True``. A line is one
``write`` on a file opened with ``O_APPEND``, so lines from several ranks never interleave and a
reader never sees half a line except the last one while it is being written.
Non-finite numbers (a diverged loss) are written as ``null``, since JSON has no NaN.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

from .env import info, job_dir

RESERVED = ("step", "time", "rank")


def path() -> str:
    return os.path.join(job_dir(), "metrics.jsonl")


def _plain(name: str, value: Any) -> Any:
    if hasattr(value, "item") and callable(value.item):  # torch / numpy scalar
        try:
            value = value.item()
        except (ValueError, RuntimeError):
            raise ValueError(
                f"metric {name!r} is not a single number (shape {getattr(value, 'shape', '?')}); "
                "report a scalar, e.g. loss.item()"
            ) from None
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    raise ValueError(
        f"metric {name!r} has type {type(value).__name__}; report numbers, strings or booleans"
    )


def report(step: int | None = None, all_ranks: bool = False, **metrics: Any) -> dict | None:
    """Append one line of metrics; returns what was written, or None on ranks that do not write."""
    for name in metrics:
        if name in RESERVED:
            raise ValueError(f"metric name {name!r} is reserved; call it something else")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
        raise ValueError(f"step must be a whole number, got {step!r}")
    me = info()
    if not all_ranks and me.rank != 0:
        return None
    line = {"step": step, "time": time.time(), "rank": me.rank}
    line.update({name: _plain(name, value) for name, value in metrics.items()})
    data = (json.dumps(line, allow_nan=False) + "\n").encode()
    target = path()
    os.makedirs(os.path.dirname(target), exist_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    return line


def read(file: str | None = None) -> list[dict]:
    """The lines written so far (a torn last line, still being written, is skipped)."""
    out = []
    try:
        with open(file or path(), encoding="utf-8") as src:
            for raw in src:
                if not raw.endswith("\n"):
                    break
                try:
                    out.append(json.loads(raw))
                except json.JSONDecodeError:
                    continue
    except FileNotFoundError:
        pass
    return out
