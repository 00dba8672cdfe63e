"""Resource vectors over (gpu, cpu, memory) and Kubernetes-style quantities.

Units, as in docs/scheduling.md: ``gpu`` is whole devices, ``cpu`` is millicores, ``memory`` is
bytes. A limit that is not set is ``UNLIMITED`` (infinity), so "fits under the limit" is one
comparison per resource.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

RESOURCES = ("gpu", "cpu", "memory")
UNLIMITED = math.inf


class QuantityError(ValueError):
    """A resource amount that cannot be read; the message says which and how to write it."""


class Resources(NamedTuple):
    """A vector over the three resources; also used for limits (UNLIMITED where not set)."""

    gpu: float = 0
    cpu: float = 0
    memory: float = 0

    def plus(self, other: tuple) -> Resources:
        return Resources(self[0] + other[0], self[1] + other[1], self[2] + other[2])

    def minus(self, other: tuple) -> Resources:
        return Resources(self[0] - other[0], self[1] - other[1], self[2] - other[2])

    def times(self, k: float) -> Resources:
        return Resources(self[0] * k, self[1] * k, self[2] * k)

    def fits_in(self, other: tuple) -> bool:
        return self[0] <= other[0] and self[1] <= other[1] and self[2] <= other[2]

    def cap(self, other: tuple) -> Resources:
        """Per-resource minimum."""
        return Resources(min(self[0], other[0]), min(self[1], other[1]), min(self[2], other[2]))

    def is_zero(self) -> bool:
        return self[0] == 0 and self[1] == 0 and self[2] == 0

    def to_dict(self, skip_unlimited: bool = True) -> dict[str, float]:
        """Plain numbers for JSON: ints where whole; unlimited entries left out."""
        out: dict[str, float] = {}
        for name, value in zip(RESOURCES, self):
            if value == UNLIMITED and skip_unlimited:
                continue
            out[name] = _plain(value)
        return out

    def describe(self) -> str:
        """Human form for messages, e.g. ``4 gpu, 2 cpu, 8Gi memory`` (zeros left out)."""
        parts = [format_amount(n, v) for n, v in zip(RESOURCES, self) if v and v != UNLIMITED]
        return ", ".join(parts) if parts else "nothing"

    @classmethod
    def from_mapping(
        cls, mapping: Mapping[str, Any] | None, default: float = 0, where: str = "request"
    ) -> Resources:
        """Read ``{gpu: 1, cpu: "500m", memory: "4Gi"}``; missing keys take ``default``."""
        if mapping is None:
            return cls(default, default, default)
        if not isinstance(mapping, Mapping):
            raise QuantityError(f"{where}: expected a mapping of gpu, cpu, memory, got {mapping!r}")
        unknown = sorted(set(mapping) - set(RESOURCES))
        if unknown:
            raise QuantityError(
                f"{where}: unknown resource {unknown[0]!r}; the resources are gpu, cpu, memory"
            )
        values = []
        for name in RESOURCES:
            if name in mapping and mapping[name] is not None:
                values.append(parse_quantity(name, mapping[name], where=where))
            else:
                values.append(default)
        return cls(*values)


ZERO = Resources(0, 0, 0)
NO_LIMIT = Resources(UNLIMITED, UNLIMITED, UNLIMITED)

_SUFFIX = {
    "": 1,
    "m": 1e-3,
    "k": 1e3,
    "K": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]{0,2})\s*$")


def parse_quantity(resource: str, value: Any, where: str = "request") -> int:
    """Read one amount in the resource's unit: gpu devices, cpu millicores, memory bytes.

    ``cpu: 2`` is two cores (2000 millicores), ``cpu: 500m`` half a core; memory takes the
    Kubernetes suffixes (``4Gi``, ``800Mi``, ``1G``); gpu must be a whole number of devices.
    """
    if resource not in RESOURCES:
        raise QuantityError(f"{where}: unknown resource {resource!r}; use gpu, cpu or memory")
    if isinstance(value, bool):
        raise QuantityError(f"{where}: {resource} must be a number, got {value!r}")
    if isinstance(value, (int, float)):
        number, suffix = float(value), ""
    elif isinstance(value, str):
        match = _QUANTITY.match(value)
        if not match or match.group(2) not in _SUFFIX:
            raise QuantityError(
                f"{where}: {resource} {value!r} is not a quantity; " + _EXAMPLES[resource]
            )
        number, suffix = float(match.group(1)), match.group(2)
    else:
        raise QuantityError(f"{where}: {resource} must be a number, got {value!r}")
    if number < 0 or not math.isfinite(number):
        raise QuantityError(f"{where}: {resource} must not be negative, got {value!r}")
    scaled = number * _SUFFIX[suffix]
    if resource == "cpu":
        scaled *= 1000
    if not scaled <= MAX_AMOUNT[resource]:  # also inf: 1e306 cores overflow the millicores
        raise QuantityError(
            f"{where}: {resource} {value!r} is too large; at most "
            f"{format_amount(resource, MAX_AMOUNT[resource])}"
        )
    if resource == "gpu" and (suffix or scaled != int(scaled)):
        raise QuantityError(f"{where}: gpu counts whole devices, got {value!r}; use 0, 1, 2, ...")
    return int(round(scaled))


# The most any request, limit or quota may name, in the core's units: far above any machine,
# far below where float arithmetic on sums of them loses whole units.
MAX_AMOUNT = {"gpu": 10**6, "cpu": 10**12, "memory": 2**60}

_EXAMPLES = {
    "gpu": "use a whole number of devices such as 1 or 4",
    "cpu": "use cores (2, 0.5) or millicores (500m)",
    "memory": "use bytes or a suffix such as 512Mi, 4Gi, 1G",
}


def format_amount(resource: str, value: float) -> str:
    """``gpu`` -> ``4 gpu``; ``cpu`` millicores -> ``2 cpu`` or ``500m cpu``; bytes -> ``4Gi``."""
    if value == UNLIMITED:
        return f"unlimited {resource}"
    if resource == "cpu":
        cores = value / 1000
        text = f"{_plain(cores)}" if value % 100 == 0 else f"{_plain(value)}m"
        return f"{text} cpu"
    if resource == "memory":
        for suffix in ("Ti", "Gi", "Mi", "Ki"):
            unit = _SUFFIX[suffix]
            if value >= unit and value % (unit / 4) == 0:
                return f"{_plain(value / unit)}{suffix} memory"
        return f"{_plain(value)} bytes memory"
    return f"{_plain(value)} {resource}"


def _plain(value: float) -> float:
    """Whole numbers as int (JSON shows 4, not 4.0); others rounded for reading."""
    if value == int(value):
        return int(value)
    return round(value, 4)
