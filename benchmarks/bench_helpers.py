"""What a user-files helper's start costs: forked by the helper server against a setpriv start.

    nice -n 19 .venv/bin/python benchmarks/bench_helpers.py [--starts 100] [--json]

Each start is one helper of a throw-away account (made here, removed at the end) up to its first
answer (``check_runnable /bin/sh``, what a job's start asks): the latency (p50, p99), the
service's CPU for it (this process, every thread: the fork request, the listener, Popen), the
helper server's CPU per start, and the helper's own CPU to its first answer. The two ways
alternate, start by start, so load on the machine falls on both alike. Each helper is ended
after a second request (the cost of a request without a start, for scale), outside the
timing of the first.

Needs root (helpers drop to the account); says so and exits 0 without it.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from extension.userfs import forked  # noqa: E402
from extension.userfs import pool as userfs  # noqa: E402
from extension.userfs.accounts import create_account  # noqa: E402

CHECK = {"id": 1, "op": "check_runnable", "args": {"program": "/bin/sh"}}
TICK = os.sysconf("SC_CLK_TCK")


def cpu_of(pid: int) -> float:
    """Seconds of CPU process ``pid`` used so far: the scheduler's nanoseconds where there are
    (a forked helper's first answer takes less than the 10 ms tick of /proc/PID/stat)."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK


def one_start(way: str, ident: userfs.Identity, account, python: str, server) -> dict:  # noqa: ANN001
    """One helper started the ``way`` named, to its first answer; what it cost."""
    cpu0, t0 = time.process_time(), time.perf_counter()
    if way == "forked":
        process = userfs._Forked(ident, server, 60.0, time.monotonic() + 10)
    else:
        process = userfs._Popened(ident, python, 60.0)
    helper = userfs._Helper(ident, account, process)
    answer = helper.exchange(CHECK, time.monotonic() + 10, 1 << 20)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    assert answer == {"id": 1, "ok": ""}, answer
    own = cpu_of(helper.pid)
    cpu0, t0 = time.process_time(), time.perf_counter()  # the next request: no start in it
    helper.exchange(CHECK, time.monotonic() + 10, 1 << 20)
    again, again_cpu = time.perf_counter() - t0, time.process_time() - cpu0
    helper.end()
    return {"wall": wall, "cpu": cpu, "helper_cpu": own, "again": again, "again_cpu": again_cpu}


def summary(runs: list[dict], server_cpu: float | None) -> dict:
    walls = sorted(r["wall"] for r in runs)
    return {
        "starts": len(runs),
        "p50_ms": 1000 * statistics.median(walls),
        "p99_ms": 1000 * walls[min(len(walls) - 1, int(0.99 * len(walls)))],
        "service_cpu_ms": 1000 * statistics.mean(r["cpu"] for r in runs),
        "server_cpu_ms": None if server_cpu is None else 1000 * server_cpu / len(runs),
        "helper_cpu_ms": 1000 * statistics.mean(r["helper_cpu"] for r in runs),
        "next_request_p50_ms": 1000 * statistics.median(r["again"] for r in runs),
        "next_request_service_cpu_ms": 1000 * statistics.mean(r["again_cpu"] for r in runs),
    }


def measure(starts: int) -> dict:
    name = f"wb{secrets.token_hex(3)}"
    home = Path(tempfile.mkdtemp(prefix="wmla-bench-helpers-"))
    try:
        account = create_account(name, home / "h")
        ident, python = userfs.identity(account), userfs.helper_python(account)
        server = forked.HelperServer(python, userfs._SOURCE, userfs.HELPER_ENV)
        try:
            one_start("forked", ident, account, python, server)  # the server's own start aside
            one_start("setpriv", ident, account, python, server)
            server0 = cpu_of(server.pid)
            runs: dict[str, list[dict]] = {"setpriv": [], "forked": []}
            for _ in range(starts):
                for way, done in runs.items():
                    done.append(one_start(way, ident, account, python, server))
            server_cpu = cpu_of(server.pid) - server0
        finally:
            server.close()
        return {
            "setpriv": summary(runs["setpriv"], None),
            "forked": summary(runs["forked"], server_cpu),
        }
    finally:
        subprocess.run(["userdel", name], capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=100, help="helper starts of each way")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    options = parser.parse_args()
    if os.geteuid() != 0 or not forked.SUPPORTED:
        print("bench_helpers: needs root and pidfds (helpers drop to an account); skipped")
        return 0
    figures = measure(options.starts)
    if options.json:
        print(json.dumps(figures, indent=2))
        return 0
    print(f"{'start':<9}{'p50 ms':>9}{'p99 ms':>9}{'service CPU ms':>16}"
          f"{'server CPU ms':>15}{'helper CPU ms':>15}")  # fmt: skip
    for way, f in figures.items():
        server = "-" if f["server_cpu_ms"] is None else f"{f['server_cpu_ms']:.2f}"
        print(f"{way:<9}{f['p50_ms']:>9.2f}{f['p99_ms']:>9.2f}{f['service_cpu_ms']:>16.2f}"
              f"{server:>15}{f['helper_cpu_ms']:>15.2f}")  # fmt: skip
    for way, f in figures.items():
        print(f"{way}: the helper's next request (no start): p50 {f['next_request_p50_ms']:.2f} "
              f"ms, service CPU {f['next_request_service_cpu_ms']:.2f} ms")  # fmt: skip
    ratio = figures["setpriv"]["p50_ms"] / figures["forked"]["p50_ms"]
    print(f"forked: {ratio:.1f}x faster to a first answer at the median "
          f"({options.starts} starts each, alternating)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
