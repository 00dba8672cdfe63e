"""What a notebook server asks the service for: its GPUs, its per-worker request and limits in
the service's units, and the notebook job's body."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .defaults import NOTEBOOK_KIND


@dataclass(frozen=True)
class NotebookRequest:
    """The one worker of a notebook job: its GPUs, its request (``gpu``, and ``cpu`` and
    ``memory`` when set) and its limits."""

    gpus: int
    resources: dict[str, Any]
    limits: dict[str, Any]

    @classmethod
    def of(
        cls,
        *,
        gpus: int,
        notebook_cpu: str = "",
        notebook_memory: str = "",
        cpu_guarantee: float | None = None,
        mem_guarantee: Any = None,
        cpu_limit: float | None = None,
        mem_limit: Any = None,
    ) -> NotebookRequest:
        """From the spawner's traits (a profile's overrides applied already): the notebook's
        own cpu and memory, else JupyterHub's guarantees; JupyterHub's limits."""
        gpus = int(gpus or 0)
        resources: dict[str, Any] = {"gpu": gpus}
        cpu = notebook_cpu or _cpu(cpu_guarantee)
        mem = notebook_memory or mem_guarantee
        if cpu:
            resources["cpu"] = cpu
        if mem:
            resources["memory"] = mem
        limits: dict[str, Any] = {}
        if cpu_limit:
            limits["cpu"] = _cpu(cpu_limit)
        if mem_limit:
            limits["memory"] = mem_limit
        return cls(gpus, resources, limits)

    def job_body(self, *, plan: str, user: str, server: str) -> dict[str, Any]:
        """``POST /jobs``'s body: a rigid, non-preemptible gang of one worker, submitted for
        ``user`` (the spawner is a plan admin)."""
        body: dict[str, Any] = {
            "plan": plan,
            "kind": NOTEBOOK_KIND,
            "user": user,
            "name": f"notebook {server}" if server else "notebook",
            "workers": 1,
            "preemptible": False,
            "resources": dict(self.resources),
        }
        if self.limits:
            body["limits"] = dict(self.limits)
        return body

    def describe(self) -> str:
        """``gpu 1, cpu 500m, memory 2Gi``: the progress line's words for the request."""
        return ", ".join(f"{k} {v}" for k, v in self.resources.items())


def _cpu(cores: float | None) -> str | None:
    """JupyterHub's cpu_guarantee/cpu_limit (cores, float) -> millicores text."""
    if not cores:
        return None
    return f"{round(float(cores) * 1000)}m"
