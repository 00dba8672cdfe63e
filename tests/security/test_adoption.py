"""An existing system account named as a hub user's (the account template's name) is adopted
only when it looks made by jupyterhub-wmla; a person's login or a daemon's account is refused
with why, by the spawner and by the local backend alike (extension/adoption.py).

Real accounts (a random prefix, removed in teardown), made with useradd as root; no hub: the
spawner's and the backend's own account lookups are called.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import types
from pathlib import Path

import pytest

from extension.backends.local.users import UserAccounts
from extension.userfs.accounts import AccountError, create_account
from spawner.local import WmlaLocalSpawner
from tests.security.accounts import remove_accounts

AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("useradd") is not None
pytestmark = pytest.mark.skipif(not AS_ROOT, reason="real accounts: root and useradd")
PREFIX = f"wd{secrets.token_hex(3)}-"
TEMPLATE = PREFIX + "{username}"


@pytest.fixture
def made(tmp_path: Path):
    """``make(user, *useradd_args)`` makes ``PREFIX + user``; every one is removed after."""
    names: list[str] = []

    def make(user: str, *args: str) -> str:
        name = PREFIX + user
        subprocess.run(["useradd", *args, name], check=True, capture_output=True)
        names.append(name)
        return name

    yield make
    remove_accounts(names)


def lookups(storage: Path, user: str, **spawner_traits) -> tuple:
    """The account as the spawner finds it for a server, and as the backend does for a job."""
    spawner = WmlaLocalSpawner(
        system_user_template=TEMPLATE, storage_root=str(storage), **spawner_traits
    )
    spawner.user = types.SimpleNamespace(name=user, groups=[], settings={})
    adopt = spawner_traits.get("adopt_accounts")
    backend = UserAccounts(True, True, TEMPLATE, 1000, adopt)
    return spawner.wmla_account, lambda: backend.account_for(user, home=str(storage / user))


@pytest.mark.parametrize(
    ("useradd", "why"),
    [
        (("--shell", "/bin/bash", "--user-group"), "it has the login shell /bin/bash"),
        (("--shell", "/usr/sbin/nologin", "--user-group", "--home-dir", "/srv/elsewhere"),
         "its home is /srv/elsewhere, not the user's folder"),
        (("--shell", "/usr/sbin/nologin", "--user-group", "--groups", "users"),
         "it belongs to the group users"),
    ],
    ids=["login-shell", "home-elsewhere", "in-another-group"],
)  # fmt: skip
def test_an_account_not_made_here_is_refused_with_why(tmp_path: Path, made, useradd, why) -> None:
    name = made("alice", *useradd)
    for lookup in lookups(tmp_path, "alice"):
        with pytest.raises(AccountError) as refused:
            lookup()
        message = str(refused.value)
        assert f"system account {name!r} exists but was not made by jupyterhub-wmla" in message
        assert why in message and "refusing to run alice's code as it" in message


def test_an_account_made_here_is_adopted_and_any_adopts_the_machines_own(
    tmp_path: Path, made
) -> None:
    ours = create_account(PREFIX + "bob", tmp_path / "bob")  # as the spawner or backend make it
    try:
        for lookup in lookups(tmp_path, "bob"):
            assert lookup().uid == ours.uid
    finally:
        remove_accounts([ours.name])
    name = made("carol", "--shell", "/bin/bash", "--user-group")
    for lookup in lookups(tmp_path, "carol", adopt_accounts="any"):
        assert lookup().name == name  # the site says the machine's accounts are its users'
