"""What configures JupyterHub for wmla: the managed service, roles and custom scopes, plans.

Use from a ``jupyterhub_config.py``::

    from hub_config import custom_scopes, roles, services
    c.JupyterHub.services = services(port=10101, config={"WmlaService": {"tick": 5}})
    c.JupyterHub.custom_scopes = custom_scopes()
    c.JupyterHub.load_roles = roles(admin_users=["admin"])
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

SERVICE_NAME = "wmla"
ADMIN_SCOPE = "custom:wmla:admin"

# The seed's defaults (000_e3bbfd5fbfa67fae): /sample-project with training, inference, notebooks,
# open to every hub user; created by the service on its first start.
DEFAULT_PLANS: dict[str, dict] = {
    "/sample-project": {},
    "/sample-project/training": {},
    "/sample-project/inference": {},
    "/sample-project/notebooks": {},
}


def default_plans() -> dict[str, dict]:
    return json.loads(json.dumps(DEFAULT_PLANS))


def custom_scopes() -> dict[str, dict]:
    """``c.JupyterHub.custom_scopes``: the plan-admin scope the service checks."""
    return {
        ADMIN_SCOPE: {
            "description": "Administer wmla resource plans: create, change and delete plans, "
            "see and cancel every user's jobs.",
        }
    }


def access_scope(name: str = SERVICE_NAME) -> str:
    return f"access:services!service={name}"


def roles(
    admin_users: Iterable[str] = (),
    admin_groups: Iterable[str] = (),
    service_name: str = SERVICE_NAME,
) -> list[dict]:
    """``c.JupyterHub.load_roles``: every user may use the service; plan admins get the scope.

    Hub admins are plan admins without this role (the service honours the ``admin`` flag).
    """
    return [
        {
            "name": "user",
            "description": "Everyone: own server, and the wmla service (jobs, plans, usage)",
            "scopes": ["self", access_scope(service_name)],
        },
        {
            "name": "wmla-plan-admin",
            "description": "Administers wmla resource plans",
            "scopes": [ADMIN_SCOPE, access_scope(service_name)],
            "users": sorted(set(admin_users)),
            "groups": sorted(set(admin_groups)),
        },
    ]


def server_token_scopes(service_name: str = SERVICE_NAME) -> list[str]:
    """``c.Spawner.server_token_scopes``: what a notebook kernel's token may do (the subset the
    user holds): the usual server scopes plus the wmla service and the plan-admin scope."""
    return [
        "users:activity!user",
        "access:servers!server",
        access_scope(service_name),
        ADMIN_SCOPE,
    ]


def services(
    port: int = 10101,
    name: str = SERVICE_NAME,
    config: Mapping[str, Mapping[str, Any]] | None = None,
    config_file: str | os.PathLike | None = None,
    environment: Mapping[str, str] | None = None,
    python: str = sys.executable,
    display: bool = True,
    cwd: str | os.PathLike | None = None,
) -> list[dict]:
    """``c.JupyterHub.services``: the managed wmla service, proxied at /services/<name>/.

    ``config`` is traitlets config as a mapping, e.g. ``{"WmlaService": {"device_layout":
    "4x8"}}``; it reaches the service as JSON in ``$WMLA_SERVICE_CONFIG``. ``config_file`` is a
    traitlets config file (``c.WmlaService.x = ...``) read after it.
    """
    command = [python, "-m", "extension.service"]
    if config_file:
        command.append(f"--config={Path(config_file).resolve()}")
    env = {"PYTHONUNBUFFERED": "1", **(environment or {})}
    if config:
        env["WMLA_SERVICE_CONFIG"] = json.dumps(config)
    entry: dict[str, Any] = {
        "name": name,
        "url": f"http://127.0.0.1:{port}",
        "command": command,
        "environment": env,
        "display": display,
        "oauth_no_confirm": True,
        # browser (OAuth) tokens of plan admins carry the admin scope too (users who lack it
        # get the identify scopes only)
        "oauth_client_allowed_scopes": [ADMIN_SCOPE],
    }
    if cwd is not None:
        entry["cwd"] = str(cwd)
    return [entry]


def embedded_passwords(state_dir: str | os.PathLike) -> tuple[str, str, bool]:
    """(user password, admin password, created now) for SharedPasswordAuthenticator.

    Generated on the first run and kept in ``<state_dir>/hub-passwords.json`` (mode 0600).
    """
    path = Path(state_dir) / "hub-passwords.json"
    if path.exists():
        data = json.loads(path.read_text())
        return data["user_password"], data["admin_password"], False
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"user_password": secrets.token_urlsafe(12), "admin_password": secrets.token_urlsafe(32)}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    return data["user_password"], data["admin_password"], True
