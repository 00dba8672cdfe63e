"""The state JupyterHub keeps across hub restarts for a spawn: its notebook job, leaf and GPUs,
and any release still due."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .record import SpawnRecord


def save_state(spawn: SpawnRecord) -> dict[str, Any]:
    """What of the spawn goes into the hub's spawner state (nothing for a spawn that holds no
    job and owes no release)."""
    state: dict[str, Any] = {}
    if spawn.job_id:
        state["wmla_job_id"] = spawn.job_id
        state["wmla_leaf"] = spawn.leaf
    if spawn.gpus:
        state["wmla_gpus"] = spawn.gpus
    if spawn.orphans:  # a release still due survives the spawner object and the hub
        state["wmla_orphans"] = list(dict.fromkeys(spawn.orphans))
    return state


def load_state(spawn: SpawnRecord, state: Mapping[str, Any]) -> None:
    """The spawn as the hub's state has it; orphans are added to those already known."""
    spawn.job_id = state.get("wmla_job_id", "")
    spawn.leaf = state.get("wmla_leaf", "")
    spawn.gpus = int(state.get("wmla_gpus") or 0)
    orphans = [i for i in state.get("wmla_orphans") or [] if isinstance(i, str) and i]
    spawn.orphans = list(dict.fromkeys([*spawn.orphans, *orphans]))


def forget_job(spawn: SpawnRecord) -> None:
    """The hub clears the state of a server that died by itself before its stop, which it then
    skips: the job becomes an orphan, released at the next stop or start."""
    if spawn.job_id:
        spawn.orphans.append(spawn.job_id)
    spawn.job_id = ""
