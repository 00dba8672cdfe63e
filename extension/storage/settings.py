"""The storage quotas' settings (``c.WmlaService.default_storage_quota`` and its kin) and how the
service starts, wires and checks its ``StorageQuotas``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from traitlets import Dict, Float, Unicode, Union, default
from traitlets.config import Configurable

from extension.userfs.files import off_loop

from .images import UserImages
from .limits import LimitError, QuotaPolicy
from .plan_limits import META_KEY as PLAN_LIMITS_KEY
from .plan_limits import PlanLimits
from .quotas import StorageQuotas


class StorageSettings(Configurable):
    """Traits only, a base of ``WmlaService``: traitlets reads a class's config under each name
    of its bases, so these are set as ``c.WmlaService.default_storage_quota`` (and so on)."""

    default_storage_quota = Union(
        [Unicode(), Dict()],
        config=True,
        help="""Each user folder's storage quota, held by the kernel (docs/security.md,
        "Storage quotas"): a hard byte limit ("50Gi"), or {"storage": "50Gi", "files": 100000,
        "soft_storage": "40Gi", "soft_files": 80000, "grace": "7d"}. Empty: no quota, except
        where storage_quotas names the user's plans. Needs the service to run as root.
        $WMLA_STORAGE_QUOTA sets it.

        c.WmlaService.default_storage_quota = "50Gi"
        """,
    )

    @default("default_storage_quota")
    def _default_storage_quota(self) -> str:
        return os.environ.get("WMLA_STORAGE_QUOTA", "")

    storage_quotas = Dict(
        config=True,
        help="""Storage quotas by plan: the limits (as default_storage_quota's) of every user
        leaf under each plan; a user with leaves under several plans gets the most generous.

        c.WmlaService.storage_quotas = {"/research": {"storage": "200Gi", "files": 1000000}}
        """,
    )
    storage_quota_dir = Unicode(
        config=True,
        help="""Where the users' storage images live and are mounted (root's alone); empty:
        <state_dir>/storage. On a filesystem other than the store's, if the images are not to
        share its space. $WMLA_STORAGE_QUOTA_DIR sets it.

        c.WmlaService.storage_quota_dir = "/var/lib/wmla-storage"
        """,
    )

    @default("storage_quota_dir")
    def _storage_quota_dir(self) -> str:
        return os.environ.get("WMLA_STORAGE_QUOTA_DIR", "")

    storage_check_seconds = Float(
        10.0,
        config=True,
        help="""Seconds between checks of the storage quotas' soft limits and grace periods
        (also when space freed while over a limit is taken back).

        c.WmlaService.storage_check_seconds = 10
        """,
    )

    def quota_policy(self) -> QuotaPolicy:
        """The configured limits, or SystemExit saying which value is wrong."""
        try:
            return QuotaPolicy.from_config(self.default_storage_quota, self.storage_quotas)
        except LimitError as err:
            raise SystemExit(f"wmla: {err}") from None

    def quota_dir(self, state_dir: str) -> Path:
        return Path(self.storage_quota_dir or Path(state_dir) / "storage")


def build_quotas(
    policy: QuotaPolicy,
    quota_dir: Path,
    storage_root: str,
    plans: Callable[[], Iterable[Any]],
    log: logging.Logger,
) -> StorageQuotas:
    """The users' storage quotas over the plans' user leaves (``plans()``: the tree now)."""
    images = UserImages(quota_dir, storage_root)
    return StorageQuotas(
        policy,
        images,
        lambda user: [p.path for p in plans() if p.user_leaf and p.name == user],
        log,
    )


async def load_plan_limits(storage: StorageQuotas, db: Any, store: Any) -> PlanLimits:
    """The admins' plan limits as stored (``db``: the service's StoreCalls over ``store``)."""
    limits = PlanLimits(storage, lambda text: db.write(store.set_meta, PLAN_LIMITS_KEY, text))
    limits.load(await db.read(store.get_meta, PLAN_LIMITS_KEY))
    return limits


def wire_local_accounts(storage: StorageQuotas, accounts: Any) -> None:
    """The local backend's accounts learn from the quotas why a job failed of its folder's
    limit, and where its private /tmp is (``UserAccounts``' hooks)."""
    accounts.storage_reason = storage.reason
    accounts.job_tmp = storage.job_tmp
    accounts.drop_job_tmp = storage.drop_job_tmp


def storage_security(storage: StorageQuotas | None, report: dict[str, Any]) -> dict[str, Any]:
    """``report`` (privacy.security_report's) with ``enforced.storage`` and its warning."""
    if storage is None:
        return report
    held = {"enforced": storage.enforced, "how": "an ext4 image per user folder"}
    if not storage.enforced:
        held["how"] = storage.problem
        if storage.policy.enabled:
            report["warnings"].append(f"storage quotas are not held: {storage.problem}")
    report["enforced"]["storage"] = held
    return report


async def check_forever(
    storage: StorageQuotas, stop: asyncio.Event, every: float, log: logging.Logger
) -> None:
    """Soft limits, grace periods and changed limits, every ``every`` seconds until ``stop``
    (nothing to do while quotas are not held: an admin may set a plan's later)."""
    while not stop.is_set():
        try:
            if storage.enforced:
                await off_loop(storage.check)
        except Exception:  # a check must not end the checks
            log.exception("storage quota check failed")
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), every)
