"""The one protocol every execution backend implements (local processes, Kubernetes).

The service turns the core's decisions into calls on a backend and learns what happened from
the events the backend emits. Decisions are never made here: a backend carries out what it is
told and reports back.

Decision -> call:
- ``Start(job, placement)``            -> ``await backend.start(spec, placement)``
- ``Grow`` / ``Shrink(job, ..., grace)`` -> ``await backend.resize(spec, new_placement, grace)``
- ``Preempt(job, grace)`` and cancel    -> ``await backend.stop(job_id, grace, reason)``

Events (``BackendEvent.kind``), emitted through the ``emit`` callable given to the backend:
- ``running``   all workers of the gang are up (``placement`` says where)
- ``resized``   a resize finished; ``placement`` is the new one
- ``finished``  every worker exited 0
- ``failed``    a worker exited non-zero; the others were stopped; ``exit_code`` and
                ``message`` (the tail of that worker's log) say why
- ``released``  a stop finished (preempted or cancelled): the job holds nothing any more
- ``lost``      after a service restart the job's workers could not be found again
- ``refused``   (the service's own) a start the platform refused for now, before anything was
                created: back to the queue (``AdmissionRefused`` with ``permanent=False``)
- ``checkpoint`` the job's runtime reported a checkpoint: ``at`` is when it was written (never
                later than when the backend learnt of it), ``progress`` the figure the script
                gave (or None). Only the latest matters: a backend may drop or coalesce them,
                and the service folds them without a cycle of their own (they change the
                victims' order only, docs/scheduling.md "Reclaim 4")

Optional hooks: a backend declares what more it can do by having the methods of a capability
below (``Opens``, ``HasQuota``, ``SyncsQueues``, ``ChecksAdmission``, ``LocalAccounts``,
``WorkerPids``, ``KeepsEnds``); the service asks ``isinstance(backend, HasQuota)``, never
``getattr``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol, runtime_checkable

from extension.scheduler import Node, PlanTree, Resources


class EventKind(str, Enum):
    """What a backend reports (a str: ``EventKind.RUNNING == "running"``)."""

    RUNNING = "running"
    RESIZED = "resized"
    FINISHED = "finished"
    FAILED = "failed"
    RELEASED = "released"
    LOST = "lost"
    REFUSED = "refused"
    CHECKPOINT = "checkpoint"


EVENT_KINDS = tuple(k.value for k in EventKind)


@dataclass(frozen=True)
class JobSpec:
    """What a backend needs to run one job's workers."""

    id: str
    user: str
    leaf: str  # the user leaf the job is charged to, e.g. /project1/dev-team/user1
    per_worker: Resources
    command: Sequence[str]  # argv of each worker, run in ``workdir``
    workdir: str  # inside the user's own directory: <storage_root>/<user>/jobs/<job-id>
    min_workers: int = 1
    max_workers: int = 1
    env: Mapping[str, str] = field(default_factory=dict)
    kind: str = "train"  # "train" or "notebook"
    # per worker, at least ``per_worker``: the ceiling (CPU quota, memory limit) where the
    # request is what is charged and weighed, as a kubelet holds a container; None: the request
    limits: Resources | None = None

    @property
    def ceiling(self) -> Resources:
        """What one worker is held to: its limits, never below its request."""
        if self.limits is None:
            return self.per_worker
        return Resources(*(max(lim, req) for lim, req in zip(self.limits, self.per_worker)))


@dataclass(frozen=True)
class BackendEvent:
    job_id: str
    kind: EventKind  # a plain string of EVENT_KINDS is taken too
    at: float  # wall-clock seconds (time.time()) when it happened
    placement: tuple[str, ...] = ()
    exit_code: int | None = None
    message: str = ""
    progress: float | None = None  # ``checkpoint`` only: the runtime's progress figure

    def __post_init__(self) -> None:
        try:  # an unknown kind is the backend's bug: said where it is made, not folded later
            kind = EventKind(self.kind)
        except ValueError:
            raise ValueError(
                f"backend event kind {self.kind!r} is not one of {', '.join(EVENT_KINDS)}"
            ) from None
        object.__setattr__(self, "kind", kind)


class AdmissionRefused(RuntimeError):
    """Raised by ``start``/``resize`` before anything was created: the platform would refuse
    the gang (a namespace quota, a LimitRange). ``permanent`` false: it may fit later, the job
    goes back to the queue with the platform's words; true: the job fails."""

    def __init__(self, message: str, permanent: bool) -> None:
        super().__init__(message)
        self.permanent = permanent


Emit = Callable[[BackendEvent], None]


@runtime_checkable
class Backend(Protocol):
    def capacity(self) -> list[Node]:
        """The nodes and what each can hold; the service cuts it by the instance quota."""

    async def start(self, spec: JobSpec, placement: tuple[str, ...]) -> None:
        """Start one worker per entry of ``placement`` (rank i on ``placement[i]``), together."""

    async def resize(self, spec: JobSpec, placement: tuple[str, ...], grace: float) -> None:
        """Restart the job at ``len(placement)`` workers from its last checkpoint."""

    async def stop(self, job_id: str, grace: float, reason: str) -> None:
        """SIGTERM (or delete) the whole gang, wait ``grace`` seconds, then kill what is left."""

    async def recover(self, specs: Sequence[JobSpec]) -> None:
        """After a service restart: re-adopt these jobs' workers, or emit ``lost`` for them."""

    def logs(self, job_id: str, worker: int | None = None, tail: int | None = None) -> str:
        """The job's log (one worker's, or all interleaved by worker), last ``tail`` lines."""

    async def close(self) -> None:
        """Stop watching; running workers are left running (they outlive the service)."""


# -- optional capabilities ------------------------------------------------------------------------
@runtime_checkable
class Opens(Protocol):
    async def open(self) -> None:
        """Called once before anything else (the Kubernetes backend lists the cluster)."""


@runtime_checkable
class HasQuota(Protocol):
    def quota(self) -> Resources:
        """The platform's own cap on what jobs may hold (a namespace ResourceQuota)."""


@runtime_checkable
class SyncsQueues(Protocol):
    async def sync_queues(self, plans: PlanTree) -> None:
        """Mirror the plan tree after every change (Volcano queues)."""


@runtime_checkable
class ChecksAdmission(Protocol):
    def admission_problem(self, per_worker: Resources, workers: int) -> tuple[str, bool] | None:
        """What the platform would refuse at submission: (message, permanent), or None."""


@runtime_checkable
class LocalAccounts(Protocol):
    def account_for(self, user: str, home: str | None = None) -> Any:
        """The account (uid, gid) ``user``'s jobs run as: a local one (made when ``home`` is
        given and the backend creates accounts), or the uid of the user's pods; None: the
        service's own."""


@runtime_checkable
class WorkerPids(Protocol):
    def worker_pids(self, job_id: str) -> list[int]:
        """The job's worker processes on this machine (metering samples their use)."""


@runtime_checkable
class KeepsEnds(Protocol):
    """A backend that keeps each job's end (finished, failed, lost) where a restarted service
    finds it, until the service has stored it: the service calls ``ends_stored`` after every
    commit that held ends, and ``recover`` at every start (also with no job running), where
    the ends reported but never stored are reported again and those stored are dropped."""

    def ends_stored(self, job_ids: Collection[str]) -> None:
        """The store has committed these jobs' ends: what was kept of them may go."""


@runtime_checkable
class HoldsDevices(Protocol):
    """Devices for a job whose processes the backend does not run (a notebook server, which
    the spawner starts): the indexes it may open, kept across service restarts."""

    def hold_devices(self, spec: JobSpec, placement: tuple[str, ...]) -> list[tuple[int, ...]]:
        """Take devices for each entry of ``placement``; the same answer while held."""

    def release_devices(self, job_id: str) -> None:
        """Give the job's devices back (nothing when it holds none)."""

    def held_devices(self, job_id: str) -> list[tuple[int, ...]] | None:
        """The job's devices by worker, or None when it holds none here."""

    def keep_holds(self, job_ids: set[str]) -> None:
        """After a restart: give back the holds of every job not in ``job_ids``."""
