"""plotly's ``FigureWidget`` imported on a daemon thread, started as soon as the magics load.

plotly's widget imports plotly.io, which imports nbformat and so jsonschema: a second or more
of CPU in a new kernel, which the user's first ``%wmla_train`` would otherwise wait for in
full (benchmarks/bench_first_log.py). The job monitor waits for what is left of it, then makes
its chart before it is displayed: a chart added to a monitor already on the page could be drawn
by a view that missed the traces added meanwhile (an empty chart, seen in the browser test).
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable

FIGURE_WIDGET_MODULE = "plotly.graph_objs._figurewidget"

log = logging.getLogger(__name__)


class BackgroundImport:
    """One import, run once on a daemon thread."""

    def __init__(self, load: Callable[[], object]) -> None:
        self.load = load
        self._done = threading.Event()
        self._guard = threading.Lock()
        self._started = False

    def start(self) -> None:
        """Begin the import (once); returns at once."""
        with self._guard:
            if self._started:
                return
            self._started = True
        threading.Thread(target=self._run, name="wmla-chart-import", daemon=True).start()

    def wait(self, timeout: float | None = None) -> bool:
        """Start the import if it was not, and wait for it; whether it is done (or failed:
        ``figure_widget`` then gives None, as it would have)."""
        self.start()
        return self._done.wait(timeout)

    def _run(self) -> None:
        try:
            self.load()
        except Exception:  # plotly or anywidget missing: the widgets show no chart
            log.debug("plotly's FigureWidget cannot be imported", exc_info=True)
        finally:
            self._done.set()


FIGURE_WIDGET = BackgroundImport(lambda: importlib.import_module(FIGURE_WIDGET_MODULE))
