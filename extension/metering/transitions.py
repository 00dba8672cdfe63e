"""The names of a job's transitions: the history the service writes and metering folds.

Each is a row of the ``transitions`` table (extension/service/store.py); the column holds the
value, a plain string (``Transition.STARTED == "started"``), so the store keeps what it always
kept. Here, not in the service, because metering reads them and does not import the service.
"""

from __future__ import annotations

from enum import Enum


class Transition(str, Enum):
    """A change of a job's state or of the workers it holds."""

    SUBMITTED = "submitted"
    STARTED = "started"
    RUNNING = "running"
    GROWN = "grown"
    SHRINKING = "shrinking"
    RESIZED = "resized"
    PREEMPTING = "preempting"
    RELEASED = "released"
    REFUSED = "refused"
    REJECTED = "rejected"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"
    TIMING_OUT = "timing-out"
    TIMED_OUT = "timed-out"
    FINISHED = "finished"
    FAILED = "failed"
    LOST = "lost"

    def __str__(self) -> str:  # the value, as the store and the pages show it
        return self.value
