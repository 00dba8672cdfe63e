"""The narrow slice of the Kubernetes API the backend uses, and the real one through
kubernetes_asyncio. Objects are plain JSON dicts both ways; an answer that is an error (or no
answer at all) is an ``ApiError``. Tests inject an in-memory fake of ``KubeApi``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from .. import manifests as m

# The kinds the backend lists and watches, and where they live.
NODES = "nodes"
PODS = "pods"
QUOTAS = "resourcequotas"
LIMIT_RANGES = "limitranges"
PYTORCHJOBS = "pytorchjobs"
VOLCANO_JOBS = "volcanojobs"
QUEUES = "queues"
CLUSTER_SCOPED = (NODES, QUEUES)


@dataclass(frozen=True)
class JobKind:
    """A kind of object a job can become, and what differs between the kinds."""

    resource: str  # what the API calls, the watches and the cache name it
    option: str  # the ``job_kind`` option's word for it
    counted: str  # a ResourceQuota counts these objects as ``count/<counted>``
    controller: str  # what makes its pods
    resizable: bool  # an elastic one grows and shrinks in place (its Worker replicas)


PYTORCHJOB = JobKind(
    PYTORCHJOBS, "pytorchjob", "pytorchjobs.kubeflow.org", "training operator", True
)
VOLCANO_JOB = JobKind(
    VOLCANO_JOBS, "volcanojob", "jobs.batch.volcano.sh", "Volcano controller", False
)
JOB_KINDS = (PYTORCHJOB, VOLCANO_JOB)

# Answers worth retrying: none at all (0), a timeout, throttling, a server that is unwell.
RETRIABLE = (0, 408, 429, 500, 502, 503, 504)


class WatchEvent(str, Enum):
    """The type of a watch event (a str: ``WatchEvent.ADDED == "ADDED"``)."""

    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"
    BOOKMARK = "BOOKMARK"  # only moves the resourceVersion on
    ERROR = "ERROR"  # e.g. an expired resourceVersion: list again


class ApiError(Exception):
    """An answer from the API server (``status``) or none at all (``status == 0``)."""

    def __init__(self, status: int, reason: str = "", message: str = "") -> None:
        super().__init__(f"{status} {reason}: {message}".strip())
        self.status = status
        self.reason = reason
        self.message = message


class KubeApi(Protocol):
    """The narrow slice of the Kubernetes API the backend uses; objects are plain dicts.

    ``KubernetesAsyncioApi`` is the real one; tests inject an in-memory fake.
    """

    async def list(
        self, kind: str, namespace: str | None, label_selector: str | None
    ) -> tuple[list[dict], str]: ...

    def watch(
        self, kind: str, namespace: str | None, label_selector: str | None, resource_version: str
    ) -> AsyncIterator[tuple[str, dict]]: ...

    async def get(self, kind: str, namespace: str | None, name: str) -> dict: ...

    async def create(self, kind: str, namespace: str | None, body: dict) -> dict: ...

    async def replace(self, kind: str, namespace: str | None, name: str, body: dict) -> dict: ...

    async def patch(self, kind: str, namespace: str | None, name: str, body: dict) -> dict: ...

    async def delete(
        self,
        kind: str,
        namespace: str | None,
        name: str,
        grace_seconds: int | None = None,
        propagation: str | None = None,
    ) -> None: ...

    async def read_log(
        self, namespace: str, pod: str, container: str | None, tail: int | None
    ) -> str: ...

    async def close(self) -> None: ...


ApiFactory = Callable[[], "KubeApi | Awaitable[KubeApi]"]


# -- the real API, through kubernetes_asyncio -----------------------------------------------------
class KubernetesAsyncioApi:
    """``KubeApi`` over kubernetes_asyncio; raw JSON dicts in and out."""

    _CUSTOM = {
        PYTORCHJOBS: m.PYTORCHJOB_API,
        VOLCANO_JOBS: m.VOLCANO_JOB_API,
        QUEUES: m.QUEUE_API,
    }

    def __init__(self, api_client: Any) -> None:
        from kubernetes_asyncio import client

        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)

    def _list_call(self, kind: str, namespace: str | None) -> tuple[Callable, tuple]:
        if kind == NODES:
            return self.core.list_node, ()
        if kind == PODS:
            return self.core.list_namespaced_pod, (namespace,)
        if kind == QUOTAS:
            return self.core.list_namespaced_resource_quota, (namespace,)
        if kind == LIMIT_RANGES:
            return self.core.list_namespaced_limit_range, (namespace,)
        group, version, plural, _ = self._CUSTOM[kind]
        if kind in CLUSTER_SCOPED:
            return self.custom.list_cluster_custom_object, (group, version, plural)
        return self.custom.list_namespaced_custom_object, (group, version, namespace, plural)

    async def _wrap(self, coro: Awaitable[Any]) -> Any:
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            return await coro
        except ApiException as exc:
            raise ApiError(exc.status or 0, exc.reason or "", str(exc.body or "")) from exc
        except asyncio.TimeoutError as exc:
            raise ApiError(0, "Timeout", str(exc)) from exc
        except OSError as exc:
            raise ApiError(0, "Unreachable", str(exc)) from exc
        except Exception as exc:  # aiohttp.ClientError and kin: the server did not answer
            if type(exc).__module__.startswith("aiohttp"):
                raise ApiError(0, "Unreachable", str(exc)) from exc
            raise

    async def list(
        self, kind: str, namespace: str | None, label_selector: str | None
    ) -> tuple[list[dict], str]:
        func, args = self._list_call(kind, namespace)
        kwargs = {"_preload_content": False}
        if label_selector:
            kwargs["label_selector"] = label_selector
        response = await self._wrap(func(*args, **kwargs))
        # Unpreloaded, the client hands back every answer, errors too: an API server that is
        # starting answers 429/503 with a Status, which must never read as an empty list (every
        # job would look deleted).
        body = await self._wrap(response.read())
        if not 200 <= response.status <= 299:
            raise ApiError(response.status, response.reason or "", body.decode(errors="replace"))
        data = json.loads(body)
        if (
            not isinstance(data, dict)
            or not isinstance(data.get("items", []), list)
            or ("metadata" not in data)
        ):
            raise ApiError(0, "Malformed", f"the list of {kind} is not a list: {body[:200]!r}")
        return data.get("items") or [], (data.get("metadata") or {}).get("resourceVersion", "")

    async def watch(
        self, kind: str, namespace: str | None, label_selector: str | None, resource_version: str
    ) -> AsyncIterator[tuple[str, dict]]:
        from kubernetes_asyncio import watch

        func, args = self._list_call(kind, namespace)
        kwargs: dict[str, Any] = {"timeout_seconds": 300, "allow_watch_bookmarks": True}
        if label_selector:
            kwargs["label_selector"] = label_selector
        if resource_version:
            kwargs["resource_version"] = resource_version
        stream = watch.Watch().stream(func, *args, **kwargs)
        iterator = stream.__aiter__()
        while True:
            try:
                event = await self._wrap(iterator.__anext__())
            except StopAsyncIteration:
                return
            yield event["type"], event.get("raw_object") or {}

    def _custom_args(self, kind: str, namespace: str | None) -> tuple:
        group, version, plural, _ = self._CUSTOM[kind]
        if kind in CLUSTER_SCOPED:
            return (group, version, plural)
        return (group, version, namespace, plural)

    async def get(self, kind: str, namespace: str | None, name: str) -> dict:
        if kind in self._CUSTOM:
            fn = (
                self.custom.get_cluster_custom_object
                if kind in CLUSTER_SCOPED
                else self.custom.get_namespaced_custom_object
            )
            return await self._wrap(fn(*self._custom_args(kind, namespace), name))
        raise ValueError(f"get of {kind} is not used")

    async def create(self, kind: str, namespace: str | None, body: dict) -> dict:
        fn = (
            self.custom.create_cluster_custom_object
            if kind in CLUSTER_SCOPED
            else self.custom.create_namespaced_custom_object
        )
        return await self._wrap(fn(*self._custom_args(kind, namespace), body))

    async def replace(self, kind: str, namespace: str | None, name: str, body: dict) -> dict:
        fn = (
            self.custom.replace_cluster_custom_object
            if kind in CLUSTER_SCOPED
            else self.custom.replace_namespaced_custom_object
        )
        return await self._wrap(fn(*self._custom_args(kind, namespace), name, body))

    async def patch(self, kind: str, namespace: str | None, name: str, body: dict) -> dict:
        fn = (
            self.custom.patch_cluster_custom_object
            if kind in CLUSTER_SCOPED
            else self.custom.patch_namespaced_custom_object
        )
        # A dict body would otherwise go out as application/json-patch+json (the client's
        # first choice), which the API server refuses: this is a JSON merge patch.
        return await self._wrap(
            fn(
                *self._custom_args(kind, namespace),
                name,
                body,
                _content_type="application/merge-patch+json",
            )
        )

    async def delete(
        self,
        kind: str,
        namespace: str | None,
        name: str,
        grace_seconds: int | None = None,
        propagation: str | None = None,
    ) -> None:
        kwargs: dict[str, Any] = {}
        if grace_seconds is not None:
            kwargs["grace_period_seconds"] = grace_seconds
        if propagation:
            kwargs["propagation_policy"] = propagation
        if kind == PODS:
            await self._wrap(self.core.delete_namespaced_pod(name, namespace, **kwargs))
            return
        fn = (
            self.custom.delete_cluster_custom_object
            if kind in CLUSTER_SCOPED
            else self.custom.delete_namespaced_custom_object
        )
        await self._wrap(fn(*self._custom_args(kind, namespace), name, **kwargs))

    async def read_log(
        self, namespace: str, pod: str, container: str | None, tail: int | None
    ) -> str:
        kwargs: dict[str, Any] = {}
        if container:
            kwargs["container"] = container
        if tail:
            kwargs["tail_lines"] = tail
        return await self._wrap(self.core.read_namespaced_pod_log(pod, namespace, **kwargs))

    async def close(self) -> None:
        await self.api_client.close()


async def default_api_factory() -> KubeApi:
    """In-cluster configuration when running in a pod, else the kubeconfig (``KUBECONFIG``)."""
    from kubernetes_asyncio import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        await config.load_kube_config()
    return KubernetesAsyncioApi(client.ApiClient())


def kubeconfig_api_factory(path: str) -> ApiFactory:
    """A factory for the cluster and credentials of the kubeconfig file at ``path`` (leaving
    the process's default configuration alone)."""

    async def factory() -> KubeApi:
        from kubernetes_asyncio import client, config

        configuration = client.Configuration()
        await config.load_kube_config(config_file=path, client_configuration=configuration)
        return KubernetesAsyncioApi(client.ApiClient(configuration))

    return factory
