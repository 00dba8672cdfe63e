"""A hub killed outright leaves no managed service behind.

A real hub from the repository's jupyterhub_config.py (as tests/service/hub.py starts it), with
its real managed services: the wmla service and the two jupyterhub-idle-culler services. The hub
is killed with SIGKILL, so it stops nothing itself; within 10 s every one of those services must
be gone (the cullers through ``hub_config.pdeath``'s parent-death signal, the wmla service by its
own watch of its parent). The proxy is left out: outliving the hub is its design (the next hub
takes it over), and the next hub on the same state comes up clean. Everything is stopped by
PID at the end whatever happened.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from hub_config.pdeath import parse, set_parent_death_signal
from tests.service.hub import PROXY, Hub

GRACE = 10.0  # seconds the services have to end once their hub is gone


def _services(hub_pid: int) -> dict[int, str]:
    """PID -> what it is, for the hub's managed services (not the proxy, not servers)."""
    found = {}
    for child in psutil.Process(hub_pid).children(recursive=True):
        try:
            cmdline = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if "jupyterhub_idle_culler" in cmdline and "hub_config.pdeath" not in cmdline:
            # exec'd: the parent-death signal is set (a wrapper still starting has not yet,
            # and a hub killed in those milliseconds is the one case pdeath.py leaves out)
            found[child.pid] = "culler"
        elif "extension.service" in cmdline:
            found[child.pid] = "wmla service"
    return found


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.mark.skipif(not PROXY.exists(), reason="configurable-http-proxy is missing: make install")
def test_no_service_outlives_a_killed_hub(tmp_path: Path) -> None:
    hub = Hub(tmp_path, {"tick": 1, "device_layout": "1x4"})
    seen: set[int] = set()
    try:
        hub.start()
        deadline = time.monotonic() + 30
        services: dict[int, str] = {}
        while time.monotonic() < deadline:  # the cullers start beside the service
            services = _services(hub.proc.pid)
            if sorted(services.values()) == ["culler", "culler", "wmla service"]:
                break
            time.sleep(0.3)
        assert sorted(services.values()) == ["culler", "culler", "wmla service"], (
            f"{services}\n{hub.log()}"
        )
        hub._collect()
        seen = set(hub.pids)
        os.kill(hub.proc.pid, signal.SIGKILL)
        hub.proc.wait(10)
        killed = time.monotonic()
        left = dict(services)
        while left and time.monotonic() - killed < GRACE:
            left = {pid: what for pid, what in left.items() if _alive(pid)}
            time.sleep(0.2)
        assert not left, f"still running {GRACE:.0f} s after the hub was killed: {left}"
        # the next start comes up clean: it takes the proxy over and starts its own services
        hub.start()
        deadline = time.monotonic() + 30
        while len(services := _services(hub.proc.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.3)
        assert sorted(services.values()) == ["culler", "culler", "wmla service"], hub.log()
    finally:
        hub.stop()
        for pid in seen:  # the proxy and anything the hub had started
            try:
                proc = psutil.Process(pid)
                proc.kill()
                proc.wait(5)
            except psutil.Error:
                pass


def test_the_wrapper_signals_its_command_when_the_parent_dies(tmp_path: Path) -> None:
    """Without a hub: a parent that dies by SIGKILL takes its wrapped child along."""
    pidfile = tmp_path / "child.pid"
    child_code = (
        f"import os, time\nopen({str(pidfile)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)"
    )
    parent_code = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-m', 'hub_config.pdeath', sys.executable, '-c', "
        f"{child_code!r}])\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_code], cwd=Path(__file__).resolve().parents[2]
    )
    child = None
    try:
        deadline = time.monotonic() + 20
        while not pidfile.exists() or not pidfile.read_text():
            assert time.monotonic() < deadline, "the wrapped command never started"
            time.sleep(0.1)
        child = psutil.Process(int(pidfile.read_text()))
        assert "hub_config.pdeath" not in " ".join(child.cmdline())  # exec'd in place
        parent.kill()
        parent.wait(10)
        gone, _ = psutil.wait_procs([child], timeout=GRACE)
        assert gone, "the wrapped command outlived its parent"
    finally:
        for proc in (child,):
            if proc is not None and proc.is_running():
                proc.kill()
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)


def test_the_wrappers_arguments() -> None:
    assert parse(["cmd", "-x"]) == (signal.SIGTERM, ["cmd", "-x"])
    assert parse(["--signal=KILL", "--", "cmd"]) == (signal.SIGKILL, ["cmd"])
    assert parse(["--signal=SIGINT", "cmd"]) == (signal.SIGINT, ["cmd"])
    for bad in ([], ["--signal=NOPE", "cmd"], ["--signal=TERM"]):
        with pytest.raises(ValueError, match="usage"):
            parse(bad)
    if sys.platform.startswith("linux"):
        # in a throw-away child: the setting must not stay on the test's own process
        code = "from hub_config.pdeath import set_parent_death_signal as s; print(s())"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert out.stdout.strip() == "True", out.stderr
    else:
        assert set_parent_death_signal() is False
