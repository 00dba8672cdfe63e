"""KubernetesBackend's reconcile logic against the in-memory FAKE API server (fake_k8s.py).

The fake stands in for a Kubernetes API server, which cannot run here; the tests play the
training operator, Volcano and the kubelet through it (``make_pods``, ``finish_job``,
``settle``). Waiting is by condition (``until``), never by elapsed time.
"""

from __future__ import annotations

import asyncio

import pytest

from extension.backends.base import BackendEvent, JobSpec
from extension.backends.kubernetes import (
    LIMIT_RANGES,
    PODS,
    PYTORCHJOBS,
    QUEUES,
    QUOTAS,
    VOLCANO_JOBS,
    AdmissionRefused,
    ApiError,
    BackendError,
    KubernetesBackend,
)
from extension.backends.manifests import ManifestError, job_object_name, queue_name
from extension.scheduler import UNLIMITED, Plan, PlanTree, Resources

try:
    from tests.backends.fake_k8s import FakeKube
except ImportError:  # tests/backends is not a package: pytest put its folder on sys.path
    from fake_k8s import FakeKube

GiB = 2**30
NS = "wmla"


def spec(job_id="job-1", user="alice", workers=(1, 1), per_worker=(1, 1000, 2 * GiB), **kw):
    return JobSpec(
        id=job_id,
        user=user,
        leaf=kw.pop("leaf", f"/project1/dev-team/{user}"),
        per_worker=Resources(*per_worker),
        command=["python", "main.py"],
        workdir=f"/gpfs/myresultfs/{user}/jobs/{job_id}",
        min_workers=workers[0],
        max_workers=workers[1],
        **kw,
    )


class Recorder:
    def __init__(self) -> None:
        self.events: list[BackendEvent] = []

    def __call__(self, event: BackendEvent) -> None:
        self.events.append(event)

    def kinds(self, job_id: str) -> list[str]:
        return [e.kind for e in self.events if e.job_id == job_id]

    def last(self, job_id: str) -> BackendEvent:
        return [e for e in self.events if e.job_id == job_id][-1]


async def until(condition, what: str, limit: int = 5000) -> None:
    """Let the watch tasks run until ``condition()`` holds: first turns of the event loop, then
    short naps (some steps wait on the clock, e.g. for a failed pod's exit code); bounded, as a
    guard against hangs, not a timing assertion."""
    for turn in range(limit):
        if condition():
            return
        await asyncio.sleep(0 if turn < 1000 else 0.005)
    raise AssertionError(f"never happened: {what() if callable(what) else what}")


def cluster(quota: dict | None = None, limit_range: list | None = None) -> FakeKube:
    fake = FakeKube()
    fake.add_node("gpu-1", gpu=4)
    fake.add_node("gpu-2", gpu=4)
    fake.add_node("cordoned", gpu=4, unschedulable=True)
    fake.add_node("broken", gpu=4, ready="False")
    fake.add_node("cpu-1", gpu=0, labels={"pool": "cpu"})
    if quota is not None:
        fake.add(
            QUOTAS,
            {"metadata": {"name": "quota-test", "namespace": NS}, "spec": {"hard": quota}},
        )
    if limit_range is not None:
        fake.add(
            LIMIT_RANGES,
            {"metadata": {"name": "lr-test", "namespace": NS}, "spec": {"limits": limit_range}},
        )
    return fake


def make_backend(fake: FakeKube, events: Recorder, **kw) -> KubernetesBackend:
    return KubernetesBackend(
        events,
        namespace=NS,
        api_factory=lambda: fake,
        backoff_initial=0.001,
        backoff_max=0.004,
        retry_deadline=0.05,
        clock=lambda: 1000.0,
        **kw,
    )


@pytest.fixture
async def setup():
    """A fake cluster with a quota, and a backend watching it; closed whatever happens."""
    fake = cluster(quota={"requests.nvidia.com/gpu": "6", "pods": "20"})
    events = Recorder()
    backend = make_backend(fake, events)
    await backend.open()
    try:
        yield fake, backend, events
    finally:
        await backend.close()


def creates(fake: FakeKube, kind: str) -> list:
    return [c for c in fake.calls if c[0] == "create" and c[1] == kind]


# -- capacity ----------------------------------------------------------------------------------
async def test_capacity_is_ready_nodes_allocatable_cut_by_the_quota(setup):
    fake, backend, _ = setup
    nodes = {n.name: n.capacity for n in backend.capacity()}
    assert nodes == {
        "gpu-1": Resources(4, 16000, 64 * GiB),
        "gpu-2": Resources(4, 16000, 64 * GiB),
        "cpu-1": Resources(0, 16000, 64 * GiB),
    }
    assert backend.quota() == Resources(6, UNLIMITED, UNLIMITED)
    assert backend.instance().capacity == Resources(6, 48000, 192 * GiB)


async def test_capacity_follows_the_watch_and_the_node_selector():
    fake, events = cluster(), Recorder()
    backend = make_backend(fake, events, node_selector={"pool": "cpu"})
    await backend.open()
    try:
        assert [n.name for n in backend.capacity()] == ["cpu-1"]
        fake.add_node("cpu-2", gpu=0, labels={"pool": "cpu"})
        await until(lambda: len(backend.capacity()) == 2, "the new node is seen")
    finally:
        await backend.close()


# -- start, run, stop, finish, fail --------------------------------------------------------------
async def test_start_creates_one_pytorchjob_and_reports_running_where_pods_landed(setup):
    fake, backend, events = setup
    job = spec(workers=(2, 2))
    await backend.start(job, ("gpu-1", "gpu-1"))
    assert len(creates(fake, PYTORCHJOBS)) == 1
    assert creates(fake, PODS) == []  # the operator makes the pods, not us
    name = job_object_name("job-1")
    obj = fake.job(name, NS)
    assert obj["spec"]["runPolicy"]["schedulingPolicy"] == {
        "minAvailable": 2,
        "queue": queue_name("/project1/dev-team/alice"),
    }
    # the user leaf's queue (and its parents) exist before the job names it
    assert {q for (_, q) in fake.objects[QUEUES]} >= {
        "wmla",
        queue_name("/project1"),
        queue_name("/project1/dev-team"),
        queue_name("/project1/dev-team/alice"),
    }
    assert events.kinds("job-1") == []
    fake.make_pods(name, ["gpu-2", "gpu-1"], namespace=NS)
    await until(lambda: events.kinds("job-1") == ["running"], "running")
    assert events.last("job-1").placement == ("gpu-2", "gpu-1")  # master (rank 0) first


async def test_stop_deletes_with_the_grace_and_releases_when_the_pods_are_gone(setup):
    fake, backend, events = setup
    name = job_object_name("job-1")
    await backend.start(spec(workers=(2, 2)), ("gpu-1", "gpu-2"))
    fake.make_pods(name, ["gpu-1", "gpu-2"], namespace=NS)
    await until(lambda: events.kinds("job-1") == ["running"], "running")

    await backend.stop("job-1", 30, "preempted for job-9")
    deletes = [c for c in fake.calls if c[0] == "delete"]
    assert deletes[0] == ("delete", PYTORCHJOBS, name, (30, "Foreground"))
    assert sorted(c[2] for c in deletes[1:]) == [f"{name}-master-0", f"{name}-worker-0"]
    assert all(c[3] == (30, None) for c in deletes[1:])
    await until(
        lambda: fake.pods_of(name, NS)[0]["metadata"].get("deletionTimestamp"), "terminating"
    )
    assert events.kinds("job-1") == ["running"]  # still holding its GPUs during the grace

    fake.settle()  # the grace period ends
    await until(lambda: events.kinds("job-1") == ["running", "released"], "released")
    assert events.last("job-1").message == "preempted for job-9"


async def test_a_finished_job_emits_finished_with_the_logs_fetched(setup):
    fake, backend, events = setup
    name = job_object_name("job-1")
    await backend.start(spec(workers=(2, 2)), ("gpu-1", "gpu-2"))
    fake.make_pods(name, ["gpu-1", "gpu-2"], namespace=NS)
    fake.logs[f"{name}-master-0"] = "epoch 4 accuracy 0.97"
    fake.finish_job(name, namespace=NS)
    await until(lambda: "finished" in events.kinds("job-1"), "finished")
    assert events.kinds("job-1") == ["running", "finished"]
    assert backend.logs("job-1", worker=0) == "epoch 4 accuracy 0.97"
    assert backend.logs("job-1") == "[worker 0] epoch 4 accuracy 0.97"


async def test_a_failed_worker_fails_the_job_with_its_exit_code_and_log_tail(setup):
    fake, backend, events = setup
    name = job_object_name("job-1")
    await backend.start(spec(workers=(2, 2)), ("gpu-1", "gpu-2"))
    fake.make_pods(name, ["gpu-1", "gpu-2"], namespace=NS)
    fake.logs[f"{name}-worker-0"] = "step 1\nRuntimeError: CUDA out of memory"
    fake.finish_job(name, succeeded=False, exit_code=3, failed_rank=1, namespace=NS)
    await until(lambda: "failed" in events.kinds("job-1"), "failed")
    failed = events.last("job-1")
    assert failed.exit_code == 3
    assert "CUDA out of memory" in failed.message


async def test_a_failure_keeps_its_exit_code_reason_and_log_after_the_operator_deletes_pods(
    setup,
):
    """The training operator (v1.9) deletes a failed job's pods about a second after they
    end, often before the job's Failed condition is seen (found on a real node)."""
    fake, backend, events = setup
    name = job_object_name("job-1")
    await backend.start(spec(workers=(2, 2)), ("gpu-1", "gpu-2"))
    fake.make_pods(name, ["gpu-1", "gpu-2"], namespace=NS)
    await until(lambda: events.kinds("job-1") == ["running"], "running")
    fake.logs[f"{name}-worker-0"] = "allocating 1 GiB"
    fake.fail_pod(f"{name}-worker-0", 137, "OOMKilled", namespace=NS)
    await until(lambda: backend.logs("job-1", worker=1) == "allocating 1 GiB", "log kept")
    fake.delete_pods(name, NS)  # the operator's cleanup, before the job's condition is seen
    await until(lambda: not backend.cache.pods_of(name), "pods gone")
    fake.set_job_failed(name, NS)
    await until(lambda: "failed" in events.kinds("job-1"), "failed")
    failed = events.last("job-1")
    assert failed.exit_code == 137 and failed.placement == ("gpu-1", "gpu-2")
    assert "OOMKilled (exit code 137)" in failed.message and "allocating 1 GiB" in failed.message


async def test_a_failure_seen_only_in_its_pods_deletion_keeps_its_exit_code_and_reason(setup):
    """On the real node the watch sometimes delivered the pod's failure and its deletion as one
    change: the DELETED event's last status is where the exit code and reason are then."""
    fake, backend, events = setup
    name = job_object_name("job-1")
    await backend.start(spec(workers=(2, 2)), ("gpu-1", "gpu-2"))
    fake.make_pods(name, ["gpu-1", "gpu-2"], namespace=NS)
    await until(lambda: events.kinds("job-1") == ["running"], "running")
    fake.delete_failed_pod(f"{name}-worker-0", 137, "OOMKilled", namespace=NS)
    fake.delete_pods(name, NS)
    await until(lambda: not backend.cache.pods_of(name), "pods gone")
    fake.set_job_failed(name, NS)
    await until(lambda: "failed" in events.kinds("job-1"), "failed")
    failed = events.last("job-1")
    assert failed.exit_code == 137 and "worker 1: OOMKilled (exit code 137)" in failed.message


async def test_a_pod_that_never_becomes_ready_keeps_the_job_pending_and_says_why(setup):
    fake, backend, events = setup
    name = job_object_name("job-1")
    await backend.start(spec(workers=(2, 2)), ("gpu-1", "gpu-2"))
    await until(lambda: backend.cache.get(PYTORCHJOBS, name) is not None, "job seen")
    assert backend.describe("job-1") == (
        f"0 of 2 pods created so far by the training operator "
        f"(queue {queue_name('/project1/dev-team/alice')})"
    )
    fake.make_pods(name, [], namespace=NS, ready=False)
    await until(lambda: len(backend.cache.pods_of(name)) == 2, "pods seen")
    assert events.kinds("job-1") == []
    assert backend.describe("job-1") == (
        f"pod {name}-master-0 not ready: Unschedulable: "
        "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
    )
    fake.set_ready(f"{name}-master-0", "gpu-1", namespace=NS)
    await until(lambda: backend.describe("job-1").startswith(f"pod {name}-worker-0"), "one left")
    assert events.kinds("job-1") == []  # half a gang is not running
    fake.set_ready(f"{name}-worker-0", "gpu-2", namespace=NS)
    await until(lambda: events.kinds("job-1") == ["running"], "running")


async def test_a_job_deleted_behind_our_back_fails(setup):
    fake, backend, events = setup
    name = job_object_name("job-1")
    await backend.start(spec(), ("gpu-1",))
    await until(lambda: backend.cache.get(PYTORCHJOBS, name) is not None, "seen")
    await fake.delete(PYTORCHJOBS, NS, name)
    fake.settle()
    await until(lambda: events.kinds("job-1") == ["failed"], "failed")
    assert "deleted outside wmla" in events.last("job-1").message


async def test_volcano_job_kind_creates_a_batch_volcano_job():
    fake, events = cluster(), Recorder()
    backend = make_backend(fake, events, job_kind="volcanojob")
    await backend.open()
    try:
        await backend.start(spec(workers=(3, 3)), ("gpu-1",) * 3)
        name = job_object_name("job-1")
        obj = fake.job(name, NS, kind=VOLCANO_JOBS)
        assert obj["apiVersion"] == "batch.volcano.sh/v1alpha1" and obj["spec"]["minAvailable"] == 3
        fake.make_pods(name, ["gpu-1"], namespace=NS, kind=VOLCANO_JOBS)
        await until(lambda: events.kinds("job-1") == ["running"], "running")
        fake.finish_job(name, namespace=NS, kind=VOLCANO_JOBS)
        await until(lambda: events.kinds("job-1") == ["running", "finished"], "finished")
    finally:
        await backend.close()


# -- elastic -------------------------------------------------------------------------------------
async def test_elastic_grow_and_shrink_patch_the_worker_replicas(setup):
    fake, backend, events = setup
    name = job_object_name("job-1")
    job = spec(workers=(1, 4))
    await backend.start(job, ("gpu-1", "gpu-1"))
    fake.make_pods(name, ["gpu-1"], namespace=NS)
    await until(lambda: events.kinds("job-1") == ["running"], "running")

    await backend.resize(job, ("gpu-1",) * 4, grace=30)
    assert (
        "patch",
        PYTORCHJOBS,
        name,
        {"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 4}}}},
    ) in fake.calls
    fake.make_pods(name, ["gpu-2"], namespace=NS)
    await until(lambda: events.kinds("job-1") == ["running", "resized"], "grown")
    assert len(events.last("job-1").placement) == 4

    await backend.resize(job, ("gpu-1",), grace=30)
    for index in (1, 2, 3):  # the operator removes the highest ranks
        await fake.delete(PODS, NS, f"{name}-worker-{index}", 30)
    fake.settle()
    await until(
        lambda: events.kinds("job-1")[-1:] == ["resized"] and len(events.events) == 3, "shrunk"
    )
    assert events.last("job-1").placement == ("gpu-1",)  # worker 0 stays

    with pytest.raises(BackendError, match="outside 1..4"):
        await backend.resize(job, ("gpu-1",) * 5, grace=30)
    with pytest.raises(BackendError, match="not an elastic"):
        await backend.resize(spec(), ("gpu-1",), grace=30)


# -- quota and LimitRange: refuse before creating anything ---------------------------------------
async def test_a_gang_the_quota_would_cut_is_refused_before_anything_is_created():
    fake, events = cluster(quota={"pods": "3", "requests.nvidia.com/gpu": "4"}), Recorder()
    backend = make_backend(fake, events)
    await backend.open()
    try:
        with pytest.raises(AdmissionRefused, match="pods") as refused:
            await backend.start(spec(workers=(4, 4), per_worker=(0, 100, GiB)), ("gpu-1",) * 4)
        assert refused.value.permanent
        assert creates(fake, PYTORCHJOBS) == [] and creates(fake, QUEUES) == []

        # Two 2-worker gangs of 1 GPU each under a 4-GPU quota: the first is created; its pods
        # are not there yet, yet they count, so the second (3 pods > 3) is refused whole.
        await backend.start(spec("a", workers=(2, 2)), ("gpu-1", "gpu-1"))
        with pytest.raises(AdmissionRefused, match="no room: pods 2 in use") as refused:
            await backend.start(spec("b", workers=(2, 2)), ("gpu-2", "gpu-2"))
        assert not refused.value.permanent
        assert len(creates(fake, PYTORCHJOBS)) == 1
        fake.make_pods(job_object_name("a"), ["gpu-1"], namespace=NS)
        await until(lambda: "running" in events.kinds("a"), "a running")
        # what the real API server charges agrees with what was counted in flight
        quota = fake.objects[QUOTAS][(NS, "quota-test")]
        assert quota["status"]["used"]["requests.nvidia.com/gpu"] == "2"
        with pytest.raises(AdmissionRefused, match=r"requests.nvidia.com/gpu 2 in use \+ 3"):
            await backend.start(spec("c", workers=(1, 1), per_worker=(3, 100, GiB)), ("gpu-2",))
    finally:
        await backend.close()


SEED_LIMITS = [
    {
        "type": "Container",
        "max": {"cpu": "1", "memory": "1Gi"},
        "min": {"cpu": "100m", "memory": "100Mi"},
        "default": {"cpu": "900m", "memory": "800Mi"},
        "defaultRequest": {"cpu": "200m", "memory": "200Mi"},
        "maxLimitRequestRatio": {"cpu": "2", "memory": "1.5"},
    },
    {"type": "Pod", "max": {"cpu": "2", "memory": "2Gi"}},
]


@pytest.mark.parametrize(
    "per_worker,message",
    [
        ((0, 2000, GiB), "Container cpu request 2 is above the maximum 1"),
        ((0, 500, 2 * GiB), "Container memory request 2Gi is above the maximum 1Gi"),
        ((0, 50, GiB // 2), "Container cpu request 50m is below the minimum 100m"),
        ((0, 0, GiB // 2), "cpu limit/request ratio 4.5 is above 2"),
    ],
    ids=["cpu-over-max", "memory-over-max", "cpu-under-min", "default-breaks-ratio"],
)
async def test_the_seed_limit_range_refuses_before_creating(per_worker, message):
    fake, events = cluster(limit_range=SEED_LIMITS), Recorder()
    backend = make_backend(fake, events)
    await backend.open()
    try:
        with pytest.raises(AdmissionRefused, match="LimitRange lr-test") as refused:
            await backend.start(spec(per_worker=per_worker), ("gpu-1",))
        assert message in str(refused.value) and refused.value.permanent
        assert creates(fake, PYTORCHJOBS) == []
    finally:
        await backend.close()


async def test_limit_range_defaults_are_what_the_quota_charges():
    fake = cluster(
        quota={"requests.cpu": "2", "requests.memory": "2Gi"}, limit_range=SEED_LIMITS[1:]
    )
    fake.objects[LIMIT_RANGES][(NS, "lr-test")]["spec"]["limits"].append(
        {"type": "Container", "defaultRequest": {"cpu": "600m"}, "default": {"cpu": "600m"}}
    )
    events = Recorder()
    backend = make_backend(fake, events)
    await backend.open()
    try:
        # cpu left at 0: the default request 600m is charged, so 4 workers (2400m) cannot fit
        with pytest.raises(AdmissionRefused, match="requests.cpu 2400m"):
            await backend.start(
                spec(workers=(4, 4), per_worker=(0, 0, 100 * 2**20)), ("cpu-1",) * 4
            )
        await backend.start(spec(workers=(3, 3), per_worker=(0, 0, 100 * 2**20)), ("cpu-1",) * 3)
    finally:
        await backend.close()


async def test_bad_input_is_refused_before_any_call(setup):
    fake, backend, _ = setup
    before = len(fake.calls)
    with pytest.raises(ManifestError, match="user name"):
        await backend.start(spec(user="../root", leaf="/project1/x"), ("gpu-1",))
    with pytest.raises(ManifestError, match="outside alice's folder"):
        await backend.start(
            JobSpec("j", "alice", "/p/alice", Resources(1, 0, 0), ["x"], "/etc"), ("gpu-1",)
        )
    assert fake.calls[before:] == []


# -- conflicts, outages, restarts ----------------------------------------------------------------
async def test_a_create_that_landed_before_the_answer_was_lost_is_adopted(setup):
    fake, backend, events = setup
    job = spec(workers=(2, 2))
    fake.add(PYTORCHJOBS, backend.build_job(job, 2))  # the first try got through
    await backend.start(job, ("gpu-1", "gpu-2"))
    assert len(fake.objects[PYTORCHJOBS]) == 1
    fake.make_pods(job_object_name("job-1"), ["gpu-1"], namespace=NS)
    await until(lambda: events.kinds("job-1") == ["running"], "running")


async def test_a_foreign_object_with_our_name_is_not_taken(setup):
    fake, backend, _ = setup
    body = backend.build_job(spec(), 1)
    body["metadata"]["annotations"]["wmla.jupyter.org/job-id"] = "someone-else"
    fake.add(PYTORCHJOBS, body)
    with pytest.raises(BackendError, match="is not job job-1's"):
        await backend.start(spec(), ("gpu-1",))
    assert "job-1" not in backend.tracking


async def test_a_restart_waits_for_the_previous_run_to_terminate(setup):
    fake, backend, events = setup
    job = spec(workers=(2, 2))
    old = backend.build_job(job, 2)
    fake.add(PYTORCHJOBS, old)
    await fake.delete(PYTORCHJOBS, NS, old["metadata"]["name"], 30)  # still in its grace
    started = asyncio.ensure_future(backend.start(job, ("gpu-1", "gpu-2")))
    await until(lambda: ("get", PYTORCHJOBS, old["metadata"]["name"], None) in fake.calls, "409")
    assert not started.done()
    fake.settle()
    await started
    assert fake.job(old["metadata"]["name"], NS)["metadata"].get("deletionTimestamp") is None


async def test_the_api_server_down_then_up(setup):
    fake, backend, events = setup
    name = job_object_name("job-1")
    await backend.start(spec(workers=(2, 2)), ("gpu-1", "gpu-2"))
    fake.make_pods(name, ["gpu-1", "gpu-2"], namespace=NS)
    await until(lambda: events.kinds("job-1") == ["running"], "running")

    fake.go_down()
    failures = backend.api_failures
    # a call while it is down is retried, then gives up clearly without changing anything
    with pytest.raises(BackendError, match="did not answer"):
        await backend.start(spec("job-2"), ("gpu-1",))
    assert "job-2" not in backend.tracking
    # the job finishes while we cannot see it
    fake.finish_job(name, namespace=NS)
    await asyncio.sleep(0)
    assert events.kinds("job-1") == ["running"]

    fake.come_up()
    await until(lambda: events.kinds("job-1") == ["running", "finished"], "finished after relist")
    assert backend.api_failures > failures
    # and calls work again: one that started during the outage completes once it is back
    fake.go_down()
    late = asyncio.ensure_future(backend.start(spec("job-3"), ("gpu-1",)))
    await until(lambda: backend.api_failures > failures + 3, "retrying")
    fake.come_up()
    await late
    assert fake.job(job_object_name("job-3"), NS) is not None


async def test_an_expired_watch_lists_again(setup):
    fake, backend, events = setup
    name = job_object_name("job-1")
    await backend.start(spec(), ("gpu-1",))
    fake.compact(PODS)  # the server forgets the history: the resumed watch gets 410 Gone
    fake.make_pods(name, ["gpu-1"], namespace=NS)
    await until(lambda: events.kinds("job-1") == ["running"], "running after relist")


async def test_a_restarted_service_readopts_its_jobs_by_label():
    fake, events = cluster(), Recorder()
    first = make_backend(fake, events)
    await first.open()
    running, pending = spec("run", workers=(2, 2)), spec("wait", workers=(2, 2))
    await first.start(running, ("gpu-1", "gpu-2"))
    await first.start(pending, ("gpu-1", "gpu-2"))
    fake.make_pods(job_object_name("run"), ["gpu-1", "gpu-2"], namespace=NS)
    await until(lambda: events.kinds("run") == ["running"], "running")
    await first.close()
    assert not [c for c in fake.calls if c[0] == "delete"]  # jobs outlive the service
    assert fake.closed == 1

    later = Recorder()
    second = make_backend(fake, later)
    try:
        await second.recover([running, pending, spec("gone")])
        assert later.kinds("gone") == ["lost"]
        assert later.kinds("run") == [] and later.kinds("wait") == []  # already reported
        fake.make_pods(job_object_name("wait"), ["gpu-1", "gpu-2"], namespace=NS)
        await until(lambda: later.kinds("wait") == ["running"], "pending job runs")
        fake.finish_job(job_object_name("run"), namespace=NS)
        await until(lambda: later.kinds("run") == ["finished"], "adopted job finishes")
        await second.stop("wait", 5, "cancelled")
        fake.settle()
        await until(lambda: later.kinds("wait") == ["running", "released"], "released")
    finally:
        await second.close()


async def test_stopping_an_unknown_job_releases_at_once(setup):
    _, backend, events = setup
    await backend.stop("never-started", 30, "cancelled")
    assert events.kinds("never-started") == ["released"]


# -- queues ---------------------------------------------------------------------------------------
def s1_tree(dev_share: float = 4) -> PlanTree:
    return PlanTree(
        [
            Plan("/project1"),
            Plan("/project1/dev-team", dev_share, Resources(4, UNLIMITED, UNLIMITED)),
            Plan("/project1/qa-team", 2, Resources(2, UNLIMITED, UNLIMITED)),
            Plan("/project1/support-team", 2, Resources(2, UNLIMITED, UNLIMITED)),
        ]
    )


async def test_sync_queues_mirrors_the_plan_tree(setup):
    fake, backend, _ = setup
    result = await backend.sync_queues(s1_tree())
    dev, project = queue_name("/project1/dev-team"), queue_name("/project1")
    assert sorted(result.created) == sorted(
        [
            "wmla",
            project,
            dev,
            queue_name("/project1/qa-team"),
            queue_name("/project1/support-team"),
        ]
    )
    queues = {name: q for (_, name), q in fake.objects[QUEUES].items()}
    assert queues["wmla"]["spec"]["parent"] == "root"
    assert queues["wmla"]["spec"]["capability"] == {"nvidia.com/gpu": "6"}  # the namespace quota
    assert queues[dev]["spec"] == {
        "weight": 400,
        "reclaimable": True,
        "parent": project,
        "capability": {"nvidia.com/gpu": "4"},
    }
    await until(lambda: backend.cache.get(QUEUES, dev) is not None, "cache has the queues")
    again = await backend.sync_queues(s1_tree())
    assert (again.created, again.updated, again.deleted) == ([], [], [])

    changed = await backend.sync_queues(s1_tree(dev_share=3))
    assert changed.updated == [dev]
    assert fake.objects[QUEUES][(None, dev)]["spec"]["weight"] == 300


async def test_queue_update_conflicts_are_retried(setup):
    fake, backend, _ = setup
    await backend.sync_queues(s1_tree())
    dev = queue_name("/project1/dev-team")
    await until(lambda: backend.cache.get(QUEUES, dev) is not None, "cache has the queues")
    fake.bump(QUEUES, dev)  # someone else wrote it: our resourceVersion is stale
    fake.fail_next("replace", QUEUES, ApiError(409, "Conflict", "modified"))
    result = await backend.sync_queues(s1_tree(dev_share=1))
    assert result.updated == [dev]
    assert fake.objects[QUEUES][(None, dev)]["spec"]["weight"] == 100
    assert [c[0] for c in fake.calls if c[1] == QUEUES][-3:] == ["replace", "get", "replace"]


async def test_removed_plans_lose_their_queues_unless_a_job_still_uses_one(setup):
    fake, backend, _ = setup
    await backend.sync_queues(s1_tree())
    await backend.start(spec(leaf="/project1/qa-team/alice"), ("gpu-1",))
    smaller = PlanTree([Plan("/project1"), Plan("/project1/dev-team", 4)])
    await until(lambda: len(backend.cache.all(QUEUES)) == 6, "cache has the queues")
    result = await backend.sync_queues(smaller)
    assert result.deleted == [queue_name("/project1/support-team")]
    assert sorted(result.kept) == sorted(
        [queue_name("/project1/qa-team"), queue_name("/project1/qa-team/alice")]
    )


# -- RBAC ------------------------------------------------------------------------------------------
_VERBS = {"replace": "update", "read_log": "get"}
_RESOURCES = {
    "nodes": ("", "nodes"),
    "pods": ("", "pods"),
    "resourcequotas": ("", "resourcequotas"),
    "limitranges": ("", "limitranges"),
    "pytorchjobs": ("kubeflow.org", "pytorchjobs"),
    "volcanojobs": ("batch.volcano.sh", "jobs"),
    "queues": ("scheduling.volcano.sh", "queues"),
}


def _granted(path) -> set[tuple[str, str, str, bool]]:
    import yaml

    granted = set()
    for doc in yaml.safe_load_all(path.read_text()):
        if doc["kind"] not in ("Role", "ClusterRole"):
            continue
        for rule in doc["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        granted.add((group, resource, verb, doc["kind"] == "ClusterRole"))
    return granted


@pytest.mark.parametrize("job_kind", ["pytorchjob", "volcanojob"])
async def test_the_shipped_rbac_grants_every_call_the_backend_makes(job_kind):
    import pathlib

    fake, events = cluster(quota={"pods": "50"}), Recorder()
    backend = make_backend(fake, events, job_kind=job_kind)
    await backend.open()
    kind = PYTORCHJOBS if job_kind == "pytorchjob" else VOLCANO_JOBS
    try:
        job = spec(workers=(1, 2) if job_kind == "pytorchjob" else (1, 1))
        await backend.start(job, ("gpu-1",))
        name = job_object_name("job-1")
        fake.make_pods(name, ["gpu-1"], namespace=NS, kind=kind)
        await until(lambda: events.kinds("job-1") == ["running"], "running")
        if job_kind == "pytorchjob":
            await backend.resize(job, ("gpu-1", "gpu-2"), grace=1)
        await backend.fetch_logs("job-1")
        await backend.sync_queues(s1_tree())
        await until(lambda: len(backend.cache.all(QUEUES)) >= 5, "queues cached")
        fake.fail_next("replace", QUEUES, ApiError(409, "Conflict", "modified"))
        await backend.sync_queues(s1_tree(dev_share=1))
        await backend.sync_queues(PlanTree([Plan("/project1")]))
        await backend.stop("job-1", 1, "cancelled")
    finally:
        await backend.close()
    used = {(*_RESOURCES[k], _VERBS.get(v, v), k in ("nodes", "queues")) for v, k, *_ in fake.calls}
    used = {(g, r + "/log" if v == "get" and r == "pods" else r, v, c) for g, r, v, c in used}
    granted = _granted(pathlib.Path(__file__).resolve().parents[2] / "hub_config/k8s/rbac.yaml")
    missing = {u for u in used if u not in granted and (*u[:3], True) not in granted}
    assert missing == set()
    assert {v for _, _, v, _ in used} >= {"list", "watch", "create", "delete", "get", "update"}


# -- opening, and receivers that misbehave ------------------------------------------------
async def test_open_says_what_it_could_not_list_in_time():
    fake, events = cluster(), Recorder()
    fake.go_down()
    backend = make_backend(fake, events)
    try:
        with pytest.raises(BackendError, match="did not list limitranges, nodes, pods"):
            await backend.open(timeout=0.05)
        fake.come_up()
        await backend.open(timeout=5)  # the loops kept trying
        assert [n.name for n in backend.capacity()] == ["cpu-1", "gpu-1", "gpu-2"]
    finally:
        await backend.close()


async def test_no_cluster_configuration_is_a_clear_error():
    def factory():
        raise RuntimeError("Invalid kube-config file. No configuration found.")

    backend = KubernetesBackend(Recorder(), namespace=NS, api_factory=factory)
    with pytest.raises(BackendError, match="set KUBECONFIG"):
        await backend.open()


async def test_a_receiver_that_raises_does_not_stop_the_watch(setup):
    fake, backend, events = setup
    calls = []

    def broken(event):
        calls.append(event.kind)
        raise RuntimeError("receiver bug")

    backend.emit = broken
    name = job_object_name("job-1")
    await backend.start(spec(), ("gpu-1",))
    fake.make_pods(name, ["gpu-1"], namespace=NS)
    await until(lambda: calls == ["running"], "running despite the error")
    fake.finish_job(name, namespace=NS)
    await until(lambda: calls == ["running", "finished"], "the watch is still alive")


async def test_a_job_that_ended_while_the_service_was_away_reports_only_the_end():
    fake, events = cluster(), Recorder()
    first = make_backend(fake, events)
    await first.open()
    job = spec(workers=(2, 2))
    await first.start(job, ("gpu-1", "gpu-2"))
    fake.make_pods(job_object_name("job-1"), ["gpu-1", "gpu-2"], namespace=NS)
    await until(lambda: events.kinds("job-1") == ["running"], "running")
    await first.close()
    fake.finish_job(job_object_name("job-1"), namespace=NS)

    later = Recorder()
    second = make_backend(fake, later)
    try:
        await second.recover([job])
        await until(lambda: later.kinds("job-1") == ["finished"], "finished only")
    finally:
        await second.close()


async def test_queues_are_deleted_children_first(setup):
    fake, backend, _ = setup
    await backend.sync_queues(s1_tree())
    await until(lambda: len(backend.cache.all(QUEUES)) == 5, "cache has the queues")
    result = await backend.sync_queues(PlanTree())
    project = queue_name("/project1")
    assert result.deleted[-1] == project and len(result.deleted) == 4  # the instance queue stays
    deleted = [c[2] for c in fake.calls if c[0] == "delete" and c[1] == QUEUES]
    assert deleted.index(project) > deleted.index(queue_name("/project1/dev-team"))


async def test_an_object_count_quota_is_respected():
    fake = cluster(quota={"count/pytorchjobs.kubeflow.org": "1"})
    events = Recorder()
    backend = make_backend(fake, events)
    await backend.open()
    try:
        await backend.start(spec("a"), ("gpu-1",))
        await until(
            lambda: backend.cache.get(QUOTAS, "quota-test").get("status", {}).get("used"),
            "the quota counts the job",
        )
        with pytest.raises(AdmissionRefused, match="count/pytorchjobs.kubeflow.org 1 in use"):
            await backend.start(spec("b"), ("gpu-1",))
        assert len(creates(fake, PYTORCHJOBS)) == 1
    finally:
        await backend.close()


# -- random histories: every job's events follow the protocol -------------------------------------
TERMINAL = {"finished", "failed", "released", "lost"}


def protocol_errors(kinds: list[str]) -> list[str]:
    """Events of one job must read: [running [resized...]] then one terminal event, then none."""
    errors = []
    terminal = [i for i, k in enumerate(kinds) if k in TERMINAL]
    if len(terminal) != 1 or terminal[0] != len(kinds) - 1:
        errors.append(f"not exactly one terminal event, last: {kinds}")
    if kinds.count("running") > 1:
        errors.append(f"running twice: {kinds}")
    if "resized" in kinds and (
        "running" not in kinds or kinds.index("resized") < kinds.index("running")
    ):
        errors.append(f"resized before running: {kinds}")
    if "finished" in kinds and "running" not in kinds:
        errors.append(f"finished without running: {kinds}")
    return errors


@pytest.mark.parametrize("seed", range(30))
async def test_random_histories_keep_the_event_protocol(seed):
    import random

    rng = random.Random(seed)
    fake, events = cluster(), Recorder()
    backend = make_backend(fake, events)
    await backend.open()
    started: list[str] = []
    try:
        for step in range(40):
            action = rng.choice(
                ["start", "pods", "ready", "finish", "fail", "stop", "settle", "outage", "compact"]
            )
            live = [j for j in started if fake.job(job_object_name(j), NS) is not None]
            name = job_object_name(rng.choice(live)) if live else None
            obj = fake.job(name, NS) if name else None
            if action == "start" and len(started) < 4:
                job_id = f"j{step}"
                try:
                    await backend.start(spec(job_id, workers=(2, 2)), ("gpu-1", "gpu-2"))
                    started.append(job_id)
                except BackendError:
                    pass  # the API server was down the whole retry window: nothing created
            elif action == "pods" and obj and not fake.pods_of(name, NS):
                fake.make_pods(name, ["gpu-1", "gpu-2"], namespace=NS, ready=rng.random() < 0.5)
            elif action == "ready" and obj:
                for pod in fake.pods_of(name, NS):
                    if pod["status"]["phase"] == "Pending":
                        fake.set_ready(pod["metadata"]["name"], "gpu-1", namespace=NS)
                        break
            elif (
                action in ("finish", "fail")
                and obj
                and not obj["metadata"].get("deletionTimestamp")
                and not obj.get("status")
            ):
                fake.finish_job(name, succeeded=action == "finish", namespace=NS)
            elif action == "stop" and live:
                await backend.stop(rng.choice(live), 1, "cancelled")
            elif action == "settle":
                fake.settle()
            elif action == "outage":
                fake.go_down()
                for _ in range(rng.randint(1, 20)):
                    await asyncio.sleep(0)
                fake.come_up()
            elif action == "compact":
                fake.compact(PODS)
            for _ in range(rng.randint(0, 5)):
                await asyncio.sleep(0)
        # wind down: stop whatever has not ended, let the grace periods pass
        fake.come_up()
        for job_id in started:
            if not any(k in TERMINAL for k in events.kinds(job_id)):
                await backend.stop(job_id, 1, "end of test")
        fake.settle()
        await until(
            lambda: all(any(k in TERMINAL for k in events.kinds(j)) for j in started),
            lambda: f"every started job ends: {[(j, events.kinds(j)) for j in started]}",
        )
        for _ in range(50):
            await asyncio.sleep(0)  # nothing more may come
        for job_id in started:
            assert protocol_errors(events.kinds(job_id)) == [], job_id
        assert {e.job_id for e in events.events} <= set(started)
    finally:
        await backend.close()


def test_the_protocol_check_can_fail():
    assert protocol_errors(["running", "finished"]) == []
    assert protocol_errors(["released"]) == []
    assert protocol_errors(["running", "finished", "released"])
    assert protocol_errors(["finished"])
    assert protocol_errors(["running", "running", "finished"])
    assert protocol_errors(["running"])


async def test_a_refused_queue_does_not_stop_the_others(setup):
    fake, backend, _ = setup
    dev = queue_name("/project1/dev-team")
    fake.fail_next("create", QUEUES, ApiError(403, "Forbidden", "denied by the webhook"))
    result = await backend.sync_queues(s1_tree())  # the first create (the instance queue) fails
    assert result.failed[0].startswith("wmla: creating Volcano queue wmla failed")
    # its children cannot be written under it; nothing half-built is left behind them
    assert any(f.startswith(queue_name("/project1") + ":") for f in result.failed)
    assert result.created == []
    again = await backend.sync_queues(s1_tree())
    assert again.failed == [] and dev in again.created


async def test_plan_queue_capability_is_capped_by_the_namespace_quota(setup):
    fake, backend, _ = setup  # the quota allows 6 GPUs
    tree = PlanTree([Plan("/big", 1, Resources(10, UNLIMITED, UNLIMITED))])
    await backend.sync_queues(tree)
    assert fake.objects[QUEUES][(None, queue_name("/big"))]["spec"]["capability"] == {
        "nvidia.com/gpu": "6"
    }
