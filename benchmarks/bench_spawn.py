"""Spawn to ready: the time from a spawn request to a notebook server ready, embedded default
as root.

    .venv/bin/python benchmarks/bench_spawn.py [--tries 20] [--json-out FILE]

Root only. The hub from the repository's jupyterhub_config.py (tests/service/hub.py: the real
JupyterHub, proxy and wmla service), its spawner the embedded default ``wmla-local`` creating a
system account for the user (a random prefix, removed after), as tests/e2e/test_new_user.py
configures it. Each try: ``POST /hub/api/users/<name>/server`` (the default profile and plan),
then ``GET /hub/api/users/<name>`` every 50 ms until the server is ``ready`` (the hub checked
it answers); then the server is stopped and the next try starts once it is gone. The first try
is the user's first spawn (account, folder, getting-started files): reported apart, and in the
p50/p99 over all tries.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import requests  # noqa: E402

from benchmarks.bench_service import pct  # noqa: E402
from tests.service.hub import PROXY, Hub  # noqa: E402

USER = "spawner"
SPAWNER_CONFIG = """
c.JupyterHub.spawner_class = "wmla-local"
c.WmlaLocalSpawner.storage_root = {storage!r}
c.WmlaLocalSpawner.system_user_template = {template!r}
c.WmlaLocalSpawner.notebook_cpu = "100m"
c.WmlaLocalSpawner.notebook_memory = "256Mi"
c.Spawner.default_url = "/lab"
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 90
"""


def as_user(hub: Hub, method: str, path: str, **kwargs) -> requests.Response:
    """The hub's API with the user's own token (the test service's may not start servers)."""
    headers = {"Authorization": f"token {hub.user_api_token}"}
    return requests.request(
        method, f"{hub.url}/hub/api{path}", headers=headers, timeout=30, **kwargs
    )


def server(hub: Hub) -> dict | None:
    r = as_user(hub, "GET", f"/users/{USER}")
    r.raise_for_status()
    return r.json().get("servers", {}).get("")


def one_try(hub: Hub, timeout: float = 180) -> float:
    t0 = time.perf_counter()
    r = as_user(hub, "POST", f"/users/{USER}/server", json={})
    if r.status_code not in (201, 202):
        raise RuntimeError(f"spawn: {r.status_code} {r.text[:300]}")
    while time.perf_counter() - t0 < timeout:
        model = server(hub)
        if model and model.get("ready"):
            return time.perf_counter() - t0
        if model is None and r.status_code == 202 and time.perf_counter() - t0 > 5:
            raise RuntimeError(f"the server is gone while starting:\n{hub.log()}")
        time.sleep(0.05)
    raise RuntimeError(f"not ready after {timeout} s:\n{hub.log()}")


def stop(hub: Hub, timeout: float = 60) -> None:
    as_user(hub, "DELETE", f"/users/{USER}/server")
    t0 = time.monotonic()
    while server(hub) is not None:
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"the server did not stop:\n{hub.log()}")
        time.sleep(0.1)


@contextlib.contextmanager
def embedded_hub() -> Iterator[Hub]:
    """The hub with the embedded default as root and a user of its own (a system account of a
    random prefix), its token at ``hub.user_api_token``; everything stopped and removed after."""
    prefix = f"wsp{secrets.token_hex(2)}-"
    tmp = Path(tempfile.mkdtemp(prefix="wmla-bench-spawn-"))
    os.chmod(tmp, 0o711)
    storage = tmp / "storage"
    storage.mkdir(mode=0o711)
    traits = {"device_layout": "1x4", "cpu_oversubscription": 4}
    traits["backend_options"] = {"account_template": prefix + "{username}"}
    hub = Hub(tmp, traits)
    hub.env["WMLA_STORAGE_ROOT"] = str(storage)
    hub.storage = storage
    with open(hub.config, "a") as f:
        f.write(SPAWNER_CONFIG.format(storage=str(storage), template=prefix + "{username}"))
    try:
        hub.start(timeout=120)
        hub.user_api_token = hub.user_token(USER)
        yield hub
    finally:
        try:
            as_user(hub, "DELETE", f"/users/{USER}/server")
        except Exception:
            pass
        hub.stop()
        subprocess.run(["userdel", prefix + USER], capture_output=True)
        inside = str(tmp.resolve()) + "/"
        points = [
            line.split()[1]
            for line in Path("/proc/self/mounts").read_text().splitlines()
            if line.split()[1].startswith(inside)
        ]
        for point in sorted(points, key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


def run(tries: int) -> dict:
    times: list[float] = []
    load0 = os.getloadavg()
    with embedded_hub() as hub:
        for k in range(tries):
            times.append(one_try(hub))
            print(f"  try {k + 1}: ready after {times[-1]:.3f} s", file=sys.stderr)
            stop(hub)
    return {
        "tries": len(times),
        "first_s": round(times[0], 3),
        "p50_s": round(pct(times, 50), 3),
        "p99_s": round(pct(times, 99), 3),
        "p50_after_first_s": round(pct(times[1:], 50), 3) if len(times) > 1 else None,
        "max_s": round(max(times), 3),
        "cores": os.cpu_count(),
        "load_before": [round(x, 2) for x in load0],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "times_s": [round(t, 3) for t in times],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tries", type=int, default=20)
    parser.add_argument("--json-out", default="")
    args = parser.parse_args()
    if os.geteuid() != 0 or not shutil.which("useradd"):
        # as `make bench` runs it: said, not failed
        print(
            "bench_spawn.py needs root and useradd (the embedded default as root); nothing measured"
        )
        return 0
    if not PROXY.exists():
        print("configurable-http-proxy is missing: run `make install`", file=sys.stderr)
        return 2
    r = run(args.tries)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(r, indent=1))
    print(
        f"spawn to ready (embedded default as root, {r['tries']} tries, {r['cores']} cores, load"
        f" {r['load_before'][0]} before, {r['load_after'][0]} after): p50 {r['p50_s']} s,"
        f" p99 {r['p99_s']} s, max {r['max_s']} s; the first spawn {r['first_s']} s, p50 of"
        f" the others {r['p50_after_first_s']} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
