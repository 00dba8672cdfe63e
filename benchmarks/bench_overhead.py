"""Overhead of running training through wmla's local backend instead of plain torchrun.

    .venv/bin/python benchmarks/bench_overhead.py [--workers 2] [--epochs 3] [--repeats 3] [--json]

The same example (examples/pytorch_mnist, DDP on gloo) with the same workers and arguments, in
one run: once launched by ``torch.distributed.run`` (plain torchrun, the baseline), once by
``LocalBackend`` (what the service's loop calls for a Start decision: the gang launch, the
environment, per-worker logs, the exit-code watch). Prints the median wall time of each, their
ratio (goal <= 1.05) and, through the backend, the time from start() to the first reported step.
The runs alternate, so load on the machine falls on both alike.
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
from extension.scheduler import Resources  # noqa: E402

EXAMPLE = ROOT / "examples" / "pytorch_mnist" / "main.py"
GOAL = 1.05


def script_args(epochs: int) -> list[str]:
    return [str(EXAMPLE), "--epochs", str(epochs), "--batch-size", "32"]


def plain_torchrun(workers: int, epochs: int, workdir: Path) -> float:
    env = {**os.environ, "WMLA_JOB_DIR": str(workdir), "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={workers}",
            *script_args(epochs),
        ],
        cwd=workdir,
        env=env,
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - start


async def through_backend(workers: int, epochs: int, workdir: Path) -> tuple[float, float]:
    done: asyncio.Queue[BackendEvent] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    backend = LocalBackend(
        lambda e: loop.call_soon_threadsafe(done.put_nowait, e),
        detect_nodes(f"1x{workers}"),
        workdir / "state",
        run_as_user=False,
    )
    spec = JobSpec(
        id="bench",
        user="bench",
        leaf="/bench/bench",
        per_worker=Resources(1, 0, 0),
        command=[sys.executable, *script_args(epochs)],
        workdir=str(workdir / "job"),
        min_workers=workers,
        max_workers=workers,
    )
    start = time.perf_counter()
    wall_start = time.time()
    await backend.start(spec, ("local",) * workers)
    while True:
        event = await done.get()
        if event.kind in ("finished", "failed"):
            break
    elapsed = time.perf_counter() - start
    await backend.close()
    if event.kind != "finished":
        raise SystemExit(f"the job failed: {event.message}")
    metrics = (workdir / "job" / "metrics.jsonl").read_text().splitlines()
    first_step = json.loads(metrics[0])["time"] - wall_start
    return elapsed, first_step


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    plain, wmla, first = [], [], []
    for n in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            base = Path(tmp)
            (base / "plain").mkdir()
            print(f"run {n + 1}/{args.repeats}: plain torchrun ...", file=sys.stderr)
            plain.append(plain_torchrun(args.workers, args.epochs, base / "plain"))
            print(f"run {n + 1}/{args.repeats}: wmla local backend ...", file=sys.stderr)
            elapsed, to_first = asyncio.run(through_backend(args.workers, args.epochs, base))
            wmla.append(elapsed)
            first.append(to_first)
    report = {
        "workers": args.workers,
        "epochs": args.epochs,
        "torchrun_s": round(statistics.median(plain), 2),
        "wmla_s": round(statistics.median(wmla), 2),
        "ratio": round(statistics.median(wmla) / statistics.median(plain), 3),
        "start_to_first_step_s": round(statistics.median(first), 2),
        "goal_ratio": GOAL,
    }
    report["met"] = report["ratio"] <= GOAL
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(f"plain torchrun      {report['torchrun_s']:>7} s (median of {args.repeats})")
        print(f"wmla local backend  {report['wmla_s']:>7} s")
        print(
            f"ratio               {report['ratio']:>7} (goal <= {GOAL}: "
            f"{'met' if report['met'] else 'NOT met'})"
        )
        print(f"start -> first step {report['start_to_first_step_s']:>7} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
