"""``wmla backup FOLDER``: consistent copies of the hub's and the wmla service's SQLite
databases, and of the users' password hashes, taken while everything runs.

Run it on the hub's machine as the hub's user (root): it reads the runtime folder (``--var``,
default ``$WMLA_VAR``, else ``var/`` of the checkout). Each database is copied with SQLite's
online backup API (``sqlite3.Connection.backup``), which copies a consistent snapshot page by
page while the hub and the service keep writing (WAL included: the copy is one file, with
nothing pending). The password hashes (``hub-passwords.dbm*``, which a restored hub needs: a
name without its hash is anyone's to claim at the next login) are read through ``dbm`` and
written anew, whole. The copies are 0600 in ``FOLDER`` (made 0700 when missing); a file already
there is never overwritten.

A store in PostgreSQL (``c.WmlaService.db_url``) is not copied here: back it up with
``pg_dump`` (docs/deploy.md "Backups").

Restore: stop the hub, put the files back where ``wmla backup`` says it read them (the hub
database and password files in the runtime folder, ``wmla.sqlite`` in its ``wmla/`` folder),
start the hub. Jobs that were running when the copy was taken come back ``FAILED`` (their
workers are not on record in the new state folder), every other job, plan, usage record,
user and token as they were.
"""

from __future__ import annotations

import argparse
import dbm
import os
import sqlite3
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from extension.service.privacy import is_private_dir, only_owner_writes

ROOT = Path(__file__).resolve().parents[1]
HUB_DB = "jupyterhub.sqlite"
SERVICE_DB = "wmla.sqlite"
PASSWORDS = "hub-passwords.dbm"


class BackupError(Exception):
    """The backup cannot be made; the message says why."""


@dataclass(frozen=True)
class Copied:
    what: str
    source: Path
    copy: Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", type=Path, help="where the copies go (made 0700 if missing)")
    parser.add_argument(
        "--var",
        type=Path,
        default=None,
        help="the hub's runtime folder (default $WMLA_VAR, else var/ of the checkout)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="the service's state folder, where wmla.sqlite is (default VAR/wmla)",
    )


def backup(folder: Path, var: Path, state_dir: Path | None = None) -> list[Copied]:
    """Copy the hub's database, the service's store and the password hashes from ``var`` into
    ``folder``; returns what was copied. Raises BackupError (nothing is overwritten)."""
    var = Path(var).resolve()
    state = Path(state_dir).resolve() if state_dir else var / "wmla"
    sources = [("hub database", var / HUB_DB), ("wmla service store", state / SERVICE_DB)]
    missing = [f"{what} {path}" for what, path in sources if not path.is_file()]
    if missing:
        hint = ""
        if not (state / SERVICE_DB).is_file() and (var / HUB_DB).is_file():
            hint = (
                "; if the service's store is PostgreSQL (c.WmlaService.db_url), back it up with "
                "pg_dump instead (docs/deploy.md), and give --state-dir when it is elsewhere"
            )
        raise BackupError(f"not found: {', '.join(missing)} (is --var right?){hint}")
    folder = Path(folder)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    # the copies are made by name (SQLite, dbm): in a folder another account can write, it
    # could swap a name for a link to a file of root's between our check and the write
    if not (is_private_dir(folder) and only_owner_writes(folder)):
        raise BackupError(
            f"{folder} is not a folder only you can enter and write (or one above it can be "
            "written by others): name a new folder, or chmod 700 it"
        )
    taken = [f for f in (HUB_DB, SERVICE_DB) if (folder / f).exists()]
    taken += [p.name for p in folder.glob(PASSWORDS + "*")]
    if taken:
        raise BackupError(f"{folder} already holds {', '.join(sorted(taken))}: name a new folder")
    done = []
    for what, source in sources:
        copy = folder / source.name
        copy_sqlite(source, copy)
        done.append(Copied(what, source, copy))
    passwords = var / PASSWORDS
    if dbm.whichdb(str(passwords)):
        copy = folder / PASSWORDS
        copy_dbm(passwords, copy)
        done.append(Copied("password hashes", passwords, copy))
    return done


def copy_sqlite(source: Path, copy: Path) -> None:
    """A consistent snapshot of the live database ``source`` in the new file ``copy`` (0600),
    checked by SQLite's integrity check."""
    private_file(copy)
    src = sqlite3.connect(source, timeout=60)
    try:
        dst = sqlite3.connect(copy)
        try:
            src.backup(dst, pages=1024, sleep=0.01)  # others write between the steps
            dst.execute("PRAGMA journal_mode=DELETE")  # one file, nothing beside it
            (verdict,) = dst.execute("PRAGMA integrity_check").fetchone()
        finally:
            dst.close()
    finally:
        src.close()
    if verdict != "ok":
        raise BackupError(f"the copy of {source} fails SQLite's integrity check: {verdict}")


def copy_dbm(source: Path, copy: Path) -> None:
    """Every key of the dbm database ``source`` written into a new one at ``copy`` (0600)."""
    old = os.umask(0o077)
    try:
        with dbm.open(str(source), "r") as src, dbm.open(str(copy), "n", 0o600) as dst:
            for key in src.keys():
                dst[key] = src[key]
    finally:
        os.umask(old)
    for path in copy.parent.glob(copy.name + "*"):
        path.chmod(0o600)


def private_file(path: Path) -> None:
    """Create ``path`` empty and 0600 (refused when it exists)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    os.close(fd)


def run(args: argparse.Namespace) -> int:
    var = args.var or Path(os.environ.get("WMLA_VAR") or ROOT / "var")
    began = time.monotonic()
    try:
        done = backup(args.folder, var, args.state_dir)
    except (BackupError, OSError, sqlite3.Error) as err:
        print(f"wmla backup: {err}", file=sys.stderr)
        return 1
    for item in done:
        size = sum(p.stat().st_size for p in item.copy.parent.glob(item.copy.name + "*"))
        print(f"{item.what}: {item.source} -> {item.copy} ({size} bytes)")
    print(
        f"done in {time.monotonic() - began:.1f} s. To restore: stop the hub, copy "
        f"{HUB_DB} and {PASSWORDS}* into the runtime folder and {SERVICE_DB} into its wmla/ "
        "folder, start the hub."
    )
    return 0
