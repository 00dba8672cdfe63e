"""When the simulated scheduler runs a cycle and how long the backend takes (docs/simulate.md
"The service model").

``Timing()`` is the simulator's model as it always was: a core cycle at every instant something
happens (and when a ``min_runtime`` runs out), events seen the moment they happen, work from the
moment of the Start decision, victims holding their resources through the whole grace period,
and a core never told of a checkpoint.
``PRESETS["service"]`` is what the service with the local backend really does (the figures and
where they come from are in docs/simulate.md); a scenario file says ``timing: service`` (or a
mapping of these fields, optionally from a ``preset``), a trace replay ``--timing service``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

CYCLES = ("instant", "service")


@dataclass(frozen=True)
class Timing:
    """How the replay's clock turns into cycles and backend events.

    - ``cycles``: ``instant`` (a cycle at every instant something happens, and when a
      ``min_runtime`` runs out) or ``service`` (as the service's loop: a cycle on every
      submission, cancel and backend event, including the backend's ``running`` report, and
      ``tick`` seconds after the last cycle when nothing woke it; nothing else, so a reclaim
      held back by ``min_runtime`` waits for the next tick or event);
    - ``tick``: seconds of the service's steady tick (``service`` cycles only; 0: none);
    - ``start_delay``: seconds from a Start decision to the workers working (and to the
      backend's ``running`` report); the job holds its resources from the decision on;
    - ``finish_seen_after``: seconds from the workers' exit to the scheduler folding ``finished``;
    - ``release_seen_after``: seconds from a stopped gang's exit to ``released`` (or a shrink's
      ``resized``) being folded;
    - ``exit_after_term``: seconds a victim takes to leave after SIGTERM; None: it ignores
      SIGTERM and holds its resources until SIGKILL at the end of the grace period; a value
      above the grace also means SIGKILL at the end of the grace period;
    - ``checkpoint_on_sigterm``: a victim that leaves within the grace period writes a
      checkpoint first, so its preemption loses nothing;
    - ``report_checkpoints``: the runtime reports every checkpoint and the scheduler shows it
      to the core (``Job.checkpointed``, which reclaim's victim order reads), as the service
      does; off, the core never learns of one (the simulator's old model).
    """

    cycles: str = "instant"
    tick: float = 5.0
    start_delay: float = 0.0
    finish_seen_after: float = 0.0
    release_seen_after: float = 0.0
    exit_after_term: float | None = None
    checkpoint_on_sigterm: bool = False
    report_checkpoints: bool = False

    @property
    def service_cycles(self) -> bool:
        return self.cycles == "service"


PRESETS: dict[str, Timing] = {
    "instant": Timing(),
    # the service (extension/service/scheduling.py) over the local backend, as measured and
    # read from the code; docs/simulate.md "The service model" gives file and line for each
    "service": Timing(
        cycles="service",
        tick=5.0,
        start_delay=0.1,
        finish_seen_after=0.1,
        release_seen_after=0.05,
        exit_after_term=1.0,
        checkpoint_on_sigterm=True,
        report_checkpoints=True,
    ),
}


def parse_timing(spec: Any, fail: Callable[[str, str], Exception], key: str = "timing") -> Timing:
    """A preset name (``service``), or a mapping of ``Timing`` fields with an optional
    ``preset`` they start from (default ``instant``). ``fail(key, problem)`` makes the error."""
    if isinstance(spec, str):
        if spec not in PRESETS:
            raise fail(key, f"unknown preset {spec!r}; the presets are {', '.join(PRESETS)}")
        return PRESETS[spec]
    if not isinstance(spec, dict):
        raise fail(key, "must be a preset name (instant, service) or a mapping of its fields")
    names = {f.name for f in fields(Timing)}
    unknown = sorted(set(spec) - names - {"preset"})
    if unknown:
        known = ", ".join(sorted(names | {"preset"}))
        raise fail(f"{key}.{unknown[0]}", f"unknown key; the keys here are {known}")
    base = parse_timing(spec.get("preset", "instant"), fail, f"{key}.preset")
    values = {k: _field(k, v, fail, f"{key}.{k}") for k, v in spec.items() if k != "preset"}
    return replace(base, **values)


def _field(name: str, value: Any, fail: Callable[[str, str], Exception], key: str) -> Any:
    if name == "cycles":
        if value not in CYCLES:
            raise fail(key, f"must be one of {', '.join(CYCLES)}, got {value!r}")
        return value
    if name in ("checkpoint_on_sigterm", "report_checkpoints"):
        if not isinstance(value, bool):
            raise fail(key, f"must be true or false, got {value!r}")
        return value
    if value is None and name == "exit_after_term":
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise fail(key, f"must be a number of seconds, got {value!r}")
    if value < 0:
        raise fail(key, f"must not be negative, got {value!r}")
    return float(value)
