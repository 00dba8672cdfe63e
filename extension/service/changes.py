"""What a cycle's backend events and decisions change: one fold per event kind, one method per
decision kind. Each returns or collects the store's change for a job (a ``StoreChange``) and
updates the live job in memory;
the loop (scheduling.py) stores them all in one transaction before any backend call goes out.

``sched`` is what a cycle works on (``CycleState``, which the service's Scheduler implements):
the live jobs, the backend calls queued for after the commit, the last cycle's result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from extension.backends.base import BackendEvent, EventKind
from extension.metering.transitions import Transition
from extension.scheduler import (
    CycleResult,
    Decision,
    Grow,
    Job,
    JobState,
    Preempt,
    Reject,
    SchedulerConfig,
    Shrink,
    Start,
    held_work,
    lost_work,
    steady_state,
)

from .backend_calls import BackendCalls
from .live import LiveJob, LiveJobs
from .notebook_devices import NotebookDevices
from .records import JobKind, StoreChange
from .runtime_limits import deadline, timeout_reason
from .store import FoldFacts, JobRow, Store


class CycleState(Protocol):
    """What the folds and decisions read and change."""

    live: LiveJobs
    calls: BackendCalls
    notebook_devices: NotebookDevices
    config: SchedulerConfig
    result: CycleResult | None
    store: Store
    clock: Callable[[], float]


# -- events --------------------------------------------------------------------------------
def on_running(sched: CycleState, job: Job, row: FoldFacts, ev: BackendEvent) -> StoreChange:
    if ev.placement:
        job.placement = tuple(ev.placement)
    return StoreChange(job.id, {"placement": list(job.placement)}, Transition.RUNNING)


def on_resized(sched: CycleState, job: Job, row: FoldFacts, ev: BackendEvent) -> StoreChange:
    record = sched.live.get(job.id)
    target = record.resize_to if record is not None else None
    if record is not None:
        record.resize_to = None
    job.placement = tuple(ev.placement) if ev.placement else (target or job.placement)
    job.terminating = False
    values = {"placement": list(job.placement), "terminating": False}
    return StoreChange(job.id, values, Transition.RESIZED)


def on_ended(sched: CycleState, job: Job, row: FoldFacts, ev: BackendEvent) -> StoreChange:
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
    ended = Transition.TIMED_OUT if state is JobState.TIMEOUT else Transition(ev.kind.value)
    return StoreChange(job.id, values, ended, reason)


def _ended(sched: CycleState, job: Job, state: JobState, ev: BackendEvent, reason: str) -> dict:
    """The job is over (``state``): out of the live jobs; the store's columns for it."""
    sched.live.end(job, state)
    return {
        "state": state.value,
        "placement": [],
        "terminating": False,
        "ended": ev.at or sched.clock(),
        "reason": reason,
    }


def on_released(sched: CycleState, job: Job, row: FoldFacts, ev: BackendEvent) -> StoreChange:
    """A stop finished: cancelled, stopped at its runtime limit (TIMEOUT, also when the limit
    came during a preemption's grace), or preempted and back to the queue (it resumes from its
    checkpoint when started again)."""
    if row.timeout_requested and not row.cancel_requested:
        reason = timeout_reason(row.max_runtime, row.started)
        values = _ended(sched, job, JobState.TIMEOUT, ev, reason)
        return StoreChange(job.id, values, Transition.TIMED_OUT, reason)
    if row.cancel_requested:
        reason = row.reason or "cancelled"
        values = _ended(sched, job, JobState.CANCELLED, ev, reason)
        return StoreChange(job.id, values, Transition.CANCELLED, reason)
    job.state, job.placement, job.started = JobState.PENDING, (), None
    job.terminating, job.aged = False, False
    values = {
        "state": JobState.PENDING.value,
        "placement": [],
        "terminating": False,
        "preemptions": row.preemptions + 1,
        "aged": False,
    }
    return StoreChange(job.id, values, Transition.RELEASED, row.reason)


def on_refused(sched: CycleState, job: Job, row: FoldFacts, ev: BackendEvent) -> StoreChange:
    """The service's own: a start the platform refused for now; back to the queue."""
    job.state, job.placement, job.started = JobState.PENDING, (), None
    job.terminating = False
    reason = f"waiting: the platform refused to start it for now: {ev.message}"
    values = {"state": JobState.PENDING.value, "placement": [], "terminating": False}
    return StoreChange(job.id, {**values, "reason": reason}, Transition.REFUSED, reason)


def on_checkpoint(
    sched: CycleState, job: Job, row: FoldFacts, ev: BackendEvent
) -> StoreChange | None:
    """The runtime reported a checkpoint: kept on the job (``Job.checkpointed``), no transition.
    Only a newer one counts, and never one later than now. It is kept across a preemption: a
    job that restarts resumes from it, and ``churn.lost_work`` counts from the later of it and
    the (re)start."""
    at = min(ev.at, sched.clock())
    if job.checkpointed is not None and at <= job.checkpointed:
        return None  # the same report again (a re-adopted gang's), or an older one
    job.checkpointed = at
    return StoreChange(job.id, {"checkpointed": at, "checkpoint_progress": ev.progress})


# one fold per event kind (base.EventKind); a kind without one fails the test that lists them
Fold = Callable[[CycleState, Job, FoldFacts, BackendEvent], StoreChange | None]
FOLDS: dict[EventKind, Fold] = {
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
def _limited(sched: CycleState) -> list[tuple[LiveJob, float]]:
    """Running jobs with a runtime limit whose stop has not been asked for, and their deadline.
    A job being shrunk waits for its ``resized`` (that event brings the cycle that judges it):
    counted here, a deadline passed during the shrink's grace would spin the loop."""
    out = []
    for record in sched.live.limited():
        if record.max_runtime is None or record.stopping or record.resize_to is not None:
            continue
        job = record.job
        if job.state is not JobState.RUNNING:
            continue
        due = deadline(job.started, record.max_runtime)
        if due is not None:
            out.append((record, due))
    return out


def next_deadline(sched: CycleState) -> float | None:
    """The nearest deadline of a running job (the loop sleeps no longer than until then)."""
    return min((due for _, due in _limited(sched)), default=None)


def due_timeouts(sched: CycleState, now: float) -> list[StoreChange]:
    """Jobs at their runtime limit: the usual stop (SIGTERM, ``grace``, SIGKILL; the runtime
    checkpoints on SIGTERM) with ``timeout_requested`` stored, so the job ends TIMEOUT when its
    workers are gone, also after a restart. A notebook (the spawner runs its server) ends
    TIMEOUT at once and the spawner's poll stops the server. A job already being preempted or
    cancelled gets the flag only: that stop ends it (a cancel stays CANCELLED). A shrink under
    way is waited for: its ``resized`` event brings a cycle that judges the job again."""
    changes = []
    for record, due in _limited(sched):
        if now < due:
            continue
        job = record.job
        reason = timeout_reason(record.max_runtime, job.started)
        record.stopping = True
        if record.kind is JobKind.NOTEBOOK:
            sched.live.end(job, JobState.TIMEOUT)
            values = {
                "state": JobState.TIMEOUT.value,
                "ended": now,
                "reason": reason,
                "placement": [],
                "terminating": False,
                "timeout_requested": True,
            }
            changes.append(StoreChange(job.id, values, Transition.TIMED_OUT, reason))
        elif job.terminating:
            changes.append(StoreChange(job.id, {"timeout_requested": True}))
        else:
            job.terminating = True
            values = {"timeout_requested": True, "terminating": True, "reason": reason}
            changes.append(StoreChange(job.id, values, Transition.TIMING_OUT, reason))
            sched.calls.stop(job.id, sched.config.grace, reason)
    return changes


# -- decisions -----------------------------------------------------------------------------
class CarryOut:
    """A cycle's decisions applied to the live jobs (``apply``: one method per decision type,
    each ``(decision, job)``): what each changes for the store, what the core decided for the
    log, and the backend calls queued for after the store has it all."""

    def __init__(self, sched: CycleState, now: float, aged: str | None = None) -> None:
        self.sched, self.now = sched, now
        self.aged = aged  # CycleResult.aged: the starved gang started first (Admission 6)
        self.changes: list[StoreChange] = []
        self.log: list[tuple[str, str, dict]] = []
        self._methods: dict[type, Callable[[Any, Job], None]] = {
            Start: self.start,
            Grow: self.grow,
            Shrink: self.shrink,
            Preempt: self.preempt,
            Reject: self.reject,
        }

    def apply(self, decision: Decision, job: Job) -> None:
        """Carry ``decision`` out on ``job`` with the method of its type."""
        self._methods[type(decision)](decision, job)

    def start(self, d: Start, job: Job) -> None:
        job.state, job.placement, job.started = JobState.RUNNING, d.placement, self.now
        values = {
            "state": JobState.RUNNING.value,
            "placement": list(d.placement),
            "started": self.now,
            "reason": "",
        }
        if job.id == self.aged:  # no reclaim stops it (Admission 6)
            job.aged = values["aged"] = True
        self.changes.append(StoreChange(job.id, values, Transition.STARTED))
        self.log.append((job.id, "start", {"placement": list(d.placement)}))
        # the spawner runs notebook servers
        record = self.sched.live[job.id]
        if record.kind is not JobKind.NOTEBOOK:
            self.sched.calls.start(record.spec, tuple(d.placement))
        else:  # its GPUs, which the spawner fences the server to
            self.sched.notebook_devices.hold(record.spec, tuple(d.placement))

    def grow(self, d: Grow, job: Job) -> None:
        job.placement = job.placement + d.add
        values = {"placement": list(job.placement)}
        self.changes.append(StoreChange(job.id, values, Transition.GROWN))
        self.log.append((job.id, "grow", {"add": list(d.add), "workers": d.workers}))
        spec = self.sched.live[job.id].spec
        self.sched.calls.resize(spec, job.placement, self.sched.config.grace)

    def shrink(self, d: Shrink, job: Job) -> None:
        job.terminating = True
        target = _without(job.placement, d.release)
        record = self.sched.live[job.id]
        record.resize_to = target
        values = {"terminating": True, "reason": d.reason}
        self.changes.append(StoreChange(job.id, values, Transition.SHRINKING, d.reason))
        self.log.append((job.id, "shrink", {"release": list(d.release), "reason": d.reason}))
        self.sched.calls.resize(record.spec, target, d.grace)

    def preempt(self, d: Preempt, job: Job) -> None:
        cost = preemption_cost(self.sched, d, job, self.now)  # before anything changes
        job.terminating = True
        values = {"terminating": True, "reason": d.reason}
        self.changes.append(StoreChange(job.id, values, Transition.PREEMPTING, d.reason))
        self.log.append((job.id, "preempt", {"reason": d.reason, "for": d.for_job, **cost}))
        self.sched.calls.stop(job.id, d.grace, d.reason)

    def reject(self, d: Reject, job: Job) -> None:
        self.sched.live.end(job, JobState.REJECTED)
        values = {"state": JobState.REJECTED.value, "ended": self.now, "reason": d.reason}
        self.changes.append(StoreChange(job.id, values, Transition.REJECTED, d.reason))
        self.log.append((job.id, "reject", {"reason": d.reason}))


def preemption_cost(sched: CycleState, d: Preempt, job: Job, now: float) -> dict[str, Any]:
    """What a preemption costs, stored with the decision (the churn figures are summed from these,
    docs/metering.md "Churn"): the victim's held and lost GPU-seconds at the decision
    (``churn.held_work``/``lost_work``; 0 for a victim without GPUs, where the simulator counts its
    worker-seconds: a difference noted in issue 18), and whether it was decided in the steady state:
    every plan with demand within the reclaimer's minimum gang of its deserved share in the previous
    cycle's figures, in which the reclaimer's leaf already had demand (``churn.within_one_gang``).
    No previous cycle, or a reclaimer no longer known, is not the steady state."""
    previous = sched.result.plans if sched.result is not None else None
    reclaimer = sched.live.jobs.get(d.for_job)
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


def resume_under_way(sched: CycleState, running: list[JobRow]) -> None:
    """At a restart, what was under way for the re-adopted ``running`` jobs when the service
    went away: a stop is sent again (one at the runtime limit too: it still ends TIMEOUT), a
    shrink is forgotten (the next cycle decides again at today's figures)."""
    for row in running:
        if not (row.cancel_requested or row.terminating or row.timeout_requested):
            continue
        events = sched.store.transitions(row.id)
        stopping = row.cancel_requested or row.timeout_requested
        if stopping or (events and events[-1].event == Transition.PREEMPTING):
            reason = row.reason or "stop resumed after restart"
            sched.calls.stop(row.id, sched.config.grace, reason, now=True)
        else:
            sched.live.jobs[row.id].terminating = False
            sched.store.update_jobs([StoreChange(row.id, {"terminating": False})], sched.clock())
