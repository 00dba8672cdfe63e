"""Seed 002 on the FAKE cluster: six 2-worker jobs (1 GPU per worker) on 4 GPUs, all at once.

Two runs over the same in-memory fake API (fake_k8s.py), with the pod placement played by the
test (it stands in for Volcano and the kubelet, which cannot run here):

- **without wmla and without gang scheduling**, as in the seed's first half: six PyTorchJobs
  created directly, every pod bound on its own as soon as a GPU is free. The checker sees jobs
  holding half a gang and none able to finish: the deadlock. This also shows that the checker
  can fail.
- **through wmla**: the real scheduler core decides, ``KubernetesBackend`` creates the
  PyTorchJobs and reports back. Every job finishes, and at no moment does a job hold part of
  its gang or do bound pods hold more than 4 GPUs.

The history is checked at every step, not only at the end (docs/scheduling.md, scenario S5).
"""

from __future__ import annotations

import asyncio

from extension.backends.base import BackendEvent, JobSpec
from extension.backends.kubernetes import PODS, PYTORCHJOBS, KubernetesBackend
from extension.backends.manifests import (
    job_object_name,
    make_container,
    make_pod_template,
    make_pytorchjob,
)
from extension.scheduler import (
    Instance,
    Job,
    JobState,
    Plan,
    PlanTree,
    Resources,
    SchedulerConfig,
    Snapshot,
    Start,
    schedule,
)

try:
    from tests.backends.fake_k8s import FakeKube
except ImportError:  # tests/backends is not a package: pytest put its folder on sys.path
    from fake_k8s import FakeKube

NS = "wmla"
GiB = 2**30
NODES = {"gpu-1": 2, "gpu-2": 2}  # 4 GPUs in all, as in the seed's small GPU pool


def fake_cluster() -> FakeKube:
    fake = FakeKube()
    for name, gpus in NODES.items():
        fake.add_node(name, gpu=gpus, cpu="8", memory="32Gi")
    return fake


def held(fake: FakeKube) -> dict[str, int]:
    """Job name -> pods bound to a node and not ended (each holds one GPU)."""
    out: dict[str, int] = {}
    for pod in fake.objects.get(PODS, {}).values():
        job = (
            pod["metadata"]["labels"].get("wmla.jupyter.org/job")
            or pod["metadata"]["labels"]["seed002/job"]
        )
        bound = pod["spec"].get("nodeName") and pod["status"].get("phase") == "Running"
        out[job] = out.get(job, 0) + (1 if bound else 0)
    return out


def free_gpus(fake: FakeKube) -> dict[str, int]:
    free = dict(NODES)
    for pod in fake.objects.get(PODS, {}).values():
        node = pod["spec"].get("nodeName")
        if node and pod["status"].get("phase") == "Running":
            free[node] -= 1
    return free


def check(fake: FakeKube, history: list[dict[str, int]]) -> None:
    now = held(fake)
    history.append(now)
    assert sum(now.values()) <= 4, f"more GPUs held than the cluster has: {now}"


def partial_gangs(history: list[dict[str, int]]) -> int:
    return sum(1 for sample in history if any(n == 1 for n in sample.values()))


async def test_without_gang_scheduling_the_six_jobs_deadlock():
    fake = fake_cluster()
    history: list[dict[str, int]] = []
    for i in range(6):
        labels = {"seed002/job": f"pytorch-t{i}"}
        template = make_pod_template(
            containers=[
                make_container(
                    name="pytorch", image="mnist", command=["python"], per_worker=Resources(1, 0, 0)
                )
            ],
            labels=labels,
            scheduler_name=None,
        )
        fake.add(
            PYTORCHJOBS,
            make_pytorchjob(
                name=f"pytorch-t{i}",
                namespace=NS,
                template=template,
                workers=2,
                queue="",
                labels=labels,
            ),
        )
    # The default scheduler binds each pod alone while a GPU is free, in creation order of the
    # six threads' requests: interleaved, master of every job first.
    for i in range(6):
        fake.make_pods(f"pytorch-t{i}", [], namespace=NS, ready=False)
    pending = sorted(
        (p for p in fake.objects[PODS].values()),
        key=lambda p: (p["metadata"]["name"][-8:], p["metadata"]["name"]),
    )
    for pod in pending:
        node = next((n for n, free in free_gpus(fake).items() if free > 0), None)
        if node is None:
            break
        fake.set_ready(pod["metadata"]["name"], node, namespace=NS)
        check(fake, history)
    # No job holds both workers, so none can start training, so none ever frees its GPU.
    final = held(fake)
    assert sum(final.values()) == 4 and max(final.values()) == 1
    assert partial_gangs(history) > 0


async def test_through_wmla_every_job_finishes_and_no_gang_is_ever_partial():
    fake = fake_cluster()
    events: list[BackendEvent] = []
    backend = KubernetesBackend(
        events.append,
        namespace=NS,
        api_factory=lambda: fake,
        backoff_initial=0.001,
        backoff_max=0.004,
        retry_deadline=0.05,
    )
    await backend.open()
    history: list[dict[str, int]] = []
    try:
        plans = PlanTree([Plan("/sample-project"), Plan("/sample-project/training")])
        leaf = plans.ensure_user_leaf("/sample-project/training", "alice").path
        await backend.sync_queues(plans)
        instance = backend.instance()
        assert instance.capacity.gpu == 4
        jobs = {
            f"t{i}": Job(
                id=f"t{i}",
                user="alice",
                plan="/sample-project/training",
                per_worker=Resources(1, 1000, 2 * GiB),
                min_workers=2,
                submitted=float(i),
            )
            for i in range(6)
        }
        specs = {
            job_id: JobSpec(
                id=job_id,
                user="alice",
                leaf=leaf,
                per_worker=job.per_worker,
                command=["python", "/gpfs/myresultfs/alice/models/mnist/main.py"],
                workdir=f"/gpfs/myresultfs/alice/jobs/{job_id}",
                min_workers=2,
                max_workers=2,
            )
            for job_id, job in jobs.items()
        }
        now, seen = 100.0, 0
        most_jobs_at_once = 0
        for _ in range(40):
            # 1. one cycle of the real core over the current state, then carry out the starts
            snapshot = Snapshot(
                plans, Instance(tuple(backend.capacity())), list(jobs.values()), SchedulerConfig()
            )
            for decision in schedule(snapshot, now).of(Start):
                job = jobs[decision.job_id]
                job.state, job.placement, job.started = JobState.RUNNING, decision.placement, now
                await backend.start(specs[job.id], decision.placement)
            most_jobs_at_once = max(most_jobs_at_once, len(fake.objects.get(PYTORCHJOBS, {})))
            # 2. Volcano and the kubelet: bind each new gang whole where the GPUs are free
            for _, name in list(fake.objects.get(PYTORCHJOBS, {})):
                if not fake.pods_of(name, NS):
                    free = [n for n, f in free_gpus(fake).items() for _ in range(f)]
                    assert len(free) >= 2, "wmla started a gang the cluster cannot hold"
                    fake.make_pods(name, free[:2], namespace=NS)
                    check(fake, history)
            await asyncio.sleep(0)
            # 3. the oldest running job finishes; the backend reports it
            running = [j for j in jobs.values() if j.state is JobState.RUNNING]
            for _ in range(200):
                if all(
                    any(e.job_id == j.id and e.kind == "running" for e in events) for j in running
                ):
                    break
                await asyncio.sleep(0)
            if running:
                oldest = min(running, key=lambda j: (j.started, j.id))
                fake.finish_job(job_object_name(oldest.id), namespace=NS)
                check(fake, history)
            for _ in range(200):
                await asyncio.sleep(0)
                if len(events) > seen and events[-1].kind == "finished":
                    break
            for event in events[seen:]:
                if event.kind == "finished":
                    jobs[event.job_id].state = JobState.FINISHED
                    jobs[event.job_id].placement = ()
                    # the finished job's pods are done: the TTL controller would remove the job
                    for pod in fake.pods_of(job_object_name(event.job_id), NS):
                        await fake.delete(PODS, NS, pod["metadata"]["name"], 0)
                    await fake.delete(PYTORCHJOBS, NS, job_object_name(event.job_id), 0)
                    fake.settle()
            seen = len(events)
            now += 60
            if all(j.state is JobState.FINISHED for j in jobs.values()):
                break
        assert {j.id: j.state for j in jobs.values()} == {
            f"t{i}": JobState.FINISHED for i in range(6)
        }
        assert partial_gangs(history) == 0
        assert most_jobs_at_once == 2  # 4 GPUs / 2 per gang: never a third PyTorchJob
        kinds = [e.kind for e in events]
        assert kinds.count("running") == 6 and kinds.count("finished") == 6
    finally:
        await backend.close()
