"""Each hub user's private folder ``<storage_root>/<user>``: a name that can be one folder,
made 0700 and owned by the account the user's server runs as (extension.userfs.accounts).

GPFS style: one shared root, one folder per user. The root stays traversable (mode 0711 when we
create it) so an account reaches its own folder; each folder is 0700 and owned by the account
the user's notebook runs as, so reading another user's folder fails at the OS level.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from extension.scheduler.names import user_name_problem
from extension.userfs import accounts
from extension.userfs.accounts import Account, AccountError

# The Linux-account form of a user name (extension.scheduler.names has the one definition of
# user names; this narrows it): folder names, label values and Linux account names all accept
# it (no '/', no '..', no '@', no upper case).
USERNAME = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")


def validate_username(user: str) -> str:
    """A hub user name that can be one folder under the storage root, or an error: a user
    name at all (``user_name_problem``), then of the narrower Linux-account form. Either
    refusal says what the folder's name needs, the narrower rule being the one that binds."""
    if user_name_problem(user) is not None or not USERNAME.match(user):
        raise AccountError(
            f"hub user name {user!r} cannot name a private folder: use 1-63 lower-case letters, "
            "digits, '.', '_' or '-', starting and ending with a letter or digit"
        )
    return user


def user_folder(storage_root: str | os.PathLike, user: str) -> Path:
    return Path(storage_root).resolve() / validate_username(user)


def ensure_folder(storage_root: str | os.PathLike, user: str, account: Account | None) -> Path:
    """``<root>/<user>`` for a valid hub user name, created 0700 and the account's."""
    return accounts.ensure_folder(storage_root, validate_username(user), account)
