"""The backend a service runs on, built from ``c.WmlaService``'s settings: its class
imported by name, the nodes detected (or laid out) on this machine, its private folder."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from extension.backends.capacity import detect_nodes

from .privacy import PRIVATE_DIR, make_dir


def build_backend(
    backend_class: str,
    emit: Callable,
    *,
    device_layout: str,
    cpu_oversubscription: float,
    state_dir: str,
    options: dict[str, Any],
) -> Any:
    """An instance of ``backend_class`` over this machine's nodes; every bad setting is a
    SystemExit naming the ``c.WmlaService`` knob to change."""
    module, _, name = backend_class.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as err:
        raise SystemExit(
            f"wmla: cannot import backend {backend_class!r} ({err}); set "
            f"c.WmlaService.backend_class to an importable class"
        ) from None
    cores = os.cpu_count() or 1
    if cpu_oversubscription <= 0:
        raise SystemExit("wmla: c.WmlaService.cpu_oversubscription must be above 0")
    try:
        nodes = detect_nodes(
            device_layout or None, cpu_millicores=int(cores * 1000 * cpu_oversubscription)
        )
    except ValueError as err:
        raise SystemExit(f"wmla: c.WmlaService.device_layout: {err}") from None
    backend_dir = Path(state_dir) / "backend"
    make_dir(backend_dir, PRIVATE_DIR)  # pid and exit files of the jobs' workers
    try:
        return cls(emit, nodes, str(backend_dir), **options)
    except TypeError as err:
        raise SystemExit(f"wmla: c.WmlaService.backend_options: {err}") from None
