"""The record of one spawn: the notebook job it holds, what the service granted it, the spawn
page's progress events and where the spawn stands (waiting for room, stopping), owned by the
spawner and handed to each collaborator that reads or changes it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any


@dataclass
class JobGrant:
    """What the service admitted the notebook job with, in its units: the request as the limit
    range filled it in, the limits, and the GPU indexes it holds per worker (None: not known)."""

    resources: dict[str, Any] = field(default_factory=dict)
    limits: dict[str, Any] = field(default_factory=dict)
    devices: list | None = None


@dataclass
class SpawnRecord:
    """One server's spawn, from its admission to its release."""

    job_id: str = ""  # the notebook job that holds the plan's resources for the server
    leaf: str = ""  # <plan>/<user>, the leaf the job is charged to
    gpus: int = 0  # GPUs the admitted notebook job holds
    granted: JobGrant = field(default_factory=JobGrant)
    profile_plan: str = ""  # the plan the picked profile forces (its wmla_plan override)
    events: list[dict[str, Any]] = field(default_factory=list)  # the spawn page's progress
    changed: asyncio.Event | None = None  # set at each new event while the admission waits
    waiting: bool = False  # the admission waits for the job to run
    stopping: bool = False  # a stop is under way: the admission gives up, the poll stays out
    orphans: list[str] = field(default_factory=list)  # released servers' jobs still held

    @property
    def plan(self) -> str:
        """The plan of the leaf, "" before an admission."""
        return self.leaf.rsplit("/", 1)[0] if self.leaf else ""
