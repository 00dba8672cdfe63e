"""Each hub user's private folder ``<storage_root>/<user>`` and, as root, their system account.

GPFS style: one shared root, one folder per user. The root stays traversable (mode 0711 when we
create it) so an account reaches its own folder; each folder is 0700 and owned by the account
the user's notebook runs as, so reading another user's folder fails at the OS level.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
from pathlib import Path

from extension.backends.accounts import (  # noqa: F401 - part of this module's API
    Account,
    account_python,
    folder_unreachable,
    stat_mode,
    unreachable,
)

# Folder names, label values and Linux account names all accept this (no '/', no '..').
USERNAME = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")
# useradd's default NAME_REGEX (Debian): a letter or '_' first, at most 32 characters.
ACCOUNT = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


class StorageError(RuntimeError):
    """A user folder or account that cannot be set up; the message says how to fix it."""


def validate_username(user: str) -> str:
    """A hub user name that can be one folder under the storage root, or an error."""
    if not isinstance(user, str) or not USERNAME.match(user):
        raise StorageError(
            f"hub user name {user!r} cannot name a private folder: use 1-63 lower-case letters, "
            "digits, '.', '_' or '-', starting and ending with a letter or digit"
        )
    return user


def user_folder(storage_root: str | os.PathLike, user: str) -> Path:
    return Path(storage_root).resolve() / validate_username(user)


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def find_account(name: str, min_uid: int) -> Account | None:
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None
    if entry.pw_uid < min_uid:
        # a hub user named root or daemon must never run as that account
        raise StorageError(
            f"system account {name!r} has uid {entry.pw_uid}, below the minimum {min_uid} "
            "for notebook accounts (c.WmlaLocalSpawner.min_uid); refusing to run as it"
        )
    return Account(name, entry.pw_uid, entry.pw_gid)


def create_account(name: str, home: Path, min_uid: int) -> Account:
    """``useradd`` an account for a hub user (home = their folder, no login shell)."""
    if not ACCOUNT.match(name):
        raise StorageError(
            f"{name!r} is not a valid system account name (a lower-case letter or '_' first, "
            "then letters, digits, '_' or '-', at most 32); set "
            "c.WmlaLocalSpawner.system_user_template"
        )
    useradd = shutil.which("useradd")
    if useradd is None:
        raise StorageError(
            f"no system account {name!r} and no useradd to create it; create the account or "
            "set c.WmlaLocalSpawner.create_system_users = False and create accounts yourself"
        )
    cmd = [useradd, "--no-create-home", "--home-dir", str(home), "--shell",
           "/usr/sbin/nologin", "--user-group", name]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if done.returncode != 0 and find_account(name, min_uid) is None:
        raise StorageError(f"useradd {name} failed: {done.stderr.strip() or done.returncode}")
    account = find_account(name, min_uid)
    if account is None:  # pragma: no cover - useradd said yes but the account is not there
        raise StorageError(f"useradd {name} did not create the account")
    return account


def ensure_folder(storage_root: str | os.PathLike, user: str, account: Account | None) -> Path:
    """Create ``<root>/<user>`` (mode 0700, owned by ``account`` when given) if it is missing.

    An existing folder keeps its content; its owner and mode are set again, so a folder that
    the service created first (as root) becomes the account's.
    """
    root = Path(storage_root).resolve()
    if not root.exists():
        root.mkdir(parents=True, mode=0o711)
        os.chmod(root, 0o711)  # the umask may have taken bits away
    folder = user_folder(root, user)
    folder.mkdir(mode=0o700, exist_ok=True)
    if folder.is_symlink() or not folder.is_dir():
        raise StorageError(f"{folder} exists and is not a folder; move it away")
    os.chmod(folder, 0o700)
    if account is not None:
        os.chown(folder, account.uid, account.gid)
    return folder
