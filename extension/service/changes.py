"""What a cycle's backend events and decisions change: one fold per event kind, one method per
decision kind (the core's ``dispatch``). Each returns or collects the store's change for a job,
``({column: value}, transition event or None, reason)``, and updates the live job in memory;
the loop (scheduling.py) stores them all in one transaction before any backend call goes out.

``sched`` is the service's Scheduler (its live jobs, its queued backend calls).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from extension.backends.base import BackendEvent, EventKind
from extension.scheduler import (
    Grow,
    Job,
    JobState,
    Preempt,
    Reject,
    Shrink,
    Start,
    held_work,
    lost_work,
    steady_state,
)

from .runtime_limits import deadline, timeout_reason
from .store import FoldFacts, JobRow

# a job's change for the store: ({column: value}, transition event or None, reason)
Change = tuple[dict[str, Any], str | None, str]


# -- events --------------------------------------------------------------------------------
def on_running(sched: Any, job: Job, row: FoldFacts, ev: BackendEvent) -> Change:
    if ev.placement:
        job.placement = tuple(ev.placement)
    return {"placement": list(job.placement)}, "running", ""


def on_resized(sched: Any, job: Job, row: FoldFacts, ev: BackendEvent) -> Change:
    target = sched._resize_to.pop(job.id, None)
    job.placement = tuple(ev.placement) if ev.placement else (target or job.placement)
    job.terminating = False
    return {"placement": list(job.placement), "terminating": False}, "resized", ""


def on_ended(sched: Any, job: Job, row: FoldFacts, ev: BackendEvent) -> Change:
    """finished, failed, lost: the workers are gone; a cancel under way ends CANCELLED, a stop
    at the runtime limit TIMEOUT (a job that finished by itself meanwhile stays FINISHED)."""
    state = JobState.FINISHED if ev.kind is EventKind.FINISHED else JobState.FAILED
    reason = ev.message
    if ev.kind is EventKind.LOST:
        reason = ev.message or "the job's workers were lost after a service restart"
    if ev.kind is EventKind.FAILED and not reason:
        reason = f"a worker exited with code {ev.exit_code}"
    if row.cancel_requested and ev.kind is not EventKind.FINISHED:
        state, reason = JobState.CANCELLED, row.reason or "cancelled"
    elif row.timeout_requested and ev.kind is not EventKind.FINISHED:
        state, reason = JobState.TIMEOUT, timeout_reason(row.max_runtime, row.started)
    values = _ended(sched, job, state, ev, reason)
    values["exit_code"] = ev.exit_code
    return values, "timed-out" if state is JobState.TIMEOUT else ev.kind.value, reason


def _ended(sched: Any, job: Job, state: JobState, ev: BackendEvent, reason: str) -> dict:
    """The job is over (``state``): out of the live jobs; the store's columns for it."""
    sched._end(job, state)
    return {
        "state": state.value,
        "placement": [],
        "terminating": False,
        "ended": ev.at or sched.clock(),
        "reason": reason,
    }


def on_released(sched: Any, job: Job, row: FoldFacts, ev: BackendEvent) -> Change:
    """A stop finished: cancelled, stopped at its runtime limit (TIMEOUT, also when the limit
    came during a preemption's grace), or preempted and back to the queue (it resumes from its
    checkpoint when started again)."""
    if row.timeout_requested and not row.cancel_requested:
        reason = timeout_reason(row.max_runtime, row.started)
        return _ended(sched, job, JobState.TIMEOUT, ev, reason), "timed-out", reason
    if row.cancel_requested:
        reason = row.reason or "cancelled"
        return _ended(sched, job, JobState.CANCELLED, ev, reason), "cancelled", reason
    job.state, job.placement, job.started = JobState.PENDING, (), None
    job.terminating = False
    values = {
        "state": JobState.PENDING.value,
        "placement": [],
        "terminating": False,
        "preemptions": row.preemptions + 1,
    }
    return values, "released", row.reason


def on_refused(sched: Any, job: Job, row: FoldFacts, ev: BackendEvent) -> Change:
    """The service's own: a start the platform refused for now; back to the queue."""
    job.state, job.placement, job.started = JobState.PENDING, (), None
    job.terminating = False
    reason = f"waiting: the platform refused to start it for now: {ev.message}"
    values = {"state": JobState.PENDING.value, "placement": [], "terminating": False}
    return {**values, "reason": reason}, "refused", reason


def on_checkpoint(sched: Any, job: Job, row: FoldFacts, ev: BackendEvent) -> Change | None:
    """The runtime reported a checkpoint: kept on the job (``Job.checkpointed``), no transition.
    Only a newer one counts, and never one later than now. It is kept across a preemption: a
    job that restarts resumes from it, and ``churn.lost_work`` counts from the later of it and
    the (re)start."""
    at = min(ev.at, sched.clock())
    if job.checkpointed is not None and at <= job.checkpointed:
        return None  # the same report again (a re-adopted gang's), or an older one
    job.checkpointed = at
    return {"checkpointed": at, "checkpoint_progress": ev.progress}, None, ""


# one fold per event kind (base.EventKind); a kind without one fails the test that lists them
FOLDS: dict[EventKind, Callable[[Any, Job, FoldFacts, BackendEvent], Change | None]] = {
    EventKind.RUNNING: on_running,
    EventKind.RESIZED: on_resized,
    EventKind.FINISHED: on_ended,
    EventKind.FAILED: on_ended,
    EventKind.LOST: on_ended,
    EventKind.RELEASED: on_released,
    EventKind.REFUSED: on_refused,
    EventKind.CHECKPOINT: on_checkpoint,
}


# -- runtime limits (docs/runtime.md "Runtime limits") ---------------------------------------
def _limited(sched: Any) -> list[tuple[Job, float]]:
    """Running jobs with a runtime limit whose stop has not been asked for, and their deadline.
    A job being shrunk waits for its ``resized`` (that event brings the cycle that judges it):
    counted here, a deadline passed during the shrink's grace would spin the loop."""
    out = []
    stopping, shrinking = sched.limits.stopping, sched._resize_to
    for job_id, limit in sched.limits.jobs.items():
        job = sched.jobs.get(job_id)
        if job is None or job.state is not JobState.RUNNING or job_id in stopping:
            continue
        if job_id in shrinking:
            continue
        due = deadline(job.started, limit)
        if due is not None:
            out.append((job, due))
    return out


def next_deadline(sched: Any) -> float | None:
    """The nearest deadline of a running job (the loop sleeps no longer than until then)."""
    return min((due for _, due in _limited(sched)), default=None)


def due_timeouts(sched: Any, now: float) -> list[tuple[str, dict, str | None, str]]:
    """Jobs at their runtime limit: the usual stop (SIGTERM, ``grace``, SIGKILL; the runtime
    checkpoints on SIGTERM) with ``timeout_requested`` stored, so the job ends TIMEOUT when its
    workers are gone, also after a restart. A notebook (the spawner runs its server) ends
    TIMEOUT at once and the spawner's poll stops the server. A job already being preempted or
    cancelled gets the flag only: that stop ends it (a cancel stays CANCELLED). A shrink under
    way is waited for: its ``resized`` event brings a cycle that judges the job again."""
    changes = []
    for job, due in _limited(sched):
        if now < due:
            continue
        limit = sched.limits.jobs[job.id]
        reason = timeout_reason(limit, job.started)
        sched.limits.stopping.add(job.id)
        if sched.kinds.get(job.id) == "notebook":
            sched._end(job, JobState.TIMEOUT)
            values = {
                "state": JobState.TIMEOUT.value,
                "ended": now,
                "reason": reason,
                "placement": [],
                "terminating": False,
                "timeout_requested": True,
            }
            changes.append((job.id, values, "timed-out", reason))
        elif job.terminating:
            changes.append((job.id, {"timeout_requested": True}, None, ""))
        else:
            job.terminating = True
            values = {"timeout_requested": True, "terminating": True, "reason": reason}
            changes.append((job.id, values, "timing-out", reason))
            sched._queue_stop(job.id, sched.config.grace, reason)
    return changes


# -- decisions -----------------------------------------------------------------------------
class CarryOut:
    """A cycle's decisions applied to the live jobs (one method per kind, the core's
    ``dispatch``): what each changes for the store, what the core decided for the log, and the
    backend calls queued for after the store has it all."""

    def __init__(self, sched: Any, now: float) -> None:
        self.sched, self.now = sched, now
        self.changes: list[tuple[str, dict, str | None, str]] = []
        self.log: list[tuple[str, str, dict]] = []

    def start(self, d: Start, job: Job) -> None:
        job.state, job.placement, job.started = JobState.RUNNING, d.placement, self.now
        values = {
            "state": JobState.RUNNING.value,
            "placement": list(d.placement),
            "started": self.now,
            "reason": "",
        }
        self.changes.append((job.id, values, "started", ""))
        self.log.append((job.id, "start", {"placement": list(d.placement)}))
        if self.sched.kinds.get(job.id) != "notebook":  # the spawner runs notebook servers
            self.sched._queue_backend(job.id, "start", tuple(d.placement))
        else:  # its GPUs, which the spawner fences the server to
            self.sched.notebook_devices.hold(self.sched.specs[job.id], tuple(d.placement))

    def grow(self, d: Grow, job: Job) -> None:
        job.placement = job.placement + d.add
        self.changes.append((job.id, {"placement": list(job.placement)}, "grown", ""))
        self.log.append((job.id, "grow", {"add": list(d.add), "workers": d.workers}))
        self.sched._queue_backend(job.id, "resize", job.placement)

    def shrink(self, d: Shrink, job: Job) -> None:
        job.terminating = True
        target = _without(job.placement, d.release)
        self.sched._resize_to[job.id] = target
        values = {"terminating": True, "reason": d.reason}
        self.changes.append((job.id, values, "shrinking", d.reason))
        self.log.append((job.id, "shrink", {"release": list(d.release), "reason": d.reason}))
        self.sched._queue_backend(job.id, "resize", target, d.grace)

    def preempt(self, d: Preempt, job: Job) -> None:
        cost = preemption_cost(self.sched, d, job, self.now)  # before anything changes
        job.terminating = True
        values = {"terminating": True, "reason": d.reason}
        self.changes.append((job.id, values, "preempting", d.reason))
        self.log.append((job.id, "preempt", {"reason": d.reason, "for": d.for_job, **cost}))
        self.sched._queue_stop(job.id, d.grace, d.reason)

    def reject(self, d: Reject, job: Job) -> None:
        self.sched._end(job, JobState.REJECTED)
        values = {"state": JobState.REJECTED.value, "ended": self.now, "reason": d.reason}
        self.changes.append((job.id, values, "rejected", d.reason))
        self.log.append((job.id, "reject", {"reason": d.reason}))


def preemption_cost(sched: Any, d: Preempt, job: Job, now: float) -> dict[str, Any]:
    """What a preemption costs, stored with the decision (the churn figures are summed from these,
    docs/metering.md "Churn"): the victim's held and lost GPU-seconds at the decision
    (``churn.held_work``/``lost_work``; 0 for a victim without GPUs, where the simulator counts its
    worker-seconds: a difference noted in issue 18), and whether it was decided in the steady state:
    every plan with demand within the reclaimer's minimum gang of its deserved share in the previous
    cycle's figures, in which the reclaimer's leaf already had demand (``churn.within_one_gang``).
    No previous cycle, or a reclaimer no longer known, is not the steady state."""
    previous = sched.result.plans if sched.result is not None else None
    reclaimer = sched.jobs.get(d.for_job)
    steady = False
    if previous and reclaimer is not None:
        steady = steady_state(previous, reclaimer)
    gpus = job.per_worker.gpu > 0  # the core's functions count workers for the others
    return {
        "held_gpu_seconds": held_work(job, now) if gpus else 0.0,
        "lost_gpu_seconds": lost_work(job, now) if gpus else 0.0,
        "steady_state": steady,
    }


def _without(placement: tuple[str, ...], release: tuple[str, ...]) -> tuple[str, ...]:
    """Drop the released nodes from the highest ranks down (Shrink releases the top ranks)."""
    out = list(placement)
    for node in release:
        for i in range(len(out) - 1, -1, -1):
            if out[i] == node:
                del out[i]
                break
    return tuple(out)


def resume_under_way(sched: Any, running: list[JobRow]) -> None:
    """At a restart, what was under way for the re-adopted ``running`` jobs when the service
    went away: a stop is sent again (one at the runtime limit too: it still ends TIMEOUT), a
    shrink is forgotten (the next cycle decides again at today's figures)."""
    for row in running:
        if not (row.cancel_requested or row.terminating or row.timeout_requested):
            continue
        events = sched.store.transitions(row.id)
        stopping = row.cancel_requested or row.timeout_requested
        if stopping or (events and events[-1].event == "preempting"):
            reason = row.reason or "stop resumed after restart"
            sched._queue_stop(row.id, sched.config.grace, reason, now=True)
        else:
            sched.jobs[row.id].terminating = False
            sched.store.update_jobs([(row.id, {"terminating": False}, None, "")], sched.clock())
