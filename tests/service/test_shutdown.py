"""SIGTERM stops the hub, the proxy, the wmla service and the idle cullers cleanly within 10 s
(issue 38, item 6): a real hub from the repository's jupyterhub_config.py.

Before: 61-68 s and a traceback. The hub stops its managed services one after another with
SIGINT first, waiting up to 30 s for each before SIGTERM; the cullers, started from a shell
that ignores SIGINT (``make run &``, ``nohup``), inherited it ignored, and when it was not
ignored they died of it with a ``KeyboardInterrupt`` traceback; the hub's service health check,
run in the middle of that long shutdown, logged ``'NoneType' object has no attribute 'proto'``.
Every process is stopped by PID at the end whatever happened (``Hub.stop``)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from .hub import PROXY, Hub

pytestmark = pytest.mark.skipif(not PROXY.exists(), reason="configurable-http-proxy is missing")


def wait_for_cullers(hub: Hub, timeout: float = 30) -> None:
    """Until both cullers made their first call to the hub (they are past their imports)."""
    deadline = time.monotonic() + timeout
    while True:
        log = whole_log(hub)
        if all(f"({name}@" in log for name in ("wmla-idle-culler", "wmla-idle-culler-gpu")):
            return
        assert time.monotonic() < deadline, log[-3000:]
        time.sleep(0.2)


def whole_log(hub: Hub) -> str:
    return hub.log_path.read_text(errors="replace")


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.mark.parametrize(
    "how",
    ["sigterm", "sigterm-sigint-ignored", "ctrl-c"],
    ids=["SIGTERM", "SIGTERM, SIGINT inherited ignored (make run &)", "Ctrl-C to the group"],
)
def test_the_hub_stops_everything_within_10_s_without_a_traceback(tmp_path: Path, how: str) -> None:
    hub = Hub(tmp_path, {"tick": 1})
    if how == "sigterm-sigint-ignored":
        hub.preexec = lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        hub.start()
        wait_for_cullers(hub)
        hub._collect()
        assert hub.proc is not None
        pids = set(hub.pids)
        names = {p: " ".join(psutil.Process(p).cmdline()) for p in pids}
        assert any("jupyterhub_idle_culler" in n for n in names.values()), names
        assert any("extension.service" in n for n in names.values()), names
        assert any("configurable-http-proxy" in n for n in names.values()), names
        before = len(whole_log(hub))
        began = time.monotonic()
        if how == "ctrl-c":  # the terminal signals the whole foreground group
            os.killpg(hub.proc.pid, signal.SIGINT)
        else:
            hub.proc.send_signal(signal.SIGTERM)
        code = hub.proc.wait(60)
        while any(alive(p) for p in pids) and time.monotonic() - began < 60:
            time.sleep(0.05)
        took = time.monotonic() - began
        print(f"{how}: everything stopped in {took:.1f} s")
        left = {p: names[p] for p in pids if alive(p)}
        assert not left and took < 10, (took, left)
        assert code == 0
        after = whole_log(hub)[before:]
        assert "wmla service stopping" in after
        assert "Traceback" not in after and "KeyboardInterrupt" not in after, after
        assert "has no attribute 'proto'" not in after
    finally:
        hub.stop()
