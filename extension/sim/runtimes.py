"""How long jobs run, as an estimate of the waiting line assumes it: the inputs of a forward
run (``estimate.estimate_starts``'s ``ends`` and ``runtimes``), built the same way by the
service (extension/service/queue.py) and by the benchmark that measures it
(benchmarks/bench_estimate.py).

- A job with a runtime limit runs to it: the service stops it there.
- A job without one runs the median runtime of its user's last ``size`` jobs of its kind that
  ran their course in its plan, else of the plan's, else ``default``: a guess (``guessed``).
- A running job already past its guess has outlived its user's usual runtime: it is assumed to
  run as long again as it has so far (what is left of a run that has lasted ``e`` is about
  ``e`` at the median, Gott's Copernican argument), within its limit. Ending it at once instead
  made every job behind a long run look about to start: on bench_estimate's Philly slice that
  one rule took the median error from 0.68 to about 0.25 of the actual wait.
- A job being stopped (a victim, a shrink, a job at its limit) ends after the grace period, and
  nothing ends sooner than that.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable, Mapping

from extension.scheduler import Job, JobState

HISTORY = 20  # runs per user (and per plan) a guess is the median of


class RunHistory:
    """The runtimes of recent jobs that ran their course, per (user, plan, kind) and per
    (plan, kind), the last ``size`` of each."""

    def __init__(self, size: int = HISTORY) -> None:
        self.size = size
        self._runs: dict[tuple, deque[float]] = {}

    def add(self, user: str, plan: str, kind: str, seconds: float) -> None:
        """One more run, the most recent so far."""
        for key in ((user, plan, kind), (plan, kind)):
            runs = self._runs.get(key)
            if runs is None:
                runs = self._runs[key] = deque(maxlen=self.size)
            runs.append(max(0.0, seconds))

    def median(self, user: str, plan: str, kind: str) -> float | None:
        """The user's median in that plan, else the plan's; None without any run."""
        runs = self._runs.get((user, plan, kind)) or self._runs.get((plan, kind))
        return statistics.median(runs) if runs else None


def forward_inputs(
    jobs: Iterable[Job],
    now: float,
    grace: float,
    limits: Mapping[str, float],
    kinds: Mapping[str, str],
    history: RunHistory,
    default: float,
) -> tuple[dict[str, float], dict[str, float], set[str]]:
    """Each running job's end and each pending job's runtime (module docstring), and the jobs
    whose figure is a guess from history (no runtime limit). ``kinds``: job id -> train or
    notebook (train when missing)."""
    ends: dict[str, float] = {}
    runtimes: dict[str, float] = {}
    guessed: set[str] = set()
    medians: dict[tuple, float | None] = {}
    for job in jobs:
        limit = limits.get(job.id)
        runtime = limit
        if runtime is None:
            key = (job.user, job.plan, kinds.get(job.id, "train"))
            if key not in medians:
                medians[key] = history.median(*key)
            runtime = medians[key]
            runtime = default if runtime is None else runtime
            guessed.add(job.id)
        if job.state is JobState.PENDING:
            runtimes[job.id] = runtime
            continue
        if job.state is not JobState.RUNNING:
            continue
        started = job.started if job.started is not None else now
        end = started + runtime
        if job.terminating:
            end = now + grace
        elif end < now:  # outlived its guess: as long again, within its limit
            end = now + (now - started)
            if limit is not None:
                end = min(end, started + limit)
        ends[job.id] = max(end, now + grace)
    return ends, runtimes, guessed
