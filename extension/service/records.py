"""The typed records the service's parts hand each other: a job's kind, a change for the store,
the instance's bounds. The store's columns keep plain strings (``JobKind.NOTEBOOK == "notebook"``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from extension.metering.transitions import Transition
from extension.scheduler import Resources


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
