"""The live jobs: one ``LiveJob`` record per pending or running job, and their collection.

A record holds everything the service keeps of a live job between cycles: the job in the core's
terms, its kind, what the backend runs, the last waiting reason written, the placement a shrink
under way goes to, its runtime limit and whether it is being stopped at it. A job that ends is one
removal (``LiveJobs.end``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from extension.backends.base import JobSpec
from extension.scheduler import Job, JobState

from .jobrows import core_job, job_spec
from .notebook_devices import NotebookDevices
from .records import JobKind
from .rows import JobRow


@dataclass
class LiveJob:
    """One live job (see the module's docstring)."""

    job: Job  # in the core's terms; the cycle changes it in place
    kind: JobKind
    spec: JobSpec  # what the backend runs
    reason: str | None = None  # the last waiting reason written to the store
    resize_to: tuple[str, ...] | None = None  # a shrink under way: the placement it goes to
    max_runtime: float | None = None  # seconds; None: no runtime limit
    stopping: bool = False  # a stop at its runtime limit was asked for

    @classmethod
    def of(cls, row: JobRow) -> LiveJob:
        """The record of a live job's store row."""
        return cls(
            job=core_job(row),
            kind=JobKind(row.kind),
            spec=job_spec(row),
            max_runtime=row.max_runtime,
            stopping=bool(row.timeout_requested),
        )


class CoreJobs(Mapping[str, Job]):
    """The live jobs in the core's terms, by id: a view, not a copy."""

    def __init__(self, records: dict[str, LiveJob]) -> None:
        self._records = records

    def __getitem__(self, job_id: str) -> Job:
        return self._records[job_id].job

    def __iter__(self) -> Iterator[str]:
        return iter(self._records)

    def __len__(self) -> int:
        return len(self._records)

    def get(self, job_id: str, default: Job | None = None) -> Job | None:  # type: ignore[override]
        record = self._records.get(job_id)  # each event of a cycle looks its job up
        return default if record is None else record.job

    def values(self) -> list[Job]:  # type: ignore[override]
        # every cycle lists them all: Mapping's view would look each one up again by its key
        return [record.job for record in self._records.values()]


class LiveJobs(Mapping[str, LiveJob]):
    """Every live job's record, by id. ``end`` takes a job out (and gives a notebook's devices
    back); ``jobs`` is the view in the core's terms."""

    def __init__(self, notebook_devices: NotebookDevices) -> None:
        self._records: dict[str, LiveJob] = {}
        # the ones with a runtime limit, which each cycle checks: not every pending job
        self._limited: dict[str, LiveJob] = {}
        self.notebook_devices = notebook_devices
        self.jobs = CoreJobs(self._records)

    def __getitem__(self, job_id: str) -> LiveJob:
        return self._records[job_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._records)

    def __len__(self) -> int:
        return len(self._records)

    def take_in(self, row: JobRow) -> LiveJob:
        record = LiveJob.of(row)
        self.add(record)
        return record

    def add(self, record: LiveJob) -> None:
        self._records[record.job.id] = record
        if record.max_runtime is not None:
            self._limited[record.job.id] = record
        else:
            self._limited.pop(record.job.id, None)

    def end(self, job: Job, state: JobState) -> None:
        """``job`` is over (``state``): out of the live jobs, its notebook devices given back."""
        record = self._records.pop(job.id, None)
        self._limited.pop(job.id, None)
        if record is not None and record.kind is JobKind.NOTEBOOK:
            self.notebook_devices.release(job.id)
        job.state = state
        job.placement = ()

    def clear(self) -> None:
        self._records.clear()
        self._limited.clear()

    def limited(self) -> list[LiveJob]:
        """The records of the live jobs that have a runtime limit."""
        return list(self._limited.values())

    def kind_of(self, job_id: str) -> JobKind | None:
        record = self._records.get(job_id)
        return record.kind if record is not None else None

    def kinds(self) -> dict[str, JobKind]:
        """Live job id -> its kind."""
        return {job_id: r.kind for job_id, r in self._records.items()}

    def runtimes(self) -> dict[str, float]:
        """Live job id -> its runtime limit in seconds, for the jobs that have one."""
        return {
            job_id: r.max_runtime
            for job_id, r in self._limited.items()
            if r.max_runtime is not None
        }

    def notebooks(self) -> list[str]:
        """Ids of the live notebook jobs."""
        return [job_id for job_id, r in self._records.items() if r.kind is JobKind.NOTEBOOK]
