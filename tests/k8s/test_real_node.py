"""Real pods on the real node (devcluster/realnode.py): a kubelet v1.34.1 over Debian's
containerd, started in the test cluster for these tests. A node that cannot start fails them
with the component, the reason and its log (never a skip); the other Kubernetes tests do not
need it and pass without it.

The pods run the image built here from this machine's python3 (``wmla.local/python:3.11``,
imported, never pulled) and read their own cgroup from inside.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devcluster import images, realnode
from devcluster.cluster import LocalCluster
from devcluster.realnode import RealNode, RealNodeError
from extension.backends.base import EventKind, JobSpec
from extension.scheduler import UNLIMITED, Plan, PlanTree, Resources

from .conftest import GiB, Recorder, Tenant, until

NAMESPACE = "real"


@pytest.fixture(scope="module")
def node(kube: LocalCluster) -> Iterator[RealNode]:
    real = kube.real_node()
    try:
        real.up()
    except RealNodeError as err:
        pytest.fail(str(err), pytrace=False)
    kube.write_service_kubeconfig(NAMESPACE, kube.var / f"{NAMESPACE}.kubeconfig")
    yield real
    kube.kubectl("delete", "pods", "--all", "-n", NAMESPACE, "--grace-period=0", "--wait=false")


def _pod(name: str, code: str, limits: dict[str, str], **spec: Any) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": images.PYTHON,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/usr/bin/python3", "-c", code],
        "resources": {"limits": limits, "requests": limits},
    }
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {realnode.NODE_LABEL: "true"},
            "tolerations": [{"key": realnode.NODE_LABEL, "operator": "Exists"}],
            "enableServiceLinks": False,
            "automountServiceAccountToken": False,
            "containers": [container],
            **spec,
        },
    }


def _run(kube: LocalCluster, node: RealNode, pod: dict[str, Any], timeout: float = 120) -> dict:
    """Create the pod, wait until it ends; its last status, with its log under ``"log"``."""
    name = pod["metadata"]["name"]
    kube.kubectl("apply", "-f", "-", input=json.dumps(pod))
    deadline = time.monotonic() + timeout
    while True:
        live = json.loads(kube.kubectl("get", "pod", name, "-n", NAMESPACE, "-o", "json"))
        if live["status"].get("phase") in ("Succeeded", "Failed"):
            break
        if time.monotonic() > deadline:
            events = kube.kubectl("get", "events", "-n", NAMESPACE, "--field-selector",
                                  f"involvedObject.name={name}")  # fmt: skip
            raise AssertionError(
                f"pod {name} not finished within {timeout:.0f} s: phase "
                f"{live['status'].get('phase')}; events:\n{events}\n"
                f"kubelet log: {node.kubelet_log}, containerd log: {node.containerd_log}"
            )
        time.sleep(0.5)
    live["log"] = kube.kubectl("logs", name, "-n", NAMESPACE)
    return live


def test_node_is_real_with_four_gpus_and_the_images(kube: LocalCluster, node: RealNode) -> None:
    status = json.loads(kube.kubectl("get", "node", realnode.NODE_NAME, "-o", "json"))
    assert status["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    assert status["status"]["nodeInfo"]["kubeletVersion"] == "v1.34.1"
    assert status["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    assert realnode.TAINT in status["spec"]["taints"]  # KWOK's tests never land here
    present = {name for image in status["status"]["images"] for name in image["names"]}
    assert {images.PYTHON, images.PAUSE} <= present


def test_pod_cgroup_holds_its_limits(kube: LocalCluster, node: RealNode) -> None:
    code = (
        "import json\n"
        "r = lambda p: open('/sys/fs/cgroup/' + p).read().strip()\n"
        "print(json.dumps({'mem': r('memory/memory.limit_in_bytes'),"
        " 'quota': r('cpu/cpu.cfs_quota_us'), 'period': r('cpu/cpu.cfs_period_us')}))\n"
    )
    live = _run(kube, node, _pod("limits", code, {"cpu": "500m", "memory": "256Mi"}))
    assert live["status"]["phase"] == "Succeeded", live["status"]
    seen = json.loads(live["log"].strip().splitlines()[-1])
    assert seen == {"mem": str(256 * 2**20), "quota": "50000", "period": "100000"}


def test_pod_that_touches_more_than_its_memory_is_oom_killed(
    kube: LocalCluster, node: RealNode
) -> None:
    code = (
        "held = []\n"
        "for i in range(16):\n"  # 16 x 64 MiB, each page written
        "    held.append(b'\\1' * (64 << 20))\n"
        "    print(i, flush=True)\n"
        "print('survived', flush=True)\n"
    )
    live = _run(kube, node, _pod("oom", code, {"cpu": "500m", "memory": "256Mi"}))
    terminated = live["status"]["containerStatuses"][0]["state"]["terminated"]
    assert live["status"]["phase"] == "Failed"
    assert terminated["reason"] == "OOMKilled", terminated
    assert terminated["exitCode"] == 137
    assert "survived" not in live["log"]


def test_pod_with_its_users_subpath_sees_nothing_of_another_user(
    kube: LocalCluster, node: RealNode
) -> None:
    data = kube.user_data / NAMESPACE  # the claim's volume (objects.user_storage)
    for user in ("alice", "bob"):
        (data / user).mkdir(parents=True, exist_ok=True)
        (data / user / f"{user}-secret.txt").write_text(f"{user} only\n")
    code = (
        "import os, json\n"
        "found = []\n"
        "for root, dirs, files in os.walk('/'):\n"
        "    dirs[:] = [d for d in dirs if os.path.join(root, d) not in ('/proc', '/sys')]\n"
        "    found += [os.path.join(root, f) for f in files if f.endswith('-secret.txt')]\n"
        "print(json.dumps({'mine': sorted(os.listdir('/home/alice')), 'found': found}))\n"
    )
    pod = _pod(
        "alice",
        code,
        {"cpu": "200m", "memory": "128Mi"},
        container={
            "volumeMounts": [
                {"name": "users", "mountPath": "/home/alice", "subPath": "alice"},
            ]
        },
        volumes=[{"name": "users", "persistentVolumeClaim": {"claimName": "wmla-user-data"}}],
    )
    live = _run(kube, node, pod)
    assert live["status"]["phase"] == "Succeeded", live["status"]
    seen = json.loads(live["log"].strip().splitlines()[-1])
    assert seen == {"mine": ["alice-secret.txt"], "found": ["/home/alice/alice-secret.txt"]}


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pytorch_mnist" / "main.py"


async def test_a_two_worker_pytorchjob_trains_on_the_real_node(
    kube: LocalCluster, node: RealNode, tenant: Tenant
) -> None:
    """examples/pytorch_mnist through the KubernetesBackend: a PyTorchJob of a Master and a
    Worker in the worker image (this venv's torch and the project's runtime), gloo on CPU, the
    master found through the node's DNS; it reaches the example's stated accuracy."""
    image = node.worker_image()
    events = Recorder()
    backend = await tenant.backend(
        events,
        image=image,
        image_pull_policy="IfNotPresent",
        node_selector={realnode.NODE_LABEL: "true"},
        tolerations=[{"key": realnode.NODE_LABEL, "operator": "Exists"}],
    )
    plans = [Plan("/project1"), Plan("/project1/dev-team", 1, Resources(4, UNLIMITED, UNLIMITED))]
    await backend.sync_queues(PlanTree(plans))
    job_dir = kube.user_data / tenant.namespace / "alice" / "jobs" / "mnist"
    job_dir.mkdir(parents=True)
    (job_dir / "main.py").write_text(EXAMPLE.read_text())
    spec = JobSpec(
        id="mnist",
        user="alice",
        leaf="/project1/dev-team/alice",
        per_worker=Resources(1, 800, 2 * GiB),
        command=["python", "main.py", "--epochs", "3", "--target-accuracy", "0.9"],
        workdir="/gpfs/myresultfs/alice/jobs/mnist",
        min_workers=2,
        max_workers=2,
    )
    await backend.start(spec, (realnode.NODE_NAME,) * 2)
    try:
        await until(lambda: EventKind.FINISHED in events.kinds("mnist"), "the job finished", 420)
    except AssertionError:
        pods = tenant.kubectl("get", "pods", "-o", "wide")
        raise AssertionError(
            f"{events.kinds('mnist')}; pods:\n{pods}\nlog:\n{backend.logs('mnist')[-3000:]}"
        ) from None
    finished = next(e for e in events.events if e.kind == EventKind.FINISHED)
    assert finished.exit_code in (0, None), backend.logs("mnist")[-3000:]
    running = next(e for e in events.events if e.kind == EventKind.RUNNING)
    assert running.placement == (realnode.NODE_NAME,) * 2
    result = json.loads((job_dir / "result.json").read_text())
    assert result["world_size"] == 2, result
    assert result["test_accuracy"] >= 0.9, result
    assert (job_dir / "model.pt").stat().st_size > 0


async def test_a_job_over_its_memory_is_oom_killed_and_reported_failed(
    node: RealNode, tenant: Tenant
) -> None:
    """Through the backend: a 1-worker job with 256 MiB that writes 1 GiB is killed by the
    kernel in its pod's cgroup (seen on the pod: OOMKilled, 137) and the backend reports it
    FAILED on the real node, with the exit code, the kubelet's reason and the place.

    Found here: the training operator 1.9 deletes a failed job's pods at once (whatever
    cleanPodPolicy says), before the job's Failed condition; the backend keeps the status of
    a pod it saw fail (events.py), so its FAILED event still says 137 and OOMKilled."""
    events = Recorder()
    backend = await tenant.backend(
        events,
        image=images.PYTHON,
        image_pull_policy="IfNotPresent",
        node_selector={realnode.NODE_LABEL: "true"},
        tolerations=[{"key": realnode.NODE_LABEL, "operator": "Exists"}],
    )
    plans = [Plan("/project1"), Plan("/project1/dev-team", 1, Resources(4, UNLIMITED, UNLIMITED))]
    await backend.sync_queues(PlanTree(plans))
    home = tenant.cluster.user_data / tenant.namespace / "alice"
    (home / "jobs" / "hog").mkdir(parents=True)
    code = "held = []\nfor i in range(16):\n    held.append(b'1' * (64 << 20))\n    print(i)"
    spec = JobSpec(
        id="hog",
        user="alice",
        leaf="/project1/dev-team/alice",
        per_worker=Resources(0, 500, 256 * 2**20),
        command=["python", "-c", code],
        workdir="/gpfs/myresultfs/alice/jobs/hog",
    )
    # every state the pod goes through, from a watch (the operator deletes it within a second)
    record = tenant.cluster.var / f"{tenant.namespace}-pods.json"
    with open(record, "w") as sink:
        watch = subprocess.Popen(
            [str(tenant.cluster.binary("kubectl")), f"--kubeconfig={tenant.cluster.kubeconfig}",
             "-n", tenant.namespace, "get", "pods", "--watch", "--output=json"],
            stdout=sink, stderr=subprocess.DEVNULL,
        )  # fmt: skip
    try:
        await backend.start(spec, (realnode.NODE_NAME,))
        await until(lambda: EventKind.FAILED in events.kinds("hog"), "the job failed", 120)
        await asyncio.sleep(1)  # the watch's last lines
    finally:
        watch.terminate()
        watch.wait(timeout=10)
    out = record.read_text()
    seen: set[tuple[str, int]] = set()
    decoder, i = json.JSONDecoder(), 0
    while (i := out.find("{", i)) >= 0:
        pod, i = decoder.raw_decode(out, i)
        for cs in pod["status"].get("containerStatuses") or []:
            if end := cs["state"].get("terminated"):
                seen.add((end["reason"], end["exitCode"]))
    event = next(e for e in events.events if e.kind == EventKind.FAILED)
    assert event.placement == (realnode.NODE_NAME,), event
    assert event.exit_code == 137 and "OOMKilled (exit code 137)" in event.message, event
    assert seen == {("OOMKilled", 137)}, seen


def test_a_node_that_cannot_start_fails_naming_the_component(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No cluster needed: the reason is one line with the component and what to do."""
    monkeypatch.setattr(realnode, "CNI_BIN", tmp_path / "no-cni")
    with pytest.raises(RealNodeError) as err:
        LocalCluster(tmp_path / "k8s").real_node().up()
    assert "real node: CNI: no " in str(err.value)
    assert "containernetworking-plugins" in str(err.value)


def _leftovers(node: RealNode) -> list[str]:
    """What of the node is still on the machine: processes, mounts, links, cgroups."""
    left = []
    for pid in node._shims():
        left.append(f"shim {pid}")
    for name in ("kubelet", "containerd"):
        if node.processes.running(name):
            left.append(name)
    prefix = str(node.dir.resolve()) + "/"
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        left += [f"mount {ln.split()[4]}" for ln in f if ln.split()[4].startswith(prefix)]
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    left += [f"link {node.bridge}"] if f" {node.bridge}:" in links else []
    left += [f"cgroup {d}" for d in node._cgroup_dirs() if d.exists()]
    results = realnode.CNI_CACHE / "results"
    if results.is_dir():
        left += [f"cni {p}" for p in results.glob(f"{node.network}-*")]
    return left


def test_down_leaves_nothing_and_up_comes_back(kube: LocalCluster, node: RealNode) -> None:
    """Runs last here: the node, with a pod running, goes down clean, then comes up again."""
    _run(kube, node, _pod("before", "print('hi')", {"cpu": "100m", "memory": "64Mi"}))
    sleeper = _pod("sleeper", "import time; time.sleep(600)", {"cpu": "100m", "memory": "64Mi"})
    kube.kubectl("apply", "-f", "-", input=json.dumps(sleeper))
    deadline = time.monotonic() + 60
    state = "jsonpath={.status.containerStatuses[0].state}"
    while "running" not in kube.kubectl("get", "pod", "sleeper", "-n", NAMESPACE, "-o", state):
        assert time.monotonic() < deadline, "the sleeper pod never ran"
        time.sleep(0.5)
    assert node._shims(), "a running pod has a shim"
    node.down()
    assert _leftovers(node) == []
    assert not [p for p in Path("/proc").glob("[0-9]*/cmdline") if _sleeping(p)]
    kube.kubectl("delete", "pod", "sleeper", "-n", NAMESPACE, "--grace-period=0", "--force")
    node.up()
    live = _run(kube, node, _pod("after", "print('back')", {"cpu": "100m", "memory": "64Mi"}))
    assert live["log"].strip() == "back"


def _sleeping(cmdline: Path) -> bool:
    try:
        return b"time.sleep(600)" in cmdline.read_bytes() and os.getpid() != int(
            cmdline.parent.name
        )
    except (OSError, ValueError):
        return False
