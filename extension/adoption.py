"""Whether an existing system account may be adopted as a hub user's: one this project made
looks exactly like what its ``useradd`` makes, and anything else is refused.

The spawner (notebook servers, spawner/local.py) and the local backend (job workers,
backends/local/users.py) find a hub user's account by name, from the account template
(``wmla-{username}``). An account of that name that someone else made (a person's login, a
daemon's) would hand the hub user whatever that account can reach, so before either runs code
as an existing account it is held to what ``extension/userfs/accounts.py``'s ``create_account``
makes: no login shell, its home the user's folder, a primary group of its own name and no other
group. The uid floor (``min_uid``) is ``find_account``'s. Where the hub's users are the
machine's own accounts (PAM, LDAP: the template ``{username}``), or the site makes the accounts
itself (``create_system_users`` / ``create_accounts`` off), they are adopted as they are.

Read only from the account databases (pwd, grp) and the storage root's path: nothing the user
controls is opened or followed.
"""

from __future__ import annotations

import grp
import os
import pwd
from enum import Enum

from extension.userfs.accounts import Account, AccountError

PLAIN_TEMPLATE = "{username}"
# what useradd --shell is given here, and the shells that refuse a login the same way
NO_LOGIN_SHELLS = frozenset({"/usr/sbin/nologin", "/sbin/nologin", "/bin/false", "/usr/bin/false"})


class Adoption(str, Enum):
    """Which existing accounts may be a hub user's."""

    OURS = "ours"  # only one that looks made by this project
    ANY = "any"  # the machine's own accounts (PAM, LDAP): the uid floor only

    @classmethod
    def default(cls, template: str, creates_accounts: bool) -> Adoption:
        """OURS where this project makes the accounts under a name of its own; ANY where the
        accounts are the machine's (``{username}``) or the site makes them."""
        return cls.OURS if creates_accounts and template != PLAIN_TEMPLATE else cls.ANY


def _same_folder(home: str, folder: str) -> bool:
    """``home`` names ``folder``: the same path, or the same name under the same storage root
    (the root's own links resolved; the root is the administrator's, not the user's)."""
    if os.path.normpath(home) == os.path.normpath(folder):
        return True
    return os.path.basename(os.path.normpath(home)) == os.path.basename(
        os.path.normpath(folder)
    ) and os.path.realpath(os.path.dirname(home)) == os.path.realpath(os.path.dirname(folder))


def foreign_traits(account: Account, folder: str | None) -> list[str]:
    """What about ``account`` ``create_account`` would not have made (empty: it looks ours).
    ``folder``: the user's folder, its home; None when the caller does not know it."""
    entry = pwd.getpwnam(account.name)
    found = []
    if entry.pw_shell not in NO_LOGIN_SHELLS:
        found.append(f"it has the login shell {entry.pw_shell or '/bin/sh'}")
    if folder is not None and not _same_folder(entry.pw_dir, folder):
        found.append(f"its home is {entry.pw_dir}, not the user's folder {folder}")
    try:
        primary = grp.getgrgid(entry.pw_gid).gr_name
    except KeyError:
        primary = str(entry.pw_gid)
    if primary != account.name:
        found.append(f"its primary group is {primary}, not its own")
    others = sorted(g.gr_name for g in grp.getgrall() if account.name in g.gr_mem)
    if others:
        found.append(f"it belongs to the group{'s' if len(others) > 1 else ''} {', '.join(others)}")
    return found


def check_adoption(
    account: Account, user: str, folder: str | None, adoption: Adoption, setting: str
) -> Account:
    """``account`` when hub user ``user`` may run as it; else AccountError saying what is
    foreign about it and what to do. ``setting`` names the option that says ``any``."""
    if adoption is Adoption.ANY:
        return account
    found = foreign_traits(account, folder)
    if found:
        raise AccountError(
            f"system account {account.name!r} exists but was not made by jupyterhub-wmla for hub "
            f"user {user} ({'; '.join(found)}): refusing to run {user}'s code as it. Remove or "
            f"rename that account, or change the account template; where the hub's users are "
            f"this machine's own accounts, set {setting} = 'any'"
        )
    return account
