"""Logins to the embedded hub, attacked: each name's own password (hub_config/auth.py).

A user who knows another's name gets nothing, the shared password of old gets nothing, the
admins' names cannot be claimed by a first login, and no password is kept or printed in clear.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import subprocess
from importlib.metadata import entry_points
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests
from traitlets.config.loader import PyFileConfigLoader

from hub_config import PASSWORD_DB, PASSWORD_DB_FILES
from hub_config.auth import (
    MAX_PASSWORD_BYTES,
    WmlaFirstUseAuthenticator,
    forget_password,
    password_problem,
    retire_shared_passwords,
    seed_admin_passwords,
)
from tests.service.hub import PROXY, Hub

REPO = Path(__file__).resolve().parents[2]
OLD_SHARED = {"user_password": "old-shared-user-pw", "admin_password": "old-shared-admin-pw"}


def db_files(folder: Path) -> list[Path]:
    return [folder / name for name in PASSWORD_DB_FILES if (folder / name).exists()]


def db_bytes(folder: Path) -> bytes:
    return b"".join(path.read_bytes() for path in db_files(folder))


def authenticator(folder: Path) -> WmlaFirstUseAuthenticator:
    return WmlaFirstUseAuthenticator(
        dbm_path=str(folder / PASSWORD_DB), check_passwords_on_startup=False, min_password_length=8
    )


async def login(auth: WmlaFirstUseAuthenticator, name: str, password: str) -> str | None:
    handler = SimpleNamespace(custom_login_error="")
    return await auth.authenticate(handler, {"username": name, "password": password})


# -- the authenticator and the admins' seed ------------------------------------------------------


async def test_a_names_first_login_sets_its_password_and_another_gets_nothing(tmp_path) -> None:
    auth = authenticator(tmp_path)
    assert await login(auth, "alice", "alice-own-pw") == "alice"
    assert await login(auth, "alice", "a-guess-at-it") is None  # knows the name, not the password
    assert await login(auth, "Alice", "a-guess-at-it") is None  # nor under another spelling
    assert await login(auth, "alice", "alice-own-pw") == "alice"
    assert b"alice-own-pw" not in db_bytes(tmp_path)  # a hash, never the password


async def test_an_admin_name_is_never_claimed_by_a_first_login(tmp_path) -> None:
    seeded = seed_admin_passwords(tmp_path / PASSWORD_DB, ["admin", "Boss"], "admin-secret-1")
    assert seeded.set_now == ("admin", "boss") and seeded.generated is None
    auth = authenticator(tmp_path)
    assert await login(auth, "admin", "whatever-i-like") is None
    assert await login(auth, "boss", "whatever-i-like") is None
    assert await login(auth, "admin", "admin-secret-1") == "admin"
    assert b"admin-secret-1" not in db_bytes(tmp_path)


async def test_the_admins_password_is_set_at_the_first_start_only(tmp_path) -> None:
    db = tmp_path / PASSWORD_DB
    first = seed_admin_passwords(db, ["admin"], None)
    assert first.generated and not password_problem(first.generated)
    again = seed_admin_passwords(db, ["admin"], "a-new-env-password")  # a later start
    assert again.set_now == () and again.generated is None  # nothing to show again
    auth = authenticator(tmp_path)
    assert await login(auth, "admin", "a-new-env-password") is None
    assert await login(auth, "admin", first.generated) == "admin"
    # changed (the change-password page calls this), the old one no longer works
    assert "success" in auth.reset_password("admin", "changed-admin-pw")
    assert await login(auth, "admin", first.generated) is None
    assert await login(auth, "admin", "changed-admin-pw") == "admin"


async def test_a_forgotten_admin_password_is_set_anew_at_the_next_start(tmp_path) -> None:
    db = tmp_path / PASSWORD_DB
    seed_admin_passwords(db, ["admin"], "lost-admin-pw")
    assert forget_password(db, "Admin") is True and forget_password(db, "admin") is False
    seeded = seed_admin_passwords(db, ["admin"], None)  # the next start
    assert seeded.set_now == ("admin",) and seeded.generated
    auth = authenticator(tmp_path)
    assert await login(auth, "admin", "lost-admin-pw") is None
    assert await login(auth, "admin", seeded.generated) == "admin"


@pytest.mark.parametrize("bad", ["short", "x" * (MAX_PASSWORD_BYTES + 1)], ids=["short", "long"])
async def test_a_password_bcrypt_cannot_take_is_refused_with_a_message(tmp_path, bad) -> None:
    with pytest.raises(ValueError, match="WMLA_ADMIN_PASSWORD"):
        seed_admin_passwords(tmp_path / PASSWORD_DB, ["admin"], bad)
    auth = authenticator(tmp_path)
    handler = SimpleNamespace(custom_login_error="")
    assert await auth.authenticate(handler, {"username": "carol", "password": bad}) is None
    assert "Password too" in handler.custom_login_error
    assert "Password too" in auth.reset_password("carol", bad)
    assert await login(auth, "carol", "a-fine-password") == "carol"  # nothing was set


def test_the_shared_password_file_of_old_is_removed_and_a_link_left_pointing(tmp_path) -> None:
    (tmp_path / "hub-passwords.json").write_text(json.dumps(OLD_SHARED))
    assert retire_shared_passwords(tmp_path) is True
    assert not (tmp_path / "hub-passwords.json").exists()
    assert retire_shared_passwords(tmp_path) is False
    target = tmp_path / "elsewhere"
    target.write_text("not ours")
    (tmp_path / "hub-passwords.json").symlink_to(target)
    assert retire_shared_passwords(tmp_path) is True
    assert target.read_text() == "not ours" and not os.path.lexists(tmp_path / "hub-passwords.json")


# -- jupyterhub_config.py as JupyterHub reads it -------------------------------------------------


def load_config(var: Path, monkeypatch: pytest.MonkeyPatch, **env: str):
    monkeypatch.setenv("WMLA_VAR", str(var))
    for name in ("WMLA_ADMIN_PASSWORD", "WMLA_AUTHENTICATOR", "WMLA_ADMIN_USERS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    umask = os.umask(0o022)  # the config sets the hub's umask: not this test process's
    try:
        return PyFileConfigLoader("jupyterhub_config.py", path=str(REPO)).load_config()
    finally:
        os.umask(umask)


def test_a_generated_admin_password_is_shown_once_and_never_again(
    tmp_path, monkeypatch, capfd
) -> None:
    config = load_config(tmp_path / "var", monkeypatch)
    first = capfd.readouterr()
    assert config.JupyterHub.authenticator_class is WmlaFirstUseAuthenticator
    assert config.Authenticator.admin_users == {"admin"}
    shown = [line for line in first.out.splitlines() if "admin users admin -> password" in line]
    assert len(shown) == 1, first.out
    password = shown[0].rsplit(" ", 1)[1]
    load_config(tmp_path / "var", monkeypatch)
    again = capfd.readouterr()
    assert password not in again.out + again.err and "each user name's first login" in again.out
    files = db_files(tmp_path / "var")
    assert files and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)


def test_the_admin_password_from_the_environment_is_never_printed(
    tmp_path, monkeypatch, capfd
) -> None:
    (tmp_path / "var").mkdir()
    (tmp_path / "var" / "hub-passwords.json").write_text(json.dumps(OLD_SHARED))
    load_config(tmp_path / "var", monkeypatch, WMLA_ADMIN_PASSWORD="env-admin-secret")
    out = capfd.readouterr()
    assert "env-admin-secret" not in out.out + out.err
    assert "$WMLA_ADMIN_PASSWORD" in out.out and "was removed" in out.out
    assert not (tmp_path / "var" / "hub-passwords.json").exists()


@pytest.mark.parametrize("name", ["pam", "ldapauthenticator", "github"])
def test_another_authenticator_replaces_first_use_and_lets_nobody_in_by_itself(
    tmp_path, monkeypatch, capfd, name
) -> None:
    """PAM, LDAP, OAuth (docs/auth.md): named by $WMLA_AUTHENTICATOR; who may log in is then
    that authenticator's settings' (allow_all would let in every account of a GitHub)."""
    config = load_config(tmp_path / "var", monkeypatch, WMLA_AUTHENTICATOR=name)
    assert config.JupyterHub.authenticator_class == name
    assert (
        "allow_all" not in config.Authenticator and "dbm_path" not in config.FirstUseAuthenticator
    )
    assert config.Authenticator.admin_users == {"admin"}
    assert not db_files(tmp_path / "var")  # no password database, no generated password
    assert "password" not in capfd.readouterr().out


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a system account with a password")
async def test_with_pam_the_machines_accounts_log_in_with_their_own_passwords(
    tmp_path, monkeypatch
) -> None:
    config = load_config(tmp_path / "var", monkeypatch, WMLA_AUTHENTICATOR="pam")
    (found,) = entry_points(group="jupyterhub.authenticators", name="pam")
    auth = found.load()(config=config, allow_all=True)
    name = f"wmlapam{secrets.token_hex(3)}"
    subprocess.run(
        ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True
    )
    try:
        subprocess.run(["chpasswd"], input=f"{name}:Pam-own-pw1\n", text=True, check=True)
        assert await auth.authenticate(None, {"username": name, "password": "Pam-own-pw1"}) == name
        assert await auth.authenticate(None, {"username": name, "password": "a-guess"}) is None
    finally:
        subprocess.run(["userdel", name], capture_output=True)


# -- a real hub's login form -------------------------------------------------------------------


def form_login(hub: Hub, user: str, password: str) -> requests.Session | None:
    """A browser's login; the session when the hub let ``user`` in, else None."""
    s = requests.Session()
    s.get(f"{hub.url}/hub/login", timeout=30)
    r = s.post(
        f"{hub.url}/hub/login?next=/hub/home",
        data={"username": user, "password": password, "_xsrf": s.cookies["_xsrf"]},
        timeout=30,
        allow_redirects=False,
    )
    if r.status_code == 302 and "/hub/login" not in r.headers["Location"]:
        return s
    assert r.status_code == 403 and "Invalid username or password" in r.text, r.status_code
    return None


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory):
    if not PROXY.exists():
        pytest.skip("configurable-http-proxy is missing")
    hub = Hub(tmp_path_factory.mktemp("login-hub"))
    hub.var.mkdir(parents=True)
    # an older version's shared passwords, known to every user of that hub
    (hub.var / "hub-passwords.json").write_text(json.dumps(OLD_SHARED))
    try:
        hub.start()
        yield hub
    finally:
        hub.stop()


def test_on_a_real_hub_only_each_names_own_password_logs_in(hub: Hub) -> None:
    assert form_login(hub, "user1", "user1-own-pw") is not None  # first login: sets it
    assert form_login(hub, "user1", "someone-elses-guess") is None
    assert form_login(hub, "user1", OLD_SHARED["user_password"]) is None
    assert form_login(hub, "admin", OLD_SHARED["admin_password"]) is None
    assert form_login(hub, "admin", hub.user_password) is None  # not claimable at first login
    assert form_login(hub, "admin", hub.admin_password) is not None
    assert form_login(hub, "user1", "user1-own-pw") is not None
    assert not (hub.var / "hub-passwords.json").exists()


def test_on_a_real_hub_a_user_changes_their_password(hub: Hub) -> None:
    s = form_login(hub, "user2", "user2-first-pw")
    assert s is not None
    page = f"{hub.url}/hub/auth/change-password"
    assert 'href="/hub/auth/change-password"' in s.get(f"{hub.url}/hub/home", timeout=30).text
    # posted straight away, as a script would: the page's template is there without a GET first
    r = s.post(page, data={"password": "user2-next-pw", "_xsrf": s.cookies["_xsrf"]}, timeout=30)
    assert r.status_code == 200 and "changed successfully" in r.text
    assert form_login(hub, "user2", "user2-first-pw") is None
    assert form_login(hub, "user2", "user2-next-pw") is not None


def test_on_a_real_hub_no_password_is_printed_or_kept_readable(hub: Hub) -> None:
    log = hub.log_path.read_text(errors="replace")
    known = [hub.admin_password, "user1-own-pw", "user2-next-pw", *OLD_SHARED.values()]
    assert not [s for s in known if s in log]
    files = db_files(hub.var)
    assert files and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)
    assert not [s for s in known if s.encode() in db_bytes(hub.var)]
