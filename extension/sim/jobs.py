"""One job as a replay tracks it: its submission, the core's view of it, and what happened to it.

The loop (``replay.py``) and the policies change these records; the recorder (``recorder.py``)
and the summary (``summary.py``) read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from extension.scheduler import Job

from .scenario import ScenarioJob


@dataclass
class ReplayJob:
    """One job as the replay tracks it; ``core`` is the core's view (state, placement)."""

    spec: ScenarioJob
    seq: int  # submission order (time, then trace order)
    core: Job
    team: str
    gpu: float  # GPUs per worker
    state: str = "PENDING"  # PENDING RUNNING FINISHED REJECTED
    first_start: float | None = None  # first time the whole gang ran
    ended: float | None = None
    preemptions: int = 0
    broken: bool = False  # ever held some but not all of its gang
    error: str | None = None
    held: float = 0.0  # GPUs it holds now (counted in the recorder)
    busy: float = 0.0  # GPUs it holds and computes on now
    leaf: str = field(init=False)  # the core's ``Job.leaf``: a job's plan and user never change

    def __post_init__(self) -> None:
        self.leaf = self.core.leaf

    @property
    def id(self) -> str:
        return self.spec.id
