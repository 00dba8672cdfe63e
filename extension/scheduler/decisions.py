"""The typed decisions one cycle returns, and ``dispatch``: the one way to carry them out.

The service and the simulator each have a handler with one method per kind (``start``,
``grow``, ``shrink``, ``preempt``, ``reject``); ``dispatch(decision, handler, *args)`` calls
the one the decision names, so a new kind of decision is a missing method, not a branch an
isinstance chain forgot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from .resources import Resources


@dataclass(frozen=True)
class Start:
    """Start the whole gang: one worker on each listed node (rank i on ``placement[i]``)."""

    kind: ClassVar[str] = "start"

    job_id: str
    placement: tuple[str, ...]

    @property
    def workers(self) -> int:
        return len(self.placement)


@dataclass(frozen=True)
class Grow:
    """Add workers to a running elastic job (it restarts from its checkpoint at the new size)."""

    kind: ClassVar[str] = "grow"

    job_id: str
    add: tuple[str, ...]
    workers: int


@dataclass(frozen=True)
class Shrink:
    """Take workers from an elastic job, the highest ranks first, after ``grace`` seconds."""

    kind: ClassVar[str] = "shrink"

    job_id: str
    release: tuple[str, ...]
    workers: int
    grace: float
    reason: str


@dataclass(frozen=True)
class Preempt:
    """Stop a whole gang (SIGTERM, ``grace``, SIGKILL); it returns to the queue."""

    kind: ClassVar[str] = "preempt"

    job_id: str
    grace: float
    reason: str
    for_job: str


@dataclass(frozen=True)
class Reject:
    """The job can never run as asked; ``reason`` is the message the user sees."""

    kind: ClassVar[str] = "reject"

    job_id: str
    reason: str


@dataclass(frozen=True)
class Wait:
    """The job stays pending this cycle; ``reason`` says what it waits for."""

    kind: ClassVar[str] = "wait"

    job_id: str
    reason: str


Decision = Start | Grow | Shrink | Preempt | Reject | Wait
KINDS = ("start", "grow", "shrink", "preempt", "reject")  # what a cycle's decisions may be


class DecisionHandler(Protocol):
    """What carries out a cycle's decisions: one method per kind."""

    def start(self, decision: Start, *args: Any) -> Any: ...

    def grow(self, decision: Grow, *args: Any) -> Any: ...

    def shrink(self, decision: Shrink, *args: Any) -> Any: ...

    def preempt(self, decision: Preempt, *args: Any) -> Any: ...

    def reject(self, decision: Reject, *args: Any) -> Any: ...


def dispatch(decision: Decision, handler: DecisionHandler, *args: Any) -> Any:
    """Carry out ``decision`` with ``handler``'s method of its kind (``Start`` ->
    ``handler.start(decision, *args)``, ...) and return what it returns."""
    return getattr(handler, decision.kind)(decision, *args)


@dataclass(frozen=True)
class PlanFigures:
    """A plan's figures after the cycle, for the API, the admin page and metering."""

    path: str
    share: float
    limit: Resources
    deserved: Resources
    allocated: Resources
    demand: Resources
    pending: int
    running: int

    def to_dict(self) -> dict:
        return {
            "path": self.path,
            "share": self.share,
            "limit": self.limit.to_dict(),
            "deserved": self.deserved.to_dict(),
            "allocated": self.allocated.to_dict(),
            "demand": self.demand.to_dict(),
            "pending": self.pending,
            "running": self.running,
        }


class PlanRows:
    """Every plan's figures as a cycle records them: one named column per field of
    ``PlanFigures``, one entry per plan, except that the vectors (deserved, allocated, demand)
    take three entries each (gpu, cpu, memory). Eight lists instead of thousands of objects
    for the garbage collector to walk every cycle; ``figures`` makes the PlanFigures."""

    __slots__ = ("path", "share", "limit", "deserved", "allocated", "demand", "pending", "running")

    def __init__(self) -> None:
        self.path: list[str] = []
        self.share: list[float] = []
        self.limit: list[tuple] = []
        self.deserved: list[float] = []
        self.allocated: list[float] = []
        self.demand: list[float] = []
        self.pending: list[int] = []
        self.running: list[int] = []

    def figures(self) -> dict[str, PlanFigures]:
        out = {}
        for i, path in enumerate(self.path):
            v = slice(3 * i, 3 * i + 3)
            out[path] = PlanFigures(
                path=path,
                share=self.share[i],
                limit=Resources(*self.limit[i]),
                deserved=Resources(*self.deserved[v]),
                allocated=Resources(*self.allocated[v]),
                demand=Resources(*self.demand[v]),
                pending=self.pending[i],
                running=self.running[i],
            )
        return out


class CycleResult:
    """What one cycle decided.

    ``decisions``: what to carry out (Start, Grow, Shrink, Preempt, Reject). ``waiting``: every
    job that stays pending, by id, with the reason its status shows (``of(Wait)`` gives them as
    Wait decisions). ``plans``: every plan's figures, built on first read from the rows the
    cycle recorded (a cycle of a big tree need not pay for figures nobody reads). ``reserved``:
    the job holding the reservation; pass it to the next cycle's Snapshot. ``aged``: the
    starved gang this cycle started first (Admission 6); the caller sets ``Job.aged`` on it,
    so that no reclaim stops it.
    """

    def __init__(
        self,
        decisions: list[Decision] | None = None,
        plans: dict[str, PlanFigures] | None = None,
        reserved: str | None = None,
        waiting: dict[str, str] | None = None,
        aged: str | None = None,
    ) -> None:
        self.decisions: list[Decision] = decisions if decisions is not None else []
        self.waiting: dict[str, str] = waiting if waiting is not None else {}
        self.reserved = reserved
        self.aged = aged
        self._plans = plans
        self.rows: PlanRows | None = None  # what ``plans`` is built from

    @property
    def plans(self) -> dict[str, PlanFigures]:
        if self._plans is None:
            self._plans = self.rows.figures() if self.rows is not None else {}
        return self._plans

    def of(self, kind: type) -> list:
        if kind is Wait:
            return [Wait(job_id, reason) for job_id, reason in self.waiting.items()]
        return [d for d in self.decisions if isinstance(d, kind)]
