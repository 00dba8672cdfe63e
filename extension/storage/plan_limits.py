"""Storage limits that plan admins set on plans (``PUT api/v1/storage/plans/<path>``), kept
in the store's meta table as JSON and laid over the configured ``c.WmlaService.storage_quotas``
(an admin's setting wins for its plan)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from .limits import LimitError, QuotaPolicy, parse_limits
from .quotas import StorageQuotas

META_KEY = "storage_quotas"


class PlanLimits:
    """The admins' plan limits over ``quotas``' policy; ``save(text)`` stores them."""

    def __init__(self, quotas: StorageQuotas, save: Callable[[str], Awaitable[None]]) -> None:
        self.quotas = quotas
        self.save = save
        self.configured = quotas.policy
        self.set: dict[str, dict[str, Any]] = {}

    def load(self, saved: str | None) -> None:
        """What was stored (a value that no longer parses is left out, not fatal)."""
        try:
            loaded = json.loads(saved) if saved else {}
        except ValueError:
            loaded = {}
        policy = self.configured
        for path, spec in loaded.items() if isinstance(loaded, dict) else []:
            try:
                policy = policy.with_plan(path, parse_limits(spec, f"plan {path}"))
            except LimitError:
                continue
            self.set[path] = spec
        self.quotas.policy = policy

    async def put(self, path: str, spec: Mapping[str, Any] | None) -> QuotaPolicy:
        """Set (``spec``) or remove (None) ``path``'s limits; LimitError when ``spec`` is
        wrong, and then nothing changes."""
        limits = parse_limits(spec, f"storage of {path}") if spec is not None else None
        policy = self.quotas.policy.with_plan(path, limits)
        if limits is None and path in self.configured.by_plan:  # back to the configured one
            policy = policy.with_plan(path, self.configured.by_plan[path])
        wanted = {k: v for k, v in self.set.items() if k != path}
        if spec is not None:
            wanted[path] = dict(spec)
        await self.save(json.dumps(wanted, sort_keys=True))  # stored first: a failure loses
        self.set = wanted  # nothing and changes nothing
        self.quotas.policy = policy
        return policy

    def rows(self) -> list[dict[str, Any]]:
        """Every plan with limits, where they come from, for the API and the admin page."""
        rows = []
        for path, limits in sorted(self.quotas.policy.by_plan.items()):
            source = "admin" if path in self.set else "configuration"
            rows.append({"plan": path, "source": source, **limits.to_dict()})
        return rows
