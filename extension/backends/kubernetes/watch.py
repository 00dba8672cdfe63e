"""Connecting to the API server: one list+watch loop per kind fills the cache, and every call
the decisions make is retried with exponential backoff while the server is unreachable.

A watch that breaks (API server briefly unreachable, ``410 Gone``) backs off and lists again,
so the cache converges to the server's state and nothing seen while away is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from .. import manifests as m
from .api import (
    _RETRIABLE,
    CLUSTER_SCOPED,
    LIMIT_RANGES,
    NODES,
    PODS,
    QUEUES,
    QUOTAS,
    ApiError,
    ApiFactory,
    KubeApi,
)
from .errors import BackendError
from .objects import _meta
from .state import Cache

log = logging.getLogger("extension.backends.kubernetes")


class _Watching:
    """Opening and closing the connection, the watch loops, and retried calls.

    A part of ``KubernetesBackend``: ``backend.py`` sets the attributes declared here.
    ``_changed`` (events.py) runs after every change the loops bring into the cache.
    """

    namespace: str
    instance_name: str
    job_kind: str
    api_factory: ApiFactory
    backoff_initial: float
    backoff_max: float
    retry_deadline: float
    cache: Cache
    api_failures: int
    _sleep: Callable[[float], Awaitable[None]]
    _api: KubeApi | None
    _tasks: list[asyncio.Task]
    _listed: dict[str, asyncio.Event]
    _background: set[asyncio.Task]
    _closed: bool
    _opening: asyncio.Lock | None
    _changed: Callable[[], None]

    @property
    def _selector(self) -> str:
        return f"{m.LABEL_MANAGED_BY}={m.MANAGED_BY},{m.LABEL_INSTANCE}={self.instance_name}"

    def _watched(self) -> list[tuple[str, str | None]]:
        return [
            (NODES, None),
            (QUOTAS, None),
            (LIMIT_RANGES, None),
            (PODS, self._selector),
            (self.job_kind, self._selector),
            (QUEUES, self._selector),
        ]

    async def open(self, timeout: float | None = None) -> None:
        """Start the list+watch loops and wait until every kind has been listed once.

        With ``timeout``, a BackendError says which kinds could not be listed in time (the
        loops keep trying); without it, this waits for the API server as long as it takes.
        """
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._api is None:
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
                self._closed = False
                for kind, selector in self._watched():
                    self._listed[kind] = asyncio.Event()
                    task = asyncio.ensure_future(self._watch_loop(kind, selector))
                    self._tasks.append(task)
        waiting = asyncio.gather(*(e.wait() for e in self._listed.values()))
        try:
            await asyncio.wait_for(waiting, timeout)
        except asyncio.TimeoutError:
            missing = sorted(k for k, e in self._listed.items() if not e.is_set())
            raise BackendError(
                f"the Kubernetes API server did not list {', '.join(missing)} within "
                f"{timeout:g}s; check the API server, the RBAC rules and the CRDs "
                "(Volcano, the training operator)"
            ) from None

    async def close(self) -> None:
        """Stop watching; running jobs are left running (they outlive the service)."""
        self._closed = True
        for task in self._tasks + list(self._background):
            task.cancel()
        for task in self._tasks + list(self._background):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        if self._api is not None:
            await self._api.close()
            self._api = None

    @property
    def api(self) -> KubeApi:
        if self._api is None:
            raise BackendError("the Kubernetes backend is not open; await backend.open() first")
        return self._api

    async def _watch_loop(self, kind: str, selector: str | None) -> None:
        namespace = None if kind in CLUSTER_SCOPED else self.namespace
        delay = self.backoff_initial
        must_list = True
        while not self._closed:
            try:
                if must_list:
                    items, version = await self.api.list(kind, namespace, selector)
                    self.cache.replace(kind, items, version)
                    self._listed[kind].set()
                    self._changed()
                    must_list = False
                    delay = self.backoff_initial
                version = self.cache.resource_version.get(kind, "")
                async for event, obj in self.api.watch(kind, namespace, selector, version):
                    if event == "ERROR":
                        # An expired resourceVersion (410) or any other watch error: list again.
                        must_list = True
                        break
                    if event == "BOOKMARK":
                        self.cache.resource_version[kind] = _meta(obj).get(
                            "resourceVersion", version
                        )
                        continue
                    self.cache.apply(kind, event, obj)
                    self._changed()
                    delay = self.backoff_initial
            except asyncio.CancelledError:
                raise
            except ApiError as exc:
                must_list = True
                if exc.status == 410:
                    continue
                self.api_failures += 1
                log.warning("watch of %s failed (%s); retrying in %.1fs", kind, exc, delay)
                await self._sleep(delay)
                delay = min(self.backoff_max, delay * 2)
            except (OSError, asyncio.TimeoutError) as exc:
                must_list = True
                self.api_failures += 1
                log.warning(
                    "watch of %s lost the API server (%s); retrying in %.1fs", kind, exc, delay
                )
                await self._sleep(delay)
                delay = min(self.backoff_max, delay * 2)
            except Exception:  # a malformed answer must not stop the cache for good
                must_list = True
                self.api_failures += 1
                log.exception("watch of %s broke; listing again in %.1fs", kind, delay)
                await self._sleep(delay)
                delay = min(self.backoff_max, delay * 2)

    async def _call(self, what: str, call: Callable[[], Awaitable[Any]]) -> Any:
        """One API call, retried with exponential backoff while the server is unreachable or
        overloaded, up to ``retry_deadline`` seconds; other errors go to the caller."""
        delay = self.backoff_initial
        waited = 0.0
        while True:
            try:
                return await call()
            except ApiError as exc:
                if exc.status not in _RETRIABLE:
                    raise
                error: Exception = exc
            except (OSError, asyncio.TimeoutError) as exc:
                error = exc
            self.api_failures += 1
            if waited >= self.retry_deadline:
                raise BackendError(
                    f"{what}: the Kubernetes API server did not answer for {waited:.0f}s "
                    f"({error}); nothing more was changed"
                ) from error
            log.warning("%s failed (%s); retrying in %.1fs", what, error, delay)
            await self._sleep(delay)
            waited += delay
            delay = min(self.backoff_max, delay * 2)
