"""A backend whose jobs run for a set time on virtual nodes, for real-time runs of the service
(benchmarks/bench_fairness.py, tests/e2e/test_sim_matches_service.py).

Configured like any backend: ``c.WmlaService.backend_class =
"benchmarks.timed_backend.TimedBackend"`` (the repository root on the service's PYTHONPATH),
``c.WmlaService.device_layout = "4x8"`` for the virtual nodes, and
``c.WmlaService.backend_options``:

- ``checkpoint_every`` (10): seconds of running between periodic checkpoints (0: none);
- ``exit_after_term`` (1): seconds a stopped job takes to write its checkpoint and exit after
  SIGTERM; its workers hold their devices until then. Past the stop's ``grace`` it is killed
  at ``grace`` instead and keeps only its last periodic checkpoint;
- ``start_delay`` (0): seconds between ``start`` and ``running`` (workers coming up; the
  devices are held meanwhile, no work is done);
- ``default_seconds`` (10): the run time of a job whose command names none.

A job's run time at full size is the number after ``--seconds`` in its command (submit
``"command": {"model_dir": "models/virtual", "model_main": "virtual-job.py", "args":
["--seconds", "12.5"]}``; the script must exist in the user's folder, as for any job, but is
never run). A job does ``seconds x max_workers`` worker-seconds of work at one per worker per
second, as the simulator's fake backend does. It checkpoints every ``checkpoint_every`` seconds
of a run and on SIGTERM (a ``stop`` or ``resize``): progress stops at SIGTERM, the checkpoint
is written ``exit_after_term`` seconds later, then the workers exit and ``released`` (or, for a
resize, ``resized`` at the new size) is emitted. Started again, a job resumes from its last
checkpoint, so what is left is what was left at that checkpoint.

Events are those of the local backend (``running``, ``finished``, ``released``, ``resized``;
``lost`` for every job ``recover`` is asked about, since runs live in this process only), plus
``checkpoint`` at every checkpoint (its ``progress`` the share of the work saved) once the
protocol has that kind (``EventKind.CHECKPOINT``) and the service folds it.
Each event is stamped with the instant it happened in the virtual job (a finish at the exact
time its work is done), not with when a timer of the event loop got round to it, so the service
learns of it late, as it does of a real process. No processes, no files: everything is in
memory.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

from extension.backends.base import EVENT_KINDS, BackendEvent, Emit, JobSpec
from extension.scheduler import Node


def _checkpoint_kind() -> str | None:
    """``checkpoint`` once the protocol has that event and the service folds it (issue 18
    adds both; a service that cannot fold an event fails its cycle), else None."""
    if "checkpoint" not in EVENT_KINDS:
        return None
    try:
        from extension.service.changes import FOLDS
    except ImportError:
        return None
    return "checkpoint" if any(k == "checkpoint" for k in FOLDS) else None


# the checkpoint event's progress figure, where the protocol's event has one
_HAS_PROGRESS = "progress" in {f.name for f in fields(BackendEvent)}


def seconds_of(command: Sequence[str], default: float) -> float:
    """The run time a job's command asks for (``--seconds S`` or ``--seconds=S``)."""
    args = list(command)
    for i, arg in enumerate(args):
        if arg == "--seconds" and i + 1 < len(args):
            return float(args[i + 1])
        if arg.startswith("--seconds="):
            return float(arg.split("=", 1)[1])
    return default


@dataclass
class _Run:
    """One job on this backend; ``done`` and ``saved`` are worker-seconds of work."""

    job_id: str
    work: float
    placement: tuple[str, ...]
    saved: float = 0.0  # the last checkpoint (what a restart resumes from)
    done: float = 0.0
    rate: int = 0  # workers computing now (0 while starting or stopping)
    since: float = 0.0  # when ``done`` was last brought up to date
    began: float = 0.0  # start of this run: periodic checkpoints count from here
    generation: int = 0  # bumped whenever the timers below are no longer valid
    timers: list[asyncio.TimerHandle] = field(default_factory=list)
    log: list[str] = field(default_factory=list)


class TimedBackend:
    def __init__(
        self,
        emit: Emit,
        nodes: Sequence[Node],
        state_dir: str,
        *,
        checkpoint_every: float = 10.0,
        exit_after_term: float = 1.0,
        start_delay: float = 0.0,
        default_seconds: float = 10.0,
    ) -> None:
        self.emit = emit
        self.nodes = list(nodes)
        self.state_dir = state_dir  # nothing is written: runs live in this process
        self.checkpoint_every = float(checkpoint_every)
        self.exit_after_term = float(exit_after_term)
        self.start_delay = float(start_delay)
        self.default_seconds = float(default_seconds)
        self.runs: dict[str, _Run] = {}  # jobs holding devices here (running or stopping)
        self.saved: dict[str, float] = {}  # checkpoints of jobs that were stopped
        self.logs_by_job: dict[str, list[str]] = {}
        self.checkpoint_kind = _checkpoint_kind()

    # -- the protocol ------------------------------------------------------------------------
    def capacity(self) -> list[Node]:
        return list(self.nodes)

    async def start(self, spec: JobSpec, placement: tuple[str, ...]) -> None:
        work = seconds_of(spec.command, self.default_seconds) * spec.max_workers
        run = _Run(spec.id, work, tuple(placement), saved=self.saved.pop(spec.id, 0.0))
        run.done = run.saved
        run.log = self.logs_by_job.setdefault(spec.id, [])
        self.runs[spec.id] = run
        now = time.time()
        self._say(run, now, f"start on {','.join(placement)} from {run.saved:.3f} of {work:.3f}")
        if self.start_delay > 0:
            generation = run.generation
            await asyncio.sleep(self.start_delay)
            if self.runs.get(spec.id) is not run or run.generation != generation:
                return  # stopped while its workers were coming up
            now += self.start_delay
        self.emit(BackendEvent(spec.id, "running", now, run.placement))
        self._compute(run, now)

    async def stop(self, job_id: str, grace: float, reason: str) -> None:
        """SIGTERM: progress stops now, the checkpoint is written ``exit_after_term`` later (or
        the job is killed at ``grace`` and keeps its last periodic one), then ``released``."""
        run = self.runs.get(job_id)
        if run is None:
            return  # it already ended and said so
        at = await self._terminate(run, grace, reason)
        if self.runs.get(job_id) is run:
            del self.runs[job_id]
            self.saved[job_id] = run.saved
            self.emit(BackendEvent(job_id, "released", at))

    async def resize(self, spec: JobSpec, placement: tuple[str, ...], grace: float) -> None:
        """Stop the gang (SIGTERM, its checkpoint), then run on at ``len(placement)`` workers
        from that checkpoint."""
        run = self.runs.get(spec.id)
        if run is None:
            await self.start(spec, placement)
            return
        at = await self._terminate(run, grace, "resized")
        if self.runs.get(spec.id) is not run:
            return
        run.placement, run.done = tuple(placement), run.saved
        self._say(run, at, f"resized to {','.join(placement)}")
        self.emit(BackendEvent(spec.id, "resized", at, run.placement))
        self._compute(run, at)

    async def recover(self, specs: Sequence[JobSpec]) -> None:
        # runs lived in the service process that went away
        for spec in specs:
            message = "the timed backend keeps its runs in memory: lost with the service"
            self.emit(BackendEvent(spec.id, "lost", time.time(), message=message))

    def logs(self, job_id: str, worker: int | None = None, tail: int | None = None) -> str:
        lines = self.logs_by_job.get(job_id, [])
        return "\n".join(lines[-tail:] if tail else lines)

    def account_for(self, user: str, home: str | None = None) -> None:
        return None  # the service's own account, as LocalBackend(run_as_user=False)

    async def close(self) -> None:
        for run in self.runs.values():
            self._cancel_timers(run)

    # -- the virtual job -----------------------------------------------------------------------
    def _compute(self, run: _Run, now: float) -> None:
        """From ``now`` on every worker computes: timers for the finish and the checkpoints."""
        loop = asyncio.get_running_loop()
        self._cancel_timers(run)
        run.rate, run.since, run.began = len(run.placement), now, now
        run.generation += 1
        finish_at = now + max(0.0, run.work - run.done) / max(1, run.rate)
        run.timers.append(self._at(loop, finish_at, self._finish, run, finish_at))
        if self.checkpoint_every > 0:
            first = now + self.checkpoint_every
            if first < finish_at:
                run.timers.append(self._at(loop, first, self._checkpoint, run, first))

    def _at(self, loop: asyncio.AbstractEventLoop, at: float, fn, run: _Run, arg: float):
        generation = run.generation

        def fire() -> None:
            if self.runs.get(run.job_id) is run and run.generation == generation:
                fn(run, arg)

        return loop.call_later(max(0.0, at - time.time()), fire)

    def _advance(self, run: _Run, now: float) -> None:
        if run.rate and now > run.since:
            run.done = min(run.work, run.done + run.rate * (now - run.since))
        run.since = max(run.since, now)

    def _checkpoint(self, run: _Run, at: float) -> None:
        self._advance(run, at)
        run.saved = run.done
        self._tell_checkpoint(run, at)
        nxt = at + self.checkpoint_every
        finish_at = at + max(0.0, run.work - run.done) / max(1, run.rate)
        if nxt < finish_at:
            loop = asyncio.get_running_loop()
            run.timers.append(self._at(loop, nxt, self._checkpoint, run, nxt))

    def _finish(self, run: _Run, at: float) -> None:
        self._advance(run, at)
        self._cancel_timers(run)
        del self.runs[run.job_id]
        self.saved.pop(run.job_id, None)
        self._say(run, at, "finished")
        self.emit(BackendEvent(run.job_id, "finished", at, exit_code=0))

    async def _terminate(self, run: _Run, grace: float, reason: str) -> float:
        """SIGTERM now; returns when the workers are gone (the stamp of that instant)."""
        now = time.time()
        self._advance(run, now)
        self._cancel_timers(run)
        run.generation += 1
        run.rate = 0
        at_sigterm = run.done
        wait = min(self.exit_after_term, max(0.0, grace))
        self._say(run, now, f"SIGTERM ({reason}) at {at_sigterm:.3f} of {run.work:.3f}")
        await asyncio.sleep(max(0.0, now + wait - time.time()))
        if self.exit_after_term <= grace:
            run.saved = at_sigterm  # the checkpoint written on SIGTERM
            self._tell_checkpoint(run, now + wait)
        else:
            self._say(run, now + wait, "killed at the end of the grace period")
        self._say(run, now + wait, f"exited, resumes from {run.saved:.3f}")
        return now + wait

    def _tell_checkpoint(self, run: _Run, at: float) -> None:
        self._say(run, at, f"checkpoint at {run.saved:.3f}")
        if self.checkpoint_kind is None:
            return
        extra = {"progress": run.saved / run.work if run.work else 1.0} if _HAS_PROGRESS else {}
        self.emit(BackendEvent(run.job_id, self.checkpoint_kind, at, run.placement, **extra))

    def _cancel_timers(self, run: _Run) -> None:
        for timer in run.timers:
            timer.cancel()
        run.timers.clear()

    def _say(self, run: _Run, at: float, what: str) -> None:
        run.log.append(f"{at:.3f} {what}")
