"""The typed records the service's parts hand each other: a job's kind, a change for the store,
the instance's bounds. The store's columns keep plain strings (``JobKind.NOTEBOOK == "notebook"``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from extension.metering.transitions import Transition
from extension.scheduler import UNLIMITED, Resources


class JobKind(str, Enum):
    """What a job runs: training workers under the backend, or a notebook server that the
    spawner runs (the service only holds its resources)."""

    TRAIN = "train"
    NOTEBOOK = "notebook"

    def __str__(self) -> str:  # the value, as the store and the pages show it
        return self.value


@dataclass(frozen=True)
class StoreChange:
    """A job's change for the store: the columns it sets, the transition row it writes (None:
    none, the columns only) and that row's reason."""

    job_id: str
    values: dict[str, Any] = field(default_factory=dict)
    transition: Transition | None = None
    reason: str = ""


@dataclass(frozen=True)
class InstanceBounds:
    """What the admin caps the whole instance at (``c.WmlaService.quota``): the resources and
    the number of live jobs (None: no cap)."""

    quota: Resources
    max_jobs: int | None = None

    @classmethod
    def from_config(cls, quota: dict[str, Any]) -> InstanceBounds:
        """From ``c.WmlaService.quota`` (``{"gpu": 4, ..., "jobs": 100}``); ValueError saying
        what is wrong."""
        resources = {k: v for k, v in quota.items() if k != "jobs"}
        bound = Resources.from_mapping(resources, UNLIMITED, where="quota")
        jobs = quota.get("jobs")
        if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
            raise ValueError(f"quota jobs must be a whole number >= 1, got {jobs!r}")
        return cls(bound, jobs)
