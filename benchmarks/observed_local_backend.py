"""The real local backend with the load benchmark's eyes (bench_service.py --as-root): what
``LocalBackend`` does, unchanged, plus the cycle and event-loop logs of ``loop_observer``.

Configured like the backend it is: ``c.WmlaService.backend_class =
"benchmarks.observed_local_backend.ObservedLocalBackend"`` and ``backend_options`` of
``LocalBackend`` plus ``cycle_log``, ``lag_log``, ``lag_interval`` (instant_backend.py says what
they hold)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from extension.backends.base import Emit
from extension.backends.local import LocalBackend
from extension.scheduler import Node

from .loop_observer import LoopObserver


class ObservedLocalBackend(LocalBackend):
    def __init__(
        self,
        emit: Emit,
        nodes: Sequence[Node],
        state_dir: str,
        *,
        cycle_log: str = "",
        lag_log: str = "",
        lag_interval: float = 0.01,
        **options: Any,
    ) -> None:
        super().__init__(emit, nodes, state_dir, **options)
        self.observer = LoopObserver(emit, cycle_log, lag_log, lag_interval)

    def capacity(self) -> list[Node]:
        self.observer.start()  # first called from the running loop, before any cycle
        return super().capacity()

    async def close(self) -> None:
        self.observer.close()
        await super().close()
