"""The typed decisions one cycle returns; the service and the backends carry them out."""

from __future__ import annotations

from dataclasses import dataclass, field

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


@dataclass
class CycleResult:
    decisions: list[Decision] = field(default_factory=list)
    plans: dict[str, PlanFigures] = field(default_factory=dict)
    reserved: str | None = None  # the job holding the reservation: pass it to the next cycle

    def of(self, kind: type) -> list:
        return [d for d in self.decisions if isinstance(d, kind)]
