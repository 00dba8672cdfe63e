"""Small fluent builders for scheduler tests (in the spirit of volcano's uthelper)."""

from __future__ import annotations

from extension.scheduler import (
    Instance,
    Job,
    JobState,
    Node,
    PlanTree,
    Resources,
    SchedulerConfig,
    Snapshot,
    schedule,
)
from extension.scheduler.resources import UNLIMITED

GiB = 2**30


def gpus(n: float, cpu: float = 0, memory: float = 0) -> Resources:
    return Resources(n, cpu, memory)


def nodes(count: int, gpu: int = 8, cpu: int = 64_000, memory: int = 512 * GiB) -> tuple:
    return tuple(Node(f"n{i + 1}", Resources(gpu, cpu, memory)) for i in range(count))


def tree(spec: dict[str, tuple]) -> PlanTree:
    """``{"/p": (share, gpu_limit_or_None)}``."""
    out = PlanTree()
    for path in sorted(spec, key=lambda p: (p.count("/"), p)):
        share, gpu_limit = spec[path]
        limit = Resources(UNLIMITED if gpu_limit is None else gpu_limit, UNLIMITED, UNLIMITED)
        out.add(path, share, limit)
    return out


def pending(job_id: str, plan: str, user: str = "u1", workers=1, gpu: int = 1, **kw) -> Job:
    low, high = (workers, workers) if isinstance(workers, int) else workers
    return Job(job_id, user, plan, Resources(gpu, 0, 0), low, high, **kw)


def running(
    job_id: str,
    plan: str,
    placement: tuple,
    user: str = "u1",
    workers=None,
    gpu: int = 1,
    started: float = 0.0,
    **kw,
) -> Job:
    n = len(placement)
    low, high = (n, n) if workers is None else workers
    return Job(
        job_id,
        user,
        plan,
        Resources(gpu, 0, 0),
        low,
        high,
        state=JobState.RUNNING,
        placement=tuple(placement),
        started=started,
        **kw,
    )


def run_cycle(
    plans: PlanTree,
    node_list: tuple,
    jobs: list[Job],
    now: float = 100.0,
    quota: Resources | None = None,
    max_jobs: int | None = None,
    reserved: str | None = None,
    **config,
) -> object:
    inst = Instance(node_list, quota or Resources(UNLIMITED, UNLIMITED, UNLIMITED), max_jobs)
    return schedule(Snapshot(plans, inst, jobs, SchedulerConfig(**config), reserved), now)


def starts(result) -> dict[str, tuple]:
    from extension.scheduler import Start

    return {d.job_id: d.placement for d in result.decisions if isinstance(d, Start)}


def waits(result) -> dict[str, str]:
    return dict(result.waiting)
