"""What a spawn leaves behind: the kernel's environment, and the state JupyterHub keeps across
hub restarts (the notebook job, its leaf and GPUs, and any release still due)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any


class SpawnState:
    """Part of :class:`~spawner.mixin.WmlaSpawnerMixin`. Reads the traits ``kernel_service_url``,
    ``service_name`` and ``storage_root``, the base spawner's ``user``; reads and restores
    ``wmla_job_id``, ``wmla_leaf``, ``wmla_gpus`` and ``_wmla_orphans``."""

    kernel_service_url: str
    service_name: str
    storage_root: str
    wmla_job_id: str
    wmla_leaf: str
    wmla_gpus: int
    _wmla_orphans: list[str]
    user: Any
    log: logging.Logger

    # -- environment for the client and the magics ------------------------------------------------
    def wmla_env(self, folder: str, ipython_dir: str | None) -> dict[str, str]:
        """What the kernel needs; the token is JUPYTERHUB_API_TOKEN (server_token_scopes)."""
        env = {
            "WMLA_URL": self.kernel_service_url or self.wmla_service_url(),
            "WMLA_SERVICE_NAME": self.service_name,
            "WMLA_USER": self.user.name,
            "WMLA_PLAN": self.wmla_leaf.rsplit("/", 1)[0] if self.wmla_leaf else "",
            "WMLA_LEAF": self.wmla_leaf,
            "WMLA_USER_DIR": folder,
            "WMLA_STORAGE_ROOT": self.storage_root,
            "WMLA_NOTEBOOK_JOB": self.wmla_job_id,
        }
        if ipython_dir:
            env["IPYTHONDIR"] = ipython_dir
        return env

    # -- state across hub restarts -------------------------------------------------------------
    def get_state(self) -> dict:
        state = super().get_state()
        if self.wmla_job_id:
            state["wmla_job_id"] = self.wmla_job_id
            state["wmla_leaf"] = self.wmla_leaf
        if self.wmla_gpus:
            state["wmla_gpus"] = self.wmla_gpus
        if self._wmla_orphans:  # a release still due survives the spawner object and the hub
            state["wmla_orphans"] = list(dict.fromkeys(self._wmla_orphans))
        return state

    def load_state(self, state: Mapping[str, Any]) -> None:
        super().load_state(state)
        self.wmla_job_id = state.get("wmla_job_id", "")
        self.wmla_leaf = state.get("wmla_leaf", "")
        self.wmla_gpus = int(state.get("wmla_gpus") or 0)
        orphans = [i for i in state.get("wmla_orphans") or [] if isinstance(i, str) and i]
        self._wmla_orphans = list(dict.fromkeys([*self._wmla_orphans, *orphans]))

    def clear_state(self) -> None:
        # LocalProcessSpawner.poll() clears the state of a server that died by itself before
        # JupyterHub's stop, which then skips stop(): keep the job id to release it
        if self.wmla_job_id:
            self._wmla_orphans.append(self.wmla_job_id)
        super().clear_state()
        self.wmla_job_id = ""
