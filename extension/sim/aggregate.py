"""The wmla policy's aggregated snapshots: running rigid jobs of one user leaf with the same
worker size, shown to the core as one running job holding all their workers (``Wmla`` in
``policies.py`` says when that gives the same decisions as the full snapshot).
"""

from __future__ import annotations

import bisect
from itertools import chain, repeat

from extension.scheduler import Job, JobState, Resources


class RunningGroup:
    """Running rigid jobs of one leaf and worker size, as one running job for the core."""

    def __init__(self, key: tuple) -> None:
        self.plan, self.user, self.per_worker = key
        self.id = f"(running jobs of {self.plan}/{self.user} with {list(self.per_worker)})"
        self.counts: dict[str, int] = {}
        # the nodes in ``counts``, in name order: kept sorted as nodes come and go, so that
        # the placement is built without sorting or a Python step per node
        self.nodes: list[str] = []
        self.size = 0
        self._job: Job | None = None

    def add(self, placement: tuple[str, ...]) -> None:
        counts = self.counts
        for node in placement:
            had = counts.get(node)
            if had is None:
                counts[node] = 1
                bisect.insort(self.nodes, node)
            else:
                counts[node] = had + 1
        self.size += len(placement)
        self._job = None

    def remove(self, placement: tuple[str, ...]) -> None:
        counts = self.counts
        for node in placement:
            left = counts[node] - 1
            if left:
                counts[node] = left
            else:
                del counts[node]
                nodes = self.nodes
                del nodes[bisect.bisect_left(nodes, node)]
        self.size -= len(placement)
        self._job = None

    def job(self) -> Job:
        if self._job is None:
            nodes = self.nodes  # each node's name once per worker there, in name order
            per_node = map(repeat, nodes, map(self.counts.__getitem__, nodes))
            self._job = Job(
                id=self.id,
                user=self.user,
                plan=self.plan,
                per_worker=Resources(*self.per_worker),
                min_workers=self.size,
                state=JobState.RUNNING,
                placement=tuple(chain.from_iterable(per_node)),
                started=0.0,
            )
        return self._job
