"""The KubernetesBackend against a real API server, Volcano, the training operator and KWOK
nodes (conftest.py). Each test would fail on a backend that got the objects wrong: Volcano,
not we, decides here whether a gang binds, and the API server's admission, not our fake, says
what it refuses."""

from __future__ import annotations

import asyncio
import json

import pytest

from extension.backends.base import AdmissionRefused, EventKind
from extension.backends.kubernetes import AdmissionRefused as K8sAdmissionRefused
from extension.backends.manifests import job_object_name, queue_name
from extension.scheduler import UNLIMITED, Plan, PlanTree, Resources

from .conftest import GiB, Recorder, Tenant, placed, until

RUNNING, FINISHED, RELEASED = EventKind.RUNNING, EventKind.FINISHED, EventKind.RELEASED


def tree(dev: float = 4, support: bool = True) -> PlanTree:
    plans = [
        Plan("/project1"),
        Plan("/project1/dev-team", dev, Resources(4, UNLIMITED, UNLIMITED)),
        Plan("/project1/qa-team", 2, Resources(2, UNLIMITED, UNLIMITED)),
    ]
    if support:
        plans.append(Plan("/project1/support-team", 2, Resources(2, UNLIMITED, UNLIMITED)))
    return PlanTree(plans)


def queues(t: Tenant) -> dict[str, dict]:
    out = json.loads(t.cluster.kubectl("get", "queues.scheduling.volcano.sh", "-o", "json"))
    return {q["metadata"]["name"]: q for q in out["items"]}


async def test_plans_are_volcano_queues_kept_in_step(tenant: Tenant) -> None:
    backend = await tenant.backend(Recorder())
    await backend.sync_queues(tree())
    teams = ("dev-team", "qa-team", "support-team")
    name = {
        p: queue_name(p, tenant.prefix) for p in ("/project1", *(f"/project1/{t}" for t in teams))
    }
    live = queues(tenant)
    assert live[tenant.prefix]["spec"]["parent"] == "root"
    assert live[name["/project1"]]["spec"]["parent"] == tenant.prefix
    weights = [live[name[f"/project1/{t}"]]["spec"]["weight"] for t in teams]
    assert weights == [400, 200, 200]
    assert live[name["/project1/dev-team"]]["spec"]["capability"]["nvidia.com/gpu"] == "4"
    assert live[name["/project1/qa-team"]]["spec"]["capability"]["nvidia.com/gpu"] == "2"
    # Volcano's queue controller opens what we create: the scheduler takes jobs from them
    await until(
        lambda: queues(tenant)[name["/project1/dev-team"]].get("status", {}).get("state") == "Open",
        "the dev-team queue open",
    )

    changed = await backend.sync_queues(tree(dev=6, support=False))
    assert changed.updated == [name["/project1/dev-team"]]
    assert changed.deleted == [name["/project1/support-team"]]
    live = queues(tenant)
    assert live[name["/project1/dev-team"]]["spec"]["weight"] == 600
    assert name["/project1/support-team"] not in live


def bound(t: Tenant, *job_ids: str) -> tuple[int, ...]:
    """How many pods of each job hold a node now (bound and not ended), from one list: one
    snapshot of the cluster for all of them."""
    pods = t.get("pods")
    return tuple(
        sum(
            1
            for p in pods
            if p["metadata"]["labels"].get("wmla.jupyter.org/job")
            == job_object_name(job_id, t.prefix)
            and p["spec"].get("nodeName")
            and p["status"].get("phase") not in ("Succeeded", "Failed")
        )
        for job_id in job_ids
    )


async def test_a_gang_binds_whole_or_not_at_all_and_finishes(tenant: Tenant) -> None:
    """Two 4-worker gangs on 4 GPUs: Volcano binds one whole gang, then the other; sampled all
    along, no job ever holds part of its gang."""
    events = Recorder()
    backend = await tenant.backend(events)
    await backend.sync_queues(tree())
    first, second = tenant.spec("gang-a", 4, "4s"), tenant.spec("gang-b", 4, "4s", user="bob")
    await backend.start(first, placed(first))
    await backend.start(second, placed(second))

    groups = {g["metadata"]["name"]: g for g in tenant.get("podgroups.scheduling.volcano.sh")}
    for job, user in (("gang-a", "alice"), ("gang-b", "bob")):
        group = groups[job_object_name(job, tenant.prefix)]
        assert group["spec"]["minMember"] == 4
        assert group["spec"]["queue"] == queue_name(f"/project1/dev-team/{user}", tenant.prefix)

    # Volcano decides a gang whole, then binds its pods one call each: a sample may catch a
    # gang between two of those calls, never one left holding part of its gang (seed 002's
    # deadlock: both gangs half bound and stuck).
    samples: list[tuple[float, int, int]] = []
    loop = asyncio.get_running_loop()

    async def sample() -> None:
        while any(events.kinds(job)[-1:] != [FINISHED] for job in ("gang-a", "gang-b")):
            samples.append((loop.time(), *bound(tenant, "gang-a", "gang-b")))
            await asyncio.sleep(0.1)

    await asyncio.wait_for(sample(), timeout=90)
    counts = [(a, b) for _, a, b in samples]
    assert (4, 0) in counts and (0, 4) in counts, counts  # each ran whole, one after the other
    assert all(a + b <= 4 for a, b in counts), counts  # 8 GPUs were never there
    assert not [(a, b) for a, b in counts if 0 < a < 4 and 0 < b < 4], counts
    for column in (1, 2):
        partial_since = None
        for sampled in samples:
            if 0 < sampled[column] < 4:
                partial_since = sampled[0] if partial_since is None else partial_since
                assert sampled[0] - partial_since < 2.0, f"a gang stayed partial: {counts}"
            else:
                partial_since = None
    for job in ("gang-a", "gang-b"):
        assert events.kinds(job) == [RUNNING, FINISHED]
        running = next(e for e in events.events if e.job_id == job and e.kind == RUNNING)
        assert sorted(running.placement) == ["kwok-node-0"] * 2 + ["kwok-node-1"] * 2
    finished = next(e for e in events.events if e.job_id == "gang-a" and e.kind == FINISHED)
    assert finished.exit_code in (0, None)


async def test_cancel_deletes_with_the_grace_and_releases_after_the_pods_are_gone(
    tenant: Tenant,
) -> None:
    events = Recorder()
    backend = await tenant.backend(events)
    await backend.sync_queues(tree())
    await backend.start(spec := tenant.spec("long", 2, "10m"), placed(spec))
    await until(lambda: events.kinds("long") == [RUNNING], "running")
    name = job_object_name("long", tenant.prefix)
    pods_at_release: list[int] = []

    def on_release() -> bool:
        if events.kinds("long")[-1:] == [RELEASED] and not pods_at_release:
            pods_at_release.append(len(tenant.get("pods", f"wmla.jupyter.org/job={name}")))
        return bool(pods_at_release)

    await backend.stop("long", 5, "cancelled by alice")
    await until(on_release, "released")
    assert pods_at_release == [0]
    assert events.kinds("long") == [RUNNING, RELEASED]
    assert not tenant.get("pytorchjobs")
    # the deletes carried the grace: the audit log has the service's calls with their queries
    audit = [
        json.loads(line)
        for line in (tenant.cluster.var / "logs" / "audit.log").read_text().splitlines()
        if f"system:serviceaccount:{tenant.namespace}:hub" in line
    ]
    deletes = [c["requestURI"] for c in audit if c["verb"] == "delete"]
    job_path = f"/apis/kubeflow.org/v1/namespaces/{tenant.namespace}/pytorchjobs/{name}?"
    assert any(uri.startswith(job_path) and "gracePeriodSeconds=5" in uri for uri in deletes)
    assert all("gracePeriodSeconds=5" in uri for uri in deletes if "/pods/" in uri), deletes


async def test_a_restarted_service_readopts_its_jobs_by_label(tenant: Tenant) -> None:
    first_events = Recorder()
    first = await tenant.backend(first_events)
    await first.sync_queues(tree())
    job = tenant.spec("kept", 2, "6s")
    await first.start(job, placed(job))
    await until(lambda: first_events.kinds("kept") == [RUNNING], "running")
    uid = tenant.get("pytorchjobs")[0]["metadata"]["uid"]
    await first.close()

    later = Recorder()
    second = await tenant.backend(later)
    await second.recover([job, tenant.spec("never-made")])
    assert later.kinds("never-made") == [EventKind.LOST]
    await until(lambda: later.kinds("kept") == [FINISHED], "the adopted job finishes", 60)
    (only,) = tenant.get("pytorchjobs")
    assert only["metadata"]["uid"] == uid  # adopted, not made again


async def test_quota_and_limit_range_refuse_as_the_api_server_does(tenant: Tenant) -> None:
    tenant.cluster.apply([
        {"apiVersion": "v1", "kind": "ResourceQuota",
         "metadata": {"name": "gpus", "namespace": tenant.namespace},
         "spec": {"hard": {"requests.nvidia.com/gpu": "2"}}},
        {"apiVersion": "v1", "kind": "LimitRange",
         "metadata": {"name": "sizes", "namespace": tenant.namespace},
         "spec": {"limits": [{"type": "Container", "max": {"cpu": "4", "memory": "32Gi"}}]}},
    ])  # fmt: skip
    events = Recorder()
    backend = await tenant.backend(events)
    await until(lambda: backend.quota().gpu == 2 and backend.limit_ranges(), "the watch saw both")

    small, large = Resources(1, 1000, 2 * GiB), Resources(1, 8000, 2 * GiB)
    assert backend.admission_problem(small, 2) is None
    over_quota = backend.admission_problem(small, 3)
    over_range = backend.admission_problem(large, 1)
    assert over_quota is not None and over_range is not None

    # what the API server itself says about the same pods (the operator makes them, as admin)

    def create(name: str, resources: Resources, dry_run: bool = False) -> str:
        body = tenant.spec(name, 1, per_worker=resources)
        doc = backend.build_job(body, 1)
        tmpl = next(iter(doc["spec"]["pytorchReplicaSpecs"].values()))["template"]
        manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                    "spec": {**tmpl["spec"], "schedulerName": "nobody"}}  # fmt: skip
        args = ["create", "-f", "-"] + (["--dry-run=server"] if dry_run else [])
        try:
            return tenant.kubectl(*args, input=json.dumps(manifest))
        except Exception as err:  # noqa: BLE001 - the refusal is what we look at
            return f"refused: {err}"

    assert "maximum cpu usage per Container is 4" in create("too-big", large, dry_run=True)
    assert "refused" not in create("q1", small)
    assert "refused" not in create("q2", small)
    third = create("q3", small)
    assert "exceeded quota" in third, third  # the third GPU pod: as our pre-check said

    with pytest.raises((AdmissionRefused, K8sAdmissionRefused)):
        await backend.start(spec := tenant.spec("gang-of-3", 3), placed(spec))
    assert not tenant.get("pytorchjobs")  # nothing half made


async def test_the_api_server_down_mid_run_loses_and_doubles_nothing(tenant: Tenant) -> None:
    events = Recorder()
    backend = await tenant.backend(events)
    await backend.sync_queues(tree())
    await backend.start(spec := tenant.spec("through", 2, "15s"), placed(spec))
    await until(lambda: events.kinds("through") == [RUNNING], "running")
    name = job_object_name("through", tenant.prefix)
    uid = tenant.get("pytorchjobs")[0]["metadata"]["uid"]

    tenant.cluster.stop_apiserver()
    try:
        # a call during the outage retries, and completes once the server is back
        during = tenant.spec("during", 1, "2s")
        late = asyncio.ensure_future(backend.start(during, placed(during)))
        await until(lambda: backend.api_failures > 0, "the backend noticed the outage")
        await asyncio.sleep(3)
        assert not late.done()
    finally:
        await asyncio.to_thread(tenant.cluster.start_apiserver)
    await asyncio.wait_for(late, 60)
    # the relists after the outage: nothing we run was taken for deleted or ended
    await asyncio.sleep(3)
    assert events.kinds("through") in ([RUNNING], [RUNNING, FINISHED])
    # Volcano's and the operator's informers are slow to come back here (restart_controllers)
    await asyncio.to_thread(tenant.cluster.restart_controllers)
    await until(lambda: events.kinds("through")[-1:] == [FINISHED], "finished", 120)
    await until(lambda: events.kinds("during")[-1:] == [FINISHED], "the late job finished", 120)
    assert events.kinds("through") == [RUNNING, FINISHED]
    assert events.kinds("during") == [RUNNING, FINISHED]
    jobs = {j["metadata"]["name"]: j["metadata"]["uid"] for j in tenant.get("pytorchjobs")}
    assert jobs.keys() == {name, job_object_name("during", tenant.prefix)}  # none doubled
    assert jobs[name] == uid


async def test_the_shipped_rbac_is_all_the_service_needs(tenant: Tenant) -> None:
    """The whole life of a job through the service's account: nothing it asked was forbidden
    (the audit log records each of its calls with the answer's code)."""
    events = Recorder()
    backend = await tenant.backend(events)
    await backend.sync_queues(tree())
    await backend.start(spec := tenant.spec("audited", 1, "1s"), placed(spec))
    await until(lambda: events.kinds("audited") == [RUNNING, FINISHED], "finished", 60)
    assert "KWOK node" in backend.logs("audited")  # fetched at the end: pods/log via "kubelet"
    await backend.start(spec := tenant.spec("stopped", 1, "10m"), placed(spec))
    await until(lambda: events.kinds("stopped") == [RUNNING], "running")
    await backend.stop("stopped", 1, "cancelled")
    await until(lambda: events.kinds("stopped")[-1:] == [RELEASED], "released")

    user = f"system:serviceaccount:{tenant.namespace}:hub"
    calls = [
        json.loads(line)
        for line in (tenant.cluster.var / "logs" / "audit.log").read_text().splitlines()
        if f'"username":"{user}"' in line
    ]
    assert len(calls) > 10  # the test sees the service's calls at all
    forbidden = [
        f"{c['verb']} {c['requestURI']}"
        for c in calls
        if c.get("responseStatus", {}).get("code") == 403
    ]
    assert forbidden == []
