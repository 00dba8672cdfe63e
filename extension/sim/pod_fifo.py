"""The ``pod-fifo`` baseline: the default Kubernetes behaviour of seed 002: every worker is a pod
placed on its own, first come first served, with no notion of a gang. A bound pod holds its
GPUs while it waits for its siblings; the job runs only once every pod is bound. The operator
that creates the pods of jobs submitted at the same instant does so concurrently, so their pods
interleave in the queue (rank 0 of each job, then rank 1, ...). Deadlock detection and the
operator's timeout are described on ``PodFifo``.
"""

from __future__ import annotations

from extension.scheduler.placement import place_gang

from .baseline import Baseline
from .jobs import ReplayJob
from .replay import Replay

DEFAULT_DEADLOCK_TIMEOUT = 1800.0  # an operator notices a stuck job after half an hour


class PodFifo(Baseline):
    """Pods first come, first served, no gangs.

    Deadlock: after each cycle, the jobs holding part of their gang are checked by the
    banker's rule: assume every running job finishes and gives its GPUs back, then let any
    partial job whose missing pods would fit complete and give its GPUs back, until no more
    can. The partial jobs left can never run: they are deadlocked, and the GPUs they hold are
    counted as deadlocked GPU-hours for as long as that lasts.

    The operator: once the cluster has been deadlocked for ``timeout`` seconds, the operator
    deletes the deadlocked job that has held GPUs the longest (then the earliest submitted)
    and submits it again (its pods go to the back of the queue), and watches again for
    ``timeout`` before the next deletion. ``timeout`` None or 0: nobody intervenes.
    """

    name = "pod-fifo"

    def __init__(self, timeout: float | None = DEFAULT_DEADLOCK_TIMEOUT) -> None:
        self.timeout = timeout if timeout else None

    def attach(self, replay: Replay) -> None:
        super().attach(replay)
        self.pods: list[ReplayJob] = []  # one entry per pod not bound yet, queue order
        self.partial: dict[str, ReplayJob] = {}  # hold some pods, not running
        self.holding_since: dict[str, float] = {}
        self.deadlocked: list[ReplayJob] = []
        self.deadlock_since: float | None = None
        self.deadlocks = 0
        self.kills = 0
        self.max_deadlocked = 0

    def arrive(self, jobs: list[ReplayJob], now: float) -> None:
        ok = []
        for job in jobs:
            reason = self._never_fits(job)
            if reason:
                self.replay.reject(job, reason, now)
            else:
                ok.append(job)
        self._enqueue(ok)
        self.dirty = True

    def _enqueue(self, jobs: list[ReplayJob]) -> None:
        most = max((j.core.min_workers for j in jobs), default=0)
        for rank in range(most):
            for job in jobs:
                if rank < job.core.min_workers:
                    self.pods.append(job)

    def _forget(self, job: ReplayJob) -> None:
        self.pods = [j for j in self.pods if j is not job]
        self.partial.pop(job.id, None)
        self.holding_since.pop(job.id, None)

    def next_timer(self) -> float | None:
        if self.deadlock_since is not None and self.timeout:
            return self.deadlock_since + self.timeout
        return None

    def step(self, now: float) -> None:
        if self.deadlock_since is not None and self.timeout and now >= self.next_timer() - 1e-9:
            self._operator_kill(now)
        if not self.dirty:
            return
        self.dirty = False
        if self.pods:
            self._bind(now)
        self._check_deadlock(now)

    def _bind(self, now: float) -> None:
        self.cycles += 1
        failed: set = set()
        left = []
        r = self.replay
        for job in self.pods:
            core = job.core
            w = core.per_worker
            shape = tuple(w)
            if shape in failed or w[0] > self.free_gpus:
                left.append(job)
                continue
            spot = self._place(w, 1)
            if spot is None:
                failed.add(shape)
                left.append(job)
                continue
            self._take(spot, w)
            placement = core.placement + (self.names[spot[0]],)
            if len(placement) == core.min_workers:
                self.partial.pop(job.id, None)
                self.holding_since.pop(job.id, None)
                self._start(job, placement, now)
            else:
                if job.id not in self.partial:
                    self.partial[job.id] = job
                    self.holding_since[job.id] = now
                r.hold(job, placement)
        self.pods = left

    def _check_deadlock(self, now: float) -> None:
        stuck = self._banker() if self.partial else []
        self.deadlocked = stuck
        self.replay.recorder.deadlocked = sum(j.held for j in stuck)
        if stuck and self.deadlock_since is None:
            self.deadlocks += 1
            self.deadlock_since = now
        elif not stuck:
            self.deadlock_since = None
        self.max_deadlocked = max(self.max_deadlocked, len(stuck))

    def _banker(self) -> list[ReplayJob]:
        avail = [row[:] for row in self.free]
        for job in self.started_jobs.values():
            self._add(avail, job)
        waiting = sorted(self.partial.values(), key=lambda j: j.seq)
        progress = True
        while progress and waiting:
            progress = False
            for job in list(waiting):
                core = job.core
                missing = core.min_workers - len(core.placement)
                if place_gang(avail, self.names, core.per_worker, missing) is not None:
                    self._add(avail, job)
                    waiting.remove(job)
                    progress = True
        return waiting

    def _add(self, avail: list, job: ReplayJob) -> None:
        w = job.core.per_worker
        for name in job.core.placement:
            row = avail[self.node_at[name]]
            for r in range(3):
                row[r] += w[r]

    def _operator_kill(self, now: float) -> None:
        if not self.deadlocked:
            self.deadlock_since = None
            return
        victim = min(self.deadlocked, key=lambda j: (self.holding_since[j.id], j.seq, j.id))
        self._give_back(victim)
        self.partial.pop(victim.id, None)
        self.holding_since.pop(victim.id, None)
        self.pods = [j for j in self.pods if j is not victim]
        self.replay.hold(victim, ())
        self._enqueue([victim])
        self.kills += 1
        self.deadlock_since = now  # the operator watches again before the next deletion
        self.dirty = True

    def figures(self) -> dict:
        return {
            "policy_cycles": self.cycles,
            "deadlocks": {
                "detected": self.deadlocks,
                "broken_by_timeout": self.kills,
                "timeout_s": self.timeout,
                "most_jobs_deadlocked": self.max_deadlocked,
                "deadlocked_at_end": len(self.deadlocked),
            },
        }
