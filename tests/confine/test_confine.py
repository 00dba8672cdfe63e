"""extension.confine: cgroups made, entered, read and removed for real where this machine has
them (cgroup v1 here, as root), and cgroup v2 against a cgroupfs laid out in a folder (this
machine binds every controller to v1, so no real v2 hierarchy can hold them)."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from extension.confine import (
    Control,
    Grant,
    Unconfined,
    detect,
    enter,
    gpu_grant,
)
from extension.confine import cgroupfs as fs
from extension.confine.v2 import CgroupV2

AS_ROOT = os.geteuid() == 0
REAL = detect("probe") if AS_ROOT else None
V1 = getattr(REAL, "version", 0) == 1
v1_only = pytest.mark.skipif(not V1, reason="needs root and cgroup v1 hierarchies")


def run_inside(group, code: str, *args: str) -> subprocess.CompletedProcess:
    files = group.enter_files()
    return subprocess.run(
        [sys.executable, "-I", "-c", code, *args],
        preexec_fn=lambda: enter(files),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture()
def confinement(request):
    scope = f"test-{os.getpid()}-{request.node.name[:40]}"
    confine = detect(scope, users_memory=0)
    yield confine
    for name in confine.names():
        group = confine.open(name)
        if group is not None:
            group.remove(5.0)
    confine.prune()


@v1_only
def test_memory_over_the_grant_is_killed_and_counted(confinement) -> None:
    group = confinement.create("mem", Grant(1000, 64 << 20))
    done = run_inside(group, "x = bytearray(256 << 20)")
    assert done.returncode == -9
    usage = group.usage()
    assert usage.oom_kills == 1 and usage.memory_limit_bytes == 64 << 20
    assert usage.memory_peak_bytes >= 60 << 20
    assert group.remove(5.0)
    assert confinement.open("mem") is None


@v1_only
def test_a_fork_past_the_pids_limit_fails_with_eagain(confinement) -> None:
    group = confinement.create("pids", Grant(1000, 0, pids=20))
    code = (
        "import os, time\nn = 0\ntry:\n    for _ in range(100):\n        if os.fork() == 0:\n"
        "            time.sleep(5); os._exit(0)\n        n += 1\nexcept OSError as e:\n"
        "    print(n, e.errno)\n"
    )
    done = run_inside(group, code)
    forked, err = done.stdout.split()
    assert int(forked) < 20 and int(err) == errno.EAGAIN
    assert group.remove(5.0)  # the sleeping children are killed with it


@v1_only
def test_only_its_own_gpu_node_opens(confinement, tmp_path: Path) -> None:
    for index in range(3):
        os.mknod(tmp_path / f"nvidia{index}", 0o666 | stat.S_IFCHR, os.makedev(195, index))
    os.mknod(tmp_path / "nvidiactl", 0o666 | stat.S_IFCHR, os.makedev(195, 255))
    template = str(tmp_path / "nvidia{index}")
    code = (
        "import errno, os, sys\nfor p in sys.argv[1:]:\n    try:\n        os.open(p, os.O_RDWR)\n"
        "    except OSError as e:\n        print(errno.errorcode[e.errno])\n"
    )
    nodes = [template.format(index=i) for i in range(3)] + [str(tmp_path / "nvidiactl")]
    one = confinement.create("one", gpu_grant(1000, 0, 50, template, (1,)))
    assert run_inside(one, code, *nodes).stdout.split() == ["EPERM", "ENXIO", "EPERM", "ENXIO"]
    none = confinement.create("none", gpu_grant(1000, 0, 50, template, ()))
    assert run_inside(none, code, *nodes).stdout.split() == ["EPERM"] * 4
    assert (
        run_inside(none, "open('/dev/null').read(); open('/dev/urandom','rb').read(1)").returncode
        == 0
    )


@v1_only
def test_cpu_quota_and_cpu_seconds(confinement) -> None:
    group = confinement.create("cpu", Grant(250, 0))
    code = "import time\nend = time.time() + 1\nwhile time.time() < end: pass\n"
    assert run_inside(group, code).returncode == 0
    assert 0.1 < group.usage().cpu_seconds < 0.4  # a quarter core for a second
    folder = Path(group.folders["cpu"])
    assert (folder / "cpu.cfs_quota_us").read_text().strip() == "25000"


@v1_only
def test_users_work_yields_the_cpu_to_the_platform(confinement) -> None:
    """A job's busy loop and the platform's (a process outside every user's cgroup, as the
    hub and the service are), on one CPU: the platform gets about 90% of it, though the job's
    grant is a whole core. At equal weights each would get half."""
    group = confinement.create("busy", Grant(1000, 0))
    parent = Path(group.folders["cpu"]).parent.parent
    assert (parent / "cpu.shares").read_text().strip() == "128"
    # both on CPU 0 from a common start until a common end: only the overlap is measured
    code = (
        "import os, sys, time\nos.sched_setaffinity(0, {0})\nstart = float(sys.argv[1])\n"
        "time.sleep(max(0.0, start - time.time()))\nbusy = time.process_time()\n"
        "while time.time() < start + 1.0: pass\nprint(time.process_time() - busy)\n"
    )
    argv = [sys.executable, "-I", "-c", code, str(time.time() + 1.0)]
    files = group.enter_files()
    job = subprocess.Popen(argv, preexec_fn=lambda: enter(files), stdout=subprocess.PIPE)
    platform = subprocess.Popen(argv, stdout=subprocess.PIPE)
    job_cpu = float(job.communicate(timeout=60)[0])
    platform_cpu = float(platform.communicate(timeout=60)[0])
    assert job_cpu / (job_cpu + platform_cpu) < 0.2, (job_cpu, platform_cpu)


@v1_only
def test_a_leftover_of_the_same_name_is_replaced_and_names_and_prune(confinement) -> None:
    first = confinement.create("same", Grant(1000, 0))
    proc = subprocess.Popen(["sleep", "30"], preexec_fn=lambda: enter(first.enter_files()))
    again = confinement.create("same", Grant(500, 0))
    assert proc.wait(10) == -9  # the leftover's process went with it
    assert confinement.names() == ["same"]
    assert again.remove(5.0)
    confinement.prune()
    assert confinement.names() == []


def test_not_root_enforces_nothing_and_says_why(monkeypatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    confine = detect("jobs")
    assert isinstance(confine, Unconfined)
    assert confine.report.missing() == list(Control)
    assert all("not run as root" in w for w in confine.report.warnings())


# -- cgroup v2, on a folder laid out like the kernel's -----------------------------------------
KERNEL_FILES = {
    "cgroup.procs": "",
    "cgroup.subtree_control": "",
    "cpu.max": "max 100000\n",
    "cpu.weight": "100\n",
    "cpu.stat": "usage_usec 2500000\nuser_usec 2000000\n",
    "memory.max": "max\n",
    "memory.swap.max": "max\n",
    "memory.current": "1048576\n",
    "memory.peak": "4194304\n",
    "memory.events": "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n",
    "pids.max": "max\n",
}


@pytest.fixture()
def unified(tmp_path: Path, monkeypatch):
    """A v2 mount in a folder: mkdir there makes the kernel's files, as the kernel would."""
    mount = tmp_path / "cgroup"
    mount.mkdir()
    (mount / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (mount / "cgroup.subtree_control").write_text("")
    real_make = fs.make

    def make(folder: str) -> bool:
        made = real_make(folder)
        if made:
            for name, text in KERNEL_FILES.items():
                Path(folder, name).write_text(text)
        return made

    monkeypatch.setattr(fs, "make", make)
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        f"30 23 0:26 / {mount} rw,nosuid - cgroup2 cgroup2 rw\n"
        "31 23 0:27 / /proc rw - proc proc rw\n"
    )
    return mount, str(mountinfo)


@pytest.mark.skipif(not AS_ROOT, reason="detect() makes cgroups only as root")
def test_v2_is_detected_and_writes_each_limit(unified) -> None:
    mount, mountinfo = unified
    confine = detect("jobs", users_memory=8 << 30, mountinfo=mountinfo)
    assert isinstance(confine, CgroupV2)
    group = confine.create("job-1-abc-w0", Grant(1500, 256 << 20, pids=64))
    folder = mount / "wmla" / "jobs" / "job-1-abc-w0"
    assert (folder / "cpu.max").read_text() == "150000 100000"
    assert (folder / "cpu.weight").read_text() == "150"
    assert (folder / "memory.max").read_text() == str(256 << 20)
    assert (folder / "memory.swap.max").read_text() == "0"
    assert (folder / "pids.max").read_text() == "64"
    assert (mount / "wmla" / "memory.max").read_text() == str(8 << 30)
    assert (mount / "wmla" / "cpu.weight").read_text() == "12"  # users' work yields the CPU
    for parent in (mount, mount / "wmla", mount / "wmla" / "jobs"):
        assert (parent / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    assert group.enter_files() == (str(folder / "cgroup.procs"),)
    usage = group.usage()
    assert (usage.cpu_seconds, usage.memory_peak_bytes, usage.oom_kills) == (2.5, 4 << 20, 1)
    report = confine.report
    assert report.missing() == [Control.DEVICES]
    assert "DevicePolicy=closed" in report.controls[Control.DEVICES].how
    assert confine.names() == ["job-1-abc-w0"]


@pytest.mark.skipif(not AS_ROOT, reason="detect() makes cgroups only as root")
def test_a_refused_users_weight_is_logged_and_jobs_still_start(unified, caplog) -> None:
    mount, mountinfo = unified
    fs.make(str(mount / "wmla"))  # as the kernel makes it, then its weight refuses a write
    (mount / "wmla" / "cpu.weight").unlink()
    (mount / "wmla" / "cpu.weight").mkdir()
    confine = detect("jobs", mountinfo=mountinfo)
    confine.create("job-2-abc-w0", Grant(500, 0))
    assert (mount / "wmla" / "jobs" / "job-2-abc-w0" / "cpu.weight").read_text() == "50"
    assert "its lower CPU weight" in caplog.text


@pytest.mark.skipif(not AS_ROOT, reason="detect() makes cgroups only as root")
def test_v2_without_the_controllers_falls_back_to_v1_or_none(tmp_path: Path) -> None:
    mount = tmp_path / "unified"
    mount.mkdir()
    (mount / "cgroup.controllers").write_text("")  # every controller bound to v1
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(f"30 23 0:26 / {mount} rw - cgroup2 cgroup2 rw\n")
    confine = detect("jobs", mountinfo=str(mountinfo))
    assert isinstance(confine, Unconfined)
    assert "no cgroup filesystem" in confine.report.warnings()[0]


def test_names_are_made_safe() -> None:
    assert fs.safe_name("../../etc") == "_.._etc"
    assert fs.safe_name("job-1/2") == "job-1_2"
    assert fs.safe_name("..") == "_"


def test_a_grant_refuses_negative_figures() -> None:
    with pytest.raises(ValueError, match="cpu_millicores"):
        Grant(-1, 0)
    with pytest.raises(ValueError, match="pids"):
        Grant(1, 0, pids=0)


# -- a notebook server's grant: quota = limit, weight = request, memory.max = the limit --------
def notebook_grant(resources: dict, limits: dict) -> Grant:
    from spawner.confining import server_grant
    from spawner.mixin.record import JobGrant

    return server_grant(JobGrant(resources=resources, limits=limits), 0, "/dev/nvidia{index}")


def test_a_notebook_server_is_held_to_its_limits_and_weighed_by_its_request() -> None:
    """As Kubernetes holds a container: a server asking 100m and 64Mi under a 2-core, 4G
    ceiling may burst to 2 cores, but weighs 100m when CPUs are busy; without limits the
    request is both, as for a job worker."""
    held = notebook_grant({"cpu": 100, "memory": 64 << 20}, {"cpu": 2000, "memory": 4 << 30})
    assert (held.cpu_millicores, held.weight_millicores, held.memory_bytes) == (2000, 100, 4 << 30)
    plain = notebook_grant({"cpu": 500, "memory": 1 << 30}, {})
    assert (plain.cpu_millicores, plain.weight_millicores, plain.memory_bytes) == (
        500,
        500,
        1 << 30,
    )


@pytest.mark.skipif(not AS_ROOT, reason="detect() makes cgroups only as root")
def test_v2_writes_a_servers_quota_from_its_limit_and_weight_from_its_request(unified) -> None:
    mount, mountinfo = unified
    confine = detect("notebooks", users_memory=8 << 30, mountinfo=mountinfo)
    held = notebook_grant({"cpu": 100, "memory": 64 << 20}, {"cpu": 2000, "memory": 4 << 30})
    confine.create("nb-1", held)
    folder = mount / "wmla" / "notebooks" / "nb-1"
    assert (folder / "cpu.max").read_text() == "200000 100000"
    assert (folder / "cpu.weight").read_text() == "10"
    assert (folder / "memory.max").read_text() == str(4 << 30)


@v1_only
def test_v1_writes_a_servers_quota_from_its_limit_and_shares_from_its_request(
    confinement,
) -> None:
    held = notebook_grant({"cpu": 100, "memory": 64 << 20}, {"cpu": 2000, "memory": 256 << 20})
    group = confinement.create("nb", held)
    cpu, memory = Path(group.folders["cpu"]), Path(group.folders["memory"])
    assert (cpu / "cpu.cfs_quota_us").read_text().strip() == "200000"
    assert (cpu / "cpu.shares").read_text().strip() == "102"
    assert (memory / "memory.limit_in_bytes").read_text().strip() == str(256 << 20)
