"""A real Kubernetes for the tests of the Kubernetes path: the local cluster of ``make k8s-up``
(kube-apiserver, controllers, etcd, Volcano, the training operator and KWOK GPU nodes, built
from Go modules), started once for tests/k8s in a temporary folder and stopped by PID whatever
happens. A cluster that does not come up fails these tests with its one-line reason; it never
skips them.

Each test gets a tenant: a namespace of its own, the service account that
hub_config/k8s/rbac.yaml binds (the backend never holds admin credentials) and its own queue
prefix, so tests do not see each other's jobs or queues.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from devcluster.cluster import ClusterError, LocalCluster
from extension.backends.base import BackendEvent, EventKind, JobSpec
from extension.backends.kubernetes import KubernetesBackend, kubeconfig_api_factory
from extension.scheduler import Resources

GiB = 2**30
LAYOUT = "2x2"  # seed 002's cluster: 2 nodes x 2 GPUs
_serial = itertools.count(1)


@pytest.fixture(scope="package")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # package scope: stopped after the last test of tests/k8s (they run together, on one
    # worker: tests/conftest.py), not at the end of that worker's session
    # the users' folders outside pytest's 0700 temp folders: the service reaches them as the
    # users' uids (the real node's hub test)
    users = Path(tempfile.mkdtemp(prefix="wmla-k8s-users-"))
    os.chmod(users, 0o711)
    cluster = LocalCluster(
        tmp_path_factory.mktemp("k8s"), layout=LAYOUT, log=sys.stderr, user_data=users
    )
    try:
        try:
            cluster.up()
        except ClusterError as err:
            pytest.fail(str(err), pytrace=False)
        yield cluster
    finally:
        cluster.down()
        shutil.rmtree(users, ignore_errors=True)


class Recorder:
    """The backend's events, in order."""

    def __init__(self) -> None:
        self.events: list[BackendEvent] = []

    def __call__(self, event: BackendEvent) -> None:
        self.events.append(event)

    def kinds(self, job_id: str) -> list[EventKind]:
        return [e.kind for e in self.events if e.job_id == job_id]


@dataclass
class Tenant:
    """A namespace of the cluster with the service's account and kubeconfig."""

    cluster: LocalCluster
    namespace: str
    kubeconfig: Path
    backends: list[KubernetesBackend] = field(default_factory=list)

    @property
    def prefix(self) -> str:
        return self.namespace

    async def backend(self, events: Callable[[BackendEvent], None], **kw: Any) -> KubernetesBackend:
        """A backend over the service kubeconfig, opened; closed by the fixture."""
        options: dict[str, Any] = {
            "namespace": self.namespace,
            "instance": self.namespace,
            "name_prefix": self.prefix,
            "image": "busybox",
            "grace": 2.0,
            "backoff_initial": 0.2,
            "backoff_max": 1.0,
            "retry_deadline": 30.0,
        }
        options.update(kw)
        backend = KubernetesBackend(
            events, api_factory=kubeconfig_api_factory(str(self.kubeconfig)), **options
        )
        self.backends.append(backend)
        await backend.open(timeout=30)
        return backend

    def kubectl(self, *args: str, input: str | None = None) -> str:
        """Admin kubectl in the tenant's namespace (to look, never on the backend's behalf)."""
        return self.cluster.kubectl("-n", self.namespace, *args, input=input)

    def get(self, kind: str, selector: str | None = None) -> list[dict]:
        args = ["get", kind, "-o", "json"] + (["-l", selector] if selector else [])
        return json.loads(self.kubectl(*args))["items"]

    def spec(self, job_id: str, workers: int = 1, runtime: str = "3s", **kw: Any) -> JobSpec:
        user = kw.pop("user", "alice")
        env = {"KWOK_RUNTIME": runtime, **kw.pop("env", {})}
        return JobSpec(
            id=job_id,
            user=user,
            leaf=kw.pop("leaf", f"/project1/dev-team/{user}"),
            per_worker=kw.pop("per_worker", Resources(1, 1000, 2 * GiB)),
            command=["python", "main.py"],
            workdir=f"/gpfs/myresultfs/{user}/jobs/{job_id}",
            min_workers=workers,
            max_workers=workers,
            env=env,
            **kw,
        )


def placed(spec: JobSpec) -> tuple[str, ...]:
    """A placement of the spec's workers, as our scheduler hands it to ``start``: on Kubernetes
    only its length counts (Volcano picks the nodes)."""
    nodes, _ = LAYOUT.split("x")
    return tuple(f"kwok-node-{i % int(nodes)}" for i in range(spec.max_workers))


async def until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Wait for ``condition``; a bound against hangs, not a timing assertion."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what}")
        await asyncio.sleep(0.05)


@pytest.fixture
async def tenant(kube: LocalCluster) -> AsyncIterator[Tenant]:
    namespace = f"t{next(_serial)}"
    kubeconfig = kube.write_service_kubeconfig(namespace, kube.var / f"{namespace}.kubeconfig")
    t = Tenant(kube, namespace, kubeconfig)
    try:
        yield t
    finally:
        for backend in t.backends:
            await backend.close()
        # free the GPUs for the next test: its jobs and pods go (KWOK ends pods at once)
        kube.kubectl("delete", "pytorchjobs,jobs.batch.volcano.sh,pods", "--all", "-n", namespace,
                     "--grace-period=0", "--wait=true", "--timeout=60s")  # fmt: skip
