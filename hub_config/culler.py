"""Idle notebooks give their resources back: jupyterhub-idle-culler as managed hub services.

The culler has one ``--timeout`` for every server it can see, so the shorter timeout of servers
that hold GPUs comes from a second culler whose token only sees the hub group the spawner keeps
(``c.WmlaLocalSpawner.gpu_group``: a user is in it while one of their servers holds GPUs). Its
role's scopes are filtered to that group (``list:users!group=wmla-gpu-notebooks``, ...), so the
hub lists, reads and stops only those users' servers for it. The other culler sees everyone with
the longer timeout. See docs/spawner.md "Idle notebooks".

Each culler runs under ``hub_config.pdeath``: the kernel stops it when its hub dies, even by
``kill -9`` (JupyterHub stops managed services only when it shuts down itself).

Use from a ``jupyterhub_config.py``::

    from hub_config.culler import culler_services
    entries, roles = culler_services(timeout=3600, gpu_timeout=900)
    c.JupyterHub.services += entries
    c.JupyterHub.load_roles += roles
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from typing import Any

CULLER_NAME = "wmla-idle-culler"
GPU_GROUP = "wmla-gpu-notebooks"  # spawner.mixin.GPU_GROUP, the spawner's gpu_group default
DEFAULT_TIMEOUT = 3600
DEFAULT_GPU_TIMEOUT = 900

# what jupyterhub-idle-culler needs (its README, "Permissions"); admin:users only with
# --cull-users, which wmla never passes (hub users are not temporary here)
CULLER_SCOPES = ("list:users", "read:users:activity", "read:servers", "delete:servers")

PDEATH_MODULE = "hub_config.pdeath"  # ends a culler when its hub dies
PLAINSTOP_MODULE = "hub_config.plainstop"  # SIGINT ends it at once, without a traceback


def culler_scopes(group: str | None = None) -> list[str]:
    """The culler's scopes; with ``group``, filtered to that hub group's members."""
    suffix = f"!group={group}" if group else ""
    return [scope + suffix for scope in CULLER_SCOPES]


def culler_services(
    timeout: int = DEFAULT_TIMEOUT,
    gpu_timeout: int | None = DEFAULT_GPU_TIMEOUT,
    gpu_group: str = GPU_GROUP,
    cull_every: int = 0,
    name: str = CULLER_NAME,
    python: str = sys.executable,
    extra_args: Iterable[str] = (),
    environment: Mapping[str, str] | None = None,
) -> tuple[list[dict], list[dict]]:
    """(``c.JupyterHub.services`` entries, ``c.JupyterHub.load_roles`` entries) for the cullers.

    ``timeout``: seconds idle after which any server is stopped (0: never). ``gpu_timeout``:
    the same for the servers of users in ``gpu_group`` (None or 0: no second culler; it is
    also left out when it is not shorter than ``timeout``). ``cull_every``: seconds between
    looks (0: the culler's default, half its timeout). ``extra_args`` go to both cullers (e.g.
    ``"--max-age=86400"``). Each command is ``python -m hub_config.pdeath python -m
    hub_config.plainstop jupyterhub_idle_culler ...``: the culler ends when its hub dies, and
    at the hub's first signal when the hub stops it (even when SIGINT was inherited ignored).
    """
    cullers: list[tuple[str, int, str | None]] = []
    if timeout and timeout > 0:
        cullers.append((name, int(timeout), None))
    if gpu_timeout and gpu_timeout > 0 and (not cullers or gpu_timeout < timeout):
        if not gpu_group:
            raise ValueError("a GPU timeout needs the hub group the spawner keeps (gpu_group)")
        cullers.append((f"{name}-gpu", int(gpu_timeout), gpu_group))
    services: list[dict] = []
    roles: list[dict] = []
    for service_name, seconds, group in cullers:
        command = [python, "-m", PDEATH_MODULE, python, "-m", PLAINSTOP_MODULE]
        command.append("jupyterhub_idle_culler")
        command.append(f"--timeout={seconds}")
        if cull_every and cull_every > 0:
            command.append(f"--cull-every={int(cull_every)}")
        command += list(extra_args)
        entry: dict[str, Any] = {"name": service_name, "command": command, "display": False}
        if environment:
            entry["environment"] = dict(environment)
        services.append(entry)
        whose = f"servers of users in hub group {group}" if group else "every server"
        roles.append(
            {
                "name": f"{service_name}-role",
                "description": f"Stops {whose} idle for {seconds} s (jupyterhub-idle-culler)",
                "scopes": culler_scopes(group),
                "services": [service_name],
            }
        )
    return services, roles


def culler_settings(environ: Mapping[str, str] = os.environ) -> dict[str, int]:
    """``culler_services`` keywords from ``$WMLA_CULL_TIMEOUT`` (default 3600),
    ``$WMLA_CULL_GPU_TIMEOUT`` (default 900) and ``$WMLA_CULL_EVERY`` (default 0: the
    culler's own, half the timeout); "0" turns a culler off."""

    def seconds(env: str, default: int) -> int:
        raw = (environ.get(env) or "").strip()
        if not raw:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"${env} must be a whole number of seconds, not {raw!r}") from None
        if value < 0:
            raise ValueError(f"${env} must be 0 (off) or more seconds, not {value}")
        return value

    return {
        "timeout": seconds("WMLA_CULL_TIMEOUT", DEFAULT_TIMEOUT),
        "gpu_timeout": seconds("WMLA_CULL_GPU_TIMEOUT", DEFAULT_GPU_TIMEOUT),
        "cull_every": seconds("WMLA_CULL_EVERY", 0),
    }
