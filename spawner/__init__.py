"""JupyterHub spawners for wmla: every notebook server is charged to a resource plan.

- :class:`~spawner.local.WmlaLocalSpawner` (entry point ``wmla-local``): local processes, the
  embedded default. As root, each hub user runs as their own system account.
- :class:`~spawner.kube.WmlaKubeSpawner` (entry point ``wmla-kube``): KubeSpawner with the
  user's folder mounted from a shared PVC, plan labels and the plan's Volcano queue.

Both share :class:`~spawner.mixin.WmlaSpawnerMixin`: hub user -> plan leaf, admission through
the wmla service as a non-preemptible one-worker job, the user's private folder, and the
kernel's environment (service URL, plan, folder, magics loaded). See docs/spawner.md.
"""

from __future__ import annotations

from typing import Any

__all__ = ["WmlaLocalSpawner", "WmlaKubeSpawner", "WmlaSpawnerMixin"]


def __getattr__(name: str) -> Any:
    # Imported lazily: kubespawner is an optional dependency (the k8s extra).
    if name == "WmlaLocalSpawner":
        from .local import WmlaLocalSpawner

        return WmlaLocalSpawner
    if name == "WmlaKubeSpawner":
        from .kube import WmlaKubeSpawner

        return WmlaKubeSpawner
    if name == "WmlaSpawnerMixin":
        from .mixin import WmlaSpawnerMixin

        return WmlaSpawnerMixin
    raise AttributeError(name)
