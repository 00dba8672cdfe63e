"""``GET api/v1/storage``: a user's own storage quota (``mmlsquota``), every user's for a plan
admin (``mmrepquota``); and the Prometheus families of the same figures."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily

from extension.userfs.files import off_loop
from extension.webapi import APIError, APIHandler

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


def storage_routes(prefix: str) -> list[tuple]:
    return [(prefix + r"api/v1/storage/?", StorageHandler)]


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
