"""What one scheduling cycle reads: nodes, jobs, the plan tree, the instance bounds, the knobs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from .plans import PlanTree, leaf_path
from .resources import NO_LIMIT, Resources


class JobState(str, Enum):
    """A job's state; ``final`` states never change again (``FINAL_STATES``)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    FINISHED = "FINISHED"
    FAILED = "FAILED"
    REJECTED = "REJECTED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"  # stopped by the service at its runtime limit (docs/runtime.md)

    @property
    def final(self) -> bool:
        return self in FINAL_STATES


# The states a job ends in: the one definition (the strings compare equal too, so
# ``"FINISHED" in FINAL_STATES`` holds for a state read from JSON or the store).
FINAL_STATES = frozenset(
    {JobState.FINISHED, JobState.FAILED, JobState.REJECTED, JobState.CANCELLED, JobState.TIMEOUT}
)


@dataclass(frozen=True)
class Node:
    """A machine (the local host, a Kubernetes node) and what it can hold."""

    name: str
    capacity: Resources


@dataclass(slots=True)
class Job:
    """A gang of identical workers. Rigid when ``min_workers == max_workers``, else elastic.

    A running job lists in ``placement`` the node of every worker that holds resources; a job
    whose preemption or shrink is under way (``terminating``) still holds them until the
    backend reports the workers gone.

    What a job is (``id``, ``user``, ``plan``, ``per_worker``, the worker counts, ``priority``,
    ``submitted``, ``preemptible``) never changes once it is made: a changed one is a new Job
    (``dataclasses.replace``). The core keeps what it derived from them between cycles
    (intake.Kept, kept.py); the rest (state, placement, ...) changes in place.
    """

    id: str
    user: str
    plan: str
    per_worker: Resources
    min_workers: int = 1
    max_workers: int = 0  # 0: same as min_workers (rigid)
    priority: int = 0
    submitted: float = 0.0
    preemptible: bool = True
    state: JobState = JobState.PENDING
    placement: tuple[str, ...] = ()
    started: float | None = None
    terminating: bool = False
    # the job's last checkpoint since it (re)started, as its runtime reported it; None: none
    # yet. Reclaim prefers the victim that loses the least work since then (Reclaim 4).
    checkpointed: float | None = None
    # started first as a starved gang (CycleResult.aged, Admission 6): never a victim
    aged: bool = False

    def __post_init__(self) -> None:
        if self.max_workers == 0:
            self.max_workers = self.min_workers
        if self.min_workers < 1 or self.max_workers < self.min_workers:
            raise ValueError(
                f"job {self.id}: workers must be at least 1 and min <= max, "
                f"got {self.min_workers}:{self.max_workers}"
            )

    @property
    def leaf(self) -> str:
        return leaf_path(self.plan, self.user)

    @property
    def elastic(self) -> bool:
        return self.max_workers > self.min_workers

    @property
    def workers(self) -> int:
        return len(self.placement)


@dataclass(frozen=True)
class Instance:
    """The machines, cut down by the namespace quota (docs/scheduling.md "Words": instance)."""

    nodes: tuple[Node, ...]
    quota: Resources = NO_LIMIT
    max_jobs: int | None = None  # most jobs running at once (ResourceQuota ``pods``-like)

    @property
    def capacity(self) -> Resources:
        total = Resources(0, 0, 0)
        for node in self.nodes:
            total = total.plus(node.capacity)
        return total.cap(self.quota)


@dataclass(frozen=True)
class SchedulerConfig:
    grace: float = 30.0  # seconds between SIGTERM and SIGKILL for a victim
    min_runtime: float = 0.0  # a job younger than this is never a victim
    # Deserved share 2: > 0 weighs each plan's share by its usage over this half-life
    # (Snapshot.usage); 0 shares by this moment's demand only
    fair_share_half_life: float = 0.0
    # Admission 6: > 0, a gang that waited this long holds the reservation whatever the fair
    # order says, and once started is no victim; 0: no such rule
    max_gang_wait: float = 0.0


@dataclass
class Snapshot:
    plans: PlanTree
    instance: Instance
    jobs: Sequence[Job]
    config: SchedulerConfig = field(default_factory=SchedulerConfig)
    # the job that held the reservation after the last cycle (CycleResult.reserved): capacity
    # freed since it blocked goes to it first, so it is tried before the fair order
    reserved: str | None = None
    # decayed usage by user leaf path (history.UsageHistory), read when
    # config.fair_share_half_life > 0 (Deserved share 2)
    usage: Mapping[str, float] = field(default_factory=dict)
