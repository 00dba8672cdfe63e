"""A notebook server's own ``/tmp``: a folder inside its user's storage quota, bound on /tmp and
/var/tmp in the server's mount namespace between fork and exec (as a job worker's is), so a
terminal cannot fill the machine's /tmp and what it writes there counts against its user."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import stat
from pathlib import Path

from extension.userfs.accounts import Account

# loaded in the hub, before any fork: a dlopen in the child of a threaded process could hang
LIBC = ctypes.CDLL(None, use_errno=True)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class ServerTmp:
    """The folder ``<template with the user>/<server>``, root's path, the account's folder."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(
        cls, template: str, user: str, server: str, account: Account, folder: Path
    ) -> ServerTmp | None:
        """None when there is no template, or its folder is not there (the user's storage has
        no image: no quota to put it in), or the user's ``folder`` lies under /tmp (the bind
        would hide it)."""
        if not template or not _NAME.match(server) or _under_tmp(folder):
            return None
        base = Path(template.format(username=user))
        try:
            info = os.lstat(base)
        except FileNotFoundError:
            return None
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != 0:
            return None  # only root's folder, as the storage quotas make it (images.py)
        path = base / server
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return None
        os.chown(path, account.uid, account.gid, follow_symlinks=False)
        return cls(path)

    def remove(self) -> None:
        """By descriptors (a link in it is removed, not followed)."""
        shutil.rmtree(self.path, ignore_errors=True)


def _under_tmp(folder: Path) -> bool:
    real = os.path.realpath(folder)
    return any(real.startswith(t + "/") for t in ("/tmp", "/var/tmp"))
