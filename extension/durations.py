"""Durations as people write them: ``90`` (seconds), ``"45s"``, ``"90m"``, ``"2h"``, ``"1h30m"``,
``"1d"``, ``"1.5h"``. One parser for the service (a job's ``max_runtime``, a plan's
``runtime_default`` and ``runtime_max``), the ``wmla`` CLI and the magics (``--runtime-limit``).

Standard library only: the magics' option parsing imports it and stays pure.

>>> parse_duration("1h30m")
5400.0
>>> format_duration(5400)
'1h30m'
"""

from __future__ import annotations

import math
import re
from typing import Any

# a runtime limit beyond a year is no limit: leave the field out (or null) instead
MIN_SECONDS = 1.0
MAX_SECONDS = 365 * 86400.0
UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
# one or more <number><unit> parts, largest unit first, each unit at most once (checked below);
# spaces between parts are allowed ("1h 30m")
PART = re.compile(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*([dhms])", re.I)
NUMBER = re.compile(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*\Z")
EXAMPLES = "use seconds or e.g. 90m, 2h, 1h30m, 1d"


class DurationError(ValueError):
    """Not a duration, or out of bounds; the message names the field and what to write."""


def parse_duration(value: Any, field: str = "max_runtime") -> float:
    """Seconds (a float) from a positive number of seconds or a duration string.

    ``field`` names the value in the error (``max_runtime``, ``runtime_max``,
    ``--runtime-limit``). Refused: booleans, NaN and infinities, zero or negative values,
    unknown units, a unit twice or out of order (``30m1h``), less than one second or more than
    365 days.
    """
    seconds = _seconds(value, field)
    if not MIN_SECONDS <= seconds <= MAX_SECONDS:
        raise DurationError(
            f"{field} {_shown(value)} is {'too short' if seconds < MIN_SECONDS else 'too long'}: "
            f"give from {format_duration(MIN_SECONDS)} to {format_duration(MAX_SECONDS)} "
            f"(leave it out for no limit)"
        )
    return seconds


def _seconds(value: Any, field: str) -> float:
    if isinstance(value, bool):  # True is an int to Python, not a duration to anyone
        raise DurationError(f"{field} {_shown(value)} is not a duration: {EXAMPLES}")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value <= 0:
            raise DurationError(
                f"{field} {_shown(value)} is not a positive number of seconds: {EXAMPLES}"
            )
        return float(value)
    if not isinstance(value, str) or len(value) > 64:
        raise DurationError(f"{field} {_shown(value)} is not a duration: {EXAMPLES}")
    number = NUMBER.match(value)
    if number:  # "3600": seconds written as text (a form field, a command line)
        seconds = float(number.group(1))
        if seconds <= 0:
            raise DurationError(
                f"{field} {_shown(value)} is not a positive number of seconds: {EXAMPLES}"
            )
        return seconds
    total, pos, seen = 0.0, 0, []
    text = value.rstrip()
    while pos < len(text):
        part = PART.match(text, pos)
        if part is None:
            raise DurationError(f"{field} {_shown(value)} is not a duration: {EXAMPLES}")
        unit = part.group(2).lower()
        if seen and "dhms".index(unit) <= "dhms".index(seen[-1]):
            raise DurationError(
                f"{field} {_shown(value)} is not a duration: write each unit once, largest "
                f"first (d, h, m, s), e.g. 1h30m"
            )
        seen.append(unit)
        total += float(part.group(1)) * UNITS[unit]
        pos = part.end()
    if not seen:  # "", "  "
        raise DurationError(f"{field} {_shown(value)} is not a duration: {EXAMPLES}")
    if total <= 0:  # "0s", "0h0m": a limit of nothing
        raise DurationError(f"{field} {_shown(value)} must be more than 0: {EXAMPLES}")
    return total


def parse_optional_duration(value: Any, field: str) -> float | None:
    """``parse_duration``, with ``None`` (JSON null) meaning no value (no default, no maximum)."""
    return None if value is None else parse_duration(value, field)


def parse_duration_or_off(value: Any, field: str) -> float:
    """``parse_duration`` for a knob that 0 turns off (``0``, ``"0"``, ``"0s"``: 0.0); the
    error says so too."""
    if isinstance(value, str) and value.strip() in ("0", "0s", "0.0"):
        return 0.0
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0:
        return 0.0
    try:
        return parse_duration(value, field)
    except DurationError as problem:
        raise DurationError(f"{problem} (0: off)") from None


def format_duration(seconds: float) -> str:
    """``5400`` -> ``1h30m``, ``86400`` -> ``1d``, ``2.5`` -> ``2.5s``, ``90061`` ->
    ``1d1h1m1s``: what ``parse_duration`` reads back to the same seconds (to the millisecond)."""
    seconds = round(float(seconds), 3)
    if seconds <= 0:
        return "0s"
    out = []
    whole = int(seconds)
    fraction = round(seconds - whole, 3)
    for unit, size in UNITS.items():
        count, whole = divmod(whole, size)
        if unit == "s" and fraction:
            out.append(f"{count + fraction:g}s")
        elif count:
            out.append(f"{count}{unit}")
    return "".join(out)


def _shown(value: Any) -> str:
    """The value as the error quotes it: strings in quotes, the rest as JSON would show it."""
    if isinstance(value, str):
        return repr(value[:64])
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return repr(value) if isinstance(value, (int, float)) else type(value).__name__
