"""What the figure modules share: the job states they colour and the coercions of the API's
loosely typed values (a number that may be missing, a bool, NaN; a time as seconds)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from extension.scheduler import FINAL_STATES

FINAL = FINAL_STATES  # the states a job ends in: one definition (the core's)
STATE_COLOURS = {
    "PENDING": "#b58900",
    "RUNNING": "#268bd2",
    "FINISHED": "#2e7d32",
    "FAILED": "#c62828",
    "REJECTED": "#c62828",
    "CANCELLED": "#6c757d",
    "TIMEOUT": "#ef6c00",  # stopped at its runtime limit: resumable, not a failure
}
# ipywidgets' styles of an ended job (the progress bar, the cancel button once off): only a
# failure is "danger"; a job that finished did what was asked of it
ENDED_STYLES = {
    "FINISHED": "success",
    "FAILED": "danger",
    "REJECTED": "danger",
    "CANCELLED": "warning",
    "TIMEOUT": "warning",
}


def is_number(value: Any) -> bool:
    """A finite int or float; a bool is not one (JSON's true would plot as 1)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def number_or_zero(v: Any) -> float:
    """``v`` as a float, 0.0 where it is not a finite number (a missing figure draws as 0)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return 0.0
    return float(v)


def first_present(mapping: Mapping[str, Any], keys: Sequence[str]) -> Any:
    """The value of the first of ``keys`` that is set (not None) in ``mapping``, else None."""
    for key in keys:
        if mapping.get(key) is not None:
            return mapping[key]
    return None


def time_label(t: Any) -> str:
    """Seconds since the epoch as a UTC date-time plotly reads; anything else as its text."""
    if isinstance(t, (int, float)) and not isinstance(t, bool):
        return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    return str(t)
