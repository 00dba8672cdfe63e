"""The typed decisions one cycle returns; the service and the backends carry them out."""

from __future__ import annotations

from dataclasses import dataclass

from .resources import Resources


@dataclass(frozen=True)
class Start:
    """Start the whole gang: one worker on each listed node (rank i on ``placement[i]``)."""

    job_id: str
    placement: tuple[str, ...]

    @property
    def workers(self) -> int:
        return len(self.placement)


@dataclass(frozen=True)
class Grow:
    """Add workers to a running elastic job (it restarts from its checkpoint at the new size)."""

    job_id: str
    add: tuple[str, ...]
    workers: int


@dataclass(frozen=True)
class Shrink:
    """Take workers from an elastic job, the highest ranks first, after ``grace`` seconds."""

    job_id: str
    release: tuple[str, ...]
    workers: int
    grace: float
    reason: str


@dataclass(frozen=True)
class Preempt:
    """Stop a whole gang (SIGTERM, ``grace``, SIGKILL); it returns to the queue."""

    job_id: str
    grace: float
    reason: str
    for_job: str


@dataclass(frozen=True)
class Reject:
    """The job can never run as asked; ``reason`` is the message the user sees."""

    job_id: str
    reason: str


@dataclass(frozen=True)
class Wait:
    """The job stays pending this cycle; ``reason`` says what it waits for."""

    job_id: str
    reason: str


Decision = Start | Grow | Shrink | Preempt | Reject | Wait


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


FIGURE_FIELDS = 14


class CycleResult:
    """What one cycle decided.

    ``decisions``: what to carry out (Start, Grow, Shrink, Preempt, Reject). ``waiting``: every
    job that stays pending, by id, with the reason its status shows (``of(Wait)`` gives them as
    Wait decisions). ``plans``: every plan's figures, built on first read from the rows the
    cycle recorded (a cycle of a big tree need not pay for figures nobody reads). ``reserved``:
    the job holding the reservation; pass it to the next cycle's Snapshot.
    """

    def __init__(
        self,
        decisions: list[Decision] | None = None,
        plans: dict[str, PlanFigures] | None = None,
        reserved: str | None = None,
        waiting: dict[str, str] | None = None,
    ) -> None:
        self.decisions: list[Decision] = decisions if decisions is not None else []
        self.waiting: dict[str, str] = waiting if waiting is not None else {}
        self.reserved = reserved
        self._plans = plans
        # per plan, FIGURE_FIELDS values: path, share, limit, deserved (3), allocated (3),
        # demand (3), pending, running
        self.figure_data: list = []

    @property
    def plans(self) -> dict[str, PlanFigures]:
        if self._plans is None:
            data, plans = self.figure_data, {}
            for i in range(0, len(data), FIGURE_FIELDS):
                path, share, limit, d0, d1, d2, a0, a1, a2, m0, m1, m2, pending, running = data[
                    i : i + FIGURE_FIELDS
                ]
                plans[path] = PlanFigures(
                    path=path,
                    share=share,
                    limit=Resources(*limit),
                    deserved=Resources(d0, d1, d2),
                    allocated=Resources(a0, a1, a2),
                    demand=Resources(m0, m1, m2),
                    pending=pending,
                    running=running,
                )
            self._plans = plans
        return self._plans

    def of(self, kind: type) -> list:
        if kind is Wait:
            return [Wait(job_id, reason) for job_id, reason in self.waiting.items()]
        return [d for d in self.decisions if isinstance(d, kind)]
