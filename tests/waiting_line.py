"""A stand-in for ``Scheduler.queue`` (extension/service/queue.py) where a test needs only its
``views()``: the admin page's and metering's readers of the waiting line."""

from __future__ import annotations

from typing import Any


class Line:
    """``views()`` answers the given views, or raises the given exception (a failing read)."""

    def __init__(self, views: Any) -> None:
        self._views = views

    def views(self) -> Any:
        if isinstance(self._views, Exception):
            raise self._views
        return self._views
