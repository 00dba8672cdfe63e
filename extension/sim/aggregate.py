"""The wmla policy's aggregated snapshots: running rigid jobs of one user leaf with the same
worker size, shown to the core as one running job holding all their workers (``Wmla`` in
``policies.py`` says when that gives the same decisions as the full snapshot).
"""

from __future__ import annotations

import bisect

from extension.scheduler import Job, JobState, Resources


class RunningGroup:
    """Running rigid jobs of one leaf and worker size, as one running job for the core."""

    def __init__(self, key: tuple) -> None:
        self.plan, self.user, self.per_worker = key
        self.id = f"(running jobs of {self.plan}/{self.user} with {list(self.per_worker)})"
        # each worker's node, in name order: the placement shown to the core, kept sorted as
        # jobs come and go (a bisection and a move in C per worker) rather than rebuilt
        self.workers: list[str] = []
        self._job: Job | None = None

    @property
    def size(self) -> int:
        return len(self.workers)

    def add(self, placement: tuple[str, ...]) -> None:
        workers = self.workers
        for node in placement:
            workers.insert(bisect.bisect_right(workers, node), node)
        self._job = None

    def remove(self, placement: tuple[str, ...]) -> None:
        workers = self.workers
        for node in placement:
            del workers[bisect.bisect_left(workers, node)]
        self._job = None

    def job(self) -> Job:
        if self._job is None:
            self._job = Job(
                id=self.id,
                user=self.user,
                plan=self.plan,
                per_worker=Resources(*self.per_worker),
                min_workers=self.size,
                state=JobState.RUNNING,
                placement=tuple(self.workers),
                started=0.0,
            )
        return self._job
