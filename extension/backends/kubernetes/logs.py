"""The workers' logs: read from the API server when a job ends (or when asked), and kept for
``logs`` to show, one text per worker rank."""

from __future__ import annotations

import contextlib

from .. import manifests as m
from .api import ApiError
from .calls import ApiCalls
from .errors import BackendError
from .objects import name_of, pod_rank
from .state import Cache, Tracking


class WorkerLogs:
    """Each job's logs by worker rank, as last read."""

    def __init__(
        self, calls: ApiCalls, cache: Cache, tracking: Tracking, *, namespace: str, prefix: str
    ) -> None:
        self.calls = calls
        self.cache = cache
        self.tracking = tracking
        self.namespace = namespace
        self.prefix = prefix
        self._logs: dict[str, dict[int, str]] = {}

    def text(self, job_id: str, worker: int | None = None, tail: int | None = None) -> str:
        """The logs read so far: one worker's, or every worker's prefixed with its rank."""
        by_worker = self._logs.get(job_id)
        if not by_worker:
            return ""
        ranks = [worker] if worker is not None else sorted(by_worker)
        lines: list[str] = []
        for rank in ranks:
            text = by_worker.get(rank, "")
            prefix = "" if worker is not None else f"[worker {rank}] "
            lines.extend(prefix + line for line in text.splitlines())
        return "\n".join(lines[-tail:] if tail else lines)

    async def fetch(self, job_id: str, tail: int | None = 1000) -> dict[int, str]:
        """Read each worker pod's log from the API (best effort: a pod that cannot be read is
        left out)."""
        tracked = self.tracking.get(job_id)
        name = tracked.name if tracked else m.job_object_name(job_id, self.prefix)
        pods = sorted(self.cache.pods_of(name), key=pod_rank)
        out: dict[int, str] = {}
        for rank, pod in enumerate(pods):
            with contextlib.suppress(ApiError, BackendError, OSError):
                out[rank] = await self.calls.call(
                    f"read log of {name_of(pod)}",
                    lambda pod=pod: self.calls.api.read_log(
                        self.namespace, name_of(pod), None, tail
                    ),
                )
        if out or job_id not in self._logs:  # pods gone since: keep what was read from them
            self._logs[job_id] = out
        return self._logs[job_id]
