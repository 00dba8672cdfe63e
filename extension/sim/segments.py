"""Every job's run segments, as sacct gives them to Slurm users (``wmla simulate --jobs-csv``).

A segment is a span in which a job ran with the same number of workers: it opens when the
job starts (or restarts, or its size changes) and closes when the job finishes, is
preempted (its workers given back), is shrunk or grown (a new segment opens with the new
size) or is cancelled; one still open at the end of the replay is ``running`` with no end.
A job that never started gets one row with no start, and the GPUs it asked for. The
recorder (``recorder.py``) tells the log of every change of a job's placement or state;
docs/simulate.md "Jobs CSV" gives the columns.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from .files import atomic_write
from .jobs import ReplayJob
from .metrics import num

COLUMNS = ("job_id", "team", "user", "gpus", "submit_s", "start_s", "end_s", "end")


class End(str, Enum):
    """How a segment ended (the ``end`` column)."""

    FINISHED = "finished"  # the job's work was done
    PREEMPTED = "preempted"  # stopped by a reclaim; the job went back to the queue
    SHRUNK = "shrunk"  # workers taken back; the next segment has fewer GPUs
    GROWN = "grown"  # workers added; the next segment has more GPUs
    TIMEOUT = "timeout"  # ran into its runtime limit (the simulator has none yet)
    CANCELLED = "cancelled"  # the user cancelled it (started or not)
    RUNNING = "running"  # still running at the end of the replay (no end_s)
    NEVER_STARTED = "never_started"  # still pending at the end of the replay (no start_s)
    REJECTED = "rejected"  # refused by the scheduler, never started (no start_s)


@dataclass
class Segment:
    """One row: a job ran ``gpus`` GPUs from ``start`` to ``end`` (None: not started, or
    still running), and how it ended."""

    job: ReplayJob
    gpus: float
    workers: int
    start: float | None
    end: float | None = None
    how: End = End.RUNNING

    def row(self) -> tuple[str, ...]:
        spec = self.job.spec
        return (
            spec.id,
            spec.plan,
            spec.user,
            _cell(self.gpus),
            _cell(spec.at),
            _cell(self.start),
            _cell(self.end),
            self.how.value,
        )


class SegmentLog:
    """The segments of every job of one replay, opened and closed as placements change."""

    def __init__(self) -> None:
        self.closed: dict[str, list[Segment]] = {}
        self.open: dict[str, Segment] = {}

    def seen(self, job: ReplayJob, now: float) -> None:
        """The job's state or placement may have changed at ``now``."""
        running = job.state == "RUNNING"
        workers = len(job.core.placement) if running else 0
        segment = self.open.get(job.id)
        if segment is not None:
            if workers == segment.workers:
                return
            self._close(segment, job, workers, now)
        if workers:
            self.open[job.id] = Segment(job, workers * job.gpu, workers, now)

    def _close(self, segment: Segment, job: ReplayJob, workers: int, now: float) -> None:
        del self.open[job.id]
        segment.end = now
        if workers:
            segment.how = End.SHRUNK if workers < segment.workers else End.GROWN
        elif job.state == "FINISHED":
            segment.how, segment.end = End.FINISHED, job.ended
        elif job.state == "CANCELLED":
            segment.how, segment.end = End.CANCELLED, job.ended
        else:
            segment.how = End.PREEMPTED
        self.closed.setdefault(job.id, []).append(segment)

    def rows(self, jobs: Iterable[ReplayJob]) -> Iterator[Segment]:
        """Every job's segments in submission order, then one for each job that never
        started (``never_started``, ``rejected`` or ``cancelled``)."""
        for job in sorted(jobs, key=lambda j: j.seq):
            yield from self.closed.get(job.id, ())
            last = self.open.get(job.id)
            if last is not None:
                yield last
            elif job.first_start is None:  # the GPUs it asked for: its whole gang at most
                asked = job.core.max_workers
                yield Segment(job, asked * job.gpu, asked, None, None, _never(job))


def _never(job: ReplayJob) -> End:
    if job.state == "REJECTED":
        return End.REJECTED
    if job.state == "CANCELLED":
        return End.CANCELLED
    return End.NEVER_STARTED


def _cell(value: float | None) -> str:
    return "" if value is None else str(num(value))


def jobs_csv(log: SegmentLog, jobs: Iterable[ReplayJob]) -> str:
    """The CSV text: the header ``COLUMNS``, then ``log.rows(jobs)``."""
    text = io.StringIO()
    out = csv.writer(text, lineterminator="\n")
    out.writerow(COLUMNS)
    out.writerows(s.row() for s in log.rows(jobs))
    return text.getvalue()


def write_jobs_csv(path: Path, log: SegmentLog, jobs: Iterable[ReplayJob]) -> None:
    """The CSV at ``path``, written whole or not at all (``files.atomic_write``)."""
    atomic_write(path, jobs_csv(log, jobs))
