"""``report_checkpoint(progress=None)``: tell the service this job has just written a checkpoint.

The service prefers, among the jobs it could preempt, the one that would lose the least work
since its last checkpoint (docs/scheduling.md "Reclaim 4"); this is how it learns when that was.
``checkpoint.save()`` calls it after every checkpoint it writes; a script that checkpoints its
own way calls it itself, after the checkpoint is safely on disk.

The channel is a datagram socket the backend's launcher (``backends/local/worker_launcher.py``)
made before it
started this worker and handed down as an inherited file descriptor, named by
``WMLA_REPORT_FD`` (rank 0 only). It carries no job id: the launcher at the other end knows which
job it started, so a report can only ever be about this job. A report is one small datagram sent
with ``MSG_DONTWAIT``: when the launcher is gone, its queue is full (a flood: only the latest
report matters anyway) or there is no channel at all (run by hand, under torchrun, on
Kubernetes), the report is dropped and training goes on; nothing here ever blocks or raises
because of the channel.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from typing import Any

ENV = "WMLA_REPORT_FD"
_FLAGS = getattr(socket, "MSG_DONTWAIT", 0) | getattr(socket, "MSG_NOSIGNAL", 0)
_channel: tuple[str, socket.socket | None] | None = None  # (the descriptor's identity, ours)


def checked_progress(progress: Any) -> float | None:
    """``progress`` as a float (None stays None); a non-number is the caller's bug, said at once.
    A non-finite figure (a diverged metric) is reported as None, since JSON has no NaN."""
    if progress is None:
        return None
    if hasattr(progress, "item") and callable(progress.item):  # torch / numpy scalar
        progress = progress.item()
    if isinstance(progress, bool) or not isinstance(progress, (int, float)):
        raise ValueError(
            f"progress must be a number such as 0.25 or an epoch count, got {progress!r}"
        )
    try:
        value = float(progress)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def report_checkpoint(progress: float | None = None) -> bool:
    """Report a checkpoint written just now; True when the report was handed to the
    channel, False when there is none, or it is gone or full (the report is dropped).

    ``progress``: any figure of how far the job is (an epoch, a step, a fraction); the service
    shows it with the checkpoint's time in ``GET /jobs/<id>``. Raises ValueError only for a
    ``progress`` that is not a number.
    """
    value = checked_progress(progress)
    sock = _socket()  # rank 0 has the channel; on the other ranks there is none
    if sock is None:
        return False
    message = json.dumps({"at": time.time(), "progress": value}).encode()
    try:
        sock.send(message, _FLAGS)
    except OSError:  # the launcher is gone, or its queue is full: drop it, train on
        return False
    return True


def _socket() -> socket.socket | None:
    """The channel's socket (a duplicate of the inherited descriptor, so that closing ours never
    closes the script's), kept while ``WMLA_REPORT_FD`` names the same open socket; None when
    there is none or the descriptor is not a datagram socket."""
    global _channel
    raw = os.environ.get(ENV, "")
    try:
        key = f"{raw}:{os.fstat(int(raw)).st_ino}" if raw.isdigit() else raw
    except OSError:  # not open in this process
        key = raw
    if _channel is not None and _channel[0] == key:
        return _channel[1]
    if _channel is not None and _channel[1] is not None:
        _channel[1].close()
    _channel = (key, _open(raw))
    return _channel[1]


def _open(raw: str) -> socket.socket | None:
    if not raw.isdigit():
        return None
    try:
        fd = os.dup(int(raw))
    except OSError:  # not open in this process
        return None
    try:
        sock = socket.socket(fileno=fd)
    except OSError:  # not a socket
        os.close(fd)
        return None
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_DGRAM:
        sock.close()
        return None
    return sock
