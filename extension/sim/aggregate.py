"""The wmla policy's aggregated snapshots: running rigid jobs of one user leaf with the same
worker size, shown to the core as one running job holding all their workers (``Wmla`` in
``policies.py`` says when that gives the same decisions as the full snapshot).
"""

from __future__ import annotations

from itertools import chain, repeat

from extension.scheduler import Job, JobState, Resources


class RunningGroup:
    """Running rigid jobs of one leaf and worker size, as one running job for the core."""

    def __init__(self, key: tuple) -> None:
        self.plan, self.user, self.per_worker = key
        self.id = f"(running jobs of {self.plan}/{self.user} with {list(self.per_worker)})"
        self.counts: dict[str, int] = {}
        self.size = 0
        self._job: Job | None = None

    def add(self, placement: tuple[str, ...]) -> None:
        for node in placement:
            self.counts[node] = self.counts.get(node, 0) + 1
        self.size += len(placement)
        self._job = None

    def remove(self, placement: tuple[str, ...]) -> None:
        for node in placement:
            left = self.counts[node] - 1
            if left:
                self.counts[node] = left
            else:
                del self.counts[node]
        self.size -= len(placement)
        self._job = None

    def job(self) -> Job:
        if self._job is None:
            counts = self.counts  # each node's name once per worker there, in name order
            placement = tuple(chain.from_iterable(repeat(n, counts[n]) for n in sorted(counts)))
            self._job = Job(
                id=self.id,
                user=self.user,
                plan=self.plan,
                per_worker=Resources(*self.per_worker),
                min_workers=self.size,
                state=JobState.RUNNING,
                placement=placement,
                started=0.0,
            )
        return self._job
