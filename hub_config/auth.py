"""Who may log in to the embedded hub: each name's own password, set at its first login.

The embedded default follows jupyterhub-firstuseauthenticator's model (TLJH's default): the first
login under a new name sets that name's password, stored as a bcrypt hash in a private (0600)
dbm database in the hub's runtime folder; every later login under that name must match it, and
the password is changed at ``/hub/auth/change-password``. The admins' names are never left to
their first login: their password is set at the hub's first start from ``$WMLA_ADMIN_PASSWORD``,
or generated then and shown that once (it is never printed again, and only its hash is kept).

The shared password of older versions (``hub-passwords.json``: one password for every name)
logs nobody in any more; the file is removed at the first start that finds it.

Other authenticators (PAM, LDAP, OAuth) replace all of this: ``$WMLA_AUTHENTICATOR`` names one,
see docs/auth.md.
"""

from __future__ import annotations

import dbm
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bcrypt
from firstuseauthenticator import FirstUseAuthenticator
from firstuseauthenticator.firstuseauthenticator import TEMPLATE_DIR

from hub_config import PASSWORD_DB

OLD_SHARED_PASSWORDS = "hub-passwords.json"
ADMIN_PASSWORD_ENV = "WMLA_ADMIN_PASSWORD"
AUTHENTICATOR_ENV = "WMLA_AUTHENTICATOR"
MIN_PASSWORD_LENGTH = 8
# bcrypt reads 72 bytes of a password at most; bcrypt 5 raises for a longer one, so a longer
# one is refused with a message instead of failing the login with a server error
MAX_PASSWORD_BYTES = 72


def password_problem(password: str) -> str | None:
    """Why ``password`` cannot be a hub password, or None when it can."""
    if len(password) < MIN_PASSWORD_LENGTH:
        return f"Password too short! Please choose at least {MIN_PASSWORD_LENGTH} characters."
    if len(password.encode("utf8")) > MAX_PASSWORD_BYTES:
        return f"Password too long! Please keep it to {MAX_PASSWORD_BYTES} bytes (UTF-8)."
    return None


class WmlaFirstUseAuthenticator(FirstUseAuthenticator):
    """FirstUseAuthenticator whose password rules are ``password_problem``'s: a password past
    bcrypt's 72 bytes is refused with a message (at first login and on the change page) and
    never matches, where the package would fail the request with bcrypt 5's ValueError."""

    async def authenticate(self, handler: Any, data: dict) -> str | None:
        if len(data.get("password", "").encode("utf8")) > MAX_PASSWORD_BYTES:
            # no stored password can be this long, and none may be set this long
            handler.custom_login_error = password_problem(data["password"])
            return None
        return await super().authenticate(handler, data)

    def reset_password(self, username: str, new_password: str) -> str:
        problem = password_problem(new_password)
        if problem:
            return problem
        return super().reset_password(username, new_password)


@dataclass(frozen=True)
class AdminPasswords:
    """What the first start did for the admins' names."""

    set_now: tuple[str, ...]  # admin names whose password was set at this start
    generated: str | None  # the password generated for them, to show once; None if from env


def seed_admin_passwords(
    db_path: str | os.PathLike, admins: Iterable[str], password: str | None
) -> AdminPasswords:
    """Give every admin name that has no password yet ``password`` (``$WMLA_ADMIN_PASSWORD``),
    or one generated now; the others keep theirs (a later start, or a changed password).

    Only the bcrypt hash is stored, in the database FirstUseAuthenticator reads (created 0600).
    Raises ValueError for a ``password`` that ``password_problem`` refuses.
    """
    if password is not None and password_problem(password):
        raise ValueError(f"${ADMIN_PASSWORD_ENV}: {password_problem(password)}")
    names = sorted({name.lower() for name in admins})  # the Authenticator's normalized names
    with dbm.open(os.fspath(db_path), "c", 0o600) as db:
        missing = [name for name in names if name.encode("utf8") not in db]
        generated = None
        if missing and password is None:
            generated = password = secrets.token_urlsafe(18)
        for name in missing:
            db[name.encode("utf8")] = bcrypt.hashpw(password.encode("utf8"), bcrypt.gensalt())
    return AdminPasswords(tuple(missing), generated)


def retire_shared_passwords(state_dir: str | os.PathLike) -> bool:
    """Remove the shared-password file of older versions; True when there was one.

    It logs nobody in any more, and it holds passwords that were printed at every start; a link
    is removed as a link (its target is never touched).
    """
    path = Path(state_dir) / OLD_SHARED_PASSWORDS
    if not os.path.lexists(path):
        return False
    os.unlink(path)
    return True


def first_use_login(c: Any, state_dir: str | os.PathLike, admins: Iterable[str]) -> list[str]:
    """Configure ``c`` (a hub's config) for first-use passwords, the admins' set at the first
    start; returns what a person must be told once (a generated admin password), as lines.

    The change-password page's template is on the hub's template path from the start: the
    package adds it only when the page is first shown (GET), so a POST to a hub that never
    showed it failed with a server error after changing the password. The hub's pages link to
    that page (``wmla_change_password`` in hub_config/templates/page.html).
    """
    state_dir = Path(state_dir)
    db_path = state_dir / PASSWORD_DB
    admins = sorted(admins)
    retired = retire_shared_passwords(state_dir)
    seeded = seed_admin_passwords(db_path, admins, os.environ.get(ADMIN_PASSWORD_ENV) or None)
    c.JupyterHub.authenticator_class = WmlaFirstUseAuthenticator
    c.FirstUseAuthenticator.dbm_path = str(db_path)
    c.FirstUseAuthenticator.min_password_length = MIN_PASSWORD_LENGTH
    # its start-up check repairs databases of versions before 1.0 (and copies the database to a
    # backup file to do it): this database never had that form
    c.FirstUseAuthenticator.check_passwords_on_startup = False
    c.JupyterHub.template_paths = [*c.JupyterHub.get("template_paths", []), TEMPLATE_DIR]
    c.JupyterHub.template_vars = {
        **c.JupyterHub.get("template_vars", {}),
        "wmla_change_password": "auth/change-password",
    }
    # any new name may sign up: its first login is what makes it someone's
    c.Authenticator.allow_all = True
    lines = ["each user name's first login sets its password (docs/auth.md)"]
    if retired:
        lines.append(f"the shared password of old ({OLD_SHARED_PASSWORDS}) was removed")
    if seeded.generated:
        lines += [
            f"admin users {', '.join(seeded.set_now)} -> password {seeded.generated}",
            "(shown this once: note it now; change it at /hub/auth/change-password)",
        ]
    elif seeded.set_now:
        lines.append(f"admin users {', '.join(seeded.set_now)} -> ${ADMIN_PASSWORD_ENV}")
    return lines


def configure_login(c: Any, state_dir: str | os.PathLike, admins: Iterable[str]) -> None:
    """The embedded hub's authenticator: first-use passwords, or the one ``$WMLA_AUTHENTICATOR``
    names (``pam``, ``ldapauthenticator``, ``github``, ...: any ``jupyterhub.authenticators``
    entry point or import path), configured further in a config file (docs/auth.md). Says on
    stdout which, and what a person must be told once.

    Who may log in is then that authenticator's settings' (``allowed_users``, ``allow_all``,
    its own, e.g. ``allowed_organizations``): nothing here lets everyone in, since "everyone"
    of an OAuth provider is the world.
    """
    chosen = os.environ.get(AUTHENTICATOR_ENV, "").strip() or "firstuse"
    c.Authenticator.admin_users = set(admins)
    if chosen == "firstuse":
        lines = first_use_login(c, state_dir, admins)
    else:
        c.JupyterHub.authenticator_class = chosen
        lines = [f"logins checked by the {chosen!r} authenticator (docs/auth.md)"]
        lines.append(f"admin users: {', '.join(sorted(admins))}")
    url = f"http://{c.JupyterHub.ip}:{c.JupyterHub.port}/"
    lines.append(f"open {url} and {url}services/wmla/")
    print("\n  wmla: " + "\n    ".join(lines) + "\n", flush=True)


def forget_password(db_path: str | os.PathLike, name: str) -> bool:
    """Remove ``name``'s password; True when it had one. Its next login sets a new one, or, for
    an admin name, the hub's next start does (``$WMLA_ADMIN_PASSWORD`` or one shown once)."""
    with dbm.open(os.fspath(db_path), "c", 0o600) as db:
        key = name.lower().encode("utf8")
        if key not in db:
            return False
        del db[key]
        return True


def main(argv: list[str] | None = None) -> int:
    """``python -m hub_config.auth forget NAME [--var DIR]``: what an admin who lost the admins'
    password runs (with the hub stopped), then starts the hub again."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m hub_config.auth")
    parser.add_argument("action", choices=["forget"])
    parser.add_argument("name", help="the hub user name whose password to remove")
    parser.add_argument("--var", default=os.environ.get("WMLA_VAR", "var"), help="runtime folder")
    args = parser.parse_args(argv)
    found = forget_password(Path(args.var) / PASSWORD_DB, args.name)
    print(f"{args.name}: {'password removed' if found else 'had no password'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
