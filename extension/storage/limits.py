"""Storage quota limits, GPFS style: bytes and files (inodes), each with a soft and a hard
limit, and the grace period a user may stay over the soft limit (``mmlsquota``'s columns).

Where they come from (docs/security.md, "Storage quotas"): ``c.WmlaService.storage_quotas``
names plans; a plan's limits apply to every user leaf under it (the nearest plan that sets
them wins), and a user with leaves under several plans gets the most generous of them, as one
folder serves all their plans. Everyone else gets ``c.WmlaService.default_storage_quota``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from extension.durations import parse_duration
from extension.scheduler.resources import QuantityError, parse_quantity

# mkfs.ext4's default bytes-per-inode: with no files limit given, a quota holds as many
# files as a fresh ext4 filesystem of that size would
BYTES_PER_INODE = 16384
MIN_BYTES = 16 * 2**20  # an ext4 filesystem smaller than this has no room for a journal
DEFAULT_GRACE = 7 * 86400.0  # GPFS's default grace period
KEYS = ("storage", "files", "soft_storage", "soft_files", "grace")


class LimitError(ValueError):
    """Storage limits that cannot be held; the message says what and how to fix it."""


@dataclass(frozen=True)
class StorageLimits:
    """One user folder's limits. A soft limit equal to the hard one means no soft limit."""

    bytes_hard: int
    files_hard: int
    bytes_soft: int
    files_soft: int
    grace: float = DEFAULT_GRACE

    def more_generous(self, other: StorageLimits) -> StorageLimits:
        return StorageLimits(
            max(self.bytes_hard, other.bytes_hard),
            max(self.files_hard, other.files_hard),
            max(self.bytes_soft, other.bytes_soft),
            max(self.files_soft, other.files_soft),
            max(self.grace, other.grace),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "storage": self.bytes_hard,
            "soft_storage": self.bytes_soft,
            "files": self.files_hard,
            "soft_files": self.files_soft,
            "grace": self.grace,
        }


def parse_bytes(value: Any, where: str) -> int:
    """``50Gi``, ``800Mi``, ``1G`` or a number of bytes (the memory quantities' form)."""
    try:
        amount = parse_quantity("memory", value, where=where)
    except QuantityError as err:
        raise LimitError(str(err).replace("memory", "storage")) from None
    return int(amount)


def parse_limits(spec: Mapping[str, Any] | str, where: str) -> StorageLimits:
    """``{"storage": "50Gi", "files": 100000, "soft_storage": "40Gi", "soft_files": 80000,
    "grace": "7d"}``; a bare string is the hard byte limit alone."""
    if isinstance(spec, str):
        spec = {"storage": spec}
    if not isinstance(spec, Mapping):
        raise LimitError(f"{where}: write limits as {{'storage': '50Gi', 'files': 100000}}")
    unknown = sorted(set(spec) - set(KEYS))
    if unknown:
        raise LimitError(f"{where}: unknown key(s) {', '.join(unknown)}; use {', '.join(KEYS)}")
    if "storage" not in spec:
        raise LimitError(f"{where}: 'storage' (the hard byte limit, e.g. '50Gi') is required")
    hard = parse_bytes(spec["storage"], f"{where} storage")
    if hard < MIN_BYTES:
        raise LimitError(f"{where}: storage {spec['storage']!r} is below the smallest quota, 16Mi")
    files = _count(spec.get("files", max(1024, hard // BYTES_PER_INODE)), f"{where} files")
    soft = parse_bytes(spec.get("soft_storage", hard), f"{where} soft_storage")
    soft_files = _count(spec.get("soft_files", files), f"{where} soft_files")
    if soft > hard or soft_files > files:
        raise LimitError(f"{where}: a soft limit above its hard limit; lower soft_* or raise it")
    try:
        grace = parse_duration(spec.get("grace", DEFAULT_GRACE), field=f"{where} grace")
    except ValueError as err:
        raise LimitError(str(err)) from None
    return StorageLimits(hard, files, soft, soft_files, grace)


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 64:
        raise LimitError(f"{where}: a whole number of files, at least 64, got {value!r}")
    return value


@dataclass(frozen=True)
class QuotaPolicy:
    """The configured limits: a default and, per plan path, what its user leaves get."""

    default: StorageLimits | None
    by_plan: Mapping[str, StorageLimits]

    @classmethod
    def from_config(cls, default: Any, by_plan: Mapping[str, Any]) -> QuotaPolicy:
        base = parse_limits(default, "c.WmlaService.default_storage_quota") if default else None
        plans = {}
        for path, spec in by_plan.items():
            if not isinstance(path, str) or not path.startswith("/"):
                raise LimitError(
                    f"c.WmlaService.storage_quotas: key {path!r} is not a plan path like /team"
                )
            plans[path.rstrip("/") or "/"] = parse_limits(
                spec, f"c.WmlaService.storage_quotas[{path!r}]"
            )
        return cls(base, plans)

    def with_plan(self, path: str, limits: StorageLimits | None) -> QuotaPolicy:
        """This policy with ``path``'s limits set (None: removed)."""
        plans = {k: v for k, v in self.by_plan.items() if k != path}
        if limits is not None:
            plans[path] = limits
        return QuotaPolicy(self.default, plans)

    @property
    def enabled(self) -> bool:
        return self.default is not None or bool(self.by_plan)

    def for_leaves(self, leaves: Iterable[str]) -> StorageLimits | None:
        """The limits of a user whose leaves are ``leaves`` (``/team/alice``, ...)."""
        found: StorageLimits | None = None
        for leaf in leaves:
            limits = self._nearest(leaf)
            if limits is not None:
                found = limits if found is None else found.more_generous(limits)
        return found or self.default

    def _nearest(self, leaf: str) -> StorageLimits | None:
        path = leaf.rsplit("/", 1)[0]  # the leaf's plan; the leaf itself names a user
        while path:
            if path in self.by_plan:
                return self.by_plan[path]
            path = path.rsplit("/", 1)[0]
        return self.by_plan.get("/")
