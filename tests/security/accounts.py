"""What the hub-as-root tests share: real system accounts, each with its own folder and a
script of the test's in ``code/``, owned by the account (so its job can run it), and their
removal."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path

from extension.userfs.accounts import create_account, ensure_folder


def accounts_with_code(
    storage: Path, users: Iterable[str], account: Callable[[str], str], script: str, text: str
) -> list[str]:
    """Make each user's account and folder under ``storage`` with ``code/<script>``; returns the
    accounts made (to remove, whatever happens next)."""
    created = []
    for user in users:
        acct = create_account(account(user), storage / user)
        created.append(acct.name)
        folder = ensure_folder(storage, user, acct)
        code = folder / "code"
        code.mkdir()
        (code / script).write_text(text)
        for path in (code, code / script):
            os.chown(path, acct.uid, acct.gid)
    return created


def remove_accounts(names: Iterable[str]) -> None:
    for name in names:
        subprocess.run(["userdel", name], capture_output=True)
