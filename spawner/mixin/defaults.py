"""The names the spawner's configuration starts from: the notebook job's kind, the plan of a user
nobody mapped, the spawner's hub service and the hub group of GPU servers."""

from __future__ import annotations

NOTEBOOK_KIND = "notebook"
DEFAULT_PLAN = "/sample-project/notebooks"
SPAWNER_SERVICE = "wmla-spawner"
GPU_GROUP = "wmla-gpu-notebooks"  # hub_config.culler.GPU_GROUP: the GPU culler's scope filter
