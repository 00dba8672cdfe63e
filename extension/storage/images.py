"""One ext4 filesystem image per user folder: the kernel holds its bytes and its files.

Why images and not project quotas: this kind of machine's kernel is built without
CONFIG_QUOTA (``mount -o prjquota`` answers "The kernel was not built with CONFIG_QUOTA" for
ext4 and "quota support not available" for XFS), and btrfs qgroups, which it has, are escaped
by any user: ``btrfs subvolume create`` needs no privilege, and a nested subvolume's data is
outside its parent's qgroup (docs/security.md, "Storage quotas", has the commands). A
filesystem of its own per user is what the kernel cannot be argued out of: writes past it fail
in the kernel, and its inode table bounds the files.

Layout, all of it root's except ``data``::

    <quota_dir>/images/<user>.img     the image (sparse), 0600
    <quota_dir>/mnt/<user>/           where it is mounted (nosuid, nodev), in a 0700 folder
        data/                         the user's folder, bound onto <storage_root>/<user>
        reserve/bytes, reserve/i/N    what root holds back so the user gets exactly the limit
        tmp/                          jobs' private /tmp, inside the user's quota

The image's size is fixed when it is made (ext4 cannot shrink while mounted, nor grow without
CAP_SYS_RESOURCE, which this kind of machine withholds even from root): GROWTH times the hard
limit, sparse, and as many inodes as the files limit. A limit below the space the
image has is held by ``reserve/``: a file root allocates (``fallocate``) and empty files that
take inodes, both in a folder no user can reach, so the free space and free inodes the kernel
gives the user are exactly the limit minus what they use. A lowered limit below what a user
holds takes all free space: their writes fail until they delete enough, as on GPFS.

As root, nothing here follows a path a user can change: everything under ``<quota_dir>`` and
the image's own root is root's; the user's folder is bound by the descriptor of the folder
opened with ``O_NOFOLLOW`` (``/proc/self/fd/N``), so a link put in its place is refused.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import shutil
import stat
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from .limits import StorageLimits

BLOCK = 4096
MS_BIND = 4096
MNT_DETACH = 2
# A new image is GROWTH times its hard limit (sparse): a limit can later be raised that far
# at once; reserve/ holds back what is over the limit
GROWTH = 4
MIN_EXTRA = 8 * 2**20
GROUP_BYTES = 8 * BLOCK * BLOCK  # an ext4 block group: as many blocks as one bitmap block maps
INODES_PER_BLOCK = BLOCK // 256  # mke2fs's default inode size
# The image is a fresh sparse file, so its unwritten journal and inode tables already read as
# zeros: mkfs need not write them (mke2fs' journal for a 40 GiB image is 256 MiB of zeros,
# written for every new user: seconds of the disk under load) nor the kernel zero the tables
# after mounting (noinit_itable)
MKFS_EXTENDED = "root_owner=0:0,nodiscard,lazy_itable_init=1,lazy_journal_init=1"
# New images made at once (mkfs, mount, the limits' holder files); the rest wait their turn,
# so a burst of new users starts a bounded number of mkfs and mounts. Fifty at once, all made
# together, each was ready only when nearly all were (two cores shared fifty ways).
MAKING_AT_ONCE = 2 * (os.cpu_count() or 1)
_NAME = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class StorageError(RuntimeError):
    """A user's storage that cannot be set up or changed; the message says how to fix it."""


@dataclass(frozen=True)
class Measured:
    """What the kernel says of one image now (statvfs), less what root holds back."""

    used_bytes: int
    used_files: int
    free_bytes: int  # what the user may still write
    free_files: int
    reserved_bytes: int
    reserved_files: int


@dataclass(frozen=True)
class Sidecar:
    """Per image, root's own record: what an empty filesystem uses (its baseline)."""

    uid: int
    gid: int
    base_bytes: int
    base_files: int

    @classmethod
    def read(cls, path: Path) -> Sidecar | None:
        try:
            data = json.loads(path.read_text())
            return cls(int(data["uid"]), int(data["gid"]), int(data["base_bytes"]),
                       int(data["base_files"]))  # fmt: skip
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def write(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(self.__dict__, out)
        os.replace(tmp, path)


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _mount_bind(source: str, target_fd: int) -> None:
    """Bind ``source`` (root's path) onto the directory open as ``target_fd``: the kernel
    follows /proc/self/fd/N to that very directory, never to a name that could be swapped."""
    target = f"/proc/self/fd/{target_fd}".encode()
    if _libc().mount(source.encode(), target, None, MS_BIND, None) != 0:
        err = ctypes.get_errno()
        raise StorageError(f"could not bind {source}: {os.strerror(err)}")


def mounted_at(path: str | os.PathLike) -> str | None:
    """The source device of the mount whose mount point is ``path`` (/proc/self/mountinfo)."""
    want = os.fsencode(os.path.abspath(path))
    with open("/proc/self/mountinfo", "rb") as info:
        for line in info:
            fields = line.split()
            point = fields[4].decode("unicode_escape").encode("latin-1")
            if point == want:
                sep = fields.index(b"-")
                return fields[sep + 2].decode()
    return None


def _run(cmd: list[str], what: str) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise StorageError(f"{what}: {err}") from None
    if done.returncode != 0:
        raise StorageError(f"{what}: {(done.stderr or done.stdout).strip()}")
    return done.stdout


def tools_missing() -> list[str]:
    return [t for t in ("mkfs.ext4", "resize2fs", "losetup", "mount", "umount")
            if shutil.which(t) is None]  # fmt: skip


class UserImages:
    """The images of every user folder under one ``quota_dir`` (root only)."""

    def __init__(self, quota_dir: str | os.PathLike, storage_root: str | os.PathLike) -> None:
        self.quota_dir = Path(os.path.abspath(quota_dir))
        self.storage_root = Path(os.path.abspath(storage_root))
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._bound: dict[str, int] = {}  # user -> st_dev of their bound folder
        self._making = threading.BoundedSemaphore(MAKING_AT_ONCE)

    # -- paths (all root's) ----------------------------------------------------------------
    def image(self, user: str) -> Path:
        return self.quota_dir / "images" / f"{_checked(user)}.img"

    def mount_point(self, user: str) -> Path:
        return self.quota_dir / "mnt" / _checked(user)

    def tmp_dir(self, user: str) -> Path:
        return self.mount_point(user) / "tmp"

    def users(self) -> list[str]:
        folder = self.quota_dir / "images"
        if not folder.is_dir():
            return []
        return sorted(p.name[:-4] for p in folder.iterdir()
                      if p.name.endswith(".img") and _NAME.match(p.name[:-4]))  # fmt: skip

    def lock(self, user: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(user, threading.Lock())

    # -- set up ------------------------------------------------------------------------------
    def prepare_dirs(self) -> None:
        for sub in ("", "images", "mnt"):
            path = self.quota_dir / sub if sub else self.quota_dir
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, 0o700)
            info = os.lstat(path)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
                raise StorageError(f"{path} is not a folder of this account; move it away")
            os.chmod(path, 0o700)

    def ensure(self, user: str, uid: int, gid: int, limits: StorageLimits) -> Path:
        """The user's image made, mounted, its limits held, and its ``data`` bound onto
        ``<storage_root>/<user>`` (which the caller made, empty, or which is bound already).
        Cheap when all of that is so already: one fstat of the user's folder."""
        with self.lock(user):
            mounted = mounted_at(self.mount_point(user)) is not None
            with contextlib.nullcontext() if mounted else self._making:
                if not mounted:
                    self._mount(user, uid, gid, limits)
                self.hold(user, limits.bytes_hard, limits.files_hard)
                self._bind(user, uid, gid)
        return self.storage_root / user

    def _mount(self, user: str, uid: int, gid: int, limits: StorageLimits) -> None:
        """Make (when new) and mount the user's image; ``ensure`` found it not mounted."""
        point = self.mount_point(user)
        self.prepare_dirs()
        image = self.image(user)
        side = image.with_suffix(".json")
        fresh = not image.exists()
        if fresh:
            # sparse, so room to raise the limit later costs the host nothing now: ext4
            # cannot grow online without CAP_SYS_RESOURCE, which this kind of machine
            # withholds even from root (docs/security.md)
            inodes = limits.files_hard + 64
            size = image_size(limits.bytes_hard, inodes)
            fd = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                os.ftruncate(fd, size)
            finally:
                os.close(fd)
            try:
                _run(["mkfs.ext4", "-q", "-F", "-b", str(BLOCK), "-m", "0", "-N", str(inodes),
                      "-E", MKFS_EXTENDED, "-L", f"wmla-{user}"[:16], str(image)],
                     f"mkfs.ext4 for {user}'s storage")  # fmt: skip
            except StorageError:
                image.unlink()
                raise
        with contextlib.suppress(FileExistsError):
            os.mkdir(point, 0o700)
        _run(["mount", "-t", "ext4", "-o", "loop,nosuid,nodev,noinit_itable", str(image),
              str(point)], f"mounting {user}'s storage image")  # fmt: skip
        os.chmod(point, 0o711)  # the image's root: traversable, root's
        for name, mode, owner in (("data", 0o700, (uid, gid)), ("tmp", 0o711, (0, 0)),
                                  ("reserve", 0o700, (0, 0))):  # fmt: skip
            path = point / name
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, mode)
            info = os.lstat(path)
            if not stat.S_ISDIR(info.st_mode):  # only root writes the image's root
                raise StorageError(f"{path} is not a folder; the image of {user} is damaged")
            if fresh or name != "data":
                os.chown(path, *owner)
                os.chmod(path, mode)
        with contextlib.suppress(FileExistsError):
            os.mkdir(point / "reserve" / "i", 0o700)
        if fresh or Sidecar.read(side) is None:
            reserve = point / "reserve" / "bytes"
            os.close(os.open(reserve, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))
            vfs = os.statvfs(point)
            Sidecar(uid, gid, (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize,
                    vfs.f_files - vfs.f_ffree).write(side)  # fmt: skip

    def _bind(self, user: str, uid: int, gid: int) -> None:
        root_fd = os.open(self.storage_root, _DIR_FLAGS)
        try:
            fd = _open_folder(root_fd, user, self.storage_root)
            data = os.stat(self.mount_point(user) / "data")
            here = os.fstat(fd)
            if (here.st_dev, here.st_ino) == (data.st_dev, data.st_ino):
                self._bound[user] = here.st_dev
                os.close(fd)
                return
            old = None
            if os.listdir(fd):  # from before quotas: moved aside, then copied in as the user
                if here.st_uid != uid:
                    os.close(fd)
                    raise StorageError(
                        f"{self.storage_root / user} holds files and is not the user's "
                        f"(owner uid {here.st_uid}); move it away"
                    )
                os.close(fd)
                old = self._move_aside(root_fd, user, uid, gid)
                fd = _open_folder(root_fd, user, self.storage_root)
            try:
                _mount_bind(str(self.mount_point(user) / "data"), fd)
            finally:
                os.close(fd)
            self._bound[user] = data.st_dev
        finally:
            os.close(root_fd)
        if old is not None:
            self._copy_in(old, user, uid, gid)

    def _move_aside(self, root_fd: int, user: str, uid: int, gid: int) -> Path:
        """``<root>/<user>`` renamed into ``<root>/.wmla-before-quota/`` (names in root's
        folders: nothing to follow), and an empty folder of the user's in its place."""
        holder = ".wmla-before-quota"
        with contextlib.suppress(FileExistsError):
            os.mkdir(holder, 0o711, dir_fd=root_fd)
        hold_fd = _open_folder(root_fd, holder, self.storage_root)
        try:
            if os.fstat(hold_fd).st_uid != os.geteuid():
                raise StorageError(f"{self.storage_root / holder} is not root's; move it away")
            os.fchmod(hold_fd, 0o711)
            os.rename(user, user, src_dir_fd=root_fd, dst_dir_fd=hold_fd)
        finally:
            os.close(hold_fd)
        os.mkdir(user, 0o700, dir_fd=root_fd)
        fd = _open_folder(root_fd, user, self.storage_root)
        try:
            os.fchown(fd, uid, gid)
        finally:
            os.close(fd)
        return self.storage_root / holder / user

    def _copy_in(self, old: Path, user: str, uid: int, gid: int) -> None:
        """The old files copied into the quota with the user's own rights (a link among them
        is copied as a link, and root reads nothing of theirs); the old folder goes once
        they are all in. A copy that does not fit leaves them where they are and says so."""
        new = self.storage_root / user
        as_user = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]
        try:
            _run([*as_user, "cp", "-a", "--", f"{old}/.", f"{new}/"], "copying")
        except StorageError as err:
            raise StorageError(
                f"{user}'s files from before storage quotas are in {old}; they do not all fit "
                f"in the quota ({err}): raise it, or have the user delete some, then retry"
            ) from None
        with contextlib.suppress(StorageError, OSError):  # what stays is the user's, harmless
            _run([*as_user, "find", str(old), "-mindepth", "1", "-delete"], "removing")
            holder_fd = os.open(old.parent, _DIR_FLAGS)
            try:
                os.rmdir(user, dir_fd=holder_fd)
            finally:
                os.close(holder_fd)

    def bound(self, user: str) -> bool:
        """Whether ``<storage_root>/<user>`` is the user's image now (one lstat)."""
        dev = self._bound.get(user)
        if dev is None:
            return False
        try:
            return os.lstat(self.storage_root / user).st_dev == dev
        except OSError:
            return False

    # -- limits --------------------------------------------------------------------------------
    def measure(self, user: str) -> Measured:
        point = self.mount_point(user)
        side = Sidecar.read(self.image(user).with_suffix(".json"))
        if side is None or not mounted_at(point):
            raise StorageError(f"the storage image of {user} is not mounted")
        vfs = os.statvfs(point)
        reserved = os.lstat(point / "reserve" / "bytes").st_blocks * 512
        held_files = len(os.listdir(point / "reserve" / "i"))
        used = (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize - reserved - side.base_bytes
        files = vfs.f_files - vfs.f_ffree - held_files - side.base_files
        return Measured(max(0, used), max(0, files), vfs.f_bavail * vfs.f_frsize,
                        vfs.f_favail, reserved, held_files)  # fmt: skip

    def hold(self, user: str, max_bytes: int, max_files: int) -> Measured:
        """Make the user's free space ``max_bytes - used`` and free inodes ``max_files -
        used`` (none when over); ``reserve/`` takes back the rest. Limits above the image's
        own size and inode count are held at those (``capacity``)."""
        now = self.measure(user)
        point = self.mount_point(user)
        want_free = max(0, max_bytes - now.used_bytes)
        target = max(0, now.free_bytes + now.reserved_bytes - want_free)
        _set_reserve(point / "reserve" / "bytes", target // BLOCK * BLOCK)
        want_files = max(0, max_files - now.used_files)
        spare = now.free_files + now.reserved_files - want_files
        _set_inodes(point / "reserve" / "i", max(0, spare))
        return self.measure(user)

    def capacity(self, user: str) -> tuple[int, int]:
        """The most bytes and files the image can give its user (its size less ext4's own)."""
        vfs = os.statvfs(self.mount_point(user))
        side = Sidecar.read(self.image(user).with_suffix(".json"))
        base = (side.base_bytes, side.base_files) if side else (0, 0)
        return vfs.f_blocks * vfs.f_frsize - base[0], vfs.f_files - base[1]

    # -- tear down (tests, and an admin moving the quota folder) ----------------------------------
    def unmount_all(self) -> list[str]:
        """Unbind every user's folder and unmount every image; what could not be, as text."""
        problems = []
        for user in self.users():
            for path in (self.storage_root / user, self.mount_point(user)):
                while mounted_at(path):
                    if _libc().umount2(os.fsencode(path), 0) != 0:
                        err = ctypes.get_errno()
                        if err != errno.EBUSY:
                            problems.append(f"{path}: {os.strerror(err)}")
                            break
                        _libc().umount2(os.fsencode(path), MNT_DETACH)
            self._bound.pop(user, None)
        return problems


def _open_folder(dir_fd: int, name: str, where: Path) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        raise StorageError(f"{where / name} is missing") from None
    except OSError:  # ELOOP: a link; ENOTDIR: a file
        raise StorageError(
            f"{where / name} is not a folder (a link or a file); refusing to bind the "
            "user's storage there: move it away"
        ) from None


def _set_reserve(path: Path, size: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        have = os.fstat(fd).st_blocks * 512
        if size < have:
            os.ftruncate(fd, size)
            return
        try:
            os.posix_fallocate(fd, 0, size) if size else None
        except OSError as err:  # the user holds more than the new limit: take all that is free
            if err.errno != errno.ENOSPC:
                raise
            free = os.fstatvfs(fd)
            step = free.f_bfree * free.f_frsize
            while step >= BLOCK:
                try:
                    os.posix_fallocate(fd, 0, have + step)
                    have += step
                except OSError:
                    step //= 2
    finally:
        os.close(fd)


def _set_inodes(folder: Path, count: int) -> None:
    fd = os.open(folder, _DIR_FLAGS)
    try:
        names = os.listdir(fd)
        have = len(names)
        for name in names[count:]:
            os.unlink(name, dir_fd=fd)
        n = 0
        while have < count:
            try:
                os.close(os.open(f"{n}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=fd))
                have += 1
            except FileExistsError:
                pass
            except OSError as err:
                if err.errno == errno.ENOSPC:  # no inode left: the user holds them all
                    return
                raise
            n += 1
    finally:
        os.close(fd)


def image_size(bytes_hard: int, inodes: int) -> int:
    """A new image's size, for ``inodes`` asked of mkfs.ext4. mke2fs gives each 128 MiB
    block group as many inodes, a whole inode-table block of them (16), so the count rounds up
    to a multiple of 16 x the groups, and every inode over it is a file in ``reserve/i``: about
    2,000 for a 10 GiB quota's 321 groups, seconds of a first job's start on a busy machine.
    Of the sizes from ``GROWTH`` times the limit to a quarter more (sparse: free until used),
    the one whose groups round the count up least."""
    least = -(-_round(GROWTH * bytes_hard + MIN_EXTRA) // GROUP_BYTES)

    def spare(groups: int) -> int:
        per_group = -(-inodes // groups)
        return -(-per_group // INODES_PER_BLOCK) * INODES_PER_BLOCK * groups - inodes

    groups = min(range(least, least + max(2, least // 4) + 1), key=lambda g: (spare(g), g))
    return groups * GROUP_BYTES


def _round(size: int) -> int:
    return -(-size // 2**20) * 2**20


def _checked(user: str) -> str:
    if not _NAME.match(user):
        raise StorageError(f"user name {user!r} cannot name a storage image")
    return user
