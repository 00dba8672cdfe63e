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
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from extension.scheduler import Node, Resources

EVENT_KINDS = ("running", "resized", "finished", "failed", "released", "lost")


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


@dataclass(frozen=True)
class BackendEvent:
    job_id: str
    kind: str  # one of EVENT_KINDS
    at: float  # wall-clock seconds (time.time()) when it happened
    placement: tuple[str, ...] = ()
    exit_code: int | None = None
    message: str = ""


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
