"""The names the mixin's parts share: the notebook job's kind, the defaults, the error the spawn
page shows."""

from __future__ import annotations

NOTEBOOK_KIND = "notebook"
DEFAULT_PLAN = "/sample-project/notebooks"
SPAWNER_SERVICE = "wmla-spawner"
GPU_GROUP = "wmla-gpu-notebooks"  # hub_config.culler.GPU_GROUP: the GPU culler's scope filter


class AdmissionError(RuntimeError):
    """The notebook cannot be admitted; the message is what the spawn page shows."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.jupyterhub_message = message
