"""Who this worker is: rank and world, read from the variables the backend sets.

The local backend (and the Kubernetes one) start every worker with the torch.distributed
variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``) and the wmla ones (``WMLA_JOB_ID``, ``WMLA_JOB_DIR``, ``WMLA_USER``,
``WMLA_BACKEND``). A script run by hand, outside the service, sees none of them and is a world of
one worker whose job directory is the current directory, so the same script runs both ways.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerInfo:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    job_id: str
    job_dir: str
    user: str
    backend: str  # torch.distributed backend: "nccl" on GPUs, else "gloo"
    devices: str  # CUDA_VISIBLE_DEVICES as set by the backend ("" when none)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _int(env: Mapping[str, str], name: str, default: int, minimum: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(
            f"{name}={raw!r} is not a whole number; unset it or set it like {name}=0"
        ) from None
    if value < minimum:
        raise ValueError(f"{name}={value} must be at least {minimum}")
    return value


def info(env: Mapping[str, str] | None = None) -> WorkerInfo:
    """This worker's place in the job, from ``env`` (default: ``os.environ``)."""
    env = os.environ if env is None else env
    world = _int(env, "WORLD_SIZE", 1, 1)
    rank = _int(env, "RANK", 0, 0)
    if rank >= world:
        raise ValueError(f"RANK={rank} must be below WORLD_SIZE={world}")
    local_world = _int(env, "LOCAL_WORLD_SIZE", 1 if "WORLD_SIZE" not in env else world, 1)
    local_rank = _int(env, "LOCAL_RANK", 0, 0)
    if local_rank >= local_world:
        raise ValueError(f"LOCAL_RANK={local_rank} must be below LOCAL_WORLD_SIZE={local_world}")
    devices = env.get("CUDA_VISIBLE_DEVICES", "")
    backend = env.get("WMLA_BACKEND") or "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"WMLA_BACKEND={backend!r} must be gloo or nccl")
    return WorkerInfo(
        rank=rank,
        world_size=world,
        local_rank=local_rank,
        local_world_size=local_world,
        master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
        master_port=_int(env, "MASTER_PORT", 29500, 1),
        job_id=env.get("WMLA_JOB_ID", ""),
        job_dir=env.get("WMLA_JOB_DIR") or os.getcwd(),
        user=env.get("WMLA_USER", ""),
        backend=backend,
        devices=devices,
    )


def rank() -> int:
    return info().rank


def world_size() -> int:
    return info().world_size


def is_main() -> bool:
    """True on rank 0, the worker that writes checkpoints, metrics and the model."""
    return info().rank == 0


def job_dir() -> str:
    """``$WMLA_JOB_DIR`` (the job's own directory), or the current directory when run by hand."""
    return os.environ.get("WMLA_JOB_DIR") or os.getcwd()
