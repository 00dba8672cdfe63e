"""What a worker's cgroup costs: its making, entering and removal, and a whole job start.

    .venv/bin/python benchmarks/bench_confine.py [--jobs 40] [--json]

Two figures, each beside its baseline in the same run, the runs alternating so load on the
machine falls on both alike:

1. the cgroup alone: ``create`` (every hierarchy's folder and limits), a process that enters it
   between fork and exec, ``remove``; against the same process started without it. Goal: at most
   5 ms added per worker start (issue 27).
2. a whole one-worker job through ``LocalBackend`` (``python -c pass``), start() to the
   ``finished`` event, confined (this machine's cgroups) and unconfined (no cgroup made).

Needs root and cgroups (v1 or v2); says so and exits 0 without them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from extension.backends.base import BackendEvent, JobSpec  # noqa: E402
from extension.backends.capacity import detect_nodes  # noqa: E402
from extension.backends.local import LocalBackend  # noqa: E402
from extension.backends.local.confining import WorkerCgroups  # noqa: E402
from extension.confine import Grant, Unconfined, detect, enter  # noqa: E402
from extension.scheduler import Resources  # noqa: E402

GOAL_MS = 5.0


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def one_process(confine, name: str | None) -> float:
    """Seconds to make the cgroup (when ``name``), start ``true`` in it, wait, remove it. Both
    ways fork and run a step before exec, as the launcher does (without ``preexec_fn``
    subprocess takes vfork, a cheaper start than any worker's)."""
    start = time.perf_counter()
    if name is None:
        subprocess.run(["/bin/true"], check=True, preexec_fn=os.getpid)
    else:
        group = confine.create(name, Grant(1000, 256 << 20, 1024))
        files = group.enter_files()
        subprocess.run(["/bin/true"], check=True, preexec_fn=lambda: enter(files))
        group.remove(5.0)
    return time.perf_counter() - start


async def one_job(backend: LocalBackend, done: asyncio.Queue, workdir: Path, n: int) -> float:
    spec = JobSpec(
        id=f"bench-{n}",
        user="bench",
        leaf="/bench/bench",
        per_worker=Resources(0, 1000, 256 << 20),
        command=[sys.executable, "-c", "pass"],
        workdir=str(workdir / f"job-{n}"),
    )
    start = time.perf_counter()
    await backend.start(spec, ("local",))
    while True:
        event = await done.get()
        if event.job_id == spec.id and event.kind in ("finished", "failed"):
            break
    if event.kind != "finished":
        raise SystemExit(f"job {spec.id} failed: {event.message}")
    return time.perf_counter() - start


async def jobs(count: int, tmp: Path) -> dict[str, list[float]]:
    done: asyncio.Queue[BackendEvent] = asyncio.Queue()

    def backend(state: str, cgroups: WorkerCgroups | None) -> LocalBackend:
        return LocalBackend(
            done.put_nowait,
            detect_nodes("1x1", cpu_millicores=2000, memory_bytes=4 << 30),
            tmp / state,
            run_as_user=False,
            real_gpus=False,
            poll_interval=0.01,
            cgroups=cgroups,
        )

    confined = backend("confined", None)
    bare = backend("bare", WorkerCgroups(Unconfined("benchmark baseline")))
    out: dict[str, list[float]] = {"confined": [], "unconfined": []}
    for n in range(count):
        out["confined"].append(await one_job(confined, done, tmp, 2 * n))
        out["unconfined"].append(await one_job(bare, done, tmp, 2 * n + 1))
    await confined.close()
    await bare.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    confine = detect(f"bench-{os.getpid()}")
    if os.geteuid() != 0 or confine.report.mechanism == "none":
        print(f"bench_confine: no cgroups here ({confine.report.warnings()[0]}); nothing to time")
        return 0
    cg, bare = [], []
    for n in range(args.jobs * 5):
        cg.append(one_process(confine, f"bench-{n}"))
        bare.append(one_process(confine, None))
    confine.prune()
    with tempfile.TemporaryDirectory() as tmp:
        timed = asyncio.run(jobs(args.jobs, Path(tmp)))
    added = [(a - b) * 1000 for a, b in zip(cg, bare)]
    result = {
        "mechanism": confine.report.mechanism,
        "process": {
            "bare_ms_median": statistics.median(bare) * 1000,
            "confined_ms_median": statistics.median(cg) * 1000,
            "added_ms_median": statistics.median(added),
            "added_ms_p90": p(added, 0.9),
        },
        "job": {
            k: {"ms_median": statistics.median(v) * 1000, "ms_p90": p(v, 0.9) * 1000}
            for k, v in timed.items()
        },  # fmt: skip
        "goal_added_ms": GOAL_MS,
    }
    result["job"]["added_ms_median"] = (
        result["job"]["confined"]["ms_median"] - result["job"]["unconfined"]["ms_median"]
    )
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    proc, job = result["process"], result["job"]
    print(
        f"cgroups: {result['mechanism']}; {args.jobs * 5} processes and {args.jobs} jobs each way"
    )
    print(f"  a process, bare:            {proc['bare_ms_median']:7.2f} ms median")
    print(f"  a process in its cgroup:    {proc['confined_ms_median']:7.2f} ms median "
          f"(create + enter + remove)")  # fmt: skip
    print(f"  added per worker start:     {proc['added_ms_median']:7.2f} ms median, "
          f"{proc['added_ms_p90']:.2f} ms p90 (goal <= {GOAL_MS} ms)")  # fmt: skip
    print(f"  a job start->finished, unconfined: {job['unconfined']['ms_median']:7.1f} ms median")
    print(f"  a job start->finished, confined:   {job['confined']['ms_median']:7.1f} ms median "
          f"({job['added_ms_median']:+.1f} ms)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
