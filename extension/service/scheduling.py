"""The scheduling loop: the store, the pure core and a backend, tied together.

One task runs cycles, so everything it does is serialized: a cycle (1) takes in the jobs
submitted and applies the cancels asked for since the last one, folds in the events the
backend emitted, (2) runs ``schedule(snapshot, now)`` on the plans and live jobs, (3) writes what
the events and the decisions change to the store in one transaction, one transition row per
change of state or of workers held, and only then (4) carries the decisions out through the
backend protocol. The store is called from threads (storecalls.py; the loop blocks on the
cycle's own read and write for 50 ms at most, on no other call); a cycle whose write fails
carries out nothing, keeps its events for the next cycle and takes the jobs back as the store
has them. Decisions are never made while a backend call is in progress; what a backend reports
arrives as events for the next cycle. Cycles run on every submission, cancel, plan change and
backend event (paced by pacing.py), and on a steady tick
(``tick`` seconds) so waiting reasons and reservations stay current.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from extension.backends.base import (
    Backend,
    BackendEvent,
    EventKind,
    HasQuota,
    KeepsEnds,
    Opens,
    SyncsQueues,
)
from extension.scheduler import (
    CycleResult,
    IndexCache,
    Instance,
    Job,
    JobState,
    PlanFigures,
    PlanTree,
    SchedulerConfig,
    Snapshot,
    schedule,
)
from extension.storage.quotas import StorageQuotas
from extension.userfs.files import UserFiles
from extension.webapi import Caller

from .actions import Actions
from .backend_calls import BackendCalls
from .cancels import Cancel, Conflict, cancel_change
from .changes import FOLDS, CarryOut, due_timeouts, next_deadline, resume_under_way
from .fair_share import META_KEY as USAGE_KEY
from .fair_share import FairShareHistory, FairShareSettings
from .jobrows import job_spec
from .live import LiveJobs
from .notebook_devices import NotebookDevices
from .pacing import cycle_gap
from .pending_cap import PendingCap
from .queue import WaitingLine
from .records import InstanceBounds, JobKind, StoreChange
from .rows import JobRow
from .runtime_limits import Limits
from .store import FoldFacts, PlanRecord, Store
from .storecalls import StoreCalls, StoreUnavailable
from .submission import Submission

LIVE = (JobState.PENDING.value, JobState.RUNNING.value)
ENDS = (EventKind.FINISHED, EventKind.FAILED, EventKind.LOST)  # kept until stored (KeepsEnds)
Clock = Callable[[], float]


class Scheduler:
    """Plans, jobs and the loop, built from collaborators: the live jobs (live.py), the backend
    calls (backend_calls.py), the actions the REST handlers ask for (actions.py) and the
    waiting line (queue.py). The handlers call the public methods."""

    def __init__(
        self,
        store: Store,
        instance_bounds: InstanceBounds,
        config: SchedulerConfig,
        storage_root: str | Path,
        python: str,
        tick: float = 5.0,
        clock: Clock = time.time,
        log: logging.Logger | None = None,
        max_pending_per_user: int = 0,
        fair_share: FairShareSettings | None = None,
    ) -> None:
        self.store = store
        self.db = StoreCalls(reset=store.engine.dispose)  # every store call, in threads
        self.bounds = instance_bounds
        self.config = config
        self.storage_root = Path(storage_root)
        self.python = python
        self.tick = tick
        self.clock = clock
        self.log = log or logging.getLogger("wmla.service")
        self.backend: Backend | None = None
        self.storage: StorageQuotas | None = None  # the users' storage quotas, when held
        self.instance = Instance(())
        self.plans = PlanTree()
        self.members: dict[str, tuple[list[str], list[str]]] = {}
        self.limits = Limits()  # the plans' runtime limits (runtime_limits.py)
        self.notebook_devices = NotebookDevices(lambda: self.backend, self.log)
        self.live = LiveJobs(self.notebook_devices)  # pending and running jobs (live.py)
        self.pending_cap = PendingCap(
            max_pending_per_user, self.live.jobs.values, lambda: self.cycles
        )
        # the usage history the fair share weighs (docs/scheduling.md "Deserved share 2")
        self.fair_share = FairShareHistory(fair_share or FairShareSettings(), self.log)
        self.index_cache = IndexCache()  # ours, kept between cycles (docs/scheduling.md "Cost")
        self.result: CycleResult | None = None  # the last cycle's
        self.reserved: str | None = None  # CycleResult.reserved, passed to the next cycle
        self.cycles = 0
        self.last_error: str | None = None  # why the last cycle failed, while it does
        self.calls = BackendCalls(lambda: self.backend, self.emit, clock, self.log)
        self.actions = Actions(self)
        self._events: list[BackendEvent] = []
        self._wake = asyncio.Event()
        self._waiters: list[asyncio.Future] = []
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self.lock = asyncio.Lock()  # a cycle, a cancel, a plan change: one at a time
        self._stale = False  # the last cycle's write failed: reload the jobs from the store
        # submitted since the last cycle: stored by its transaction (group commit)
        self._submitted: list[tuple[JobRow, asyncio.Future]] = []
        self._cancels: list[Cancel] = []  # asked for since the last cycle (cancels.py)
        # the latest checkpoint report per job since the last cycle: coalesced, and no cycle
        # of their own (they change the victims' order only; the next cycle folds them)
        self._checkpoints: dict[str, BackendEvent] = {}
        self._listeners()

    def _listeners(self) -> None:
        """Who hears of each cycle: the hooks, and the waiting line as the first of them."""
        self.cycle_hooks: list[Callable[[Any, float, float], None]] = []  # (result, now, s)
        # hook(decisions, now) once a cycle's (job id, kind, detail) are stored (metering's
        # churn counters); must not raise
        self.decision_hooks: list[Callable[[list[tuple[str, str, dict]], float], None]] = []
        # every pending job's place in line, reason and start estimate (queue.py), off the loop
        self.queue = WaitingLine(self)
        self.cycle_hooks.append(self.queue.after_cycle)

    # -- start and stop -----------------------------------------------------------------------
    def load(self, default_plans: dict[str, dict] | None = None) -> None:
        """Read plans and live jobs from the store; seed the default plans on the first start."""
        records = self.store.plans()
        if not records and default_plans and self.store.get_meta("seeded") is None:
            tree = PlanTree.from_dict(default_plans)
            records = [
                PlanRecord(
                    p.path,
                    p.share,
                    p.limit,
                    p.user_leaf,
                    list((default_plans.get(p.path) or {}).get("members", {}).get("users", [])),
                    list((default_plans.get(p.path) or {}).get("members", {}).get("groups", [])),
                )
                for p in tree
            ]
            self.store.save_plans(records, self.clock())
            self.store.set_meta("seeded", "1")
        self.plans = PlanTree()
        self.limits.load(records)
        for rec in sorted(records, key=lambda r: (r.path.count("/"), r.path)):
            self.plans.add(rec.path, rec.share, rec.limit, user_leaf=rec.user_leaf)
            self.members[rec.path] = (rec.users, rec.groups)
        self._reload_jobs()
        self.fair_share.load(self.store.get_meta(USAGE_KEY))

    def _reload_jobs(self, rows: list[JobRow] | None = None) -> None:
        self.live.clear()
        for row in self.store.jobs(states=LIVE) if rows is None else rows:
            self.live.take_in(row)

    async def start(self, backend: Backend, run_loop: bool = True) -> None:
        """Attach the backend, re-adopt running jobs, and start the loop task (tests may drive
        ``cycle()`` themselves with ``run_loop=False``)."""
        self._loop = asyncio.get_running_loop()
        self.backend = backend
        if isinstance(backend, Opens):  # e.g. the Kubernetes backend lists the cluster first
            await backend.open()
        self._refresh_instance()
        self.sync_queues()
        live = self.store.jobs(states=[JobState.RUNNING.value])
        running = [r for r in live if r.kind != JobKind.NOTEBOOK]
        self.notebook_devices.keep({r.id for r in live if r.kind == JobKind.NOTEBOOK})
        if running or isinstance(backend, KeepsEnds):  # ends kept but stored go there too
            await backend.recover([job_spec(r) for r in running])
            resume_under_way(self, running)
        if run_loop:
            self.start_loop()

    def start_loop(self) -> None:
        """Start the loop task (``start`` does unless told not to)."""
        self._task = asyncio.ensure_future(self._run())

    @property
    def loop_started(self) -> bool:
        return self._task is not None

    @property
    def loop_running(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def events_waiting(self) -> list[BackendEvent]:
        """The backend's events the next cycle folds (checkpoints aside)."""
        return list(self._events)

    def _refresh_instance(self) -> None:
        """The instance the core sees: the backend's nodes now, cut by the configured quota
        and by the backend's own (a namespace ResourceQuota on Kubernetes) when it has one."""
        backend = self.backend
        assert backend is not None
        quota = self.bounds.quota
        if isinstance(backend, HasQuota):
            quota = quota.cap(backend.quota())
        self.instance = Instance(tuple(backend.capacity()), quota, self.bounds.max_jobs)

    def sync_queues(self) -> None:
        """Backends that mirror the plan tree (Volcano queues) get it after every change."""
        if isinstance(self.backend, SyncsQueues):
            self.calls.sync_queues(self.plans.copy())

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, 30)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                self._task.cancel()
        self.queue.close()
        tasks = self.calls.under_way()
        if tasks:  # a stop in its grace period finishes; the workers outlive us anyway
            await asyncio.wait(tasks, timeout=5)
        if self.backend is not None:
            await self.backend.close()
        self.db.close()

    # -- events from the backend (any thread) ------------------------------------------------------
    def emit(self, event: BackendEvent) -> None:
        """The ``emit`` callable given to the backend; safe to call from any thread. A
        ``checkpoint`` replaces the job's last one and waits for the next cycle; every other
        event asks for a cycle."""
        loop = self._loop
        here = loop is None or _in_loop(loop)
        if event.kind is EventKind.CHECKPOINT:
            if here:
                self._checkpoints[event.job_id] = event
            else:
                loop.call_soon_threadsafe(self._checkpoints.__setitem__, event.job_id, event)
        elif here:
            self._events.append(event)
            self._wake.set()
        else:
            loop.call_soon_threadsafe(self._events.append, event)
            loop.call_soon_threadsafe(self._wake.set)

    async def cancel_through_cycle(self, cancel: Cancel) -> None:
        """Hand a cancel to the next cycle, which applies and stores it with everything else
        it writes; returns once it is stored (Conflict: nothing to cancel). Where cycles are
        driven by hand (tests), the cancel runs one."""
        self._cancels.append(cancel)
        if self.loop_running:
            self._wake.set()
        else:
            try:
                await self.cycle()
            except Exception:
                if not cancel.done.done():  # failed before it took the cancel
                    self._cancels.remove(cancel)
                    raise
        await cancel.done

    async def through_cycle(self, row: JobRow) -> None:
        """Hand a new job to the next cycle, which stores it with everything else it writes, in
        one commit, and decides on it; returns once it is stored (``row`` as the cycle left it)."""
        stored = asyncio.get_running_loop().create_future()
        self._submitted.append((row, stored))
        self._wake.set()
        await stored

    # -- what the REST handlers ask for (actions.py) ------------------------------------------
    def may_submit(self, caller: Caller, plan: str) -> bool:
        return self.actions.may_submit(caller, plan)

    def usable_plans(self, caller: Caller) -> list[str]:
        return self.actions.usable_plans(caller)

    async def submit_once(
        self,
        caller: Caller,
        sub: Submission | Callable[[], Awaitable[Submission]],
        key: str,
        digest: str,
    ) -> tuple[JobRow, bool]:
        return await self.actions.submit_once(caller, sub, key, digest)

    async def submit(
        self, caller: Caller, sub: Submission, key: str | None = None, digest: str = ""
    ) -> JobRow:
        return await self.actions.submit(caller, sub, key=key, digest=digest)

    def files_for(self, user: str, create: bool = False) -> UserFiles:
        return self.actions.files_for(user, create)

    async def visible_job(self, caller: Caller, job_id: str) -> JobRow:
        return await self.actions.visible_job(caller, job_id)

    async def cancel(self, caller: Caller, job_id: str) -> JobRow:
        return await self.actions.cancel(caller, job_id)

    def notebook_jobs(self) -> list[str]:
        return self.live.notebooks()

    async def release_notebook(self, job_id: str, reason: str) -> None:
        await self.actions.release_notebook(job_id, reason)

    async def change_plans(
        self, records: list[PlanRecord], create: bool, delete: Iterable[str] = ()
    ) -> None:
        await self.actions.change_plans(records, create, delete)

    def live_jobs_under(self, path: str) -> list[Job]:
        return self.actions.live_jobs_under(path)

    def record(self, path: str) -> PlanRecord:
        return self.actions.record(path)

    async def kick(self) -> None:
        """Ask for a cycle and wait until one that started after this call has finished."""
        if not self.loop_running:
            return
        future = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        self._wake.set()
        await future

    @property
    def jobs(self) -> Mapping[str, Job]:
        """The live jobs in the core's terms, by id (a view of ``live``)."""
        return self.live.jobs

    @property
    def runtimes(self) -> dict[str, float]:
        """Live job id -> its runtime limit in seconds (the waiting line reads it)."""
        return self.live.runtimes()

    @property
    def figures(self) -> dict[str, PlanFigures]:
        """Every plan's figures after the last cycle, built when first read (not every tick)."""
        return self.result.plans if self.result is not None else {}

    # -- the loop -----------------------------------------------------------------------
    async def _run(self) -> None:
        began = -math.inf  # the last cycle's start (perf_counter)
        took = 0.0  # the last cycle's length
        while not self._stopping:
            # while the store is down, try again every second (kept events wait to be stored)
            up = self.db.up and not self._stale
            wait = self.tick if up else min(self.tick, 1.0)
            due = next_deadline(self) if up else None  # (down: a try every second anyway)
            if due is not None:  # a runtime limit is reached at its time, not the next tick
                wait = min(wait, max(0.0, due - self.clock()) + 0.01)
            try:
                await asyncio.wait_for(self._wake.wait(), wait)
            except asyncio.TimeoutError:
                pass
            rest = cycle_gap(took) - (time.perf_counter() - began)
            if rest > 0:  # what arrives meanwhile joins this cycle
                await asyncio.sleep(rest)
            began = time.perf_counter()
            self._wake.clear()
            waiters, self._waiters = self._waiters, []
            await self.run_cycle()
            took = time.perf_counter() - began
            for future in waiters:
                if not future.done():
                    future.set_result(None)

    async def run_cycle(self) -> bool:
        """One cycle as the loop runs it: a failure is logged and kept in ``last_error`` (for
        /health and the admin page) until a cycle succeeds; the next one retries."""
        try:
            await self.cycle()
        except StoreUnavailable as err:  # said once by storecalls; retried every second
            self.log.debug("scheduling cycle not stored: %s", err)
            self.last_error = f"{type(err).__name__}: {err}"[:500]
            return False
        except Exception as err:  # one bad cycle must not end the loop
            self.log.exception("scheduling cycle failed")
            self.last_error = f"{type(err).__name__}: {err}"[:500]
            return False
        self.last_error = None
        return True

    async def cycle(self) -> None:
        """One pass: events, decisions, store, then backend calls (in that order)."""
        async with self.lock:
            await self._cycle()

    async def _cycle(self) -> None:
        now = self.clock()
        began = time.perf_counter()
        if self._stale:  # the last write failed: the store has the truth
            self._reload_jobs(await self.db.read(self.store.jobs, states=LIVE))
            self._stale = False
        # the checkpoints first: they were written before any end reported with them
        events = [*self._checkpoints.values(), *self._events]
        self._checkpoints, self._events = {}, []
        submitted, self._submitted = self._submitted, []
        for row, _ in submitted:  # decided on in this very cycle
            if row.id not in self.live:
                self.live.take_in(row)
        cancels = self._take_cancels()
        new_rows = [row for row, _ in submitted]
        try:
            result, log = await self._decide_and_store(events, new_rows, cancels, now)
        except BaseException as err:
            await self._undo(events, submitted, cancels, err)
            raise
        self.result = result
        self._ends_stored(events)
        for done in [done for _, done in submitted] + [c.done for c, _ in cancels]:
            if not done.done():
                done.set_result(None)
        # the reservation holder is tried first next cycle (docs/scheduling.md "Admission 4"):
        # what a reclaim freed goes to the reclaimer, not back to its victim
        self.reserved = result.reserved
        self.calls.run_queued()
        saved = self.fair_share.to_save(now)
        if saved is not None:  # a failed save is retried at the next one
            with contextlib.suppress(Exception):
                await self.db.write(self.store.set_meta, USAGE_KEY, saved)
        seconds = time.perf_counter() - began
        hooks = [(h, (result, now, seconds)) for h in self.cycle_hooks]
        hooks += [(h, (log, now)) for h in self.decision_hooks if log]
        for hook, args in hooks:
            try:
                hook(*args)
            except Exception:  # a listener's failure is not the cycle's
                self.log.exception("cycle hook %r failed", hook)

    def _ends_stored(self, events: list[BackendEvent]) -> None:
        """The cycle stored these events: a backend that keeps jobs' ends until then
        (``KeepsEnds``) may drop them now."""
        backend = self.backend
        if not isinstance(backend, KeepsEnds):
            return
        ended = {e.job_id for e in events if e.kind in ENDS}
        if ended:
            try:
                backend.ends_stored(ended)
            except Exception:  # kept a while longer: the next start drops them
                self.log.exception("the backend could not drop the stored ends of %s", ended)

    def _take_cancels(self) -> list[tuple[Cancel, StoreChange | None]]:
        """The cancels asked for since the last cycle, applied to the live jobs (before the
        events: they were asked for first); one with nothing to cancel is answered at once."""
        cancels, self._cancels = self._cancels, []
        out = []
        for cancel in cancels:
            try:
                out.append((cancel, cancel_change(self, cancel)))
            except Conflict as err:
                if not cancel.done.done():
                    cancel.done.set_exception(err)
        return out

    async def _decide_and_store(
        self,
        events: list[BackendEvent],
        new_rows: list[JobRow],
        cancels: list[tuple[Cancel, StoreChange | None]],
        now: float,
    ) -> tuple[CycleResult, list[tuple[str, str, dict]]]:
        """Steps 1-3: fold the events, run the core, store it all in one transaction; returns
        the result and the decisions stored."""
        # what the leaves held since the last cycle, as it left them: an event wakes a cycle
        # within milliseconds, so before they are folded is what was held until now
        usage = self.fair_share.advance(now, self.jobs.values())
        asked = [(c.at, change) for c, change in cancels if change is not None]
        facts = {}
        if events:
            facts = await self.db.cycle_read(self.store.fold_facts, {e.job_id for e in events})
        for _, change in asked:  # the events see a cancel as stored before them
            found = facts.get(change.job_id)
            if found is not None and change.values.get("cancel_requested"):
                facts[change.job_id] = replace(found, cancel_requested=True, reason=change.reason)
        folded = [*asked, *self._fold_events(events, facts, now)]
        # before the core: a job stopping at its limit is terminating (its resources on their
        # way back, never a victim), a notebook ended there frees its resources in this cycle
        timeouts = due_timeouts(self, now)
        self._refresh_instance()
        jobs = list(self.jobs.values())
        snapshot = Snapshot(
            self.plans, self.instance, jobs, self.config, reserved=self.reserved, usage=usage
        )
        result = schedule(snapshot, now, self.index_cache)
        self.cycles += 1
        changes, log = self._apply(result, now)
        changes[:0] = timeouts
        if folded or changes or log or new_rows:
            await self.db.cycle_write(self.store.commit_cycle, folded, changes, now, log, new_rows)
        elif not self.db.up:  # nothing to store: find out whether the store is back
            await self.db.write(self.store.set_meta, "probe", repr(now), probe=True)
        return result, log

    async def _undo(
        self,
        events: list[BackendEvent],
        submitted: list[tuple[JobRow, asyncio.Future]],
        cancels: list[tuple[Cancel, StoreChange | None]],
        err: BaseException,
    ) -> None:
        """Nothing of the cycle is stored: carry none of it out, keep its events (they are
        folded again next cycle), tell its submitters and cancellers, and take the jobs back as
        the store has them."""
        self.calls.discard_queued()
        self._events[:0] = events
        answers = [(done, "the job was not stored") for _, done in submitted]
        answers += [(c.done, "the job was not cancelled") for c, _ in cancels]
        for done, what in answers:
            if not done.done():
                done.set_exception(_failed_write(err, what))
        self._stale = True
        with contextlib.suppress(Exception):  # else the next cycle reloads first
            self._reload_jobs(await self.db.read(self.store.jobs, states=LIVE))
            self._stale = False

    async def drain(self) -> None:
        """Wait for every backend call under way (tests, shutdown)."""
        await self.calls.drain()

    def _fold_events(
        self, events: list[BackendEvent], rows: dict[str, FoldFacts], now: float
    ) -> list[tuple[float, StoreChange]]:
        """Each event's change to its job, stamped with when it happened, not when it is read."""
        folded = []
        for ev in events:
            job = self.jobs.get(ev.job_id)
            row = rows.get(ev.job_id)
            if job is None or row is None:
                continue  # a late event for a job that already ended
            change = self._event_change(job, row, ev)
            if change is not None:
                folded.append((ev.at or now, change))
        return folded

    def _event_change(self, job: Job, row: FoldFacts, ev: BackendEvent) -> StoreChange | None:
        """What the event changes; one fold per kind (docs/service.md "The scheduling loop")."""
        return FOLDS[ev.kind](self, job, row, ev)

    def _apply(
        self, result: CycleResult, now: float
    ) -> tuple[list[StoreChange], list[tuple[str, str, dict]]]:
        """The decisions applied to the live jobs; returns the store's (changes, decisions)."""
        carry = CarryOut(self, now, result.aged)
        live, waiting = self.live, result.waiting
        for d in result.decisions:
            record = live.get(d.job_id)
            if record is None:
                continue
            carry.apply(d, record.job)
            record.reason = None
        changes, log = carry.changes, carry.log
        for job_id, reason in waiting.items():
            record = live.get(job_id)
            if record is not None and record.reason != reason:  # write only what changed
                changes.append(StoreChange(job_id, {"reason": reason}))
                record.reason = reason
        return changes, log


def _failed_write(err: BaseException, what: str) -> Exception:
    """What a submitter or canceller of a cycle that stored nothing is told (each its own
    exception)."""
    if isinstance(err, StoreUnavailable):
        return StoreUnavailable(str(err), err.retry_after)
    return RuntimeError(f"the scheduling cycle failed, {what}: {err}")


def _in_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return threading.current_thread() is threading.main_thread() and not loop.is_running()
