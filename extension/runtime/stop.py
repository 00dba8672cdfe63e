"""SIGTERM means "save a checkpoint now, then exit", cooperatively.

The backend stops a gang (preemption, cancel, resize) with SIGTERM to every worker's process
group, then SIGKILL after the grace period. The handler installed here only raises a flag; the
training loop asks ``should_stop()`` at a safe point (between steps), saves its state and calls
``exit_stopped()``. ``should_stop()`` agrees across the ranks (an all-reduce of the flag), so all
ranks leave the loop at the same step and none is left waiting in a collective for a peer that is
gone.

A worker that stops this way exits with ``STOPPED_EXIT_CODE`` (143, the shell's code for
SIGTERM), never 0: a job stopped by someone else than the service must not pass for finished.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

STOPPED_EXIT_CODE = 143

_flag = threading.Event()
_installed = False


def _on_sigterm(signum: int, frame: Any) -> None:
    _flag.set()


def install_stop_handler() -> bool:
    """Turn SIGTERM into a flag; returns False when not in the main thread (cannot install)."""
    global _installed
    if threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(signal.SIGTERM, _on_sigterm)
    _installed = True
    return True


def stop_requested() -> bool:
    """This worker got SIGTERM (no agreement with the other ranks)."""
    return _flag.is_set()


def request_stop() -> None:
    """Behave as if SIGTERM had arrived (tests, or a script that wants to stop itself)."""
    _flag.set()


def should_stop(sync: bool = True) -> bool:
    """True when any rank got SIGTERM; every rank must call it at the same point when ``sync``."""
    local = _flag.is_set()
    if not sync:
        return local
    dist = _initialized_dist()
    if dist is None or dist.get_world_size() < 2:
        return local
    import torch

    device = "cpu"
    if dist.get_backend() == "nccl":
        device = f"cuda:{torch.cuda.current_device()}"
    flag = torch.tensor([1 if local else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item():
        _flag.set()
        return True
    return False


def exit_stopped(state: Any = None, code: int = STOPPED_EXIT_CODE) -> None:
    """Save ``state`` as the latest checkpoint (rank 0; skipped when None), then exit ``code``."""
    if state is not None:
        from . import checkpoint

        checkpoint.save(state)
    from .distributed import cleanup, leave

    if "torch" in sys.modules:
        try:
            cleanup(timeout_s=5.0)
        except Exception:  # peers may be gone already; exiting is what matters
            pass
    leave(code)


def _initialized_dist() -> Any:
    if "torch" not in sys.modules:
        return None
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch without distributed
        return None
    if dist.is_available() and dist.is_initialized():
        return dist
    return None
