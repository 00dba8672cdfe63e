"""Reporting the backend's events to the service: ``EventKind`` members only, and a receiver
that raises never stops the backend."""

from __future__ import annotations

import logging
import time

from extension.backends.base import BackendEvent, Emit, EventKind

log = logging.getLogger("wmla.backends.local")


class Emitter:
    """Builds each ``BackendEvent`` and hands it to the service's ``emit``."""

    def __init__(self, emit: Emit) -> None:
        self.emit = emit

    def __call__(
        self,
        job_id: str,
        kind: EventKind,
        placement: tuple[str, ...] = (),
        exit_code: int | None = None,
        message: str = "",
        at: float | None = None,
        progress: float | None = None,
    ) -> None:
        when = time.time() if at is None else at
        event = BackendEvent(job_id, kind, when, tuple(placement), exit_code, message, progress)
        try:
            self.emit(event)
        except Exception:  # the receiver's bug must not stop the backend
            log.exception("emit(%s) raised", event)
