"""Notebook magics: ``%load_ext extension.magics`` registers ``%wmla_train`` and friends.

``%wmla_train``/``%%wmla_train`` submit a training job and show its monitor; ``%wmla_jobs``,
``%wmla_logs JOB``, ``%wmla_cancel JOB``, ``%wmla_plans`` and ``%wmla_usage`` read the service.
No decisions are made here: everything goes through :mod:`extension.client`. IPython is imported
only when the extension is loaded, so the option parsing stays importable anywhere.
"""

from __future__ import annotations

import threading
from typing import Any


def load_ipython_extension(ipython: Any) -> None:
    from .core import WmlaMagics

    ipython.register_magics(WmlaMagics)
    threading.Thread(target=_import_the_monitor, name="wmla-monitor-import", daemon=True).start()


def _import_the_monitor() -> None:
    """The job monitor's imports, in the background while the kernel is new rather than in the
    user's first ``%wmla_train``, which waits only for what is left of them; plotly's widget,
    the slow one, on a thread of its own (widgets/chart_import.py)."""
    try:
        from widgets.chart_import import FIGURE_WIDGET

        FIGURE_WIDGET.start()
        import widgets.monitor  # noqa: F401
    except Exception:  # the magic says what is missing when it is used
        return


def unload_ipython_extension(ipython: Any) -> None:  # magics stay until the kernel restarts
    return None
