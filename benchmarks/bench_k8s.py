"""One stream of PyTorchJobs on one local Kubernetes cluster, three ways (issue 37, item 6).

    .venv/bin/python benchmarks/bench_k8s.py [--jobs 1000] [--layout 16x8] [--only wmla]
                                             [--var /tmp/bench-k8s] [--seed 7] [--rate 0]

The cluster is devcluster's (etcd, kube-apiserver, controller manager, kube-scheduler, Volcano,
KWOK GPU nodes, the Kubeflow training operator, built from Go modules; Kueue v0.17 for the third
way). The stream: ``--jobs`` PyTorchJobs, each of 1 to 8 workers of 1 GPU (1 cpu, 2Gi), charged
to one of three plans with shares 4:2:2 (one user each), each running 2 to 5 s on its KWOK nodes
(``KWOK_RUNTIME``), seeded; submitted all at once (``--rate 0``) or ``--rate`` jobs a
second. The same stream runs, one way after the other, in one run:

1. **wmla**: the service's scheduling loop (``extension.service.scheduling.Scheduler``, its
   store on SQLite, the real core) with ``KubernetesBackend``: the core admits, the backend
   creates one PyTorchJob per admitted job, Volcano binds the gang;
2. **volcano**: the same PyTorchJobs created straight away, ``runPolicy.schedulingPolicy``
   (queue, minAvailable) set, one Volcano Queue per plan (weights 400:200:200): the training
   operator and Volcano do the rest;
3. **kueue**: the same PyTorchJobs, suspended, with the ``kueue.x-k8s.io/queue-name`` label of
   their plan's LocalQueue; one ClusterQueue per plan (nominal GPUs by share, one cohort, so
   they borrow), ResourceFlavor ``default``. Kueue admits whole jobs by quota; the pods go to
   the default kube-scheduler (the training operator runs without Volcano then), which binds
   them one by one: Kueue has no gang binding.

Measured for each way, from a watch of the pods in a separate process (so its work is no one's
CPU): **placed/s**, the jobs divided by the time from the first submission to the moment the
last job had every pod bound (``spec.nodeName``); **p50/p99** of each job's time from its
submission to every pod bound; **partial gangs**, jobs with a pod bound while the gang was
incomplete: bound before the gang's last pod even existed, or some but not all of its pods
bound for longer than ``PARTIAL_S`` (the binds of one gang by Volcano are separate API writes
that land within milliseconds of each other, all its pods existing; 1 s leaves room for a slow
watch), and the pods bound meanwhile, plus the widest first-to-last bind spread of a gang; the
submitting side's **CPU per job** (time.process_time of this
process: for wmla that is the whole service, its REST-free submit path, loop, store and backend;
for the others the submitter alone) and the controllers' (from /proc/<pid>/stat:
vc-scheduler, vc-controller-manager, training operator, kube-scheduler, Kueue; API server and
etcd apart), both until every job has ended; **API calls per job** (wmla: every call its
backend made, counted by a proxy around the ``KubeApi`` its factory returns; the others: the
creates made).

The cluster comes up once; between two ways every job and pod is deleted and the namespace
waited on until empty (the time it took is printed, beside the time the cluster took to come
up, which is what a fresh cluster would cost instead). Every process started is stopped in
``finally``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from devcluster.cluster import ClusterError, LocalCluster  # noqa: E402
from devcluster.objects import RUNTIME_ENV  # noqa: E402  (how long a pod runs on its KWOK node)
from extension.backends.base import BackendEvent, EventKind, JobSpec  # noqa: E402
from extension.backends.kubernetes import (  # noqa: E402
    PODS,
    PYTORCHJOBS,
    ApiError,
    KubeApi,
    KubernetesBackend,
    kubeconfig_api_factory,
)
from extension.scheduler import UNLIMITED, Resources  # noqa: E402

NAMESPACE = "wmla"
PLANS = {"a": 4, "b": 2, "c": 2}  # plan /bench/<x> and its share
USERS = {"a": "alice", "b": "bob", "c": "carol"}
GiB = 2**30
PER_WORKER = Resources(1, 1000, 2 * GiB)
TTL = 5  # ttlSecondsAfterFinished: finished jobs leave, so the cluster recycles
PARTIAL_S = 1.0
JOB_ENV = "BENCH_JOB"  # the stream index, in every pod's env: how the watch finds its job
WORKERS_ENV = "BENCH_WORKERS"
WAYS = ("volcano", "wmla", "kueue")
CONTROLLERS = (
    "vc-scheduler",
    "vc-controller-manager",
    "training-operator",
    "kube-scheduler",
    "kube-controller-manager",
    "kueue",
)
SERVERS = ("kube-apiserver", "etcd", "kwok")  # kwok: every node's kubelet, logs served too
GOAL_VS_VOLCANO = 0.9


# -- the stream -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class StreamJob:
    index: int
    plan: str  # "a", "b" or "c"
    workers: int
    runtime: int  # seconds on the KWOK nodes

    @property
    def user(self) -> str:
        return USERS[self.plan]

    @property
    def env(self) -> dict[str, str]:
        return {
            RUNTIME_ENV: f"{self.runtime}s",
            JOB_ENV: str(self.index),
            WORKERS_ENV: str(self.workers),
        }


def make_stream(jobs: int, seed: int) -> list[StreamJob]:
    """``jobs`` jobs: plan uniform over the three, workers uniform 1..8, runtime 2..5 s."""
    rng = random.Random(seed)
    return [
        StreamJob(i, rng.choice("abc"), rng.randint(1, 8), rng.randint(2, 5)) for i in range(jobs)
    ]


# -- counting the calls a KubeApi makes -------------------------------------------------------
class CountingApi:
    """A ``KubeApi`` that counts each call (verb, kind) before passing it on."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self.created: dict[int, float] = {}  # stream index -> when its job object was sent

    async def list(
        self, kind: str, namespace: str | None, label_selector: str | None
    ) -> tuple[list[dict], str]:
        self.counts["list", kind] += 1
        return await self.api.list(kind, namespace, label_selector)

    def watch(
        self, kind: str, namespace: str | None, label_selector: str | None, resource_version: str
    ) -> Any:
        self.counts["watch", kind] += 1
        return self.api.watch(kind, namespace, label_selector, resource_version)

    async def get(self, kind: str, namespace: str | None, name: str) -> dict:
        self.counts["get", kind] += 1
        return await self.api.get(kind, namespace, name)

    async def create(self, kind: str, namespace: str | None, body: dict) -> dict:
        self.counts["create", kind] += 1
        if kind == PYTORCHJOBS:
            index = _body_index(body)
            if index is not None:
                self.created.setdefault(index, time.time())
        return await self.api.create(kind, namespace, body)

    async def replace(self, kind: str, namespace: str | None, name: str, body: dict) -> dict:
        self.counts["replace", kind] += 1
        return await self.api.replace(kind, namespace, name, body)

    async def patch(self, kind: str, namespace: str | None, name: str, body: dict) -> dict:
        self.counts["patch", kind] += 1
        return await self.api.patch(kind, namespace, name, body)

    async def delete(
        self,
        kind: str,
        namespace: str | None,
        name: str,
        grace_seconds: int | None = None,
        propagation: str | None = None,
    ) -> None:
        self.counts["delete", kind] += 1
        await self.api.delete(kind, namespace, name, grace_seconds, propagation)

    async def read_log(
        self, namespace: str, pod: str, container: str | None, tail: int | None
    ) -> str:
        self.counts["read_log", PODS] += 1
        return await self.api.read_log(namespace, pod, container, tail)

    async def close(self) -> None:
        await self.api.close()

    def total(self) -> int:
        return sum(self.counts.values())


def _body_index(body: dict) -> int | None:
    """The stream index a job object carries in its pods' env."""
    for replica in (body.get("spec") or {}).get("pytorchReplicaSpecs", {}).values():
        env = _pod_env(replica.get("template") or {})
        if JOB_ENV in env:
            return int(env[JOB_ENV])
    return None


def counting_factory(kubeconfig: Path, into: list[CountingApi]) -> Callable[[], Awaitable[Any]]:
    """An ``api_factory`` whose every API is a ``CountingApi`` (appended to ``into``)."""
    inner = kubeconfig_api_factory(str(kubeconfig))

    async def factory() -> CountingApi:
        api = inner()
        if asyncio.iscoroutine(api):
            api = await api
        counting = CountingApi(api)  # type: ignore[arg-type]
        into.append(counting)
        return counting

    return factory


async def open_api(kubeconfig: Path) -> KubeApi:
    api = kubeconfig_api_factory(str(kubeconfig))()
    if asyncio.iscoroutine(api):
        api = await api
    return api  # type: ignore[return-value]


# -- the watcher: a separate process ------------------------------------------------------------
def _pod_env(pod: dict) -> dict[str, str]:
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    return {e.get("name"): e.get("value") for e in containers[0].get("env") or []}


async def observe(kubeconfig: Path, namespace: str, jobs: int, out: Path, timeout: float) -> None:
    """Watch the namespace's pods until every job of the stream has had all its pods bound and
    ended (or ``timeout``); write each job's bind times and end, print progress to stderr."""
    api = await open_api(kubeconfig)
    binds: dict[int, dict[str, float]] = collections.defaultdict(dict)  # job -> pod -> bound at
    created: dict[int, dict[str, float]] = collections.defaultdict(dict)  # job -> pod -> seen at
    ended: dict[int, set[str]] = collections.defaultdict(set)
    workers: dict[int, int] = {}
    placed_at: dict[int, float] = {}
    done_at: dict[int, float] = {}
    every = max(1, jobs // 10)
    started = time.time()

    def seen(kind: str, pod: dict) -> None:
        env = _pod_env(pod)
        if JOB_ENV not in env:
            return
        job, name = int(env[JOB_ENV]), pod["metadata"]["name"]
        workers[job] = int(env.get(WORKERS_ENV) or 1)
        now = time.time()
        created[job].setdefault(name, now)
        if (pod.get("spec") or {}).get("nodeName") and name not in binds[job]:
            binds[job][name] = now
            if len(binds[job]) >= workers[job] and job not in placed_at:
                placed_at[job] = now
                if len(placed_at) % every == 0 or len(placed_at) == jobs:
                    took = now - started
                    print(
                        f"  {len(placed_at):>5}/{jobs} jobs placed, {len(done_at):>5} ended, "
                        f"{took:6.1f} s",
                        file=sys.stderr,
                        flush=True,
                    )
        phase = (pod.get("status") or {}).get("phase")
        if name in binds[job] and (kind == "DELETED" or phase in ("Succeeded", "Failed")):
            ended[job].add(name)
            if len(ended[job]) >= workers[job] and job not in done_at:
                done_at[job] = now

    print("ready", flush=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(done_at) < jobs:
        try:
            items, version = await api.list(PODS, namespace, None)
            for pod in items:
                seen("ADDED", pod)
            async for kind, pod in api.watch(PODS, namespace, None, version):
                if kind == "ERROR":
                    break
                if kind != "BOOKMARK":
                    seen(kind, pod)
                if len(done_at) >= jobs or time.monotonic() > deadline:
                    break
        except ApiError:
            await asyncio.sleep(0.5)
    await api.close()
    out.write_text(
        json.dumps(
            {
                "binds": {str(j): sorted(b.values()) for j, b in binds.items()},
                "created": {str(j): sorted(c.values()) for j, c in created.items()},
                "placed": {str(j): t for j, t in placed_at.items()},
                "done": {str(j): t for j, t in done_at.items()},
            }
        )
    )


class Observer:
    """``observe`` in a child process of this script (``--observe``)."""

    def __init__(self, kubeconfig: Path, jobs: int, out: Path, timeout: float) -> None:
        self.args = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--observe",
            "--kubeconfig",
            str(kubeconfig),
            "--jobs",
            str(jobs),
            "--out",
            str(out),
            "--timeout",
            str(timeout),
        ]
        self.out = out
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self.out.unlink(missing_ok=True)
        self.proc = await asyncio.create_subprocess_exec(
            *self.args, stdout=asyncio.subprocess.PIPE, cwd=str(REPO)
        )
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), 60)
        if line.strip() != b"ready":
            raise RuntimeError("the pod watcher did not start")

    async def wait(self) -> dict[str, Any]:
        assert self.proc is not None
        await self.proc.wait()
        return json.loads(self.out.read_text())

    def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.terminate()


def _limit(stream: list[StreamJob]) -> float:
    """How long the watch waits for every job to end: generous, but not for ever."""
    return 300.0 + 2.0 * len(stream)


# -- CPU of the cluster's processes ------------------------------------------------------------
def _ticks(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime
    except (OSError, ValueError, IndexError):
        return 0


def cpu_seconds(cluster: LocalCluster, kueue_pid: int | None) -> dict[str, float]:
    """Each component's CPU seconds so far (by PID, from /proc)."""
    hz = os.sysconf("SC_CLK_TCK")
    out = {}
    for name in CONTROLLERS + SERVERS:
        if name == "kueue":
            pid = kueue_pid
        else:
            running = cluster.processes.running(name)
            pid = running.pid if running else None
        if pid:
            out[name] = _ticks(pid) / hz
    return out


# -- the three ways ---------------------------------------------------------------------------
@dataclass
class WayResult:
    way: str
    submitted: dict[int, float] = field(default_factory=dict)
    watched: dict[str, Any] = field(default_factory=dict)
    cpu_self: float = 0.0
    cpu_parts: dict[str, float] = field(default_factory=dict)
    calls: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    setup_calls: int = 0
    created: dict[int, float] = field(default_factory=dict)  # job object sent
    ended: dict[int, float] = field(default_factory=dict)  # wmla: its end reported
    wall: float = 0.0
    note: str = ""


def job_body(job: StreamJob, name: str, builder: KubernetesBackend) -> dict:
    """The PyTorchJob wmla's builder would make for ``job``, under ``name``, without wmla's
    labels and annotations (nothing of wmla watches it)."""
    spec = JobSpec(
        id=name,
        user=job.user,
        leaf=f"/bench/{job.plan}/{job.user}",
        per_worker=PER_WORKER,
        command=["python", f"/gpfs/myresultfs/{job.user}/models/main.py"],
        workdir=f"/gpfs/myresultfs/{job.user}/jobs/{name}",
        min_workers=job.workers,
        max_workers=job.workers,
        env=job.env,
    )
    body = builder.build_job(spec, job.workers)
    labels = {"app.kubernetes.io/part-of": "bench-k8s"}
    body["metadata"] = {"name": name, "namespace": NAMESPACE, "labels": dict(labels)}
    for replica in body["spec"]["pytorchReplicaSpecs"].values():
        replica["template"]["metadata"] = {"labels": dict(labels)}
    return body


async def submit_direct(
    stream: list[StreamJob], bodies: list[dict], kubeconfig: Path, rate: float, result: WayResult
) -> CountingApi:
    """Create every body (8 at a time), at ``rate`` a second or all at once."""
    api = CountingApi(await open_api(kubeconfig))
    gate = asyncio.Semaphore(8)
    t0 = time.time()

    async def one(job: StreamJob, body: dict) -> None:
        if rate > 0:
            await asyncio.sleep(max(0.0, t0 + job.index / rate - time.time()))
        async with gate:
            result.submitted[job.index] = time.time()
            await api.create(PYTORCHJOBS, NAMESPACE, body)

    await asyncio.gather(*(one(j, b) for j, b in zip(stream, bodies, strict=True)))
    return api


async def run_direct(
    way: str,
    stream: list[StreamJob],
    cluster: LocalCluster,
    service_kc: Path,
    var: Path,
    rate: float,
    kueue_pid: Callable[[], int | None],
) -> WayResult:
    builder = KubernetesBackend(lambda e: None, namespace=NAMESPACE, image="busybox")
    bodies = []
    for job in stream:
        body = job_body(job, f"{way[:3]}-{job.index}", builder)
        body["spec"]["runPolicy"]["ttlSecondsAfterFinished"] = TTL
        if way == "volcano":
            body["spec"]["runPolicy"]["schedulingPolicy"] = {
                "minAvailable": job.workers,
                "queue": f"bench-{job.plan}",
            }
        else:
            body["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = f"lq-{job.plan}"
            body["spec"]["runPolicy"].pop("schedulingPolicy", None)
            body["spec"]["runPolicy"]["suspend"] = True
            for replica in body["spec"]["pytorchReplicaSpecs"].values():
                replica["template"]["spec"].pop("schedulerName", None)
        bodies.append(body)
    result = WayResult(way)
    observer = Observer(cluster.kubeconfig, len(stream), var / f"watch-{way}.json", _limit(stream))
    await observer.start()
    try:
        cpu0, self0, t0 = cpu_seconds(cluster, kueue_pid()), time.process_time(), time.time()
        api = await submit_direct(stream, bodies, service_kc, rate, result)
        await api.close()
        result.cpu_self = time.process_time() - self0
        result.watched = await observer.wait()
        result.wall = time.time() - t0
        cpu1 = cpu_seconds(cluster, kueue_pid())
        result.cpu_parts = {k: cpu1[k] - cpu0.get(k, 0.0) for k in cpu1}
        result.calls = api.counts
        result.created = api.created
    finally:
        observer.stop()
    return result


async def run_wmla(
    stream: list[StreamJob], cluster: LocalCluster, service_kc: Path, var: Path, rate: float
) -> WayResult:
    from extension.scheduler import SchedulerConfig
    from extension.service.records import InstanceBounds
    from extension.service.scheduling import Scheduler
    from extension.service.store import Store, sqlite_url
    from extension.service.submission import LimitRange, parse_submission
    from extension.webapi import Caller

    storage = var / "storage"
    for user in USERS.values():
        models = storage / user / "models"
        models.mkdir(parents=True, exist_ok=True)
        (models / "main.py").write_text("# runs on a KWOK node: never read\n")
    db = var / "wmla-bench.sqlite"
    for f in var.glob("wmla-bench.sqlite*"):
        f.unlink()
    store = Store.open(sqlite_url(db))
    sched = Scheduler(
        store,
        InstanceBounds(Resources(UNLIMITED, UNLIMITED, UNLIMITED)),
        SchedulerConfig(),
        storage_root=storage,
        python="python3",
        tick=5.0,  # the service's default
    )
    sched.load({"/bench": {}, **{f"/bench/{p}": {"share": share} for p, share in PLANS.items()}})
    apis: list[CountingApi] = []
    result = WayResult("wmla")
    index_of: dict[str, int] = {}

    def emit(event: BackendEvent) -> None:
        if event.kind in (EventKind.FINISHED, EventKind.FAILED) and event.job_id in index_of:
            result.ended.setdefault(index_of[event.job_id], time.time())
        sched.emit(event)

    backend = KubernetesBackend(
        emit,
        namespace=NAMESPACE,
        api_factory=counting_factory(service_kc, apis),
        image="busybox",
        storage_root=str(storage),
        ttl_seconds_after_finished=TTL,
    )
    limit_range = LimitRange.from_config({})
    observer = Observer(cluster.kubeconfig, len(stream), var / "watch-wmla.json", _limit(stream))
    await observer.start()
    try:
        cpu0, self0, t0 = cpu_seconds(cluster, None), time.process_time(), time.time()
        await sched.start(backend)
        await sched.drain()
        result.setup_calls = sum(a.total() for a in apis)

        async def one(job: StreamJob) -> None:
            if rate > 0:
                await asyncio.sleep(max(0.0, t0 + job.index / rate - time.time()))
            body = {
                "plan": f"/bench/{job.plan}",
                "workers": str(job.workers),
                "resources": {"gpu": 1, "cpu": "1", "memory": "2Gi"},
                "command": {"model_dir": "models", "model_main": "main.py"},
                "env": job.env,
            }
            sub = parse_submission(
                body, user=job.user, storage_root=storage, limit_range=limit_range, max_workers=8
            )
            result.submitted[job.index] = time.time()
            row = await sched.submit(Caller(job.user), sub)
            index_of[row.id] = job.index

        await asyncio.gather(*(one(j) for j in stream))
        watch = asyncio.ensure_future(observer.wait())
        while not watch.done():
            await asyncio.sleep(0.5)
        result.watched = watch.result()
        # the service's own end: every job's end folded in (its last log reads done)
        deadline = time.monotonic() + 120
        while sched.jobs and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        await sched.drain()
        result.cpu_self = time.process_time() - self0
        result.wall = time.time() - t0
        cpu1 = cpu_seconds(cluster, None)
        result.cpu_parts = {k: cpu1[k] - cpu0.get(k, 0.0) for k in cpu1}
        for api in apis:
            result.calls.update(api.counts)
            result.created.update(api.created)
        states = collections.Counter(r.state for r in store.jobs())
        preempted = sum(1 for r in store.jobs() if (getattr(r, "preemptions", 0) or 0) > 0)
        result.note = f"service end states {dict(states)}, preempted {preempted}"
    finally:
        observer.stop()
        with contextlib.suppress(Exception):
            await sched.stop()
        store.close()
    return result


# -- the cluster's objects for each way ----------------------------------------------------------
def volcano_queues(cluster: LocalCluster) -> None:
    cluster.apply(
        {
            "apiVersion": "scheduling.volcano.sh/v1beta1",
            "kind": "Queue",
            "metadata": {"name": f"bench-{plan}"},
            "spec": {"weight": share * 100, "reclaimable": True, "parent": "root"},
        }
        for plan, share in PLANS.items()
    )
    deadline = time.monotonic() + 60
    for plan in PLANS:
        while time.monotonic() < deadline:
            state = cluster.kubectl(
                "get", "queue", f"bench-{plan}", "-o", "jsonpath={.status.state}"
            )
            if state.strip() == "Open":
                break
            time.sleep(0.3)


def kueue_queues(cluster: LocalCluster, gpus: int, cpu: int, memory_gi: int) -> None:
    total = sum(PLANS.values())
    docs: list[dict] = [
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": "default"},
            "spec": {},
        }
    ]
    for plan, share in PLANS.items():
        part = share / total
        docs.append(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ClusterQueue",
                "metadata": {"name": f"cq-{plan}"},
                "spec": {
                    "cohortName": "bench",
                    "namespaceSelector": {},
                    "resourceGroups": [
                        {
                            "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                            "flavors": [
                                {
                                    "name": "default",
                                    "resources": [
                                        {"name": "cpu", "nominalQuota": str(int(cpu * part))},
                                        {
                                            "name": "memory",
                                            "nominalQuota": f"{int(memory_gi * part)}Gi",
                                        },
                                        {
                                            "name": "nvidia.com/gpu",
                                            "nominalQuota": str(int(gpus * part)),
                                        },
                                    ],
                                }
                            ],
                        }
                    ],
                },
            }
        )
        docs.append(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "LocalQueue",
                "metadata": {"name": f"lq-{plan}", "namespace": NAMESPACE},
                "spec": {"clusterQueue": f"cq-{plan}"},
            }
        )
    cluster.apply(docs)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        out = cluster.kubectl(
            "get",
            "clusterqueues.kueue.x-k8s.io",
            "-o",
            'jsonpath={range .items[*]}{.status.conditions[?(@.type=="Active")].status}{" "}{end}',
        )
        if out.split().count("True") == len(PLANS):
            return
        time.sleep(0.5)
    raise ClusterError("bench: Kueue's ClusterQueues did not become active")


def clean(cluster: LocalCluster) -> float:
    """Delete every job and pod of the namespace and wait until none is left; the seconds."""
    began = time.monotonic()
    ns = ["-n", NAMESPACE]
    cluster.kubectl("delete", "pytorchjobs.kubeflow.org", "--all", *ns, "--wait=false")
    cluster.kubectl("delete", "pods", "--all", *ns, "--grace-period=0", "--force", "--wait=false")
    with contextlib.suppress(ClusterError):
        cluster.kubectl("delete", "workloads.kueue.x-k8s.io", "--all", *ns, "--wait=false")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        left = cluster.kubectl(
            "get",
            "pods,pytorchjobs.kubeflow.org,podgroups.scheduling.volcano.sh",
            *ns,
            "-o",
            "name",
        ).split()
        if not left:
            break
        if any(n.startswith("podgroup") for n in left) and not any(
            n.startswith(("pod/", "pytorchjob")) for n in left
        ):
            cluster.kubectl("delete", "podgroups.scheduling.volcano.sh", "--all", *ns)
        time.sleep(1.0)
    return time.monotonic() - began


# -- figures ----------------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[k]


def figures(r: WayResult, stream: list[StreamJob]) -> dict[str, Any]:
    binds = {int(k): v for k, v in r.watched.get("binds", {}).items()}
    placed = {int(k): v for k, v in r.watched.get("placed", {}).items()}
    t0 = min(r.submitted.values())
    latencies = [placed[j.index] - r.submitted[j.index] for j in stream if j.index in placed]
    partial = partial_pods = 0
    spread_max = 0.0
    created = {int(k): v for k, v in r.watched.get("created", {}).items()}
    for job in stream:
        times = binds.get(job.index, [])
        if not times:
            continue
        complete = len(times) >= job.workers
        last = times[job.workers - 1] if complete else math.inf
        spread = last - times[0]
        if complete:
            spread_max = max(spread_max, spread)
        made = created.get(job.index, [])
        # the gang's last pod came into being after its first pod was bound
        last_made = made[job.workers - 1] if len(made) >= job.workers else math.inf
        early = times[0] < last_made
        if early or spread > PARTIAL_S:
            partial += 1
            until = max(last_made if early else -math.inf, last - PARTIAL_S)
            partial_pods += sum(1 for t in times if t < until)
    last_placed = max(placed.values()) if placed else math.nan
    calls = sum(r.calls.values())
    controllers = sum(r.cpu_parts.get(n, 0.0) for n in CONTROLLERS)
    servers = sum(r.cpu_parts.get(n, 0.0) for n in SERVERS)
    n = len(stream)
    return {
        "way": r.way,
        "placed": len(placed),
        "rate": len(placed) / (last_placed - t0) if placed else 0.0,
        "span": last_placed - t0,
        "p50": percentile(latencies, 50),
        "p99": percentile(latencies, 99),
        "partial": partial,
        "partial_pods": partial_pods,
        "spread_max": spread_max,
        "cpu_self_ms": 1000 * r.cpu_self / n,
        "cpu_ctrl_ms": 1000 * controllers / n,
        "cpu_api_ms": 1000 * servers / n,
        "calls": calls / n,
        "calls_in_run": (calls - r.setup_calls) / n,
        "wall": r.wall,
    }


def where_time_goes(r: WayResult) -> str:
    """Medians of each step of a job's way: submission to its job object, that to every pod
    bound, every pod bound to every pod ended, and (wmla) that to the service's end event."""
    placed = {int(k): v for k, v in r.watched.get("placed", {}).items()}
    done = {int(k): v for k, v in r.watched.get("done", {}).items()}
    steps = {
        "submit->object": [r.created[j] - r.submitted[j] for j in r.created if j in r.submitted],
        "object->bound": [placed[j] - r.created[j] for j in r.created if j in placed],
        "bound->pods ended": [done[j] - placed[j] for j in placed if j in done],
    }
    if r.ended:
        steps["pods ended->end event"] = [r.ended[j] - done[j] for j in r.ended if j in done]
    return ", ".join(f"{name} {statistics.median(v):.2f}" for name, v in steps.items() if v)


def table(rows: list[dict[str, Any]]) -> str:
    base = next((f for f in rows if f["way"] == "volcano"), None)
    head = (
        f"{'way':<8} {'placed':>7} {'jobs/s':>7} {'vs vol':>7} {'p50 s':>7} {'p99 s':>7} "
        f"{'partial':>8} {'pods':>5} {'spread':>7} {'cpu/job':>8} {'ctrl/job':>9} "
        f"{'srv/job':>9} {'calls/job':>9}"
    )
    lines = [head, "-" * len(head)]
    for f in rows:
        vs = f"{f['rate'] / base['rate']:.2f}x" if base and base["rate"] else "-"
        lines.append(
            f"{f['way']:<8} {f['placed']:>7} {f['rate']:>7.2f} {vs:>7} {f['p50']:>7.1f} "
            f"{f['p99']:>7.1f} {f['partial']:>8} {f['partial_pods']:>5} "
            f"{f['spread_max']:>6.2f}s {f['cpu_self_ms']:>6.1f}ms {f['cpu_ctrl_ms']:>7.1f}ms "
            f"{f['cpu_api_ms']:>7.1f}ms {f['calls']:>9.2f}"
        )
    return "\n".join(lines)


def verdict(rows: list[dict[str, Any]]) -> list[str]:
    by = {f["way"]: f for f in rows}
    out = []
    w, v, k = by.get("wmla"), by.get("volcano"), by.get("kueue")
    if w and v:
        ok = w["rate"] >= GOAL_VS_VOLCANO * v["rate"]
        out.append(
            f"goal wmla >= {GOAL_VS_VOLCANO}x Volcano alone: {w['rate']:.2f} vs "
            f"{v['rate']:.2f} jobs/s ({w['rate'] / v['rate']:.2f}x): {'met' if ok else 'NOT met'}"
        )
    if w and k:
        ok = w["rate"] >= k["rate"]
        out.append(
            f"goal wmla no slower than Kueue: {w['rate']:.2f} vs {k['rate']:.2f} jobs/s: "
            f"{'met' if ok else 'NOT met'}"
        )
    if w:
        out.append(
            f"goal zero partial gangs through wmla: {w['partial']}: "
            f"{'met' if w['partial'] == 0 else 'NOT met'}"
        )
    return out


# -- main -----------------------------------------------------------------------------------
async def run_all(args: argparse.Namespace) -> int:
    var = Path(args.var).resolve()
    stream = make_stream(args.jobs, args.seed)
    ways = [args.only] if args.only else list(WAYS)
    cluster = LocalCluster(var, layout=args.layout)
    kueue = None
    results: list[WayResult] = []
    timings: dict[str, float] = {}
    began = time.monotonic()
    gpus = sum(j.workers for j in stream)
    print(
        f"bench_k8s: {len(stream)} jobs ({gpus} workers, 1-8 each, 2-5 s), plans "
        f"{':'.join(str(s) for s in PLANS.values())}, layout {args.layout}, seed {args.seed}, "
        f"ways {', '.join(ways)}",
        flush=True,
    )
    try:
        t = time.monotonic()
        cluster.up()
        timings["cluster up"] = time.monotonic() - t
        service_kc = cluster.write_service_kubeconfig(NAMESPACE, var / "bench-service.kubeconfig")
        for i, way in enumerate(ways):
            if i:
                t = time.monotonic()
                timings[f"clean before {way}"] = clean(cluster)
            print(f"[{way}] {len(stream)} jobs ...", flush=True)
            if way == "wmla":
                results.append(await run_wmla(stream, cluster, service_kc, var, args.rate))
            elif way == "volcano":
                volcano_queues(cluster)
                results.append(
                    await run_direct(way, stream, cluster, service_kc, var, args.rate, lambda: None)
                )
            else:
                from devcluster.kueue import Kueue

                kueue = Kueue(cluster)
                t = time.monotonic()
                kueue.up()
                timings["kueue up"] = time.monotonic() - t
                layout = cluster.layout
                kueue_queues(
                    cluster,
                    layout.nodes * layout.gpus,
                    layout.nodes * layout.cpu,
                    layout.nodes * layout.memory_gi,
                )
                k = kueue
                results.append(
                    await run_direct(way, stream, cluster, service_kc, var, args.rate, k.pid)
                )
            r = results[-1]
            f = figures(r, stream)
            print(
                f"[{way}] placed {f['placed']}/{len(stream)} in {f['span']:.1f} s "
                f"({f['rate']:.2f} jobs/s); all ended after {r.wall:.1f} s"
                + (f"; {r.note}" if r.note else ""),
                flush=True,
            )
            print(table([f]).splitlines()[-1], flush=True)
    finally:
        if kueue is not None:
            with contextlib.suppress(Exception):
                kueue.down()
        cluster.down()
    rows = [figures(r, stream) for r in results]
    print()
    print(table(rows))
    print()
    for line in verdict(rows):
        print(line)
    print()
    print(
        f"placed: every pod of the job bound (spec.nodeName, seen by a pod watch); p50/p99: "
        "submission to that; partial: a pod bound before the gang's last pod existed, or some "
        f"but not all bound for > {PARTIAL_S:.0f} s (pods: those bound meanwhile); "
        "spread: widest first-to-last bind of a complete gang; "
        "cpu/job: this process (wmla: the whole service; others: the submitter); ctrl/job: "
        "vc-scheduler + vc-controller-manager + training operator + kube-scheduler + "
        "kube-controller-manager + Kueue; srv/job: kube-apiserver + etcd + kwok (the nodes' "
        "kubelet); CPU until every job ended."
    )
    for r in results:
        parts = ", ".join(
            f"{k} {1000 * v / len(stream):.1f}" for k, v in sorted(r.cpu_parts.items()) if v > 0
        )
        print(f"  {r.way} CPU ms/job by process: {parts}")
        calls = ", ".join(f"{verb} {kind} {n}" for (verb, kind), n in sorted(r.calls.items()))
        extra = f" (of which opening: {r.setup_calls})" if r.setup_calls else ""
        print(f"  {r.way} API calls{extra}: {calls}")
    for r in results:
        print(f"  {r.way} where the time goes (median s): {where_time_goes(r)}")
    print(
        "  "
        + "; ".join(f"{k}: {v:.1f} s" for k, v in timings.items())
        + f"; whole run {time.monotonic() - began:.0f} s"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--layout", default="16x8", help="KWOK nodes x GPUs per node (default 16x8)")
    p.add_argument("--only", choices=WAYS)
    p.add_argument("--var", default="/tmp/bench-k8s", help="the cluster's folder")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--rate", type=float, default=0.0, help="jobs a second; 0: all at once")
    p.add_argument("--observe", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--kubeconfig", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--timeout", type=float, default=1800, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.observe:
        asyncio.run(
            observe(Path(args.kubeconfig), NAMESPACE, args.jobs, Path(args.out), args.timeout)
        )
        return 0
    try:
        return asyncio.run(run_all(args))
    except ClusterError as err:
        print(err, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
