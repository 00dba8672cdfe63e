"""The ``gang-fifo`` baseline: all-or-nothing admission in submission order with no fair share,
no reservation and no preemption (Volcano's gang plugin alone): each cycle walks the queue
oldest first and starts every gang that fits whole; one that does not fit is passed over.
"""

from __future__ import annotations

from .baseline import Baseline
from .jobs import ReplayJob
from .replay import Replay


class GangFifo(Baseline):
    name = "gang-fifo"

    def attach(self, replay: Replay) -> None:
        super().attach(replay)
        self.queue: list[ReplayJob] = []

    def arrive(self, jobs: list[ReplayJob], now: float) -> None:
        for job in jobs:
            reason = self._never_fits(job)
            if reason:
                self.replay.reject(job, reason, now)
            else:
                self.queue.append(job)
        self.dirty = True

    def _forget(self, job: ReplayJob) -> None:
        self.queue = [j for j in self.queue if j is not job]

    def step(self, now: float) -> None:
        if not self.dirty or not self.queue:
            self.dirty = False
            return
        self.dirty = False
        self.cycles += 1
        failed: set = set()
        left = []
        for job in self.queue:  # submission order: arrivals are appended in order
            core = job.core
            w, n = core.per_worker, core.min_workers
            shape = (tuple(w), n)
            if shape in failed or w[0] * n > self.free_gpus:
                left.append(job)
                continue
            placement = self._place(w, n)
            if placement is None:
                failed.add(shape)
                left.append(job)
                continue
            self._take(placement, w)
            self._start(job, tuple(self.names[i] for i in placement), now)
        self.queue = left

    def figures(self) -> dict:
        return {"policy_cycles": self.cycles}
