"""Estimated start: the real core run forward in simulated time from a service's state, with no
new arrivals, gives every pending job the time it would start (docs/simulate.md "Estimated
start").

``estimate_starts(snapshot, now, ends, runtimes)`` copies the live jobs and repeats, from
``now``: apply what happens by the next event time, run ``schedule`` on the jobs as they are
then, carry its decisions out through ``dispatch`` (``_Forward`` is the handler), carry the
reservation to the next cycle (``CycleResult.reserved`` -> ``Snapshot.reserved``, as the
service does), until every job pending in the snapshot has started, nothing more can happen,
or the budget is spent. What happens, and when:

- a running job of the snapshot stops holding its resources at ``ends[job_id]`` (the caller's
  figure: start + runtime limit, a history estimate, now + grace for a terminating one; a
  missing or past entry means ``now``) and is gone. A terminating job that also has an entry in
  ``runtimes`` is a preempted victim: at its end it is pending again with that runtime left;
  without one it is gone (the snapshot does not say whether a stop is a preemption, a shrink
  or a cancel);
- a started job runs ``runtimes[job_id]`` seconds (a job without an entry never ends within
  the forward run: it holds what it got, so the others' estimates err late, never early);
  an elastic job's end does not move when it grows or shrinks;
- a job preempted in the forward run keeps its resources through ``Preempt.grace`` and is then
  pending again with the rest of its runtime (nothing lost: the runtime checkpoints on
  SIGTERM); a shrink releases its workers after ``Shrink.grace``; a grow adds workers at once;
- ``min_runtime`` running out for a job is an event of its own (a reclaim it held back can
  happen then, as the simulator's instant timing has it);
- nothing is submitted or cancelled: the estimate is what the line looks like if nobody else
  comes. A later submission that the fair order puts ahead makes a job start later than its
  estimate; the estimate is not a promise.

The first cycle runs at ``now`` on the snapshot as given. The state a cycle at ``now`` would
see is the simulator's (tests/sim/test_estimate.py takes it so, and the estimate is then the
real start exactly); a service that takes it just after its own cycle gets one more cycle at
``now`` than it runs itself (a decision its next event or tick would take comes that early).

Settling. The service's loop runs a cycle on every backend event, so a cycle that starts a
job is followed, within milliseconds, by another (on that job's ``running`` event) that may
decide again on the new state: e.g. reclaim from a gang the reservation just started. With
``settle`` = n, up to n more cycles run at the same instant after one that decided something
(the service passes 2); 0 is the simulator's instant timing, a cycle only at an event.

Cost and binning. A cycle is O(jobs + plans): at 1,000 pending on 512 nodes a settled one
takes 50-100 ms, so one cycle per distinct end time (hundreds) does not fit a service's
refresh. The forward run sizes itself on the cycles it has run: with ``k`` more cycles
affordable in what is left of ``budget_s`` (the median wall time of the last five cycles is
the price of the next) and fewer than the events still to come, the next cycle takes every
event up to a bin's end and runs at the last of them. Bins widen geometrically from ``now``
to a guess of when the last pending job starts (``now`` + the work left over the capacity,
the most of any resource): a bin that begins ``d`` after ``now`` ends ``d * q`` after it,
``q`` chosen so that ``k`` such bins reach the guess; so a start errs late by about ``q - 1``
of its own wait, little near ``now`` and more far away. While the budget allows it every
event time gets its own cycle: tens of jobs (under a millisecond a cycle) are exact within
the default budget on an idle machine, and a caller that needs exactness whatever the load
passes a roomy budget. The first cycle always runs, whatever it costs; a later one only
while what is left, less what the rough tail will cost (``TAIL_PER_JOB`` per live job),
covers ``HEADROOM`` (3) times its price: a cycle after a batch of events can start and
reclaim far more than the ones it is priced by (at 1,000 pending on 512 nodes the cycle that
takes the first victims back costs 100-400 ms after a 30-50 ms one), and one such overrun
misses a 200 ms goal by far. When the budget runs out, ``exact`` is False and the jobs not
started yet get their starts from the rough tail (tail.py: a capacity model continued from
where the core stopped, ``Estimate.rough``); a job that gets no start at all (``None``) is
one that nothing it waits for ever frees, under these assumptions.

Determinism: the same inputs give the same estimates whenever the run is exact; a binned or
cut run depends on how many cycles the machine affords within the budget.
"""

from __future__ import annotations

import copy
import heapq
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass

from extension.scheduler import (
    Grow,
    IndexCache,
    Job,
    JobState,
    Preempt,
    Reject,
    Shrink,
    Snapshot,
    Start,
    dispatch,
    schedule,
)

from .metrics import EPS  # event times this close are one instant, as in the simulator
from .tail import TailWorld, rough_starts

HEADROOM = 3.0  # a later cycle runs only while the budget left covers this many of its price
BATCH_SCALE = 10.0  # the most a batch of events scales a cycle's price by (_Forward._scale)
TAIL_PER_JOB = 15e-6  # what the rough tail (tail.py) costs per live job, kept back for it
_NEVER = math.inf

# event kinds
_END = "end"  # the job stops holding its resources and is gone
_RELEASE = "release"  # a preempted job's grace is over: pending again with its runtime left
_SHRUNK = "shrunk"  # a shrink's grace is over: the released workers are gone
_WAKE = "wake"  # a job's min_runtime runs out: it may be a victim from now on


@dataclass(frozen=True)
class Estimate:
    """One pending job's estimate. ``start``: its simulated start, None when the forward run
    did not reach it (budget or horizon). ``rank``: its 0-based place in the forward start
    order over the whole instance (ties within one cycle: the order of the core's Start
    decisions); jobs never reached come after, by (priority desc, submitted asc, id)."""

    start: float | None
    rank: int
    rough: bool = False  # the start is the rough tail's (tail.py), not the core's


@dataclass
class Estimates:
    """The forward run's answer: ``jobs`` has every pending job of the snapshot."""

    jobs: dict[str, Estimate]
    cycles: int  # core cycles run
    exact: bool  # every distinct event time got its own cycle (no binning, nothing cut)
    horizon: float  # the last simulated time reached
    seconds: float  # wall time spent
    rough: int = 0  # jobs whose start is the rough tail's (the budget cut the core's run)


def estimate_starts(
    snapshot: Snapshot,
    now: float,
    ends: Mapping[str, float],
    runtimes: Mapping[str, float],
    *,
    budget_s: float = 0.15,
    cache: IndexCache | None = None,
    settle: int = 0,
) -> Estimates:
    """Every pending job's estimated start by the real core run forward from ``snapshot`` at
    ``now`` with no new arrivals (module docstring: the assumptions, the binning, the budget).
    ``cache``: a plan index to keep between calls (default: a fresh one for this run, so a
    forward run never takes the service's own). ``settle``: up to that many more cycles at the
    same instant after one that decided something (module docstring, "Settling")."""
    clock = time.perf_counter()
    run = _Forward(snapshot, now, ends, runtimes, cache if cache is not None else IndexCache())
    run.settle = settle
    run.until_started(clock + budget_s)
    return run.estimates(time.perf_counter() - clock)


class _Forward:
    """The forward world: copies of the live jobs, the events to come, the starts seen; it is
    also the handler the core's decisions are dispatched to (one method per kind)."""

    def __init__(
        self,
        snapshot: Snapshot,
        now: float,
        ends: Mapping[str, float],
        runtimes: Mapping[str, float],
        cache: IndexCache,
    ) -> None:
        self.snapshot = snapshot
        self.now = self.t = now
        self.cache = cache
        self.reserved = snapshot.reserved
        self.min_runtime = snapshot.config.min_runtime
        self.jobs: dict[str, Job] = {}  # live: pending and running, copied (ours to change)
        self.end: dict[str, float] = {}  # running job -> when it stops holding its resources
        self.left: dict[str, float] = {}  # pending job -> how long it runs once started
        self.generation: dict[str, int] = {}  # a bump makes the job's queued end stale
        self.events: list[tuple] = []  # (time, seq, kind, job id, generation, payload)
        self.seq = 0
        self.waiting: dict[str, Job] = {}  # the snapshot's pending jobs not started yet
        self.order: list[str] = []  # the snapshot's pending jobs in forward start order
        self.starts: dict[str, float] = {}
        self.pending: list[Job] = []  # the snapshot's pending jobs (for the ranks)
        self.cycles = 0
        self.exact = True
        self.costs: list[float] = []  # wall seconds of the recent cycles (the price of the next)
        self.batches: list[int] = []  # how many events each cycle took (settling ones: none)
        self.settle = 0  # more cycles at an instant after one that decided (estimate_starts)
        self.decided = False  # the last cycle made a decision
        self.tail: dict[str, float] = {}  # the rough tail's starts (tail.py), after a cut
        for job in snapshot.jobs:
            if job.state is JobState.PENDING:
                mine = self._copy(job)
                self.pending.append(mine)
                self.waiting[job.id] = mine
                self.left[job.id] = runtimes.get(job.id, _NEVER)
            elif job.state is JobState.RUNNING:
                mine = self._copy(job)
                stop = max(now, ends.get(job.id, now))
                self.end[job.id] = stop
                if job.terminating and job.id in runtimes:  # a victim: it comes back
                    self._push(stop, _RELEASE, job.id, runtimes[job.id])
                else:
                    self._push(stop, _END, job.id)
                if not job.terminating and job.started is not None:
                    self._wake(job.started)

    def _copy(self, job: Job) -> Job:
        mine = copy.copy(job)
        self.jobs[job.id] = mine
        self.generation[job.id] = 0
        return mine

    # the loop --------------------------------------------------------------------------------
    def until_started(self, deadline: float) -> None:
        first = self._due(self.now)
        self.batches.append(len(first))
        self._apply(first)
        self._cycle(self.now)  # always, whatever it costs: the starts now and the order
        self._settle(self.now, deadline)
        while self.waiting:
            nxt = self._next_time()
            if nxt is None:
                return  # nothing more happens: the rest never start under these assumptions
            price = self._price()
            left = deadline - time.perf_counter() - TAIL_PER_JOB * len(self.jobs)
            until = self._bin_end(nxt, int(left / price)) if left >= HEADROOM * price else nxt
            if left < HEADROOM * price * self._scale(until):
                self.exact = False  # cut by the budget: the rest get the rough tail's starts
                self.tail = rough_starts(self._tail_world(), self.waiting)
                return
            batch = self._due(until)
            self.batches.append(len(batch))
            self._apply(batch)
            self._cycle(self.t)
            self._settle(self.t, deadline)

    def _price(self) -> float:
        """What the next cycle will cost: the median of the last few (one cycle slowed by the
        machine, or the first one building the plan index, does not bin a whole run)."""
        recent = sorted(self.costs[-5:])
        return max(recent[len(recent) // 2], 1e-6)

    def _scale(self, until: float) -> float:
        """How many times its price the cycle that takes the events up to ``until`` may cost:
        the events it takes over the usual batch of the recent cycles, at most ``BATCH_SCALE``
        (the victims of a reclaim coming back at once start a cycle of hundreds of starts)."""
        taken = sum(1 for e in self.events if e[0] <= until + EPS and self._counts(e))
        recent = sorted(self.batches[-5:])
        usual = max(recent[len(recent) // 2], 1)
        return min(max(taken / usual, 1.0), BATCH_SCALE)

    def _bin_end(self, nxt: float, affordable: int) -> float:
        """The last time the next cycle takes events up to: ``nxt`` itself while every event
        to come can have its own cycle, else the end of the geometric bin ``nxt`` falls in."""
        # each pending job adds its end once started, and its min_runtime wake-up
        per_start = 2 if self.min_runtime > 0 else 1
        to_come = len(self.events) + per_start * len(self.waiting)
        if affordable >= to_come:
            return nxt
        guess = self._last_start_guess()
        d = max(nxt - self.now, EPS)
        if guess - self.now <= d:
            return nxt
        q = ((guess - self.now) / d) ** (1.0 / affordable)
        return self.now + d * q

    def _last_start_guess(self) -> float:
        """When the last pending job starts, guessed from the work left: ``t`` + the
        resource-seconds still to run over the capacity, the most of any resource."""
        t = self.t
        work = [0.0, 0.0, 0.0]
        for job_id, job in self.jobs.items():
            if job.state is JobState.RUNNING:
                seconds, workers = self.end.get(job_id, _NEVER) - t, job.workers
            else:
                seconds, workers = self.left.get(job_id, _NEVER), job.min_workers
            if math.isfinite(seconds) and seconds > 0:
                for r, amount in enumerate(job.per_worker):
                    work[r] += seconds * workers * amount
        capacity = self.snapshot.instance.capacity
        spans = [w / c for w, c in zip(work, capacity) if c > 0 and math.isfinite(c)]
        return t + max(spans, default=0.0)

    def _next_time(self) -> float | None:
        """The time of the next event that still counts (stale ends are dropped)."""
        events = self.events
        while events:
            if self._counts(events[0]):
                return events[0][0]
            heapq.heappop(events)
        return None

    def _counts(self, event: tuple) -> bool:
        """A wake-up always counts; a job's event only while the job is live, and an end only
        while the job still ends then (a preemption bumps its generation)."""
        _, _, kind, job_id, generation, _ = event
        if kind == _WAKE:
            return True
        if job_id not in self.jobs:
            return False
        return kind != _END or generation == self.generation[job_id]

    def _due(self, until: float) -> list[tuple]:
        """Every event that still counts up to ``until``; the clock moves to the last of them
        (a batch of more than one distinct time is a bin: the run is no longer exact)."""
        batch = []
        events = self.events
        while events and events[0][0] <= until + EPS:
            event = heapq.heappop(events)
            if self._counts(event):
                batch.append(event)
        if batch:
            self.t = max(self.t, batch[-1][0])
            if batch[-1][0] - batch[0][0] > EPS:
                self.exact = False
        return batch

    def _apply(self, batch: list[tuple]) -> None:
        for _, _, kind, job_id, _, payload in batch:
            if kind == _WAKE:
                continue  # nothing changes: the next cycle sees the job past min_runtime
            job = self.jobs[job_id]
            if kind == _END:
                del self.jobs[job_id]
                self.end.pop(job_id, None)
            elif kind == _RELEASE:  # as the simulator's RELEASED: pending, nothing held
                job.state, job.placement, job.started = JobState.PENDING, (), None
                job.terminating, job.checkpointed = False, None
                self.end.pop(job_id, None)
                self.left[job_id] = payload
            elif kind == _SHRUNK:
                placement = list(job.placement)
                for node in payload:
                    placement.remove(node)
                job.placement, job.terminating = tuple(placement), False

    def _cycle(self, t: float) -> None:
        began = time.perf_counter()
        s = self.snapshot
        jobs = list(self.jobs.values())
        result = schedule(
            # the usage history as the caller had it (its decay over the horizon is left out)
            Snapshot(s.plans, s.instance, jobs, s.config, self.reserved, usage=s.usage),
            t,
            self.cache,
            explain=False,
        )
        self.reserved = result.reserved  # carried to the next cycle, as the service does
        for decision in result.decisions:
            dispatch(decision, self, t)
        if result.aged is not None:  # Admission 6's starved gang: no victim, as the caller does
            self.jobs[result.aged].aged = True
        self.decided = bool(result.decisions)
        self.cycles += 1
        self.costs.append(time.perf_counter() - began)

    def _settle(self, t: float, deadline: float) -> None:
        """The cycles the service runs right after one that decided (on its backend's events:
        a start's ``running``, a shrink's ``resized``), before anything else happens."""
        for _ in range(self.settle):
            if not self.decided or deadline - time.perf_counter() < HEADROOM * self._price():
                return
            self._cycle(t)

    # events ----------------------------------------------------------------------------------
    def _push(self, t: float, kind: str, job_id: str, payload: object = None) -> None:
        self.seq += 1
        entry = (t, self.seq, kind, job_id, self.generation[job_id], payload)
        heapq.heappush(self.events, entry)

    def _wake(self, started: float) -> None:
        """A wake-up when ``min_runtime`` runs out for a job started at ``started``."""
        if self.min_runtime > 0 and started + self.min_runtime > self.t:
            self.seq += 1
            heapq.heappush(self.events, (started + self.min_runtime, self.seq, _WAKE, "", 0, None))

    # the decisions (dispatch calls these) ----------------------------------------------------
    def start(self, d: Start, t: float) -> None:
        job = self.jobs[d.job_id]
        job.state, job.placement, job.started = JobState.RUNNING, d.placement, t
        job.checkpointed, job.terminating = None, False
        stop = t + self.left.pop(d.job_id, _NEVER)
        self.end[d.job_id] = stop
        if math.isfinite(stop):
            self._push(stop, _END, d.job_id)
        self._wake(t)
        if self.waiting.pop(d.job_id, None) is not None:
            self.order.append(d.job_id)
            self.starts[d.job_id] = t

    def grow(self, d: Grow, t: float) -> None:
        job = self.jobs[d.job_id]
        job.placement = job.placement + d.add

    def shrink(self, d: Shrink, t: float) -> None:
        self.jobs[d.job_id].terminating = True
        self._push(t + d.grace, _SHRUNK, d.job_id, d.release)

    def preempt(self, d: Preempt, t: float) -> None:
        self.jobs[d.job_id].terminating = True
        self.generation[d.job_id] += 1  # its end is no longer when it stops holding
        left = max(0.0, self.end.get(d.job_id, _NEVER) - t)
        self._push(t + d.grace, _RELEASE, d.job_id, left)

    def reject(self, d: Reject, t: float) -> None:
        del self.jobs[d.job_id]
        self.waiting.pop(d.job_id, None)

    def _tail_world(self) -> TailWorld:
        """Where the core stopped, for the rough tail: what each running job gives back
        when, from the events still to come (a shrink's workers leave its end's count)."""
        s = self.snapshot
        world = TailWorld(
            self.t,
            s.instance.capacity,
            s.plans,
            self.jobs,
            self.left,
            min_runtime=self.min_runtime,
        )
        shrunk: dict[str, int] = {}
        ends = []
        for event in self.events:
            t, _, kind, job_id, _, payload = event
            if kind == _WAKE or not self._counts(event):
                continue
            if kind == _SHRUNK:
                shrunk[job_id] = shrunk.get(job_id, 0) + len(payload)
                world.gives.append((t, job_id, len(payload), None))
            else:
                ends.append((t, job_id, payload if kind == _RELEASE else None))
        for t, job_id, back in ends:
            workers = self.jobs[job_id].workers - shrunk.get(job_id, 0)
            world.gives.append((t, job_id, workers, back))
        return world

    # the answer ------------------------------------------------------------------------------
    def estimates(self, seconds: float) -> Estimates:
        starts = self.starts
        out = {job_id: Estimate(starts[job_id], rank) for rank, job_id in enumerate(self.order)}
        tail = sorted(self.tail, key=lambda job_id: (self.tail[job_id], job_id))
        for rank, job_id in enumerate(tail, len(out)):
            out[job_id] = Estimate(self.tail[job_id], rank, rough=True)
        rest = sorted(
            (j for j in self.pending if j.id not in out),
            key=lambda j: (-j.priority, j.submitted, j.id),
        )
        for rank, job in enumerate(rest, len(out)):
            out[job.id] = Estimate(None, rank)
        return Estimates(out, self.cycles, self.exact, self.t, seconds, len(tail))
