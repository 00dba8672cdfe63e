"""Join the job's process group from the variables the backend set (torch imported lazily)."""

from __future__ import annotations

import datetime
from typing import Any

from .env import info


def init_distributed(timeout_s: float = 300.0) -> Any:
    """Initialise torch.distributed (``env://``) once and return this worker's ``torch.device``.

    On ``nccl`` (real GPUs) the worker uses the first of the devices it was given
    (``CUDA_VISIBLE_DEVICES`` holds exactly its own); on ``gloo`` it uses the CPU. Under the
    backend the group is created even for a world of one, so code that calls collectives
    unconditionally still runs after an elastic job shrank to one worker.
    """
    import torch
    import torch.distributed as dist

    me = info()
    if me.backend == "nccl":
        if not torch.cuda.is_available():
            raise RuntimeError(
                "WMLA_BACKEND=nccl but torch sees no GPU (CUDA_VISIBLE_DEVICES="
                f"{me.devices!r}); install a CUDA build of torch or run with gloo"
            )
        torch.cuda.set_device(0)
        device = torch.device("cuda", 0)
    else:
        device = torch.device("cpu")
    if me.world_size == 1 and not me.job_id:
        return device  # run by hand: a world of one needs no process group (nor a free port)
    if not dist.is_initialized():
        kwargs: dict[str, Any] = {}
        if me.backend == "nccl":
            kwargs["device_id"] = device
        dist.init_process_group(
            backend=me.backend,
            init_method=f"tcp://{me.master_addr}:{me.master_port}",
            rank=me.rank,
            world_size=me.world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
            **kwargs,
        )
    return device


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def cleanup() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
