"""The waiting line: every pending job's place in line, why it waits, and its estimated start
(docs/service.md "Why a job waits, and until when").

After a cycle that leaves jobs pending, the line is worked out again off the scheduling loop: the
live jobs are copied, each running job's end and each pending job's runtime are set by
``extension/sim/runtimes.py`` (its runtime limit; without one, the median runtime of that user's
last jobs of its kind that ran their course in its plan (finished, reached their limit, a notebook
its user stopped), else the plan's, else ``default_runtime``: a guess, and the assumption says so; a
running job past its guess runs as long again), and the real core is run forward in simulated time
with no new submissions (``extension/sim/estimate.py``) in a child process, so the loop's decisions
never wait for it. The places in line are the order in which that forward run starts the jobs: the
line is the core's own fair order played out, not a second ordering that could disagree with it. At
most one forward run is under way; the next starts ``interval`` seconds after the last at the
earliest, and no sooner than ``DUTY`` times as long as the last took (a tenth of a core at most,
whatever the instance's size); each is cut at ``budget`` seconds of work (later starts are binned,
then left unestimated).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import copy
import logging
import multiprocessing
import time
from collections.abc import Callable
from typing import Any, Protocol

from extension.queue_text import ordinal
from extension.scheduler import (
    CycleResult,
    Instance,
    JobState,
    PlanTree,
    SchedulerConfig,
    Snapshot,
)
from extension.scheduler.resources import format_amount
from extension.sim.runtimes import RunHistory, forward_inputs

from .live import LiveJobs
from .rows import JobRow
from .store import Store
from .storecalls import StoreCalls

HISTORY_SECONDS = 60.0  # finished jobs' runtimes are read again at most this often
HISTORY_ROWS = 5000  # the most recent finished jobs they are read from
SETTLE = 2  # cycles the loop runs on a decision's backend events at the same instant
DUTY = 10  # a refresh waits at least this many times as long as the last one took


class LineSource(Protocol):
    """What the line reads of the scheduler: its plans, instance and live jobs, the last
    cycle's result, and the store (the runtimes of the jobs that ran their course)."""

    plans: PlanTree
    instance: Instance
    config: SchedulerConfig
    reserved: str | None
    live: LiveJobs
    result: CycleResult | None
    store: Store
    db: StoreCalls
    log: logging.Logger
    clock: Callable[[], float]

    @property
    def loop_started(self) -> bool: ...

    @property
    def runtimes(self) -> dict[str, float]: ...


class WaitingLine:
    """The line of one Scheduler (``sched.queue``): ``view(job_id)`` for the job's JSON,
    ``views()`` for the admin page and metering; ``refresh()`` runs one forward estimate;
    ``after_cycle`` is the scheduler's cycle hook that starts one when it is time."""

    def __init__(
        self,
        sched: LineSource,
        interval: float = 2.0,
        budget: float = 0.15,
        default_runtime: float = 3600.0,
        history: int = 20,
        in_process: bool = True,
    ) -> None:
        self.sched = sched
        self.interval = interval  # 0: no estimates (positions and reasons only)
        self.budget = budget
        self.default_runtime = default_runtime
        self.history = history
        self.in_process = in_process
        self.log: logging.Logger = getattr(sched, "log", logging.getLogger("wmla.service"))
        self._views: dict[str, dict] = {}
        self._history = RunHistory(history)
        self._history_at = -HISTORY_SECONDS
        self._pool: concurrent.futures.Executor | None = None
        self._running: asyncio.Task | None = None
        self._again: asyncio.TimerHandle | None = None
        self._last = -1e18  # monotonic time the last forward run began
        self._closed = False
        self.runs = 0  # forward runs done (the tests read it)
        self.last_wall: float | None = None  # seconds the last refresh took, start to views

    # -- what the API shows --------------------------------------------------------------------
    def view(self, row: JobRow) -> dict | None:
        """The ``queue`` object of a job's JSON: None unless it is pending."""
        if row.state != JobState.PENDING.value:
            return None
        found = self._views.get(row.id)
        if found is not None:
            return found
        # not in a forward run yet (submitted since): what the last cycle said
        return {"position": None, "plan": row.plan, "reason": row.reason, "estimate": None}

    def views(self) -> dict[str, dict]:
        """Every pending job's ``queue`` object that a forward run placed, by job id."""
        return dict(self._views)

    # -- refreshing ----------------------------------------------------------------------------
    def after_cycle(self, result: Any, now: float, seconds: float) -> None:
        """A cycle hook (runs on the loop): start a forward run unless one is under way or the
        last began less than ``interval`` ago; then one is started when that time is up."""
        if self._closed or self.interval <= 0 or not self.sched.loop_started:
            return
        if not any(j.state is JobState.PENDING for j in self.sched.live.jobs.values()):
            self._views = {}
            return
        if self._running is not None or self._again is not None:
            return
        # at most one run in DUTY's worth of time: a big instance's long runs come less often
        spacing = max(self.interval, DUTY * (self.last_wall or 0.0))
        wait = self._last + spacing - time.monotonic()
        if wait > 0:
            loop = asyncio.get_running_loop()
            self._again = loop.call_later(wait, self._start_again)
        else:
            self._running = asyncio.ensure_future(self._refresh_logged())

    def _start_again(self) -> None:
        self._again = None
        if not self._closed and self._running is None:
            self._running = asyncio.ensure_future(self._refresh_logged())

    async def _refresh_logged(self) -> None:
        try:
            await self.refresh()
        except Exception:  # an estimate that failed is not the service's failure
            self.log.exception("estimating the waiting line failed")
        finally:
            self._running = None

    async def refresh(self) -> None:
        """One forward run from the service's state now, then the views rebuilt from it."""
        sched = self.sched
        self._last = time.monotonic()
        now = sched.clock()
        jobs = [copy.copy(j) for j in sched.live.jobs.values()]  # the loop changes the live ones
        usage = sched.fair_share.usage_now(now)  # the estimate weighs shares as cycles do
        snapshot = Snapshot(
            sched.plans, sched.instance, jobs, sched.config, sched.reserved, usage=usage
        )
        limits = dict(sched.runtimes)  # live job id -> its runtime limit
        if now - self._history_at >= HISTORY_SECONDS:
            self._history = await sched.db.read(self._history_now)
            self._history_at = now
        ends, runtimes, guessed = forward_inputs(
            jobs,
            now,
            sched.config.grace,
            limits,
            sched.live.kinds(),
            self._history,
            self.default_runtime,
        )
        loop = asyncio.get_running_loop()
        pool = self._executor()
        args = (snapshot, now, ends, runtimes)
        try:
            estimates = await loop.run_in_executor(pool, _forward, args, self.budget)
        except concurrent.futures.process.BrokenProcessPool:
            self._pool = None  # the child died (killed, out of memory): a new one next time
            raise
        self.runs += 1
        self._views = self._build(jobs, estimates, now, guessed)
        self.last_wall = time.monotonic() - self._last

    def _history_now(self) -> RunHistory:
        """In a store thread: the runtimes of the jobs that ran their course lately."""
        history = RunHistory(self.history)
        rows = self.sched.store.ran_their_course(HISTORY_ROWS)
        for user, plan, kind, started, end in reversed(rows):  # the most recent last
            if end is not None and end >= started:
                history.add(user, plan, kind, end - started)
        return history

    def _executor(self) -> concurrent.futures.Executor:
        if self._pool is None:
            if self.in_process:
                # spawn, not fork: the service has threads (store calls, backends) that a
                # forked child would inherit mid-call
                context = multiprocessing.get_context("spawn")
                self._pool = concurrent.futures.ProcessPoolExecutor(1, mp_context=context)
            else:
                self._pool = concurrent.futures.ThreadPoolExecutor(1, "wmla-estimate")
        return self._pool

    def _build(self, jobs: list, estimates: Any, now: float, guessed: set[str]) -> dict:
        """The views of the jobs still pending now, placed in the forward run's start order."""
        sched = self.sched
        live = sched.live.jobs
        placed = estimates.jobs
        pending = [
            j
            for j in jobs
            if j.id in placed and j.id in live and live[j.id].state is JobState.PENDING
        ]
        pending.sort(key=lambda j: estimates.jobs[j.id].rank)
        result = sched.result
        waiting = result.waiting if result is not None else {}
        figures = result.plans if result is not None else {}
        unlimited = sum(1 for j in jobs if j.state is not JobState.PENDING and j.id in guessed)
        assumption = _assumption(unlimited, estimates.exact)
        by_leaf: dict[str, int] = {}
        by_plan: dict[str, int] = {}
        views = {}
        for place, job in enumerate(pending, 1):
            leaf_place = by_leaf[job.leaf] = by_leaf.get(job.leaf, 0) + 1
            plan_place = by_plan[job.plan] = by_plan.get(job.plan, 0) + 1
            reason = waiting.get(job.id, "")
            views[job.id] = {
                "position": {"leaf": leaf_place, "plan": plan_place, "instance": place},
                "plan": job.plan,
                "reason": waiting_reason(job, plan_place, figures.get(job.plan), reason),
                "estimate": _estimate(estimates.jobs[job.id], now, estimates, assumption),
                "updated": now,
            }
        return views

    def close(self) -> None:
        self._closed = True
        if self._again is not None:
            self._again.cancel()
        if self._pool is not None:
            with contextlib.suppress(Exception):
                self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def _forward(args: tuple, budget: float) -> Any:
    """In the child: the forward run (a module-level function, so it pickles by name)."""
    from extension.sim.estimate import estimate_starts

    snapshot, now, ends, runtimes = args
    return estimate_starts(snapshot, now, ends, runtimes, budget_s=budget, settle=SETTLE)


# -- words ---------------------------------------------------------------------------------
def in_words(seconds: float) -> str:
    """``within a minute``, ``in about 12 minutes``, ``in about 3 hours``, ``in about 2 days``."""
    if seconds < 60:
        return "within a minute"
    return f"in about {duration_words(seconds)}"


def duration_words(seconds: float) -> str:
    """``1 minute``, ``12 minutes``, ``3 hours``, ``2 days`` (rounded)."""
    minutes = max(1, round(seconds / 60))
    if minutes < 90:
        return f"{minutes} minute{'s' if minutes != 1 else ''}"
    hours = round(seconds / 3600)
    if hours < 36:
        return f"{hours} hours"
    return f"{round(seconds / 86400)} days"


def waiting_reason(job: Any, plan_place: int, figures: Any, reason: str) -> str:
    """``3rd in line in /project1/qa-team; qa-team holds 8 of its 8 deserved GPUs; <the core's
    reason>``: the resource named is the job's own (GPUs, else CPUs)."""
    parts = [f"{ordinal(plan_place)} in line in {job.plan}"]
    if figures is not None:
        name = job.plan.rsplit("/", 1)[-1] or job.plan
        if job.per_worker.gpu > 0:
            held, deserved, unit = figures.allocated.gpu, figures.deserved.gpu, "GPUs"
        else:
            held, deserved, unit = figures.allocated.cpu / 1000, figures.deserved.cpu / 1000, "CPUs"
        parts.append(f"{name} holds {_figure(held)} of its {_figure(deserved)} deserved {unit}")
    if reason:
        parts.append(reason)
    return "; ".join(parts)


def _figure(value: float) -> str:
    return format_amount("gpu", round(value, 1)).split(" ")[0]


ROUGH = (
    "this far down the line the start is rough: counted on the instance's total free "
    "capacity and the plans' shares, not on nodes"
)


def _assumption(unlimited: int, exact: bool) -> str:
    text = "running jobs end at their runtime limits"
    if unlimited:
        if unlimited == 1:
            text += " (1 has none: its end is estimated from its user's finished jobs)"
        else:
            text += f" ({unlimited} have none: their ends are estimated from their users' "
            text += "finished jobs)"
    text += "; no new submissions"
    if not exact:
        text += "; later events are grouped to bound the cost"
    return text


NO_START = "no start in sight: what it waits for does not end under these assumptions"


def _estimate(estimate: Any, now: float, estimates: Any, assumption: str) -> dict:
    start = estimate.start
    if estimate.rough:  # the rough tail's start (extension/sim/tail.py)
        assumption += "; " + ROUGH
    if start is None:
        return {
            "start": None,
            "in_seconds": None,
            "text": NO_START,  # a cut run's rough tail starts every job anything frees for
            "assumption": assumption,
            "exact": False,
        }
    wait = max(0.0, start - now)
    return {
        "start": max(start, now),
        "in_seconds": round(wait),
        "text": in_words(wait),
        "assumption": assumption,
        "exact": bool(estimates.exact),
    }
