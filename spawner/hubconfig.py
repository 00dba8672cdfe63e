"""The hub-side piece the spawner needs: a token service allowed to submit for users.

Use in ``jupyterhub_config.py``::

    from spawner.hubconfig import spawner_service
    service, role = spawner_service()
    c.JupyterHub.services.append(service)
    c.JupyterHub.load_roles.append(role)
    c.JupyterHub.spawner_class = "wmla-local"

The spawner finds the token itself (the hub service named ``c.WmlaLocalSpawner.token_service``).
"""

from __future__ import annotations

import secrets

from .mixin import SPAWNER_SERVICE

ADMIN_SCOPE = "custom:wmla:admin"


def spawner_service(
    token: str | None = None, name: str = SPAWNER_SERVICE, service_name: str = "wmla"
) -> tuple[dict, dict]:
    """(``c.JupyterHub.services`` entry, ``c.JupyterHub.load_roles`` entry).

    The token is new at every hub start unless given: only the hub process uses it.
    """
    token = token or secrets.token_hex(32)
    service = {"name": name, "api_token": token, "display": False}
    role = {
        "name": f"{name}-role",
        "description": "The wmla spawner: submits and releases notebook jobs for users",
        "scopes": [ADMIN_SCOPE, f"access:services!service={service_name}"],
        "services": [name],
    }
    return service, role
