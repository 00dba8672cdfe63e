"""A deterministic in-memory backend in simulated time, for the simulator and tests.

It carries out the core's decisions on make-believe workers: a job does ``work`` worker-seconds
(``duration`` x max workers) at one worker-second per worker per second. What it models, as
SCENARIO-FORMAT.md says and docs/scheduling.md writes down:
- a preempted job stops making progress at once, loses what it did since its last periodic
  checkpoint (every ``checkpoint_every`` seconds of running), and holds its resources until the
  grace period ends; then it is pending again;
- a shrink keeps the job running at its old size until the grace period ends, then at the new
  size, losing nothing (the runtime saves a checkpoint on SIGTERM before a resize);
- a grow takes effect at once.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from .base import EventKind

# the backend protocol's own words (base.EventKind); they sort as before on a tie
FINISHED = EventKind.FINISHED
RELEASED = EventKind.RELEASED  # a preempted gang's grace ended: it is pending again
SHRUNK = EventKind.RESIZED  # a shrink's grace ended: the released workers are gone


@dataclass
class FakeRun:
    job_id: str
    work: float  # worker-seconds to do in all
    done: float = 0.0
    checkpointed: float = 0.0
    placement: list[str] = field(default_factory=list)
    rate: float = 0.0  # workers making progress now
    since: float = 0.0  # time ``done`` was last brought up to date
    started: float = 0.0  # start of this run (checkpoints count from here)
    stopping: bool = False
    generation: int = 0  # bumps invalidate scheduled events


class FakeBackend:
    """Runs the make-believe jobs; the caller owns the clock and asks for due events."""

    def __init__(self, checkpoint_every: float = 60.0) -> None:
        self.checkpoint_every = checkpoint_every
        self.runs: dict[str, FakeRun] = {}
        self._events: list[tuple[float, int, str, str, int, tuple]] = []
        self._seq = 0
        self._shrunk: set[str] = set()  # jobs that ever had a shrink event (see _reschedule)

    # decisions -------------------------------------------------------------------------------
    def register(self, job_id: str, work: float) -> None:
        self.runs[job_id] = FakeRun(job_id, work)

    def start(self, job_id: str, placement: tuple[str, ...], now: float) -> None:
        run = self.runs[job_id]
        run.placement = list(placement)
        run.rate = len(placement)
        run.since = run.started = now
        run.stopping = False
        self._reschedule_finish(run, now)

    def grow(self, job_id: str, add: tuple[str, ...], now: float) -> None:
        run = self.runs[job_id]
        self._advance(run, now)
        run.placement.extend(add)
        run.rate = len(run.placement)
        self._reschedule_finish(run, now)

    def shrink(self, job_id: str, release: tuple[str, ...], grace: float, now: float) -> None:
        run = self.runs[job_id]
        self._shrunk.add(job_id)
        self._push(now + grace, SHRUNK, job_id, run.generation, release)

    def preempt(self, job_id: str, grace: float, now: float) -> None:
        run = self.runs[job_id]
        self._advance(run, now)
        run.done = run.checkpointed  # progress since the last checkpoint is lost
        run.rate = 0
        run.stopping = True
        run.generation += 1
        self._push(now + grace, RELEASED, job_id, run.generation, ())

    def cancel(self, job_id: str, now: float) -> None:
        run = self.runs.pop(job_id, None)
        if run is not None:
            run.generation += 1

    # events ----------------------------------------------------------------------------------
    def next_time(self) -> float | None:
        while self._events:
            t, _, kind, job_id, gen, _ = self._events[0]
            run = self.runs.get(job_id)
            if run is not None and run.generation == gen:
                return t
            heapq.heappop(self._events)
        return None

    def due(self, now: float) -> list[tuple[str, str, tuple]]:
        """Events at or before ``now``, in time order: (kind, job id, released nodes)."""
        out = []
        while self._events and self._events[0][0] <= now + 1e-9:
            t, _, kind, job_id, gen, nodes = heapq.heappop(self._events)
            run = self.runs.get(job_id)
            if run is None or run.generation != gen:
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
            out.append((kind, job_id, tuple(nodes)))
        return out

    def progress(self, job_id: str, now: float) -> float:
        run = self.runs.get(job_id)
        if run is None:
            return 1.0
        self._advance(run, now)
        return run.done / run.work if run.work else 1.0

    # internals -------------------------------------------------------------------------------
    def _advance(self, run: FakeRun, now: float) -> None:
        if run.rate and now > run.since:
            every = self.checkpoint_every
            if every > 0:
                last_ckpt = run.started + math.floor((now - run.started) / every) * every
                if last_ckpt >= run.since:
                    run.checkpointed = min(run.work, run.done + run.rate * (last_ckpt - run.since))
            run.done = min(run.work, run.done + run.rate * (now - run.since))
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
        if run.rate > 0:
            left = max(0.0, run.work - run.done)
            self._push(now + left / run.rate, FINISHED, run.job_id, run.generation, ())
        for t, _, kind, job_id, _, nodes in pending_shrinks:
            self._push(t, kind, job_id, run.generation, nodes)

    def _push(self, t: float, kind: str, job_id: str, gen: int, nodes: tuple) -> None:
        self._seq += 1
        heapq.heappush(self._events, (t, self._seq, kind, job_id, gen, tuple(nodes)))
