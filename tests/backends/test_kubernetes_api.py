"""The real adapter (``KubernetesAsyncioApi`` over kubernetes_asyncio) against a local HTTP
server that answers like the Kubernetes API for the requests it makes.

This checks what the reconcile tests with the in-memory fake cannot: the URLs, query
parameters, headers and bodies that actually go over the wire, how list and watch responses are
read, and how HTTP errors and a refused connection become ``ApiError``. The server is a FAKE
(aiohttp, a few canned routes), started on a free port and stopped whatever happens.
"""

from __future__ import annotations

import json
import socket

import pytest
from aiohttp import web

from extension.backends.kubernetes import (
    NODES,
    PODS,
    PYTORCHJOBS,
    QUEUES,
    ApiError,
    KubernetesAsyncioApi,
)

NODE = {"metadata": {"name": "gpu-1", "resourceVersion": "7"}, "status": {"allocatable": {}}}


class Server:
    """FAKE API server: records every request and answers from canned routes."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.created: set[str] = set()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.text()
        self.requests.append(
            {
                "method": request.method,
                "path": request.path,
                "query": dict(request.query),
                "content_type": request.headers.get("Content-Type", ""),
                "body": json.loads(body) if body else None,
            }
        )
        path, method = request.path, request.method
        if path == "/api/v1/nodes" and request.query.get("watch", "").lower() == "true":
            response = web.StreamResponse()
            await response.prepare(request)
            events = [
                {
                    "type": "ADDED",
                    "object": {**NODE, "metadata": {"name": "gpu-2", "resourceVersion": "8"}},
                },
                {
                    "type": "BOOKMARK",
                    "object": {"kind": "Node", "metadata": {"resourceVersion": "9"}},
                },
                {"type": "DELETED", "object": NODE},
            ]
            for event in events:
                await response.write((json.dumps(event) + "\n").encode())
            await response.write_eof()
            return response
        if path == "/api/v1/nodes":
            return web.json_response({"items": [NODE], "metadata": {"resourceVersion": "7"}})
        if path == "/api/v1/namespaces/wmla/pods" and method == "GET":
            return web.json_response({"items": [], "metadata": {"resourceVersion": "3"}})
        if path == "/api/v1/namespaces/wmla/pods/p-0/log":
            return web.Response(text="line 1\nline 2\n")
        if path.startswith("/api/v1/namespaces/wmla/pods/") and method == "DELETE":
            return web.json_response({"kind": "Status", "status": "Success"})
        if path == "/apis/kubeflow.org/v1/namespaces/wmla/pytorchjobs" and method == "POST":
            name = json.loads(body)["metadata"]["name"]
            if name in self.created:
                return web.json_response(
                    {"kind": "Status", "code": 409, "reason": "AlreadyExists"}, status=409
                )
            self.created.add(name)
            return web.json_response(json.loads(body), status=201)
        if path.startswith("/apis/kubeflow.org/v1/namespaces/wmla/pytorchjobs/"):
            if path.endswith("/missing"):
                return web.json_response({"kind": "Status", "code": 404}, status=404)
            return web.json_response({"metadata": {"name": path.rsplit("/", 1)[1]}})
        if path.startswith("/apis/scheduling.volcano.sh/v1beta1/queues"):
            return web.json_response(json.loads(body) if body else {"items": [], "metadata": {}})
        if path == "/boom":
            return web.Response(status=503)
        return web.json_response({"kind": "Status", "code": 404}, status=404)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
async def api_and_server():
    from kubernetes_asyncio import client

    server = Server()
    runner = web.AppRunner(server.app())
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    config = client.Configuration(host=f"http://127.0.0.1:{port}")
    api = KubernetesAsyncioApi(client.ApiClient(config))
    try:
        yield api, server
    finally:
        await api.close()
        await runner.cleanup()


async def test_list_reads_items_and_the_resource_version(api_and_server):
    api, server = api_and_server
    items, version = await api.list(NODES, None, None)
    assert items == [NODE] and version == "7"
    items, version = await api.list(PODS, "wmla", "app.kubernetes.io/managed-by=jupyterhub-wmla")
    assert (items, version) == ([], "3")
    assert (
        server.requests[-1]["query"]["labelSelector"]
        == "app.kubernetes.io/managed-by=jupyterhub-wmla"
    )


async def test_watch_streams_raw_dicts_from_the_resource_version(api_and_server):
    api, server = api_and_server
    seen = [
        (event, obj["metadata"]["name"] if event != "BOOKMARK" else "")
        async for event, obj in api.watch(NODES, None, None, "7")
    ]
    assert seen == [("ADDED", "gpu-2"), ("BOOKMARK", ""), ("DELETED", "gpu-1")]
    query = server.requests[-1]["query"]
    # the client writes booleans as True; the API server's ParseBool takes that
    assert query["watch"].lower() == "true" and query["resourceVersion"] == "7"
    assert query["allowWatchBookmarks"].lower() == "true"


async def test_create_then_conflict(api_and_server):
    api, server = api_and_server
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "j"}}
    assert (await api.create(PYTORCHJOBS, "wmla", job))["metadata"]["name"] == "j"
    with pytest.raises(ApiError) as err:
        await api.create(PYTORCHJOBS, "wmla", job)
    assert err.value.status == 409


async def test_patch_is_a_json_merge_patch(api_and_server):
    api, server = api_and_server
    await api.patch(
        PYTORCHJOBS, "wmla", "j", {"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 4}}}}
    )
    sent = server.requests[-1]
    assert sent["method"] == "PATCH" and sent["path"].endswith("/pytorchjobs/j")
    assert sent["content_type"] == "application/merge-patch+json"
    assert sent["body"] == {"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 4}}}}


async def test_delete_carries_the_grace_and_the_propagation(api_and_server):
    api, server = api_and_server
    await api.delete(PYTORCHJOBS, "wmla", "j", 30, "Foreground")
    assert server.requests[-1]["query"] == {
        "gracePeriodSeconds": "30",
        "propagationPolicy": "Foreground",
    }
    await api.delete(PODS, "wmla", "j-worker-0", 30)
    assert server.requests[-1]["path"] == "/api/v1/namespaces/wmla/pods/j-worker-0"
    with pytest.raises(ApiError) as err:
        await api.delete(PYTORCHJOBS, "wmla", "missing", 0)
    assert err.value.status == 404


async def test_cluster_scoped_queues_and_logs(api_and_server):
    api, server = api_and_server
    queue = {"metadata": {"name": "wmla", "resourceVersion": "5"}, "spec": {"weight": 1}}
    await api.replace(QUEUES, None, "wmla", queue)
    assert server.requests[-1]["method"] == "PUT"
    assert server.requests[-1]["path"] == "/apis/scheduling.volcano.sh/v1beta1/queues/wmla"
    assert await api.read_log("wmla", "p-0", None, 1) == "line 1\nline 2\n"
    assert server.requests[-1]["query"] == {"tailLines": "1"}


async def test_a_refused_connection_is_status_0():
    from kubernetes_asyncio import client

    api = KubernetesAsyncioApi(
        client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{free_port()}"))
    )
    try:
        with pytest.raises(ApiError) as err:
            await api.list(NODES, None, None)
        assert err.value.status == 0
    finally:
        await api.close()
