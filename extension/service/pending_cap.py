"""The per-user cap on pending jobs (Slurm's MaxSubmitJobs): a flood of submissions from one
tenant is answered 429 before anything is stored, so it can exhaust neither the store nor the
scheduling cycle for the others."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from extension.scheduler import Job, JobState


class TooManyPending(RuntimeError):
    """The user has as many pending jobs as the instance takes; the message says the figure."""


class PendingCap:
    """Counts each user's pending jobs once per scheduling cycle (lazily, at the first
    submission of the cycle), plus the submissions taken since; ``limit`` 0: no cap."""

    def __init__(self, limit: int, jobs: Callable[[], Iterable[Job]], cycle: Callable[[], int]):
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(
                f"max_pending_per_user must be a whole number, 0 for no cap, got {limit!r}"
            )
        self.limit = limit
        self._jobs = jobs
        self._cycle = cycle
        self._counted_at: int | None = None
        self._counts: Counter[str] = Counter()

    def pending(self, user: str) -> int:
        """``user``'s pending jobs as of the last cycle, with the submissions taken since."""
        cycle = self._cycle()
        if cycle != self._counted_at:
            self._counts = Counter(j.user for j in self._jobs() if j.state is JobState.PENDING)
            self._counted_at = cycle
        return self._counts[user]

    def admit(self, user: str) -> None:
        """Count one more pending job of ``user``, or raise TooManyPending at the cap."""
        if not self.limit:
            return
        pending = self.pending(user)
        if pending >= self.limit:
            raise TooManyPending(
                f"you have {pending} pending jobs, the most this instance queues per user "
                f"(c.WmlaService.max_pending_per_user = {self.limit}); wait until some start, or "
                "cancel some (wmla exec-get --state PENDING; wmla exec-stop JOB), then submit again"
            )
        self._counts[user] += 1
