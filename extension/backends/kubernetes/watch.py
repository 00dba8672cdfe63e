"""The watches: one list+watch loop per kind fills the cache from the API server.

A watch that breaks (API server briefly unreachable, ``410 Gone``) backs off and lists again,
so the cache converges to the server's state and nothing seen while away is lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from .. import manifests as m
from .api import (
    CLUSTER_SCOPED,
    LIMIT_RANGES,
    NODES,
    PODS,
    QUEUES,
    QUOTAS,
    ApiError,
    WatchEvent,
)
from .calls import ApiCalls
from .errors import BackendError
from .objects import meta_of
from .state import Cache
from .tasks import Background, finish

log = logging.getLogger("extension.backends.kubernetes")


@dataclass(frozen=True)
class Watched:
    """One kind the backend lists and watches; ``selector`` narrows it to our objects."""

    kind: str
    selector: str | None


class Watcher:
    """Opens the connection, runs the list+watch loops, and closes both (with the background
    tasks, which need the connection). ``on_change`` runs after every change the loops bring
    into the cache."""

    def __init__(
        self,
        calls: ApiCalls,
        cache: Cache,
        background: Background,
        on_change: Callable[[], None],
        *,
        namespace: str,
        instance_name: str,
        job_kind: str,
    ) -> None:
        self.calls = calls
        self.cache = cache
        self.background = background
        self.on_change = on_change
        self.namespace = namespace
        selector = f"{m.LABEL_MANAGED_BY}={m.MANAGED_BY},{m.LABEL_INSTANCE}={instance_name}"
        self.watched = [
            Watched(NODES, None),
            Watched(QUOTAS, None),
            Watched(LIMIT_RANGES, None),
            Watched(PODS, selector),
            Watched(job_kind, selector),
            Watched(QUEUES, selector),
        ]
        self.closed = False
        self._tasks: list[asyncio.Task] = []
        self._listed: dict[str, asyncio.Event] = {}
        self._opening: asyncio.Lock | None = None

    def has_listed(self, kind: str) -> bool:
        return kind in self._listed and self._listed[kind].is_set()

    async def open(self, timeout: float | None = None) -> None:
        """Start the list+watch loops and wait until every kind has been listed once.

        With ``timeout``, a BackendError says which kinds could not be listed in time (the
        loops keep trying); without it, this waits for the API server as long as it takes.
        """
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if not self.calls.connected:
                await self.calls.connect()
                self.closed = False
                for watched in self.watched:
                    self._listed[watched.kind] = asyncio.Event()
                    self._tasks.append(asyncio.ensure_future(self._loop(watched)))
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
        self.closed = True
        tasks = self._tasks + self.background.cancel()
        for task in self._tasks:
            task.cancel()
        await finish(tasks)
        self._tasks.clear()
        await self.calls.disconnect()

    async def _loop(self, watched: Watched) -> None:
        kind = watched.kind
        delay = self.calls.backoff.initial
        must_list = True
        while not self.closed:
            try:
                if must_list:
                    await self._list(watched)
                    must_list = False
                    delay = self.calls.backoff.initial
                must_list = await self._watch(watched)
            except asyncio.CancelledError:
                raise
            except ApiError as exc:
                must_list = True
                if exc.status == 410:
                    continue
                self.calls.failed()
                log.warning("watch of %s failed (%s); retrying in %.1fs", kind, exc, delay)
            except (OSError, asyncio.TimeoutError) as exc:
                must_list = True
                self.calls.failed()
                log.warning(
                    "watch of %s lost the API server (%s); retrying in %.1fs", kind, exc, delay
                )
            except Exception:  # a malformed answer must not stop the cache for good
                must_list = True
                self.calls.failed()
                log.exception("watch of %s broke; listing again in %.1fs", kind, delay)
            else:
                continue
            await self.calls.backoff.sleep(delay)
            delay = self.calls.backoff.next(delay)

    def _namespace(self, kind: str) -> str | None:
        return None if kind in CLUSTER_SCOPED else self.namespace

    async def _list(self, watched: Watched) -> None:
        kind = watched.kind
        items, version = await self.calls.api.list(kind, self._namespace(kind), watched.selector)
        self.cache.replace(kind, items, version)
        self._listed[kind].set()
        self.on_change()

    async def _watch(self, watched: Watched) -> bool:
        """Follow one watch until it ends; True when it must be listed again."""
        kind = watched.kind
        version = self.cache.resource_version.get(kind, "")
        stream = self.calls.api.watch(kind, self._namespace(kind), watched.selector, version)
        async for event, obj in stream:
            if event == WatchEvent.ERROR:
                # An expired resourceVersion (410) or any other watch error: list again.
                return True
            if event == WatchEvent.BOOKMARK:
                self.cache.resource_version[kind] = meta_of(obj).get("resourceVersion", version)
                continue
            self.cache.apply(kind, event, obj)
            self.on_change()
        return False
