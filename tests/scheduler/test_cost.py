"""docs/scheduling.md "Cost": a settled cycle on a busy cluster leaves the garbage collector
nothing to do. Objects a cycle keeps alive at once (a tuple per running job, per blocked
bucket, ...) add up past the collector's threshold and start collections inside the cycle; a
full one over a big world costs tens of milliseconds, which is the benchmark's p99."""

from __future__ import annotations

import gc
import importlib.util

from extension.scheduler import schedule

from .golden_record import BENCH


def test_a_settled_cycle_starts_no_garbage_collection():
    spec = importlib.util.spec_from_file_location("bench_scheduler", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    snapshot = bench.world(2_000)
    schedule(snapshot, 100.0)
    bench.settle(snapshot)  # starts run, victims terminate: what every later tick sees
    schedule(snapshot, 100.0)
    collections = []

    def count(phase: str, info: dict) -> None:
        if phase == "start":
            collections.append(info["generation"])

    threshold = gc.get_threshold()
    gc.set_threshold(700, 10, 10)  # Python's defaults
    for _ in range(3):  # the steady state: each cycle frees what the one before kept
        schedule(snapshot, 100.0)
    gc.callbacks.append(count)
    try:
        for _ in range(20):
            schedule(snapshot, 100.0)
    finally:
        gc.callbacks.remove(count)
        gc.set_threshold(*threshold)
    # one may come from what was counted before the first; a cycle that holds more than the
    # threshold at once starts several of its own (four a cycle, when it kept a tuple per
    # running job and per blocked bucket)
    assert len(collections) <= 1, collections
