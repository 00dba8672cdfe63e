"""A cancel as an intent the scheduling cycle commits: the action hands it to the loop, and the
cycle checks it against the live job, applies it and stores it in its one transaction (group
commit) before the core runs, so the cycle is the one writer of a job's state. A pending job or a
notebook's ends CANCELLED at once (nothing runs under the backend); a running job gets its stop,
sent once the cycle is stored, and ends CANCELLED when its workers are gone (changes.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from extension.metering.transitions import Transition
from extension.scheduler import JobState, SchedulerConfig

from .backend_calls import BackendCalls
from .live import LiveJobs
from .records import JobKind, StoreChange
from .rows import JobRow


class Conflict(RuntimeError):
    """The request conflicts with the state: a job that already ended or is already being
    stopped otherwise, a plan that already exists (a 409)."""


@dataclass
class Cancel:
    """A cancel for the next cycle: the job as the action read it (None: a notebook job whose
    server is gone, reconcile.py), why, when it was asked for, and the asker's answer."""

    job_id: str
    reason: str
    at: float
    row: JobRow | None
    done: asyncio.Future

    @property
    def server_gone(self) -> bool:
        return self.row is None


class CancelState(Protocol):
    """What applying a cancel reads and changes."""

    live: LiveJobs
    calls: BackendCalls
    config: SchedulerConfig
    clock: Callable[[], float]


def cancel_change(state: CancelState, cancel: Cancel) -> StoreChange | None:
    """Apply ``cancel`` to its live job; its change for the store (None: nothing to store).
    Conflict when there is nothing to cancel."""
    record = state.live.get(cancel.job_id)
    row = cancel.row
    if record is None or (row is None and record.kind is not JobKind.NOTEBOOK):
        if row is None:
            return None  # the notebook job ended meanwhile: nothing to release
        raise Conflict(f"job {cancel.job_id} is already {row.state}; nothing to cancel")
    job = record.job
    if row is not None and record.stopping and not row.cancel_requested:
        # the stop is under way already; a second one would only change the end state
        why = row.reason or "its runtime limit was reached"
        raise Conflict(
            f"job {job.id} is already stopping ({why}); it ends TIMEOUT once its "
            "workers have saved their checkpoint and exited"
        )
    reason = cancel.reason
    if job.state is JobState.PENDING or record.kind is JobKind.NOTEBOOK:
        # nothing runs under the backend (a notebook's server is the spawner's): free at once
        state.live.end(job, JobState.CANCELLED)
        values = {
            "state": JobState.CANCELLED.value,
            "ended": cancel.at,
            "reason": reason,
            "placement": [],
            "terminating": False,
        }
        return StoreChange(job.id, values, Transition.CANCELLED, reason)
    if row is None or row.cancel_requested:
        return None
    job.terminating = True
    state.calls.stop(job.id, state.config.grace, reason)
    values = {"cancel_requested": True, "terminating": True, "reason": reason}
    return StoreChange(job.id, values, Transition.CANCELLING, reason)
