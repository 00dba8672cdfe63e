"""What a system account can reach, from the permission bits: whether it can run a program or
read a folder, and which Python it can run the hub's packages with.

Both places that run code as a hub user's own account use it: the spawner (notebook servers,
spawner/local.py) and the local backend (job workers, backends/local.py). The usual trap it
answers: the hub's Python installed under /root (mode 0700), which no other account can start;
then the system Python of the same version runs over the hub's packages.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int


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
