"""Keeping the hub's and the service's state private to the account that runs them.

Every hub user has a terminal on the machine, so every hub user is a local attacker. The state
holds what they must not read: the wmla store (job environments carry secrets), the hub's
database (tokens), its cookie secret and the password hashes. State directories are therefore
0700 and state files 0600, new files get them from a 0077 umask, and what an older version left
looser is tightened at every start.

Nothing here follows a symbolic link: a link in a state directory is reported and left alone
(neither the link nor its target is changed), and walking goes by directory file descriptors
opened with O_NOFOLLOW, so a path swapped for a link half way cannot redirect a chmod.

The users' storage root is the opposite case: it must stay traversable (0711) so that each
account reaches its own folder, and what is inside belongs to the users, so it is never walked.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from extension.confine import Control

PRIVATE_UMASK = 0o077
PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600
# traversable, not listable: what a directory above users' folders needs (storage root, var/)
TRAVERSABLE_DIR = 0o711
# what SQLite writes next to a database file; it gives them the database file's own mode
SQLITE_SIDECARS = ("-wal", "-shm", "-journal")

# ELOOP on a link, and no blocking open of a FIFO or terminal swapped in for a file
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_OPEN_DIR = _OPEN | os.O_DIRECTORY

Outcome = Literal["missing", "private", "fixed", "symlink", "other"]
"""What a fix found: no such path, already private, made private, a symbolic link (left alone),
or something that is neither a regular file nor a directory (left alone)."""

HIDEPID_ADVICE = (
    "every account on this machine can read the command lines of every other account's "
    "processes (jobs, notebook servers) in /proc; hide them: `mount -o remount,hidepid=2 /proc` "
    "(or hidepid=invisible), with gid=<group> for a monitoring group that must still see all, "
    "and the same options on the /proc line of /etc/fstab to keep it across reboots"
)
NOT_ROOT_ADVICE = (
    "the service does not run as root, so every job runs as the service's own account (uid {uid}) "
    "and users' folders and jobs are NOT separated by the operating system; only the wmla API "
    "keeps users apart. Run the hub (and with it the service) as root for one system account "
    "per user"
)


def restrict_umask() -> int:
    """Give this process (and every process it starts) umask 0077; returns the previous one.

    Files and directories created without an explicit mode are then private to the account,
    so no new state file is readable by other users before a fix at the next start.
    """
    return os.umask(PRIVATE_UMASK)


def make_dir(path: str | os.PathLike, mode: int, parents_mode: int = TRAVERSABLE_DIR) -> bool:
    """Create directory ``path`` with exactly ``mode`` and its missing parents with
    ``parents_mode``; True when ``path`` was created now. An existing directory is left as it
    is (a link to a directory counts as existing).

    Explicit chmods, because the umask takes bits away: a storage root made under umask 0077
    would be 0700 and lock every account out of its own folder. Parents default to 0711 so a
    private state directory and a traversable storage root can share a parent such as var/.
    """
    target = Path(os.path.abspath(path))
    missing: list[Path] = []
    here = target
    while not os.path.lexists(here):
        missing.append(here)
        here = here.parent
    created = False
    for folder in reversed(missing):
        want = mode if folder == target else parents_mode
        try:
            os.mkdir(folder, want)
        except FileExistsError:  # made by someone else meanwhile: theirs, not ours to chmod
            continue
        fd = os.open(folder, _OPEN_DIR)
        try:
            os.fchmod(fd, want)
        finally:
            os.close(fd)
        created = created or folder == target
    if not target.is_dir():
        raise FileExistsError(f"{target} exists and is not a directory; move it away")
    return created


def tighten(path: str | os.PathLike, most: int, *, dir_fd: int | None = None) -> Outcome:
    """Take away every permission bit of ``path`` beyond ``most`` (0600 for a file, 0700 for a
    directory), without following a symbolic link. Only regular files and directories change.
    """
    return _chmod_nofollow(path, lambda mode: mode & most, dir_fd)


def set_mode(path: str | os.PathLike, mode: int) -> Outcome:
    """Give directory or regular file ``path`` exactly ``mode`` (bits may be added: var/ must
    be traversable), without following a symbolic link."""
    return _chmod_nofollow(path, lambda _: mode, None)


def _chmod_nofollow(
    path: str | os.PathLike, new_mode: Callable[[int], int], dir_fd: int | None
) -> Outcome:
    """chmod a regular file or directory to ``new_mode(its mode)``, by a descriptor of what
    ``lstat`` saw: never through a link, never on something swapped in between."""
    try:
        before = os.lstat(path, dir_fd=dir_fd)
    except FileNotFoundError:
        return "missing"
    if stat.S_ISLNK(before.st_mode):
        return "symlink"
    if not (stat.S_ISREG(before.st_mode) or stat.S_ISDIR(before.st_mode)):
        return "other"
    mode = new_mode(stat.S_IMODE(before.st_mode))
    if stat.S_IMODE(before.st_mode) == mode:
        return "private"
    fd = os.open(path, _OPEN_DIR if stat.S_ISDIR(before.st_mode) else _OPEN, dir_fd=dir_fd)
    try:
        if not _same(os.fstat(fd), before):
            return "other"  # replaced between the lstat and the open: not what we looked at
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    return "fixed"


def create_private_file(path: str | os.PathLike) -> Outcome:
    """Create ``path`` empty with mode 0600 unless it exists, and tighten it to 0600 if it does.

    For a SQLite database: an empty file is a valid database, and SQLite gives the -wal, -shm
    and -journal files it creates later the database file's mode, so they are 0600 too. A
    symbolic link is neither followed nor created through (``"symlink"`` is returned).
    """
    try:
        before: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        before = None
    if before is not None and stat.S_ISLNK(before.st_mode):
        return "symlink"
    fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                 PRIVATE_FILE)  # fmt: skip
    try:
        now = os.fstat(fd)
        if not stat.S_ISREG(now.st_mode):
            return "other"
        if stat.S_IMODE(now.st_mode) & ~PRIVATE_FILE == 0:
            return "private"
        return _tighten_fd(fd, now, PRIVATE_FILE)
    finally:
        os.close(fd)


def private_sqlite_file(path: str | os.PathLike) -> dict[str, Outcome]:
    """Make a SQLite database file private before anything opens it: create it 0600 if missing,
    tighten it and its existing -wal, -shm and -journal files. {path: outcome}."""
    path = os.fspath(path)
    found = {path: create_private_file(path)}
    for suffix in SQLITE_SIDECARS:
        found[path + suffix] = tighten(path + suffix, PRIVATE_FILE)
    return found


@dataclass
class TreeFix:
    """What ``privatize_tree`` did: paths made private, symbolic links and kept-out
    directories left alone, and paths it could not fix (with the error)."""

    fixed: list[str] = field(default_factory=list)
    symlinks: list[str] = field(default_factory=list)
    kept_out: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def warnings(self, top: str) -> list[str]:
        """What an operator should hear of it (``top``: the tree it was run on)."""
        out = []
        if self.fixed:
            out.append(
                f"wmla: {len(self.fixed)} path(s) in the state directory {top} were open to "
                "other accounts; now private (directories 0700, files 0600): "
                + ", ".join(self.fixed[:5])
            )
        out += [
            f"wmla: {link} is a symbolic link; neither it nor its target was made private: "
            "make sure only this account can read what it points to"
            for link in self.symlinks
        ]
        out += [f"wmla: cannot make {failure} private" for failure in self.failed]
        out += [
            f"wmla: the storage root {kept} lies in the state directory; it was left as it is"
            for kept in self.kept_out
        ]
        return out


def privatize_tree(top: str | os.PathLike, keep_out: Iterable[str | os.PathLike] = ()) -> TreeFix:
    """Make directory ``top`` 0700 and everything under it private where looser: directories
    0700, regular files 0600. Symbolic links are neither changed nor followed; directories in
    ``keep_out`` (a storage root that lies inside ``top``: users own what is in it) are neither
    changed nor entered, and neither is ``top`` itself when it is one of them.
    """
    result = TreeFix()
    top = os.path.abspath(top)
    keep = {_identity(p) for p in keep_out} - {None}
    try:
        before = os.lstat(top)
    except FileNotFoundError:
        return result
    if stat.S_ISLNK(before.st_mode):
        result.symlinks.append(top)
        return result
    if not stat.S_ISDIR(before.st_mode):
        result.failed.append(f"{top}: not a directory")
        return result
    if (before.st_dev, before.st_ino) in keep:
        result.kept_out.append(top)
        return result
    try:
        fd = os.open(top, _OPEN_DIR)
    except OSError as err:
        result.failed.append(f"{top}: {err.strerror}")
        return result
    try:
        _privatize_dir(fd, top, os.fstat(fd), keep, result)
    finally:
        os.close(fd)
    return result


def is_private_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a directory (not a link) of this process's account that no other
    account may enter, list or write."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (
        stat.S_ISDIR(st.st_mode)
        and st.st_mode & 0o077 == 0
        and (not hasattr(os, "geteuid") or st.st_uid == os.geteuid())
    )


def only_owner_writes(path: str | os.PathLike) -> bool:
    """Whether ``path`` and every folder above it are directories that only this process's
    account (or root) may write: then no other account can swap a name in them, such as a
    user's folder in the storage root for a link (what root's chown of it relies on)."""
    here = Path(os.path.abspath(path))
    for folder in (here, *here.parents):
        try:
            st = os.stat(folder)
        except OSError:
            return False
        owner_ok = st.st_uid in (0, os.geteuid()) if hasattr(os, "geteuid") else True
        # a sticky parent such as /tmp is fine: others cannot rename what they do not own, and
        # the folder below it was checked to be root's
        shared = st.st_mode & 0o022 and (folder == here or not st.st_mode & stat.S_ISVTX)
        if not stat.S_ISDIR(st.st_mode) or not owner_ok or shared:
            return False
    return True


def proc_hides_other_processes(mounts: str | None = None) -> bool:
    """Whether /proc hides other accounts' processes (``hidepid=2``/``invisible``, or
    ``4``/``ptraceable``, which for an unprivileged account is the same), from the text of
    /proc/mounts (read when ``mounts`` is None; unreadable counts as not hidden).

    Without it any account lists every process with its command line. ``hidepid=1``
    (``noaccess``) is not enough: it protects the contents of /proc/<pid>, but every process
    stays listed with its owner. The last /proc mount wins: it is the one on top.
    """
    if mounts is None:
        try:
            with open("/proc/mounts", encoding="utf-8", errors="replace") as f:
                mounts = f.read()
        except OSError:
            return False
    hidden = False
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[1] != "/proc" or fields[2] != "proc":
            continue
        hidepid = ""
        for option in fields[3].split(","):
            if option.startswith("hidepid="):
                hidepid = option[len("hidepid=") :]
        hidden = hidepid in ("2", "invisible", "4", "ptraceable")
    return hidden


# -- internals ----------------------------------------------------------------------------------
def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _identity(path: str | os.PathLike) -> tuple[int, int] | None:
    try:
        st = os.stat(path)  # followed on purpose: the storage root may be reached by a link
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _tighten_fd(fd: int, before: os.stat_result, most: int) -> Outcome:
    now = os.fstat(fd)
    if not _same(now, before):
        return "other"  # replaced between the lstat and the open: not what we looked at
    os.fchmod(fd, stat.S_IMODE(now.st_mode) & most)
    return "fixed"


def _privatize_dir(
    fd: int, path: str, st: os.stat_result, keep: set[tuple[int, int] | None], result: TreeFix
) -> None:
    """Tighten the open directory ``fd`` (at ``path``) and, by descriptors, all below it."""
    if stat.S_IMODE(st.st_mode) & ~PRIVATE_DIR:
        os.fchmod(fd, stat.S_IMODE(st.st_mode) & PRIVATE_DIR)
        result.fixed.append(path)
    with os.scandir(fd) as entries:  # scandir works on a duplicate: fd stays ours
        names = [entry.name for entry in entries]
    for name in names:
        child = os.path.join(path, name)
        try:
            before = os.lstat(name, dir_fd=fd)
            if stat.S_ISLNK(before.st_mode):
                result.symlinks.append(child)
            elif stat.S_ISREG(before.st_mode):
                if tighten(name, PRIVATE_FILE, dir_fd=fd) == "fixed":
                    result.fixed.append(child)
            elif stat.S_ISDIR(before.st_mode):
                if (before.st_dev, before.st_ino) in keep:
                    result.kept_out.append(child)
                    continue
                sub = os.open(name, _OPEN_DIR, dir_fd=fd)
                try:
                    now = os.fstat(sub)
                    if _same(now, before):  # else replaced meanwhile: leave it
                        _privatize_dir(sub, child, now, keep, result)
                finally:
                    os.close(sub)
        except FileNotFoundError:
            continue  # removed while we walked
        except OSError as err:
            result.failed.append(f"{child}: {err.strerror}")


def security_report(state_dir: str, storage_root: str, backend: Any) -> dict[str, Any]:
    """How well this machine keeps users apart, for GET /instance and the start log:
    {"runs_as_root", "proc_hidepid", "state_dir_private", "warnings": [what to do]};
    ``backend``: the service's (its ``run_as_user``), None before it is made."""
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    hidepid = proc_hides_other_processes()
    private = is_private_dir(state_dir)
    warnings = []
    if not root:
        uid = os.geteuid() if hasattr(os, "geteuid") else "?"
        warnings.append(NOT_ROOT_ADVICE.format(uid=uid))
    elif not hidepid:  # as one account for everyone, hiding processes would change nothing
        warnings.append(HIDEPID_ADVICE)
    as_service = getattr(backend, "run_as_user", None) is False
    if root and as_service:
        warnings.append(
            "c.WmlaService.backend_options has run_as_user=False: every job runs as root, "
            "so any hub user can act as root; remove it (jobs then run as their users' "
            "accounts)"
        )
    storage_safe = only_owner_writes(storage_root)
    if root and not storage_safe:
        warnings.append(
            f"the storage root {storage_root} (or a folder above it) is writable by "
            "other accounts or not root's: a user could put a link where another user's "
            "folder is; make it and its parents root's, not group- or world-writable "
            "(the storage root itself 0711)"
        )
    if not private:
        warnings.append(
            f"the state directory {state_dir} (the store, with every job's "
            "environment) is open to other accounts, a symbolic link, or not this "
            "account's: make it a directory of this account with mode 0700"
        )
    enforcement = enforcement_of(backend)
    warnings += enforcement.get("warnings", [])
    return {
        "runs_as_root": root,
        "proc_hidepid": hidepid,
        "state_dir_private": private,
        "storage_root_safe": storage_safe,
        "jobs_run_as": "the service's account" if as_service or not root else "their users",
        "grants_enforced_by": enforcement["mechanism"],
        "enforced": enforcement["enforced"],
        "warnings": warnings,
    }


def enforcement_of(backend: Any) -> dict[str, Any]:
    """What holds a job to its grant: the backend's ``enforcement`` (a confine.Report: cgroups
    on this machine, the kubelet's container limits on Kubernetes), with a warning for each
    control that is not enforced; nothing at all for a backend that says nothing."""
    report = getattr(backend, "enforcement", None)
    if report is None:
        why = "this backend does not say how grants are enforced"
        return {
            "mechanism": "none",
            "enforced": {c.value: {"enforced": False, "how": why} for c in Control},
            "warnings": [f"grants are not enforced: {why}"] if backend is not None else [],
        }
    return {**report.as_dict(), "warnings": report.warnings()}
