"""What the baseline policies (``gang_fifo.py``, ``pod_fifo.py``) share: free GPUs per node,
kept by the policy itself without the core, and the core's own placement (``FitIndex``, which
answers what ``place_gang`` does, and ``max_workers_on``) so that only the admission policy
differs from wmla, not the bin-packing.

A ``FitIndex`` per worker shape is kept between cycles and told of every node whose free
resources change, so that placing a gang costs a bisection instead of a pass over every node.
"""

from __future__ import annotations

from extension.scheduler.placement import FitIndex, max_workers_on

from .jobs import ReplayJob
from .replay import Policy, Replay


class Baseline(Policy):
    """Free GPUs per node, kept by the policy itself (the core is not involved)."""

    def attach(self, replay: Replay) -> None:
        super().attach(replay)
        nodes = replay.instance.nodes
        self.names = [n.name for n in nodes]
        self.node_at = {name: i for i, name in enumerate(self.names)}
        self.capacity = [list(n.capacity) for n in nodes]
        self.free = [list(n.capacity) for n in nodes]
        self.dirty = False
        self.cycles = 0
        self.started_jobs: dict[str, ReplayJob] = {}
        self._most: dict[tuple, float] = {}  # worker shape -> most such workers on the nodes
        self.free_gpus = sum(row[0] for row in self.free)
        self.indexes: dict[tuple, FitIndex] = {}  # worker shape -> its nodes by fit
        # per index, the nodes that changed since it was last used: an index is told of them
        # only when it places a gang (the shapes of rare gangs are not kept up at every change)
        self.stale: dict[tuple, set[int]] = {}

    def _place(self, w: tuple, count: int) -> list[int] | None:
        """``place_gang(self.free, self.names, w, count)``, from the shape's index."""
        index = self.indexes.get(w)
        if index is None:
            index = self.indexes[w] = FitIndex(self.free, self.names, w)
            self.stale[w] = set()
        stale = self.stale[w]
        if stale:
            for i in stale:
                index.update(i)
            stale.clear()
        return index.place(count)

    def _start(self, job: ReplayJob, placement: tuple[str, ...], now: float) -> None:
        self.started_jobs[job.id] = job
        self.replay.start(job, placement, now)

    def _never_fits(self, job: ReplayJob) -> str | None:
        w, n = job.core.per_worker, job.core.min_workers
        most = self._most.get(w)
        if most is None:
            most = self._most[w] = max_workers_on(self.capacity, w)
        if most < n:
            return (
                f"rejected: the gang of {n} x {w.describe()} cannot be placed even on empty nodes"
            )
        return None

    def _take(self, placement: list[int], w: tuple, sign: int = -1) -> None:
        w0, w1, w2 = w
        for i in placement:
            row = self.free[i]
            row[0] += sign * w0
            row[1] += sign * w1
            row[2] += sign * w2
        self.free_gpus += sign * w0 * len(placement)
        for stale in self.stale.values():
            stale.update(placement)

    def _give_back(self, job: ReplayJob) -> None:
        idx = [self.node_at[n] for n in job.core.placement]
        self._take(idx, job.core.per_worker, +1)

    def finished(self, job: ReplayJob, now: float) -> None:
        self._give_back(job)
        self.started_jobs.pop(job.id, None)
        self.dirty = True

    def cancelled(self, job: ReplayJob, now: float) -> None:
        self._give_back(job)  # running or holding part of its gang
        self.started_jobs.pop(job.id, None)
        self._forget(job)
        self.dirty = True

    def _forget(self, job: ReplayJob) -> None:
        """Drop a cancelled job from the policy's queues."""
