"""Hub users' system accounts: finding and creating them, their private folders, and what an
account can reach (from the permission bits): whether it can run a program or read a folder,
and which Python it can run the hub's packages with.

Both places that run code as a hub user's own account use it: the spawner (notebook servers,
spawner/local.py) and the local backend (job workers, backends/local/), so a user's notebook
and jobs run as one account, created the same way by either. The usual trap it answers: the
hub's Python installed under /root (mode 0700), which no other account can start; then the
system Python of the same version runs over the hub's packages.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# useradd's default NAME_REGEX (Debian): a letter or '_' first, at most 32 characters.
ACCOUNT = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
MIN_UID = 1000  # below: system accounts (root, daemon, ...), never a hub user's


class AccountError(RuntimeError):
    """A user account or folder that cannot be set up; the message says how to fix it."""


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int
    home: str = ""


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def find_account(name: str, min_uid: int = MIN_UID) -> Account | None:
    """The account called ``name``; one below ``min_uid`` is refused, never used."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None
    if entry.pw_uid < min_uid:
        # a hub user named root or daemon must never run as that account
        raise AccountError(
            f"system account {name!r} has uid {entry.pw_uid}, below the minimum {min_uid} "
            "for hub users' accounts (c.WmlaLocalSpawner.min_uid, LocalBackend min_uid); "
            "refusing to run as it"
        )
    return Account(name, entry.pw_uid, entry.pw_gid, entry.pw_dir)


def create_account(name: str, home: str | os.PathLike, min_uid: int = MIN_UID) -> Account:
    """``useradd`` an account for a hub user (home = their folder, no login shell)."""
    if not ACCOUNT.match(name):
        raise AccountError(
            f"{name!r} is not a valid system account name (a lower-case letter or '_' first, "
            "then letters, digits, '_' or '-', at most 32); set "
            "c.WmlaLocalSpawner.system_user_template and the backend's account_template"
        )
    useradd = shutil.which("useradd")
    if useradd is None:
        raise AccountError(
            f"no system account {name!r} and no useradd to create it; create the account, "
            "or install useradd (package passwd)"
        )
    cmd = [useradd, "--no-create-home", "--home-dir", str(home), "--shell",
           "/usr/sbin/nologin", "--user-group", name]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if done.returncode != 0 and find_account(name, min_uid) is None:
        raise AccountError(f"useradd {name} failed: {done.stderr.strip() or done.returncode}")
    account = find_account(name, min_uid)
    if account is None:  # pragma: no cover - useradd said yes but the account is not there
        raise AccountError(f"useradd {name} did not create the account")
    return account


def ensure_folder(storage_root: str | os.PathLike, user: str, account: Account | None) -> Path:
    """Create ``<root>/<user>`` (mode 0700, owned by ``account`` when given) if it is missing.

    An existing folder keeps its content; its owner and mode are set again, so a folder that
    the service created first (as root) becomes the account's. As root this is done by
    descriptors: ``<user>`` is opened relative to the storage root with ``O_NOFOLLOW`` and
    chmod/chown go to that descriptor, so a link or a file put there is refused, never
    followed, whoever could write the storage root.
    """
    if not user or "/" in user or user in (".", "..") or "\x00" in user:
        raise AccountError(f"user name {user!r} cannot name one folder under {storage_root}")
    root = Path(storage_root).resolve()
    if not root.exists():
        root.mkdir(parents=True, mode=0o711)
        os.chmod(root, 0o711)  # the umask may have taken bits away
    folder = root / user
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(user, 0o700, dir_fd=root_fd)
        try:
            fd = os.open(user, _FOLDER_FLAGS, dir_fd=root_fd)
        except OSError:  # ELOOP (a link) or ENOTDIR (a file)
            raise AccountError(f"{folder} exists and is not a folder; move it away") from None
    finally:
        os.close(root_fd)
    try:
        os.fchmod(fd, 0o700)
        if account is not None:
            os.fchown(fd, account.uid, account.gid)
    finally:
        os.close(fd)
    return folder


_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def system_python() -> str | None:
    """The system Python of this interpreter's major.minor (its compiled packages load), if any."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return shutil.which(version, path="/usr/bin:/usr/local/bin")


def allows(info: os.stat_result, account: Account, bit: int) -> bool:
    """Whether mode bits grant ``bit`` (1 = x, 4 = r) to the account (no ACLs considered)."""
    if account.uid == 0:
        return True
    if info.st_uid == account.uid:
        return bool(info.st_mode & (bit << 6))
    try:
        groups = os.getgrouplist(account.name, account.gid)
    except OSError:
        groups = [account.gid]
    if info.st_gid in groups:
        return bool(info.st_mode & (bit << 3))
    return bool(info.st_mode & bit)


def unreachable(program: str, account: Account) -> str | None:
    """Why ``account`` cannot run ``program`` (and its ``#!`` interpreter), or None.

    Checked before the server starts: otherwise the failure is an opaque "Exception occurred in
    preexec_fn" or a PermissionError from exec, e.g. a Python installed under /root (0700).
    """
    path = shutil.which(program) or program
    seen = 0
    while path and seen < 4:  # the program, then its interpreter (and theirs)
        seen += 1
        real = Path(os.path.realpath(path))
        closed = _closed_folder(reversed(real.parents), account)
        if closed:
            return closed
        try:
            info = real.stat()
        except OSError as err:
            return f"{real}: {err.strerror}"
        if not allows(info, account, 1):
            return f"{real} is not executable by {account.name}"
        try:
            with open(real, "rb") as f:
                head = f.readline(200)
        except OSError:
            return None
        if not head.startswith(b"#!"):
            return None
        words = head[2:].decode(errors="replace").split()
        path = words[0] if words else ""
        if path.endswith("/env") and len(words) > 1:
            path = shutil.which(words[1]) or words[1]
    return None


def _closed_folder(folders: Iterable[Path], account: Account) -> str | None:
    """The first of ``folders`` the account cannot pass through (no x bit), and why."""
    for folder in folders:
        try:
            info = folder.stat()
        except OSError as err:
            return f"{folder}: {err.strerror}"
        if not allows(info, account, 1):
            return f"{folder} (mode {stat_mode(info)}) is not open to {account.name}"
    return None


def stat_mode(info: os.stat_result) -> str:
    return oct(info.st_mode & 0o7777)[2:].rjust(4, "0")


def folder_unreachable(path: str, account: Account) -> str | None:
    """Why ``account`` cannot list and read ``path`` (a folder), or None."""
    real = Path(os.path.realpath(path))
    closed = _closed_folder([*reversed(real.parents), real], account)
    if closed:
        return closed
    if not allows(real.stat(), account, 4):
        return f"{real} is not readable by {account.name}"
    return None


def account_python(account: Account, wanted: str, hub_paths: list[str]) -> str | None:
    """A Python the account can run, with the hub's packages on ``hub_paths``, or None.

    ``wanted``: a path, or "auto" for the system Python of the hub's major.minor version (its
    compiled extensions then load unchanged).
    """
    if wanted == "auto":
        found = system_python()
        if found is None:
            return None
        wanted = found
    if unreachable(wanted, account) is not None:
        return None
    if any(folder_unreachable(p, account) for p in hub_paths):
        return None
    return wanted
