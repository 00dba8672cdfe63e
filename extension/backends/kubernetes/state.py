"""What the backend knows: the cache of what the watches have seen, and its record of each job
it tracks (the phase it is in, the size asked for, where it runs)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import Enum

from .. import manifests as m
from ..base import JobSpec
from .api import PODS, WatchEvent
from .objects import labels_of, meta_of, name_of

GONE_KEPT = 10_000  # deleted pods kept with their final status (a few KiB each)


# -- the cache -----------------------------------------------------------------------------------
class Cache:
    """What the watches have seen, by kind and name. Read it; only the watch loop writes it."""

    def __init__(self) -> None:
        self._objects: dict[str, dict[str, dict]] = {}
        self.resource_version: dict[str, str] = {}
        # pods as their DELETED event last showed them (their final status), the latest
        # GONE_KEPT: a failed job's pods may be deleted before the job's end is derived
        self._gone: OrderedDict[str, dict] = OrderedDict()

    def replace(self, kind: str, items: Iterable[dict], resource_version: str) -> None:
        self._objects[kind] = {self._key(o): o for o in items}
        self.resource_version[kind] = resource_version

    def apply(self, kind: str, event: str, obj: dict) -> None:
        objects = self._objects.setdefault(kind, {})
        if event == WatchEvent.DELETED:
            objects.pop(self._key(obj), None)
            if kind == PODS:
                self._gone[self._key(obj)] = obj
                while len(self._gone) > GONE_KEPT:
                    self._gone.popitem(last=False)
        elif event in (WatchEvent.ADDED, WatchEvent.MODIFIED):
            objects[self._key(obj)] = obj
        version = meta_of(obj).get("resourceVersion")
        if version:
            self.resource_version[kind] = version

    def get(self, kind: str, name: str) -> dict | None:
        return self._objects.get(kind, {}).get(name)

    def all(self, kind: str) -> list[dict]:
        return [self._objects[kind][k] for k in sorted(self._objects.get(kind, {}))]

    def pods_of(self, job_name: str) -> list[dict]:
        """The pods of one job object (by the job label every pod template carries)."""
        return [p for p in self.all(PODS) if labels_of(p).get(m.LABEL_JOB) == job_name]

    def gone_pods_of(self, job_name: str) -> list[dict]:
        """The job's pods deleted since, as their deletion showed them last."""
        return [p for p in self._gone.values() if labels_of(p).get(m.LABEL_JOB) == job_name]

    @staticmethod
    def _key(obj: Mapping) -> str:
        return name_of(obj)


# -- the jobs tracked ----------------------------------------------------------------------------
class Phase(Enum):
    """Where a tracked job is in what the backend was told to do with it."""

    STARTING = "starting"
    RUNNING = "running"
    RESIZING = "resizing"
    STOPPING = "stopping"


@dataclass(frozen=True)
class FailedPod:
    """A worker pod seen with a failed container: its rank among the job's pods then."""

    rank: int
    pod: dict


@dataclass
class TrackedJob:
    """The backend's record of one job it carries out decisions on."""

    spec: JobSpec
    name: str  # the job object's name
    kind: str  # the job object's kind (PYTORCHJOBS or VOLCANO_JOBS)
    phase: Phase = Phase.STARTING
    workers: int = 0  # the size asked for (the target during a resize)
    seen: bool = False  # the job object has been in the cache
    reason: str = ""  # why it is being stopped
    placement: tuple[str, ...] = ()
    # its pods as last seen with a failed container, by name: the training operator deletes a
    # failed job's pods at once, and the job's failure still needs their exit code and rank
    failed_pods: dict[str, FailedPod] = field(default_factory=dict)


class Tracking:
    """The jobs tracked by id, and those whose end was (or is being) reported: a job's end is
    reported once, and a stop after it has nothing to release."""

    def __init__(self) -> None:
        self._jobs: dict[str, TrackedJob] = {}
        self._ended: set[str] = set()

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs

    def __iter__(self) -> Iterator[TrackedJob]:
        return iter(list(self._jobs.values()))

    def get(self, job_id: str) -> TrackedJob | None:
        return self._jobs.get(job_id)

    def ids(self) -> list[str]:
        return list(self._jobs)

    def track(self, job_id: str, tracked: TrackedJob) -> None:
        """Track a job (again: a preempted job that starts again may end again)."""
        self._ended.discard(job_id)
        self._jobs[job_id] = tracked

    def adopt(self, job_id: str, tracked: TrackedJob) -> None:
        """Track a job found in the cluster (a stop of it, a restart's recover)."""
        self._jobs[job_id] = tracked

    def forget(self, job_id: str) -> None:
        """Stop tracking a job that was never created (its start failed)."""
        self._jobs.pop(job_id, None)

    def end(self, job_id: str) -> None:
        """Its end is being reported: no longer tracked, and remembered as ended."""
        del self._jobs[job_id]
        self._ended.add(job_id)

    def has_ended(self, job_id: str) -> bool:
        return job_id in self._ended
