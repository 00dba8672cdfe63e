"""Join the job's process group from the variables the backend set (torch imported lazily).

Under the wmla backend the rendezvous store is a TCPStore served by rank 0 on ``MASTER_PORT``
(there is no torchrun agent to host it); under torchrun (no ``WMLA_JOB_ID``) ``env://`` uses the
agent's store, so the same script runs under both. Under wmla, rank 0 therefore leaves last:
``cleanup()`` lets every other rank tear its group down and check out through the store before
rank 0's process, and the store with it, goes away; otherwise a slow rank could lose the store in
the middle of its own teardown and abort.
"""

from __future__ import annotations

import datetime
import logging
import os
import sys
import time
from typing import Any, NoReturn

from .env import info

_store: Any = None
_LEFT = "wmla/left"
_joined = False  # this process created a process group (see leave())


def init_distributed(timeout_s: float = 300.0) -> Any:
    """Initialise torch.distributed once and return this worker's ``torch.device``.

    On ``nccl`` (real GPUs) the worker uses the first of the devices it was given
    (``CUDA_VISIBLE_DEVICES`` holds exactly its own); on ``gloo`` it uses the CPU. Under the
    backend the group is created even for a world of one, so code that calls collectives
    unconditionally still runs after an elastic job shrank to one worker.
    """
    global _store
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
        timeout = datetime.timedelta(seconds=timeout_s)
        kwargs: dict[str, Any] = {}
        if me.backend == "nccl":
            kwargs["device_id"] = device
        if me.job_id:  # under the wmla backend: rank 0 serves the store on MASTER_PORT
            _store = dist.TCPStore(
                me.master_addr,
                me.master_port,
                me.world_size,
                is_master=me.rank == 0,
                timeout=timeout,
            )
            kwargs["store"] = _store
        else:  # torchrun and friends: their agent serves the store, env:// finds it
            kwargs["init_method"] = "env://"
        dist.init_process_group(
            backend=me.backend,
            rank=me.rank,
            world_size=me.world_size,
            timeout=timeout,
            **kwargs,
        )
        global _joined
        _joined = True
    return device


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def cleanup(timeout_s: float = 30.0) -> None:
    """Leave the process group; rank 0 waits (up to ``timeout_s``) until every rank has left."""
    global _store
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    store, _store = _store, None
    if store is None:
        return
    me = info()
    try:
        store.add(_LEFT, 1)
        if me.rank == 0:
            deadline = time.monotonic() + timeout_s
            while store.add(_LEFT, 0) < me.world_size and time.monotonic() < deadline:
                time.sleep(0.02)
    except Exception:  # a peer or the store is gone already: nothing left to wait for
        pass


def leave(code: int) -> NoReturn:
    """Exit the worker with ``code`` once its work is done and its group left (``cleanup()``).

    A process that joined a process group exits at once (``os._exit``, after flushing stdout,
    stderr and logging) instead of through interpreter finalization: a DDP module still holds
    the group, and gloo's native threads that outlive the interpreter's teardown can abort the
    process ("terminate called without an active exception", SIGABRT; pytorch/pytorch#179291).
    That turned a worker which had finished, or saved its checkpoint, into a failed gang now and
    then. Without a group (a script run by hand) this is ``sys.exit(code)``.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    if _joined:
        os._exit(code)
    sys.exit(code)
