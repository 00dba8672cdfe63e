"""The service's storage quotas: each user's limits from the plans, soft limits with their
grace period, and what ``wmla quota`` and ``GET api/v1/storage`` report.

The kernel holds the hard limits (images.py). The soft limit is GPFS's: a user may stay over it
for the grace period; then the soft limit is held as the hard one until they are back under it.
``check`` does that, from the service's loop every few seconds, and it is also what takes back
space a user frees while over a lowered limit.
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import os
import re
import shutil
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from extension.tables import size_text

from .images import Sidecar, StorageError, UserImages, mounted_at, tools_missing
from .limits import QuotaPolicy, StorageLimits

_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
WARN_AT = 0.9
NEAR_FULL = 4 * 2**20  # a failed job's folder this near its limit: the limit is named
# ext4 refuses the last megabyte or so (room for delayed allocations' metadata): "full" within
FULL_MARGIN = 5 * 2**18  # the spawn page and the widget warn from 90 % of a limit


class QuotaState(enum.Enum):
    UNDER = "under"
    NEAR = "near"  # at 90 % of a limit or more
    SOFT = "over soft limit, in grace"
    GRACE_EXPIRED = "over soft limit, grace expired"
    HARD = "at hard limit"


@dataclass(frozen=True)
class QuotaReport:
    """One user's storage as ``mmlsquota`` shows it, plus what the kernel holds now."""

    user: str
    folder: str
    used_bytes: int
    used_files: int
    limits: StorageLimits
    held_bytes: int  # the byte limit the kernel holds now: hard, or soft once grace expired
    held_files: int
    over_soft_since: float | None
    state: QuotaState
    enforced: bool = True
    reason: str = ""

    def grace_left(self, now: float) -> float | None:
        if self.over_soft_since is None:
            return None
        return max(0.0, self.over_soft_since + self.limits.grace - now)

    def to_dict(self, now: float) -> dict[str, Any]:
        return {
            "user": self.user,
            "folder": self.folder,
            "used_bytes": self.used_bytes,
            "used_files": self.used_files,
            **{k: v for k, v in self.limits.to_dict().items()},
            "held_bytes": self.held_bytes,
            "held_files": self.held_files,
            "over_soft_since": self.over_soft_since,
            "grace_left": self.grace_left(now),
            "state": self.state.value,
            "enforced": self.enforced,
            "reason": self.reason,
        }


class GraceBook:
    """When each user went over a soft limit: a private JSON file, so a restart keeps it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.since: dict[str, float] = {
                k: float(v) for k, v in json.loads(path.read_text()).items()
            }
        except (OSError, ValueError, AttributeError):
            self.since = {}

    def mark(self, user: str, over: bool, now: float) -> float | None:
        before = self.since.get(user)
        if over and before is None:
            self.since[user] = now
        elif not over and before is not None:
            del self.since[user]
        else:
            return before
        self._save()
        return self.since.get(user)

    def _save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(self.since, out)
        os.replace(tmp, self.path)


class StorageQuotas:
    """Quotas on every user folder: made on a user's first job or notebook (``attach``), held
    and reported. ``leaves_of(user)`` gives the user's plan leaves (the limits' source)."""

    def __init__(
        self,
        policy: QuotaPolicy,
        images: UserImages,
        leaves_of: Callable[[str], Iterable[str]],
        log: logging.Logger,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.policy = policy
        self.images = images
        self.leaves_of = leaves_of
        self.log = log
        self.clock = clock
        self.grace = GraceBook(images.quota_dir / "grace.json")
        self.machine_problem = _machine_problem()
        self.latest: dict[str, QuotaReport] = {}  # the last check's, for the metrics
        # a job's /tmp is bound over the machine's: a storage root under it would be hidden
        root = os.path.realpath(images.storage_root)
        self.private_tmp = not any(root.startswith(t + "/") for t in ("/tmp", "/var/tmp"))
        if not self.private_tmp:
            log.warning("the storage root %s is under /tmp: jobs keep the machine's /tmp", root)

    @property
    def problem(self) -> str:
        """Why quotas are not held here ("" when they are): nothing configured (an admin may
        set a plan's later), or what this machine lacks."""
        if not self.policy.enabled:
            return "no storage quota is configured (c.WmlaService.default_storage_quota)"
        return self.machine_problem

    @property
    def enforced(self) -> bool:
        return not self.problem

    def start(self) -> None:
        """Mount again every image a restart (of the service or the machine) left unmounted;
        users' folders are bound again on their next job or notebook."""
        if not self.enforced:
            return
        self.images.prepare_dirs()
        for user in self.images.users():
            side = self.images.image(user).with_suffix(".json")
            if not side.exists():
                continue
            try:
                self.attach(user, None)
            except (StorageError, OSError) as err:
                self.log.warning("storage of %s not mounted again: %s", user, err)

    def limits_for(self, user: str) -> StorageLimits | None:
        return self.policy.for_leaves(self.leaves_of(user))

    def attach(self, user: str, account: Any) -> None:
        """The user's folder on its own image with the user's limits; ``account``: the owner
        of a new image (an existing one keeps its owner). Raises StorageError."""
        limits = self.limits_for(user)
        if not self.enforced or limits is None:
            return
        if account is None:
            side = Sidecar.read(self.images.image(user).with_suffix(".json"))
            if side is None:
                return
            uid, gid = side.uid, side.gid
        else:
            uid, gid = account.uid, account.gid
        if self.images.bound(user):
            return
        self.images.ensure(user, uid, gid, limits)
        self.check_one(user)

    def check(self) -> list[QuotaReport]:
        """Every mounted user: soft limits and their grace, limits changed by an admin, space
        freed while over a limit taken back. Blocking: call it from a thread."""
        reports = []
        for user in self.images.users():
            try:
                reports.append(self.check_one(user))
            except (StorageError, OSError) as err:
                self.log.warning("storage of %s: %s", user, err)
        return reports

    def check_one(self, user: str) -> QuotaReport:
        limits = self.limits_for(user)
        folder = str(self.images.storage_root / user)
        if limits is None:
            return self._unenforced(user, folder, "no storage quota applies to this user")
        with self.images.lock(user):
            now = self.clock()
            used = self.images.measure(user)
            over = used.used_bytes > limits.bytes_soft or used.used_files > limits.files_soft
            since = self.grace.mark(user, over, now)
            expired = since is not None and now - since >= limits.grace
            held_bytes = limits.bytes_soft if expired else limits.bytes_hard
            held_files = limits.files_soft if expired else limits.files_hard
            cap_bytes, cap_files = self.images.capacity(user)
            held_bytes, held_files = min(held_bytes, cap_bytes), min(held_files, cap_files)
            used = self.images.hold(user, held_bytes, held_files)
        state = _state(used.used_bytes, used.used_files, limits, since, expired, held_bytes)
        report = QuotaReport(user, folder, used.used_bytes, used.used_files, limits, held_bytes,
                             held_files, since, state)  # fmt: skip
        self.latest[user] = report
        return report

    def report(self, user: str) -> QuotaReport:
        folder = str(self.images.storage_root / user)
        if not self.enforced:
            return self._unenforced(user, folder, self.problem)
        if not mounted_at(self.images.mount_point(user)):
            limits = self.limits_for(user)
            why = "no folder yet: it is made with the user's first job or notebook"
            if limits is None:
                why = "no storage quota applies to this user"
            return self._unenforced(user, folder, why, limits)
        try:
            return self.check_one(user)
        except (StorageError, OSError) as err:
            return self._unenforced(user, folder, str(err))

    def reports(self) -> list[QuotaReport]:
        return [self.report(user) for user in self.images.users()]

    def reason(self, user: str) -> str | None:
        """Why a job of ``user`` that failed may have failed of storage: its folder is at a
        limit the kernel holds."""
        if not self.enforced or not mounted_at(self.images.mount_point(user)):
            return None
        try:
            rep = self.check_one(user)
        except (StorageError, OSError):
            return None
        # ext4 refuses a write a little before the last block (room for the metadata of
        # delayed allocations): "at the limit" is within NEAR_FULL of it
        if rep.used_bytes >= rep.held_bytes - max(NEAR_FULL, rep.held_bytes // 200):
            quota = size_text(rep.held_bytes)
            return (
                f"wrote more than its {quota} storage quota in {rep.folder}; "
                "free space or ask for more"
            )
        if rep.used_files >= rep.held_files:
            return (f"made more than its {rep.held_files} files allowed in {rep.folder}; "
                    "delete some or ask for more")  # fmt: skip
        return None

    def job_tmp(self, user: str, job_id: str) -> str | None:
        """A private /tmp for ``job_id``: a folder of the user's inside their image (root's
        ``tmp/``), or None where their folder has no quota (the job gets the machine's)."""
        if not (self.enforced and self.private_tmp) or not _JOB_ID.match(job_id):
            return None
        side = Sidecar.read(self.images.image(user).with_suffix(".json"))
        if side is None or not mounted_at(self.images.mount_point(user)):
            return None
        folder = self.images.tmp_dir(user) / job_id
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o700)
        info = os.lstat(folder)  # root's tmp/ has only what root made in it
        if not stat.S_ISDIR(info.st_mode):
            raise StorageError(f"{folder} is not a folder")
        os.chown(folder, side.uid, side.gid, follow_symlinks=False)
        return str(folder)

    def drop_job_tmp(self, user: str, job_id: str) -> None:
        """The job's /tmp, gone with it (by descriptors: a link in it is removed, not followed)."""
        if not self.enforced or not _JOB_ID.match(job_id):
            return
        folder = self.images.tmp_dir(user) / job_id
        if os.path.lexists(folder):
            shutil.rmtree(folder, ignore_errors=True)

    def _unenforced(
        self, user: str, folder: str, why: str, limits: StorageLimits | None = None
    ) -> QuotaReport:
        limits = limits or StorageLimits(0, 0, 0, 0, 0.0)
        return QuotaReport(user, folder, 0, 0, limits, 0, 0, None, QuotaState.UNDER, False, why)


def _machine_problem() -> str:
    """Why this machine cannot hold quotas ("" when it can)."""
    if os.geteuid() != 0:
        return "the service does not run as root: it cannot mount the users' images"
    missing = tools_missing()
    if missing:
        return f"{', '.join(missing)} missing (Debian packages e2fsprogs, util-linux, mount)"
    if not os.path.exists("/dev/loop-control"):
        return "no loop devices here (/dev/loop-control is missing)"
    return ""


def _state(
    used: int, files: int, limits: StorageLimits, since: float | None, expired: bool, held: int
) -> QuotaState:
    if expired:
        return QuotaState.GRACE_EXPIRED
    if used >= held - max(FULL_MARGIN, held // 1000) or files >= limits.files_hard:
        return QuotaState.HARD
    if since is not None:
        return QuotaState.SOFT
    if used >= WARN_AT * limits.bytes_soft or files >= WARN_AT * limits.files_soft:
        return QuotaState.NEAR
    return QuotaState.UNDER
