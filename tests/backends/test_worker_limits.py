"""A job's limits mean the same on both backends, as a kubelet holds a container: the CPU quota
and the memory limit are the limits, the CPU weight the request (what the scheduler charged).
Local: the worker's real cgroup (as root); Kubernetes: the container's resources and the
admission pre-check's view of them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from extension.backends.base import JobSpec
from extension.backends.kubernetes.admission import effective_pod
from extension.backends.local.confining import WorkerCgroups
from extension.backends.manifests.pods import make_container
from extension.confine import detect
from extension.scheduler import Resources

Mi = 2**20
SPEC = JobSpec(
    id="job-limits",
    user="ann",
    leaf="/p/ann",
    per_worker=Resources(0, 100, 64 * Mi),
    command=("python", "main.py"),
    workdir="/s/ann/jobs/job-limits",
    limits=Resources(0, 1000, 128 * Mi),
)


def test_the_ceiling_is_the_limits_never_below_the_request() -> None:
    assert SPEC.ceiling == Resources(0, 1000, 128 * Mi)
    low = JobSpec(**{**SPEC.__dict__, "limits": Resources(0, 50, 32 * Mi)})
    assert low.ceiling == SPEC.per_worker
    assert JobSpec(**{**SPEC.__dict__, "limits": None}).ceiling == SPEC.per_worker


def test_a_pod_asks_the_request_and_is_held_to_the_limits() -> None:
    container = make_container(name="pytorch", image="i:1", command=["python"],
                               per_worker=SPEC.per_worker, limits=SPEC.ceiling)  # fmt: skip
    assert container["resources"] == {
        "requests": {"cpu": "100m", "memory": "64Mi"},
        "limits": {"cpu": "1", "memory": "128Mi"},
    }
    ask = effective_pod(SPEC.per_worker, [], ceiling=SPEC.ceiling)
    assert ask.requests == {"cpu": 100.0, "memory": 64.0 * Mi}
    assert ask.limits == {"cpu": 1000.0, "memory": 128.0 * Mi}


AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


@pytest.mark.skipif(not AS_ROOT, reason="cgroups are made by root")
def test_a_local_workers_cgroup_has_the_limits_as_quota_and_the_request_as_weight() -> None:
    cgroups = WorkerCgroups(detect(f"test-limits-{os.getpid()}", users_memory=0))
    if not cgroups.enforce:
        pytest.skip("no cgroups on this machine")
    group = cgroups.create(SPEC, "l1", 0, ())
    try:
        folders = [Path(p).parent for p in group.enter_files()]
        text = {f.name: f.read_text().strip() for d in folders for f in d.iterdir()
                if f.name in ("cpu.cfs_quota_us", "cpu.cfs_period_us", "cpu.shares",
                              "memory.limit_in_bytes", "cpu.max", "cpu.weight",
                              "memory.max")}  # fmt: skip
        assert folders
        if "cpu.cfs_quota_us" in text:  # v1
            assert int(text["cpu.cfs_quota_us"]) == int(text["cpu.cfs_period_us"])  # 1 core
            assert int(text["cpu.shares"]) == 102  # 100m of 1024 a core
            assert int(text["memory.limit_in_bytes"]) == 128 * Mi
        else:  # v2
            quota, period = text["cpu.max"].split()
            assert int(quota) == int(period) and int(text["memory.max"]) == 128 * Mi
    finally:
        cgroups.remove([group.name])
