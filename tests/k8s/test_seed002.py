"""Seed 002 on the real control plane: hub_config/k8s/seed002/six_jobs.py, six 2-worker
PyTorchJobs at once, in its modes (docs/kubernetes.md's runbook).

``plain`` gives the pods to the default kube-scheduler, without a gang, on the real node (a
kubelet over containerd, 4 GPUs): each worker really joins its gang through torch.distributed,
so a job holding one of its two workers hangs in the rendezvous, holding its GPU, until the
timeout fails it. ``volcano`` (PyTorchJobs with a schedulingPolicy, on the KWOK nodes) never
splits a gang and all six succeed. ``wmla`` (six REST submissions to the hub on the real node)
is in test_kube_hub.py, beside that hub."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devcluster import images, realnode
from devcluster.cluster import LocalCluster
from devcluster.realnode import RealNode, RealNodeError

REPO = Path(__file__).resolve().parents[2]
SEED = REPO / "hub_config" / "k8s" / "seed002" / "six_jobs.py"
SEED_MODULE = importlib.import_module("hub_config.k8s.seed002.six_jobs")


def run_seed(kube: LocalCluster, namespace: str, *args: str) -> tuple[int, int, str]:
    """Run the seed as a user with kubectl rights would; (partial samples, succeeded, output)."""
    out = subprocess.run(
        [sys.executable, str(SEED), "--namespace", namespace, "--kwok-runtime", "3s",
         "--watch", "150", "--every", "0.5", *args],
        capture_output=True, text=True, timeout=300, cwd=REPO,
        env={**os.environ, "KUBECONFIG": str(kube.kubeconfig), "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    partial = re.search(r"samples with a partly running gang: (\d+)", text)
    succeeded = re.search(r"jobs succeeded: (\d+)/6", text)
    assert partial and succeeded, text[-3000:]
    return int(partial.group(1)), int(succeeded.group(1)), text


def test_seed002_volcano(kube: LocalCluster) -> None:
    namespace = "seed-volcano"
    kube.write_service_kubeconfig(namespace, kube.var / f"{namespace}.kubeconfig")
    partial, succeeded, text = run_seed(kube, namespace, "--mode", "volcano")
    assert (partial, succeeded) == (0, 6), text[-3000:]


@pytest.fixture(scope="module")
def node(kube: LocalCluster) -> RealNode:
    real = kube.real_node()
    try:
        real.up()
    except RealNodeError as err:
        pytest.fail(str(err), pytrace=False)
    return real


def test_seed002_plain_on_the_real_node_deadlocks_until_the_rendezvous_timeout(
    kube: LocalCluster, node: RealNode
) -> None:
    """Someone else's pod holds the node's 4 GPUs while the six jobs come in, as on a busy
    cluster; when it ends the default scheduler binds the pods that wait, every job's master
    first (--masters-first: the seed's race at its worst, every run). Four masters hold the
    four GPUs, each waiting in the rendezvous for a worker that cannot be placed: nothing
    runs until the timeout fails those four jobs; then the last two run and succeed."""
    namespace = "seed-real"
    kube.write_service_kubeconfig(namespace, kube.var / f"{namespace}.kubeconfig")
    kube.kubectl("apply", "-f", "-", input=json.dumps(SEED_MODULE.masters_first_class()))
    blocker = _blocker(4)
    kube.kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(blocker))
    kube.kubectl("-n", namespace, "wait", "--for=jsonpath={.status.phase}=Running",
                 "pod/someone-else", "--timeout=120s")  # fmt: skip
    seed = start_seed(
        kube, namespace, "--mode", "plain", "--job", "rendezvous", "--masters-first",
        "--rendezvous-timeout", str(RENDEZVOUS_TIMEOUT), "--image", node.worker_image(),
        "--cpu", "300m", "--memory", "1Gi", "--watch", "300", "--every", "1",
        "--node-selector", f"{realnode.NODE_LABEL}=true", "--toleration", realnode.NODE_LABEL,
    )  # fmt: skip
    try:
        # the four masters that will take the GPUs, pending behind the blocker with their
        # workers (the operator, started with Volcano as its gang scheduler, makes a job's pods
        # once Volcano enqueued its PodGroup: four of the six here, the rest when GPUs free)
        pods = wait_for_pods(kube, namespace, masters=4)
        kube.kubectl("-n", namespace, "delete", "pod", "someone-else", "--grace-period=0",
                     "--force", "--wait=false")  # fmt: skip
        out, _ = seed.communicate(timeout=360)
    finally:
        if seed.poll() is None:
            seed.kill()
        kube.kubectl("-n", namespace, "delete", "pytorchjobs,pods", "--all",
                     "--grace-period=0", "--force", "--wait=false")  # fmt: skip
    keep_output("plain", out)
    assert seed.returncode == 0, out[-3000:]
    figures = seed_figures(out)
    # all four GPUs held by half gangs, in the rendezvous, until its timeout
    assert max(line.count("=1/2") for line in out.splitlines()) == 4, out[-3000:]
    assert figures["longest"] >= RENDEZVOUS_TIMEOUT * 0.8, out[-3000:]
    assert (figures["failed"], figures["succeeded"]) == (4, 2), (pods, out[-3000:])


RENDEZVOUS_TIMEOUT = 30


def _blocker(gpus: int) -> dict:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "someone-else"},
        "spec": {"restartPolicy": "Never", "schedulerName": "default-scheduler",
                 "nodeSelector": {realnode.NODE_LABEL: "true"},
                 "tolerations": [{"key": realnode.NODE_LABEL, "operator": "Exists"}],
                 "containers": [{"name": "busy", "image": images.PYTHON,
                                 "imagePullPolicy": "IfNotPresent",
                                 "command": ["/usr/bin/python3", "-c",
                                             "import time; time.sleep(600)"],
                                 "resources": {"limits": {"nvidia.com/gpu": str(gpus),
                                                          "cpu": "50m", "memory": "32Mi"}}}]},
    }  # fmt: skip


def start_seed(kube: LocalCluster, namespace: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(SEED), "--namespace", namespace, *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
        env={**os.environ, "KUBECONFIG": str(kube.kubeconfig), "PYTHONPATH": str(REPO)},
    )  # fmt: skip


def wait_for_pods(kube: LocalCluster, namespace: str, masters: int, timeout: float = 120) -> str:
    """The seed's pods once ``masters`` masters and their workers exist, settled for 3 s."""
    deadline, last, since = time.monotonic() + timeout, "", time.monotonic()
    while True:
        names = kube.kubectl("-n", namespace, "get", "pods", "-l", "app=seed002",
                             "-o", "name").split()  # fmt: skip
        listed = "\n".join(sorted(names))
        if listed != last:
            last, since = listed, time.monotonic()
        made = sum("-master-" in name for name in names)
        if made >= masters and len(names) >= 2 * masters and time.monotonic() - since >= 3:
            return listed
        assert time.monotonic() < deadline, f"{made} of {masters} masters came:\n{listed}"
        time.sleep(1)


def keep_output(mode: str, text: str) -> None:
    """The seed's samples and figures, in test-artifacts/seed002-real/ (docs/kubernetes.md)."""
    folder = REPO / "test-artifacts" / "seed002-real"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{mode}.txt").write_text(text)


def seed_figures(text: str) -> dict[str, float]:
    """The seed's closing lines as numbers."""
    found = {}
    for key, pattern in (
        ("partial", r"samples with a partly running gang: (\d+)"),
        ("longest", r"longest run of such samples: ([\d.]+) s"),
        ("succeeded", r"jobs succeeded: (\d+)/6"),
        ("failed", r"jobs failed: (\d+)/6"),
    ):
        match = re.search(pattern, text)
        assert match, f"no {key!r} line in the seed's output:\n{text[-3000:]}"
        found[key] = float(match.group(1))
    return found
