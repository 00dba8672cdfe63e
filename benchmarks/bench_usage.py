"""Usage query benchmark: one plan subtree over 30 days of history with 1,000 user leaves.

    .venv/bin/python benchmarks/bench_usage.py [--json] [--quick]

History: a plan tree /bench/org-O/team-T (10 x 10 teams) with 10 user leaves per team (1,000
leaves); every leaf runs about ``--jobs`` jobs a day for 30 days (submitted, started with 1-8
one-GPU workers after a wait, some resized, finished), as transition rows like the service's
store writes them. The ledger keeps the last 7 days at full resolution and hourly buckets before.

Measured, in the same run:
- the ledger's usage query (``extension.metering.usage.usage``) for /bench (1,000 leaves below,
  10 children) and for one org (100 leaves), 30 days at 1-hour steps, and 1 day at 5-minute steps;
- the baseline: a naive full scan that walks every transition of the subtree and integrates it
  into the same hourly steps per child (what a service without a ledger does per request);
- that both give the same GPU-hours per child, exactly;
- how many entries the ledger stores (full-resolution points and runs of equal buckets) against
  one entry per hour per series.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from extension.metering.accounting import Fact, Ledger, ms  # noqa: E402
from extension.metering.usage import usage  # noqa: E402

DAY = 86400.0
T_END = 1_800_000_000.0  # "now": a whole hour


def history(leaves: list[str], days: int, jobs_per_day: float, seed: int = 7) -> list[Fact]:
    rng = random.Random(seed)
    facts: list[Fact] = []
    start = T_END - days * DAY
    n = 0
    for leaf in leaves:
        user = leaf.rsplit("/", 1)[1]
        t = start + rng.uniform(0, DAY / jobs_per_day)
        while t < T_END - 3600:
            n += 1
            job = f"job-{n}"
            workers = rng.randint(1, 8)
            run = rng.uniform(600, 4 * 3600)
            wait = rng.uniform(0, 1800)

            def fact(
                at: float, event: str, state: str, held: int, j=job, w=workers, lf=leaf, u=user
            ) -> Fact:
                return Fact(at, j, lf, u, event, state, held, w, 1, 500, 2**30)

            facts.append(fact(t, "submitted", "PENDING", 0))
            facts.append(fact(t + wait, "started", "RUNNING", workers))
            if workers > 1 and rng.random() < 0.3:
                facts.append(fact(t + wait + run / 2, "resized", "RUNNING", workers // 2))
            facts.append(fact(t + wait + run, "finished", "FINISHED", 0))
            t += rng.expovariate(jobs_per_day / DAY) + wait + run
    facts.sort(key=lambda f: f.at)  # the order the store writes them
    return facts


def naive(facts: list[Fact], plan: str, start: float, end: float, step: float) -> dict:
    """Baseline: scan every transition, keep those under ``plan``, integrate per child and
    step (exact integers, like the ledger)."""
    prefix = plan.rstrip("/") + "/"
    depth = prefix.count("/")
    t0, t1, dt = ms(start), ms(end), ms(step)
    steps = -(-(t1 - t0) // dt)
    per_job: dict[str, list[tuple[int, int]]] = defaultdict(list)
    child_of: dict[str, str] = {}
    for f in facts:
        if not f.leaf.startswith(prefix):
            continue
        child_of[f.job_id] = "/".join(f.leaf.split("/")[: depth + 1])
        per_job[f.job_id].append((ms(f.at), round(f.gpu * 1000) * f.workers))
    out: dict[str, list[int]] = defaultdict(lambda: [0] * steps)
    for job, points in per_job.items():
        row = out[child_of[job]]
        for i, (t, v) in enumerate(points):
            if not v:
                continue
            e = points[i + 1][0] if i + 1 < len(points) else t1
            lo, hi = max(t, t0), min(e, t1)
            while lo < hi:
                k = (lo - t0) // dt
                edge = min(hi, t0 + (k + 1) * dt)
                row[k] += v * (edge - lo)
                lo = edge
    return {child: sum(row) for child, row in out.items()}


def timed(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - began)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quick", action="store_true", help="3 days of history (a smoke run)")
    parser.add_argument("--jobs", type=float, default=2.0, help="jobs per leaf per day")
    args = parser.parse_args()
    days = 3 if args.quick else 30
    leaves = [
        f"/bench/org-{o}/team-{t}/user{o}{t}{u}"
        for o in range(10)
        for t in range(10)
        for u in range(10)
    ]
    began = time.perf_counter()
    facts = history(leaves, days, args.jobs)
    made = time.perf_counter() - began
    ledger = Ledger(bucket_seconds=3600, full_resolution_seconds=7 * DAY)
    began = time.perf_counter()
    ledger.extend(facts)
    ledger.compact(T_END)
    built = time.perf_counter() - began
    start = T_END - days * DAY
    figures: dict = {
        "leaves": len(leaves),
        "days": days,
        "transitions": len(facts),
        "history_s": round(made, 3),
        "ledger_build_s": round(built, 3),
        "ledger_build_per_transition_us": round(1e6 * built / len(facts), 2),
        "stored_entries": sum(
            s.points + len(s.otimes) for n in ledger.nodes.values() for s in (n.requested, n.used)
        ),
        "dense_hourly_entries": 2 * len(ledger.nodes) * int(days * 24),
    }
    queries = [
        ("/bench", start, 3600.0, f"{days} days, 1 h steps, 1,000 leaves"),
        ("/bench/org-3", start, 3600.0, f"{days} days, 1 h steps, 100 leaves"),
        ("/bench", T_END - DAY, 300.0, "1 day, 5 min steps, 1,000 leaves"),
    ]
    for plan, q_start, step, label in queries:
        answer = usage(ledger, plan, q_start, T_END, step, T_END)
        fast = timed(lambda p=plan, s=q_start, st=step: usage(ledger, p, s, T_END, st, T_END), 3)
        slow = timed(lambda p=plan, s=q_start, st=step: naive(facts, p, s, T_END, st), 1)
        want = naive(facts, plan, q_start, T_END, step)
        got = {
            c["path"]: ledger.integrals(c["path"], "used", [ms(q_start), ms(T_END)])
            for c in answer["children"]
        }
        agree = all(want.get(p, 0) == v[1][0] - v[0][0] for p, v in got.items())
        figures[label] = {
            "ledger_ms": round(1000 * fast, 2),
            "naive_scan_ms": round(1000 * slow, 1),
            "speedup": round(slow / fast, 1),
            "gpu_hours": round(answer["totals"]["gpu_hours"], 1),
            "same_gpu_hours_per_child": agree,
        }
    if args.json:
        print(json.dumps(figures))
        return
    print(
        f"history: {figures['transitions']:,} transitions, {len(leaves):,} leaves, {days} days "
        f"(ledger built in {built:.2f} s, {figures['ledger_build_per_transition_us']} us each)"
    )
    print(
        f"stored: {figures['stored_entries']:,} points and bucket runs for {len(ledger.nodes):,} "
        f"nodes (one entry per hour per series would be {figures['dense_hourly_entries']:,})"
    )
    for _, _, _, label in queries:
        f = figures[label]
        print(
            f"{label:38s} ledger {f['ledger_ms']:8.2f} ms   naive scan {f['naive_scan_ms']:9.1f} ms"
            f"   x{f['speedup']:<7} {f['gpu_hours']:>10,.1f} GPU-h  exact match: "
            f"{f['same_gpu_hours_per_child']}"
        )


if __name__ == "__main__":
    main()
