"""``GET api/v1/storage``: a user's own storage quota (``mmlsquota``), every user's for a plan
admin (``mmrepquota``); and the Prometheus families of the same figures."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily

from extension.userfs.files import off_loop
from extension.webapi import APIError, APIHandler

from .limits import LimitError
from .quotas import QuotaReport, StorageQuotas


class StorageHandler(APIHandler):
    async def get(self) -> None:
        caller = self.caller()
        quotas: StorageQuotas = self.service.storage
        user = self.get_argument("user", None)
        if user is not None and user != caller.name and not caller.admin:
            raise APIError(403, "only plan admins may see other users' storage quotas")
        if user is None and caller.admin:
            reports = await off_loop(quotas.reports)
        else:
            reports = [await off_loop(quotas.report, user or caller.name)]
        now = quotas.clock()  # after the reports: a grace started by them is not in the future
        self.reply(
            {
                "enforced": quotas.enforced,
                "reason": quotas.problem,
                "users": [r.to_dict(now) for r in reports],
                "units": {"storage": "bytes", "files": "inodes", "grace": "seconds"},
            }
        )


class PlanStorageHandler(APIHandler):
    """``GET storage/plans``: the plans with storage limits; ``PUT``/``DELETE
    storage/plans/<path>``: a plan admin sets or removes a plan's (its user leaves' limits)."""

    async def get(self, path: str = "") -> None:
        self.caller()
        self.reply({"plans": self.service.plan_limits.rows()})

    async def put(self, path: str = "") -> None:
        await self._change(path, self.body())

    async def delete(self, path: str = "") -> None:
        await self._change(path, None)

    async def _change(self, path: str, spec: Any) -> None:
        self.admin_caller()
        plans = self.sched.plans
        if not path or path not in plans:
            raise APIError(404, f"there is no plan {path!r}")
        if plans.get(path).user_leaf:
            raise APIError(400, f"{path} is a user leaf: set the limits on its plan")
        try:
            await self.service.plan_limits.put(path, spec)
        except LimitError as err:
            raise APIError(400, str(err)) from None
        self.reply({"plans": self.service.plan_limits.rows()})


def storage_routes(prefix: str) -> list[tuple]:
    return [
        (prefix + r"api/v1/storage/?", StorageHandler),
        (prefix + r"api/v1/storage/plans/?", PlanStorageHandler),
        (prefix + r"api/v1/storage/plans(/.+?)/?", PlanStorageHandler),
    ]


class StorageCollector:
    """``wmla_storage_*`` per user, from the last check (a scrape never touches a disk)."""

    def __init__(self, quotas: StorageQuotas) -> None:
        self.quotas = quotas

    def collect(self) -> Iterator[Any]:
        reports: list[QuotaReport] = list(self.quotas.latest.values())
        used = GaugeMetricFamily(
            "wmla_storage_used_bytes", "Bytes in each user's folder.", labels=["user"]
        )
        files = GaugeMetricFamily(
            "wmla_storage_used_files", "Files (inodes) in each user's folder.", labels=["user"]
        )
        soft = GaugeMetricFamily(
            "wmla_storage_soft_limit_bytes", "Each user's soft byte limit.", labels=["user"]
        )
        hard = GaugeMetricFamily(
            "wmla_storage_hard_limit_bytes", "Each user's hard byte limit.", labels=["user"]
        )
        held = GaugeMetricFamily(
            "wmla_storage_held_bytes",
            "The byte limit the kernel holds now (the soft one once the grace expired).",
            labels=["user"],
        )
        for r in reports:
            used.add_metric([r.user], r.used_bytes)
            files.add_metric([r.user], r.used_files)
            soft.add_metric([r.user], r.limits.bytes_soft)
            hard.add_metric([r.user], r.limits.bytes_hard)
            held.add_metric([r.user], r.held_bytes)
        yield from (used, files, soft, hard, held)
