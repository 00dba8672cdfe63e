"""The admin page's preview of a plan change, off the event loop: the inputs are copied on the
loop (the cycle changes the live jobs in place), then the core runs on them in a thread of the
page's own, with an index cache of its own (``views.preview``)."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from extension.scheduler import IndexCache, Instance, Job, PlanFigures, PlanTree, SchedulerConfig

from ..store import PlanRecord
from . import views


@dataclass(frozen=True)
class PreviewInputs:
    """What a preview reads of the scheduler, as it was when the preview was asked for."""

    plans: PlanTree
    jobs: Mapping[str, Job]
    instance: Instance
    config: SchedulerConfig
    figures: Mapping[str, PlanFigures]

    @classmethod
    def of(cls, sched: Any) -> PreviewInputs:
        """On the loop: the tree, the instance and the figures are replaced, never changed, by
        the cycle and plan changes; the jobs are copied."""
        jobs = {job_id: replace(job) for job_id, job in sched.jobs.items()}
        return cls(sched.plans, jobs, sched.instance, sched.config, sched.figures)


class Previews:
    """One thread and one index cache for the page's previews, one preview at a time."""

    def __init__(self) -> None:
        self.cache = IndexCache()
        self._pool = concurrent.futures.ThreadPoolExecutor(1, "wmla-preview")

    async def rows(
        self, sched: Any, records: list[PlanRecord], create: bool, delete: list[str], now: float
    ) -> list[dict]:
        """``views.preview``'s rows for the change, worked out in the page's thread."""
        inputs = PreviewInputs.of(sched)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._pool, views.preview, inputs, records, create, delete, now, self.cache
        )
