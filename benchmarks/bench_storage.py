"""What a storage quota costs a job's start, and a user's first folder.

    .venv/bin/python benchmarks/bench_storage.py [--starts 400] [--users 10] [--json]

Two figures, each beside its baseline in the same run:

1. per job start: what the service does for the user's folder when a job is submitted
   (``ensure_folder``, then the quota's check that the folder is the user's image, bound), against
   ``ensure_folder`` alone, the runs alternating. Goal: at most 5 ms added (issue 39).
2. once per user: making the image (truncate, mkfs.ext4, mount, bind, reserve), against making
   the plain folder.

Needs root (the images are loop-mounted); says so and exits 0 without it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from extension.storage.images import UserImages  # noqa: E402
from extension.storage.limits import QuotaPolicy  # noqa: E402
from extension.storage.quotas import StorageQuotas  # noqa: E402
from extension.userfs.accounts import Account, ensure_folder  # noqa: E402

GOAL_MS = 5.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=400)
    parser.add_argument("--users", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_storage: needs root (the images are loop-mounted); nothing measured")
        return 0
    base = Path(tempfile.mkdtemp(prefix="wmla-bench-storage-", dir="/srv"))
    os.chmod(base, 0o711)
    storage, plain = base / "storage", base / "plain"
    storage.mkdir(mode=0o711)
    plain.mkdir(mode=0o711)
    images = UserImages(base / "quota", storage)
    quotas = StorageQuotas(
        QuotaPolicy.from_config("1Gi", {}), images, lambda user: [], logging.getLogger()
    )
    account = Account("bench", 54399, 54399)
    try:
        firsts, plain_firsts = [], []
        for n in range(args.users):
            user = f"u{n}"
            t = time.perf_counter()
            ensure_folder(plain, user, account)
            plain_firsts.append(time.perf_counter() - t)
            t = time.perf_counter()
            ensure_folder(storage, user, account)
            quotas.attach(user, account)
            firsts.append(time.perf_counter() - t)
        starts, plain_starts = [], []
        for n in range(args.starts):
            user = f"u{n % args.users}"
            t = time.perf_counter()
            ensure_folder(plain, user, account)
            plain_starts.append(time.perf_counter() - t)
            t = time.perf_counter()
            ensure_folder(storage, user, account)
            quotas.attach(user, account)
            starts.append(time.perf_counter() - t)
    finally:
        problems = images.unmount_all()
        shutil.rmtree(base, ignore_errors=True)
    ms = 1000.0
    figures = {
        "start_ms_p50": statistics.median(starts) * ms,
        "start_ms_p99": sorted(starts)[int(len(starts) * 0.99) - 1] * ms,
        "baseline_start_ms_p50": statistics.median(plain_starts) * ms,
        "added_ms_p50": (statistics.median(starts) - statistics.median(plain_starts)) * ms,
        "first_folder_ms_p50": statistics.median(firsts) * ms,
        "baseline_first_folder_ms_p50": statistics.median(plain_firsts) * ms,
        "goal_added_ms": GOAL_MS,
        "unmount_problems": problems,
    }
    if args.json:
        print(json.dumps(figures, indent=1))
    else:
        print(f"per job start: {figures['start_ms_p50']:.3f} ms p50 "
              f"({figures['start_ms_p99']:.3f} ms p99) with quotas, "
              f"{figures['baseline_start_ms_p50']:.3f} ms without: "
              f"{figures['added_ms_p50']:.3f} ms added (goal <= {GOAL_MS} ms)")  # fmt: skip
        print(f"a user's first folder: {figures['first_folder_ms_p50']:.1f} ms with its image, "
              f"{figures['baseline_first_folder_ms_p50']:.3f} ms plain")  # fmt: skip
    return 0 if figures["added_ms_p50"] <= GOAL_MS and not problems else 1


if __name__ == "__main__":
    sys.exit(main())
