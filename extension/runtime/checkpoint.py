"""Checkpoints in ``$WMLA_JOB_DIR/checkpoints/``: written by rank 0, atomically, read by all.

``save(state)`` writes ``checkpoints/<name>.pt`` through a temporary file in the same directory,
fsync and ``os.replace``, so a worker killed mid-write (SIGKILL after the grace period) leaves the
previous checkpoint intact, never a torn one. With torch loaded the file is a ``torch.save`` file
(tensors of any device); without it, a pickle. ``load()`` reads either.

Once the file is in place, ``save`` reports the checkpoint to the service
(``channel.report_checkpoint``: its time and the optional ``progress``), which then counts the
job's work at risk from it; a report that cannot be delivered is dropped, never an error.
"""

from __future__ import annotations

import os
import pickle
import re
import sys
import tempfile
from typing import Any

from .channel import checked_progress, report_checkpoint
from .env import info, job_dir

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
DEFAULT = "latest"


def directory() -> str:
    return os.path.join(job_dir(), "checkpoints")


def path(name: str = DEFAULT) -> str:
    if not _NAME.match(name):
        raise ValueError(
            f"checkpoint name {name!r} must be letters, digits, '.', '_' or '-' "
            "(at most 100), like 'latest' or 'epoch-3'"
        )
    return os.path.join(directory(), f"{name}.pt")


def exists(name: str = DEFAULT) -> bool:
    return os.path.exists(path(name))


def save(
    state: Any, name: str = DEFAULT, all_ranks: bool = False, progress: float | None = None
) -> str | None:
    """Write ``state`` as checkpoint ``name``; only rank 0 writes unless ``all_ranks``. Then
    report it to the service with ``progress`` (a number, e.g. the epoch; shown with it).

    Returns the file's path on the worker that wrote it, else None.
    """
    target = path(name)
    progress = checked_progress(progress)  # a bad figure fails before anything is written
    if not all_ranks and info().rank != 0:
        return None
    os.makedirs(os.path.dirname(target), exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=os.path.dirname(target))
    try:
        with os.fdopen(fd, "wb") as out:
            torch = sys.modules.get("torch")
            if torch is not None:
                torch.save(state, out)
            else:
                pickle.dump(state, out, protocol=pickle.HIGHEST_PROTOCOL)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(os.path.dirname(target))
    report_checkpoint(progress)  # rank 0's reaches the service; dropped when it cannot
    return target


def load(name: str = DEFAULT, map_location: Any = "cpu", default: Any = None) -> Any:
    """The state saved as ``name``, or ``default`` when there is none yet."""
    source = path(name)
    try:
        with open(source, "rb") as src:
            magic = src.read(2)
            src.seek(0)
            if magic == b"PK":  # torch.save's zip container
                import torch

                return torch.load(src, map_location=map_location, weights_only=False)
            return pickle.load(src)
    except FileNotFoundError:
        return default


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
