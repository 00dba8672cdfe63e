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
    user's first ``%wmla_train``: plotly's figures import plotly.io, which imports nbformat and
    so jsonschema, about 1 s in a new kernel (jsonschema below 4.24, pyproject.toml: from 4.24
    its format checkers built a URI grammar at import, 8-9 s on 2 busy cores;
    benchmarks/bench_first_log.py)."""
    try:
        import plotly.io  # noqa: F401

        import widgets.monitor  # noqa: F401
    except Exception:  # the magic says what is missing when it is used
        return


def unload_ipython_extension(ipython: Any) -> None:  # magics stay until the kernel restarts
    return None
