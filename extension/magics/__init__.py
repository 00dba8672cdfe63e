"""Notebook magics: ``%load_ext extension.magics`` registers ``%wmla_train`` and friends.

``%wmla_train``/``%%wmla_train`` submit a training job and show its monitor; ``%wmla_jobs``,
``%wmla_logs JOB``, ``%wmla_cancel JOB``, ``%wmla_plans`` and ``%wmla_usage`` read the service.
No decisions are made here: everything goes through :mod:`extension.client`. IPython is imported
only when the extension is loaded, so the option parsing stays importable anywhere.
"""

from __future__ import annotations

from typing import Any


def load_ipython_extension(ipython: Any) -> None:
    from .core import WmlaMagics

    ipython.register_magics(WmlaMagics)


def unload_ipython_extension(ipython: Any) -> None:  # magics stay until the kernel restarts
    return None
