"""What configures JupyterHub for wmla: the managed service, roles and custom scopes, plans.

Use from a ``jupyterhub_config.py``::

    from hub_config import custom_scopes, roles, services
    c.JupyterHub.services = services(port=10101, config={"WmlaService": {"tick": 5}})
    c.JupyterHub.custom_scopes = custom_scopes()
    c.JupyterHub.load_roles = roles(admin_users=["admin"])
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from extension.service.privacy import (
    PRIVATE_DIR,
    PRIVATE_FILE,
    SQLITE_SIDECARS,
    TRAVERSABLE_DIR,
    create_private_file,
    make_dir,
    set_mode,
    tighten,
)

SERVICE_NAME = "wmla"
ADMIN_SCOPE = "custom:wmla:admin"


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
        {
            "name": "wmla-service",
            "description": "The wmla service: looks at users' servers to free the resources "
            "of notebook jobs no server holds any more (extension/service/reconcile.py)",
            "scopes": ["list:users", "read:servers", "admin:server_state"],
            "services": [service_name],
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


# the users' password hashes (hub_config/auth.py): a dbm database, which dbm.dumb (the only dbm
# module some Pythons have) keeps in three files beside the name and dbm.gnu in the bare name
PASSWORD_DB = "hub-passwords.dbm"
PASSWORD_DB_FILES = (PASSWORD_DB, *(PASSWORD_DB + ext for ext in (".dat", ".dir", ".bak")))

# what the embedded hub keeps directly in its runtime folder (var/): tokens, the cookie secret,
# the password hashes; JupyterHub, SQLite and dbm create them, so they are fixed at every start
HUB_STATE_FILES = (
    *(f"jupyterhub.sqlite{suffix}" for suffix in ("", *SQLITE_SIDECARS)),
    "jupyterhub_cookie_secret",
    *PASSWORD_DB_FILES,
    "jupyterhub-proxy.pid",
)


def private_hub_state(var: str | os.PathLike, service_state: str = "wmla") -> list[str]:
    """Make the embedded hub's runtime folder safe for a hub run as root whose users all have
    a terminal; returns the warnings it printed.

    ``var`` becomes 0711: traversable, since ``var/storage`` holds the users' folders, but not
    listable. Its state files become 0600 and ``var/<service_state>`` (the wmla service's
    state, which the service itself fixes inside) 0700. ``jupyterhub.sqlite`` is created 0600
    when missing (an empty file is a valid SQLite database) so that the hub's database and its
    journal never exist readable. Symbolic links are left alone, with a warning. Set a 0077
    umask first (``extension.service.privacy.restrict_umask``) for what is created later.
    """
    var = Path(var)
    warnings: list[str] = []
    if not make_dir(var, TRAVERSABLE_DIR):
        warnings += _report(var, set_mode(var, TRAVERSABLE_DIR), "0711")
    warnings += _report(var / "jupyterhub.sqlite", create_private_file(var / "jupyterhub.sqlite"))
    for name in HUB_STATE_FILES[1:]:
        warnings += _report(var / name, tighten(var / name, PRIVATE_FILE))
    warnings += _report(var / service_state, tighten(var / service_state, PRIVATE_DIR), "0700")
    return warnings


def _report(path: Path, outcome: str, mode: str = "0600") -> list[str]:
    """Print what a fix of ``path`` found when it needs saying; the printed lines."""
    if outcome == "fixed":
        message = f"wmla: {path} was open to other accounts; now {mode}"
    elif outcome == "symlink":
        message = (
            f"\n!!! wmla: {path} is a symbolic link; refusing to change its mode or its "
            "target's: make sure only this account can read what it points to, or replace it "
            "by the file itself"
        )
    elif outcome == "other":
        message = f"\n!!! wmla: {path} is not a regular file or folder; its mode is left alone"
    else:
        return []
    print(message, file=sys.stderr, flush=True)
    return [message]


def stop_servers_before_services(app: Any = None) -> bool:
    """At hub shutdown, stop the single-user servers before the managed services, and the
    services together.

    JupyterHub's cleanup stops the managed services first and only then the users' servers
    (when ``c.JupyterHub.cleanup_servers`` is on, the default), so a spawner that releases its
    notebook job through the wmla service at stop finds the service gone. This wraps the hub's
    ``cleanup`` to stop every active server first, concurrently, while the services still run;
    JupyterHub's own cleanup then finds none left and stops the services and the proxy as
    usual. With ``cleanup_servers = False`` nothing changes: servers (and their jobs) live on.

    The wrapper also stops the hub's periodic checks first (its service health check, run in
    the middle of the shutdown, read a stopped service's server and logged ``'NoneType' object
    has no attribute 'proto'``), and stops the managed services concurrently (JupyterHub stops
    them one after another, each up to 30 s after its SIGINT): the shutdown takes as long as
    the slowest, not their sum.

    ``app``: the JupyterHub application; default: the running one when called from a
    ``jupyterhub_config.py`` that JupyterHub loads (returns False when there is none, e.g. when
    the file is read by a test). Returns whether the hub's cleanup is wrapped.
    """
    if app is None:
        from jupyterhub.app import JupyterHub

        if not JupyterHub.initialized():
            return False
        app = JupyterHub.instance()
    if getattr(app, "_wmla_servers_first", False):
        return True
    cleanup = app.cleanup

    async def cleanup_servers_first() -> None:
        for callback in getattr(app, "_periodic_callbacks", {}).values():
            callback.stop()
        if app.cleanup_servers:
            await stop_user_servers(app)
        await stop_managed_services(app)
        await cleanup()

    app.cleanup = cleanup_servers_first
    app._wmla_servers_first = True
    return True


async def stop_managed_services(app: Any) -> int:
    """Stop the hub ``app``'s managed services together and wait for all of them; returns how
    many. JupyterHub's cleanup, after this, finds them stopped. Never raises for one."""
    services = [s for s in getattr(app, "_service_map", {}).values() if s.managed]
    if not services:
        return 0
    app.log.info("wmla: stopping %i managed services together", len(services))
    results = await asyncio.gather(*(s.stop() for s in services), return_exceptions=True)
    for service, result in zip(services, results):
        if isinstance(result, BaseException):
            app.log.error("Failed to stop service %s: %s", service.name, result)
    return len(services)


async def stop_user_servers(app: Any) -> int:
    """Stop every active single-user server of the hub ``app`` (as its cleanup does) and wait
    for all of them; returns how many were stopped. Never raises for one server's failure."""
    stops = [
        (spawner, asyncio.ensure_future(user.stop(name)))
        for user in list(app.users.values())
        for name, spawner in list(user.spawners.items())
        if spawner.active
    ]
    if not stops:
        return 0
    app.log.info("wmla: stopping %i single-user servers before the services", len(stops))
    results = await asyncio.gather(*(f for _, f in stops), return_exceptions=True)
    for (spawner, _), result in zip(stops, results):
        if isinstance(result, BaseException):
            app.log.error("Failed to stop %s: %s", spawner._log_name, result)
    return len(stops)
