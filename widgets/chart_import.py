"""plotly's ``FigureWidget`` imported on a daemon thread, and the charts that wait for it.

plotly's widget imports plotly.io, which imports nbformat and so jsonschema, whose format
checkers build a URI grammar (rfc3987_syntax, Lark) at import: 2.5 s of CPU, 8-9 s in a kernel
on two busy cores (benchmarks/bench_first_log.py). A job monitor that made its chart at once
held the user's first ``%wmla_train`` that long after the job was submitted. It shows the
job's state and log tail at once instead and adds its chart when the import is done.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable

FIGURE_WIDGET_MODULE = "plotly.graph_objs._figurewidget"

log = logging.getLogger(__name__)


class BackgroundImport:
    """One import, run once on a daemon thread; callbacks run when it is done."""

    def __init__(self, load: Callable[[], object]) -> None:
        self.load = load
        self._done = threading.Event()  # imported (or failed): new callbacks run at once
        self._settled = threading.Event()  # and every callback waiting then has run
        self._guard = threading.Lock()
        self._started = False
        self._waiting: list[Callable[[], None]] = []

    def done(self) -> bool:
        return self._done.is_set()

    def start(self) -> None:
        """Begin the import (once); returns at once."""
        with self._guard:
            if self._started:
                return
            self._started = True
        threading.Thread(target=self._run, name="wmla-chart-import", daemon=True).start()

    def wait(self, timeout: float | None = None) -> bool:
        """Start the import if it was not, and wait for it and the callbacks that waited for
        it; whether that is done."""
        self.start()
        return self._settled.wait(timeout)

    def then(self, callback: Callable[[], None]) -> None:
        """``callback()`` now when the import is done, else from its thread once it is (also
        when the import failed: ``figure_widget`` then gives None, as it would have)."""
        with self._guard:
            ready = self._done.is_set()
            if not ready:
                self._waiting.append(callback)
        if ready:
            callback()
        else:
            self.start()

    def _run(self) -> None:
        try:
            self.load()
        except Exception:  # plotly or anywidget missing: the widgets show no chart
            log.debug("plotly's FigureWidget cannot be imported", exc_info=True)
        with self._guard:
            self._done.set()
            waiting, self._waiting = self._waiting, []
        for callback in waiting:
            try:
                callback()
            except Exception:  # one monitor's failure is not another's
                log.warning("a chart could not be added", exc_info=True)
        self._settled.set()


FIGURE_WIDGET = BackgroundImport(lambda: importlib.import_module(FIGURE_WIDGET_MODULE))
