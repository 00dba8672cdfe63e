"""A deterministic in-memory backend in simulated time, for the simulator and tests.

It carries out the core's decisions on make-believe workers: a job does ``work`` worker-seconds
(``duration`` x max workers) at one worker-second per worker per second. What it models, as
SCENARIO-FORMAT.md says and docs/simulate.md writes down:
- a started job works from ``start_delay`` seconds after the decision on (its workers coming
  up) and checkpoints every ``checkpoint_every`` seconds of its run from then on;
- a preempted job stops making progress at once (SIGTERM). Its workers leave
  ``exit_after_term`` seconds later, or at the end of the grace period when that is None or
  longer (SIGKILL); then it is pending again. It loses what it did since its last periodic
  checkpoint, unless ``checkpoint_on_sigterm`` and it leaves within the grace period: then it
  writes a checkpoint of where it stopped and loses nothing;
- a shrink keeps the job running at its old size until its stop is over (as long as a
  preemption's), then at the new size, losing nothing (the runtime saves a checkpoint on
  SIGTERM before a resize);
- a grow takes effect at once;
- every event is delivered when the scheduler sees it: a finish ``finish_seen_after`` seconds
  after the work is done, a release or shrink ``release_seen_after`` seconds after the workers
  left; ``FakeEvent.at`` keeps when it happened. With ``report_running`` a start also reports
  ``running`` when the workers come up (the service runs a cycle on it).

With every option at its default the backend is the one the simulator always had.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import NamedTuple

from .base import EventKind

# the backend protocol's own words (base.EventKind); they sort as before on a tie
FINISHED = EventKind.FINISHED
RELEASED = EventKind.RELEASED  # a preempted gang's workers are gone: it is pending again
SHRUNK = EventKind.RESIZED  # a shrink's stop is over: the released workers are gone
RUNNING = EventKind.RUNNING  # the workers came up (only with ``report_running``)
EPS = 1e-9


class FakeEvent(NamedTuple):
    kind: str
    job_id: str
    nodes: tuple[str, ...]  # a shrink's released nodes
    at: float  # when it happened (the scheduler sees it at the event's time in the queue)


@dataclass
class FakeRun:
    job_id: str
    work: float  # worker-seconds to do in all
    done: float = 0.0
    checkpointed: float = 0.0  # worker-seconds done at the last checkpoint
    checkpoint_at: float | None = None  # when this run last checkpointed (None: not yet)
    placement: list[str] = field(default_factory=list)
    rate: float = 0.0  # workers making progress now
    since: float = 0.0  # time ``done`` was last brought up to date
    started: float = 0.0  # when this run's work began (checkpoints count from here)
    finish_at: float | None = None  # when its work is done at the present rate
    stopping: bool = False
    generation: int = 0  # bumps invalidate scheduled events


class FakeBackend:
    """Runs the make-believe jobs; the caller owns the clock and asks for due events."""

    def __init__(
        self,
        checkpoint_every: float = 60.0,
        *,
        start_delay: float = 0.0,
        finish_seen_after: float = 0.0,
        release_seen_after: float = 0.0,
        exit_after_term: float | None = None,
        checkpoint_on_sigterm: bool = False,
        report_running: bool = False,
    ) -> None:
        self.checkpoint_every = checkpoint_every
        self.start_delay = start_delay
        self.finish_seen_after = finish_seen_after
        self.release_seen_after = release_seen_after
        self.exit_after_term = exit_after_term
        self.checkpoint_on_sigterm = checkpoint_on_sigterm
        self.report_running = report_running
        self.runs: dict[str, FakeRun] = {}
        self._events: list[tuple[float, int, str, str, int | None, tuple, float]] = []
        self._seq = 0
        self._shrunk: set[str] = set()  # jobs that ever had a shrink event (see _reschedule)

    # decisions -------------------------------------------------------------------------------
    def register(self, job_id: str, work: float) -> None:
        self.runs[job_id] = FakeRun(job_id, work)

    def start(self, job_id: str, placement: tuple[str, ...], now: float) -> None:
        run = self.runs[job_id]
        run.placement = list(placement)
        run.rate = len(placement)
        run.since = now
        run.started = now + self.start_delay
        run.checkpoint_at = None
        run.stopping = False
        self._reschedule_finish(run, now)
        if self.report_running:  # no generation: any later change leaves the report valid
            self._push(run.started, RUNNING, job_id, None, (), run.started)

    def grow(self, job_id: str, add: tuple[str, ...], now: float) -> None:
        run = self.runs[job_id]
        self._advance(run, now)
        run.placement.extend(add)
        run.rate = len(run.placement)
        self._reschedule_finish(run, now)

    def shrink(self, job_id: str, release: tuple[str, ...], grace: float, now: float) -> None:
        run = self.runs[job_id]
        self._shrunk.add(job_id)
        gone = now + self.stop_takes(grace)
        self._push(gone + self.release_seen_after, SHRUNK, job_id, run.generation, release, gone)

    def preempt(self, job_id: str, grace: float, now: float) -> str:
        """SIGTERM now. Returns ``saved`` (it writes a checkpoint before it leaves: nothing is
        lost), ``lost`` (it goes back to its last periodic checkpoint) or ``finished`` (its work
        was already done; the finish it is about to report stands)."""
        run = self.runs[job_id]
        if run.finish_at is not None and run.finish_at <= now + EPS:
            return "finished"  # done, the scheduler has not seen it yet: a stop finds it ended
        self._advance(run, now)
        saved = self.saves_on_stop(grace)
        if saved:  # the checkpoint written on SIGTERM holds the work done until now
            run.checkpointed, run.checkpoint_at = run.done, now
        else:
            run.done = run.checkpointed  # progress since the last checkpoint is lost
        run.rate = 0
        run.stopping = True
        run.finish_at = None
        run.generation += 1
        gone = now + self.stop_takes(grace)
        self._push(gone + self.release_seen_after, RELEASED, job_id, run.generation, (), gone)
        return "saved" if saved else "lost"

    def cancel(self, job_id: str, now: float) -> None:
        run = self.runs.pop(job_id, None)
        if run is not None:
            run.generation += 1

    def stop_takes(self, grace: float) -> float:
        """Seconds from SIGTERM until a stopped gang's workers are gone."""
        leave = self.exit_after_term
        return grace if leave is None or leave > grace else leave

    def saves_on_stop(self, grace: float) -> bool:
        leave = self.exit_after_term
        return self.checkpoint_on_sigterm and leave is not None and leave <= grace

    # events ----------------------------------------------------------------------------------
    def next_time(self) -> float | None:
        while self._events:
            t, _, kind, job_id, gen, _, _ = self._events[0]
            run = self.runs.get(job_id)
            if run is not None and (gen is None or run.generation == gen):
                return t
            heapq.heappop(self._events)
        return None

    def due(self, now: float) -> list[FakeEvent]:
        """Events the scheduler sees at or before ``now``, in time order."""
        out = []
        while self._events and self._events[0][0] <= now + EPS:
            t, _, kind, job_id, gen, nodes, at = heapq.heappop(self._events)
            run = self.runs.get(job_id)
            if run is None or (gen is not None and run.generation != gen):
                continue
            if kind == FINISHED:
                del self.runs[job_id]
            elif kind == RELEASED:
                run.placement = []
                run.stopping = False
            elif kind == SHRUNK:
                self._advance(run, t)
                for node in nodes:
                    run.placement.remove(node)
                run.rate = len(run.placement)
                self._reschedule_finish(run, t)
            out.append(FakeEvent(kind, job_id, tuple(nodes), at))
        return out

    def progress(self, job_id: str, now: float) -> float:
        run = self.runs.get(job_id)
        if run is None:
            return 1.0
        self._advance(run, now)
        return run.done / run.work if run.work else 1.0

    def checkpoint_time(self, job_id: str, now: float) -> float | None:
        """When the job last checkpointed in this run, as of ``now`` (None: not yet), without
        bringing its progress up to date: the simulator shows it to the core every cycle."""
        run = self.runs.get(job_id)
        if run is None:
            return None
        every = self.checkpoint_every
        if run.rate and not run.stopping and every > 0 and now > run.started:
            k = math.floor((now - run.started) / every)
            if run.finish_at is not None:  # no checkpoint after the work is done
                k = min(k, math.floor((run.finish_at - run.started) / every))
            if k >= 1:
                return run.started + k * every
        return run.checkpoint_at

    # internals -------------------------------------------------------------------------------
    def _advance(self, run: FakeRun, now: float) -> None:
        begin = max(run.since, run.started)  # no work while the workers come up
        if run.rate and now > begin:
            every = self.checkpoint_every
            if every > 0:
                last_ckpt = run.started + math.floor((now - run.started) / every) * every
                if last_ckpt >= begin:
                    run.checkpointed = min(run.work, run.done + run.rate * (last_ckpt - begin))
                    if last_ckpt > run.started:
                        run.checkpoint_at = last_ckpt
            run.done = min(run.work, run.done + run.rate * (now - begin))
        run.since = now

    def _reschedule_finish(self, run: FakeRun, now: float) -> None:
        run.generation += 1
        # a shrink keeps its event across a reschedule; scanning the queue only for jobs that
        # were ever shrunk keeps a long replay from paying O(events) at every start
        pending_shrinks = (
            [e for e in self._events if e[3] == run.job_id and e[2] == SHRUNK]
            if run.job_id in self._shrunk
            else []
        )
        run.finish_at = None
        if run.rate > 0:
            left = max(0.0, run.work - run.done)
            run.finish_at = max(now, run.started) + left / run.rate
            seen = run.finish_at + self.finish_seen_after
            self._push(seen, FINISHED, run.job_id, run.generation, (), run.finish_at)
        for t, _, kind, job_id, _, nodes, at in pending_shrinks:
            self._push(t, kind, job_id, run.generation, nodes, at)

    def _push(
        self, t: float, kind: str, job_id: str, gen: int | None, nodes: tuple, at: float
    ) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, kind, job_id, gen, tuple(nodes), at))
