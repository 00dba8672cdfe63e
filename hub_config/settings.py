"""The site's own settings, outside the repository: a traitlets config file loaded after the
shipped ``jupyterhub_config.py``, so an upgrade of the checkout never touches it.

Where it is looked for, the first that exists:

1. ``$WMLA_SETTINGS`` (it must exist when set; ``$WMLA_CONFIG`` is taken: it is where ``wmla
   logon`` keeps the client's token);
2. ``/etc/jupyterhub-wmla/config.py``;
3. ``<var>/local_config.py`` (``$WMLA_VAR``, default ``var/`` of the checkout).

It is Python run by the hub, and the hub runs as root: a file that someone else could change is
refused, naming the fix. Refused: a file or its folder writable by its group or by everyone
(``chmod go-w``; a sticky folder such as /tmp is fine for the folder), or owned by someone
other than root or the hub's own user.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

SYSTEM_SETTINGS = Path("/etc/jupyterhub-wmla/config.py")
LOCAL_NAME = "local_config.py"


class SettingsError(Exception):
    """The settings file cannot be used; the message says why and what to do."""


def settings_file(
    var: Path, environ: Mapping[str, str] = os.environ, system: Path = SYSTEM_SETTINGS
) -> Path | None:
    """The settings file to load (see the module), checked (``check_settings_file``), or None
    when there is none. Raises SettingsError when ``$WMLA_SETTINGS`` names no file or the file
    found is not safe to run."""
    named = (environ.get("WMLA_SETTINGS") or "").strip()
    if named:
        path = Path(named).expanduser()
        if not path.is_file():
            raise SettingsError(f"$WMLA_SETTINGS is {named!r}, and that is not a file")
    else:
        found = [p for p in (system, Path(var) / LOCAL_NAME) if p.is_file()]
        if not found:
            return None
        path = found[0]
    check_settings_file(path)
    return path


def check_settings_file(path: Path, uid: int | None = None) -> None:
    """Raise SettingsError when ``path`` (or its folder) could be changed by anyone but root
    and ``uid`` (default: this process's user)."""
    me = os.geteuid() if uid is None else uid
    real = Path(os.path.realpath(path))
    trusted = {0, me}
    for what, target in (("file", real), ("folder", real.parent)):
        info = os.stat(target)
        if info.st_uid not in trusted:
            raise SettingsError(
                f"refusing the settings {what} {target}: it belongs to uid {info.st_uid}, not "
                f"to root or to the hub's own user (uid {me}), and the hub runs what it says; "
                f"chown root {target}"
            )
        writable = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        sticky = what == "folder" and info.st_mode & stat.S_ISVTX
        if writable and not sticky:
            raise SettingsError(
                f"refusing the settings {what} {target}: mode {stat.S_IMODE(info.st_mode):04o} "
                f"lets others than its owner change it, and the hub runs what it says; "
                f"chmod go-w {target}"
            )
