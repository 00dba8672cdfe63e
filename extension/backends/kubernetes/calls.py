"""The connection to the API server and every call the decisions make through it, retried with
exponential backoff while the server is unreachable or overloaded."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from .api import RETRIABLE, ApiError, ApiFactory, KubeApi
from .errors import BackendError

log = logging.getLogger("extension.backends.kubernetes")


@dataclass(frozen=True)
class Backoff:
    """How long to wait between tries (doubling from ``initial`` up to ``most``) and for how
    long in all (``deadline`` seconds of waiting) before a call gives up."""

    initial: float
    most: float
    deadline: float
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    def next(self, delay: float) -> float:
        return min(self.most, delay * 2)


class ApiCalls:
    """The API a connection gives (``api``) and calls through it retried (``call``).

    ``failures`` counts the calls and watches that met an unreachable or failing server."""

    def __init__(self, api_factory: ApiFactory, backoff: Backoff) -> None:
        self.api_factory = api_factory
        self.backoff = backoff
        self.failures = 0
        self._api: KubeApi | None = None

    @property
    def connected(self) -> bool:
        return self._api is not None

    @property
    def api(self) -> KubeApi:
        if self._api is None:
            raise BackendError("the Kubernetes backend is not open; await backend.open() first")
        return self._api

    async def connect(self) -> None:
        """Make the API client (in-cluster configuration or the kubeconfig, by default)."""
        try:
            api = self.api_factory()
            if asyncio.iscoroutine(api):
                api = await api
        except Exception as exc:
            raise BackendError(
                f"cannot reach Kubernetes: {exc}; run the service in a pod with a "
                "service account (see hub_config/k8s/rbac.yaml) or set KUBECONFIG"
            ) from exc
        self._api = api  # type: ignore[assignment]

    async def disconnect(self) -> None:
        if self._api is not None:
            await self._api.close()
            self._api = None

    def failed(self) -> None:
        """One more call or watch met an unreachable or failing server."""
        self.failures += 1

    async def call(self, what: str, call: Callable[[], Awaitable[Any]]) -> Any:
        """One API call, retried with exponential backoff while the server is unreachable or
        overloaded, up to ``backoff.deadline`` seconds; other errors go to the caller."""
        delay = self.backoff.initial
        waited = 0.0
        while True:
            try:
                return await call()
            except ApiError as exc:
                # A server that this very call saw down answers 401/403 for a moment once it is
                # back, before its authorizer has read the RBAC rules: retried, not final.
                warming_up = waited > 0 and exc.status in (401, 403)
                if exc.status not in RETRIABLE and not warming_up:
                    raise
                error: Exception = exc
            except (OSError, asyncio.TimeoutError) as exc:
                error = exc
            self.failed()
            if waited >= self.backoff.deadline:
                raise BackendError(
                    f"{what}: the Kubernetes API server did not answer for {waited:.0f}s "
                    f"({error}); nothing more was changed"
                ) from error
            log.warning("%s failed (%s); retrying in %.1fs", what, error, delay)
            await self.backoff.sleep(delay)
            waited += delay
            delay = self.backoff.next(delay)
