"""Metering inside the wmla service: the ledger fed from the store, Prometheus, sampling.

``Metering(parent=service, store=store)`` reads the ``transitions`` table (joined with ``jobs``
for each job's user and max workers) into a ``Ledger``, and after that only the rows written
since (``id`` greater than the last one read). The ledger's sealed history goes to a spill file
in the service's ``state_dir`` (``blocks.py``). ``attach(scheduler)`` registers ``on_cycle`` on
the scheduling loop: after every cycle it folds in the new transitions, keeps the cycle's plan
figures (deserved, limit, pending, running) for Prometheus, times the cycle and, every
``sample_interval`` seconds, samples the measured utilization of running local jobs, and keeps
the fair-share samples of the admin page's chart (``shares.py``). The churn
counters (``churn.py``) are read from the stored Preempt decisions at start and fed by the loop's
``decision_hooks``.

Knobs are traits of ``Metering``: set them as ``c.Metering.x = ...`` in the service's config.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from traitlets import Bool, Float, Int
from traitlets.config import LoggingConfigurable

from extension.backends.base import WorkerPids

from .accounting import RESOURCES, ROOT, Fact, Ledger
from .blocks import MEMORY, Blocks, SpillFile
from .churn import Churn, churn_families
from .pending import pending_families, queue_views
from .shares import ShareSamples, share_families
from .utilization import UtilizationSampler

# Prometheus base units: devices, cores, bytes (the ledger keeps milli-devices and millicores)
PROM_SCALE = (1000.0, 1000.0, 1.0)
CORE_SCALE = (1.0, 1000.0, 1.0)  # the scheduler's figures: devices, millicores, bytes


class Metering(LoggingConfigurable):
    full_resolution = Float(
        7 * 86400.0,
        config=True,
        help="""Seconds of history kept at full resolution (every change); older history is kept
        as bucket integrals (see bucket), exact at bucket boundaries.

        c.Metering.full_resolution = 14 * 86400
        """,
    )
    bucket = Float(
        3600.0,
        config=True,
        help="""Seconds per bucket of downsampled history (older than full_resolution). Ask the
        usage API for steps that are multiples of it to get exact figures there.

        c.Metering.bucket = 3600
        """,
    )
    retention = Float(
        400 * 86400.0,
        config=True,
        help="""Seconds of history kept at all (as buckets); older usage reads as zero. At least
        full_resolution.

        c.Metering.retention = 2 * 365 * 86400
        """,
    )
    max_points = Int(
        11_000,
        config=True,
        help="""Most steps one usage query may ask for (end - start) / step.

        c.Metering.max_points = 11000
        """,
    )
    sample_interval = Float(
        15.0,
        config=True,
        help="""Seconds between samples of measured utilization (psutil for CPU and memory of
        local workers, NVML for GPUs when pynvml is installed); 0 turns sampling off.

        c.Metering.sample_interval = 15
        """,
    )
    metrics_user_leaves = Bool(
        True,
        config=True,
        help="""Whether /metrics shows user leaves (one series per user and plan and resource)
        besides the plans; False keeps Prometheus to the plans an admin created (their figures
        include their leaves).

        c.Metering.metrics_user_leaves = False
        """,
    )
    metrics_require_auth = Bool(
        True,
        config=True,
        help="""Whether /services/wmla/metrics needs a hub token of a plan admin (custom:wmla:admin,
        e.g. a Prometheus service's token). False opens it to anyone who reaches the service.

        c.Metering.metrics_require_auth = True
        """,
    )

    def __init__(self, store: Any, clock: Callable[[], float] = time.time, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.store = store
        self.clock = clock
        self.ledger = Ledger(self.bucket, self.full_resolution, self.retention, self._blocks())
        self.last_id = 0
        self._result: Any = None  # the last cycle's; its plan figures are built on first read
        self.cycles = 0
        self.scheduler: Any = None
        self._refreshing = asyncio.Lock()
        self._refresh_task: asyncio.Task | None = None
        self.sampler = UtilizationSampler() if self.sample_interval > 0 else None
        self._sampled = -math.inf
        self.registry = CollectorRegistry()
        self.cycle_seconds = Histogram(
            "wmla_scheduling_cycle_duration_seconds",
            "Wall time of one scheduling cycle (events, decisions, store writes).",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.registry.register(_Collector(self))
        self.churn = Churn()
        self.shares = ShareSamples()
        self.churn.load(store.preemption_details())  # the history: counters survive restarts
        self.refresh()

    def _blocks(self) -> Blocks:
        """Where the ledger keeps its sealed history: a spill file in the service's state
        directory (the parent's ``state_dir``, private to the service), else memory."""
        directory = getattr(self.parent, "state_dir", None)
        if not directory:
            return MEMORY
        try:
            return SpillFile.open(directory)
        except OSError as err:
            self.log.warning("metering keeps its full-resolution history in memory: %s", err)
            return MEMORY

    @property
    def figures(self) -> dict:
        """The plan figures of the last cycle seen (empty before the first)."""
        return self._result.plans if self._result is not None else {}

    # -- wiring ------------------------------------------------------------------------------
    def attach(self, scheduler: Any) -> None:
        """Feed from the scheduling loop: ``scheduler.cycle_hooks`` gets ``on_cycle``."""
        self.scheduler = scheduler
        scheduler.cycle_hooks.append(self.on_cycle)
        scheduler.decision_hooks.append(self.on_decisions)

    def on_cycle(self, result: Any, now: float, seconds: float) -> None:
        """Called by the loop after each cycle; never raises (the loop must go on)."""
        try:
            self.cycles += 1
            self._result = result
            self.cycle_seconds.observe(max(0.0, seconds))
            self._refresh_soon()
            if self.sampler is not None and now - self._sampled >= self.sample_interval:
                self._sampled = now
                self.sample(now)
            self.shares.take(self.scheduler, now)  # the fair-share chart's (shares.py)
        except Exception:
            self.log.exception("metering could not take the cycle in")

    def on_decisions(self, decisions: list[tuple[str, str, dict]], now: float) -> None:
        """Called by the loop with each cycle's stored decisions: the churn counters take its
        Preempts (the victim is still live: its release comes later, as an event)."""
        try:
            jobs = self.scheduler.jobs
            for job_id, kind, detail in decisions:
                job = jobs.get(job_id) if kind == "preempt" else None
                if job is not None:
                    self.churn.add(job.leaf, detail)
        except Exception:
            self.log.exception("metering could not count the cycle's preemptions")

    # -- the ledger ------------------------------------------------------------------------------
    def refresh(self) -> int:
        """Fold in the transitions written since the last read; returns how many. Blocking:
        on the service's loop use ``refresh_off_loop``."""
        return self._fold(self._fetch(self.last_id))

    async def refresh_off_loop(self) -> int:
        """``refresh`` with the query in the store's reader threads (the loop never waits on
        the database); one at a time, so the facts go in in their order."""
        db = getattr(self.scheduler, "db", None)
        if db is None:
            return self.refresh()
        async with self._refreshing:
            return self._fold(await db.read(self._fetch, self.last_id))

    def _refresh_soon(self) -> None:
        """After a cycle: refresh in the background, unless one is already under way."""
        if getattr(self.scheduler, "db", None) is None:
            self.refresh()
            return
        if self._refresh_task is not None and not self._refresh_task.done():
            return
        self._refresh_task = asyncio.ensure_future(self.refresh_off_loop())
        self._refresh_task.add_done_callback(self._refreshed)

    def _refreshed(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.log.warning("metering could not read the transitions: %s", task.exception())

    def _fold(self, rows: list) -> int:
        n = 0
        for row in rows:
            if row[0] <= self.last_id:  # read twice (a refresh that raced this one)
                continue
            self.ledger.apply(Fact(*row[1:]))
            self.last_id = row[0]
            n += 1
        self.ledger.compact(self.clock())
        return n

    def _fetch(self, after: int) -> list:
        return self.store.transition_facts(after)

    # -- measured utilization ------------------------------------------------------------------
    def sample(self, now: float) -> None:
        sched = self.scheduler
        backend = getattr(sched, "backend", None)
        if self.sampler is None or not isinstance(backend, WorkerPids):
            return  # nothing to sample (e.g. Kubernetes: the workers are not on this machine)
        pids_of = backend.worker_pids
        usage_of = getattr(backend, "job_usage", None)  # the workers' cgroups, where confined
        jobs, counted = {}, {}
        for job in list(sched.jobs.values()):
            if job.placement:
                try:
                    jobs[job.id] = (job.leaf, list(pids_of(job.id)))
                    usage = usage_of(job.id) if usage_of is not None else None
                except Exception:
                    continue
                if usage is not None:
                    counted[job.id] = usage
        self.sampler.sample(jobs, now, counted)


class _Collector:
    """Builds the metric families at scrape time from the ledger and the last cycle."""

    def __init__(self, meter: Metering) -> None:
        self.meter = meter

    def describe(self) -> list:
        return []  # collected lazily: the families depend on the plans of the moment

    def collect(self) -> Iterator:
        m = self.meter
        try:
            if getattr(m.scheduler, "db", None) is None:  # the handler refreshed off the loop
                m.refresh()
        except Exception:  # a scrape still answers with what is known
            m.log.exception("metering refresh failed during a scrape")
        yield from self._plan_families()
        jobs = getattr(m.scheduler, "jobs", None) or {}
        views = queue_views(m.scheduler)
        now = getattr(m.scheduler, "clock", m.clock)()  # the clock the estimates were made on
        yield from pending_families(m.figures, views, jobs, now, self._shown)
        yield from churn_families(m.churn, self._shown(m.churn.plans))
        yield from share_families(m.scheduler, now, self._shown)
        cycles = CounterMetricFamily("wmla_scheduling_cycles", "Scheduling cycles run.")
        cycles.add_metric([], m.cycles)
        yield cycles
        if m.sampler is not None:
            yield from _measured_families(m.sampler)

    def _shown(self, paths: Any) -> set[str]:
        """The plans of ``paths`` that /metrics shows (user leaves only when asked)."""
        m = self.meter
        paths = set(paths)
        if not m.metrics_user_leaves:
            paths -= set(m.ledger.owners) | _leaves(m.scheduler)
        return paths

    def _plan_families(self) -> list:
        """Per plan: requested and used (the ledger), deserved, demand, limit and jobs (the
        last cycle's figures), preemptions."""
        m = self.meter
        ledger = m.ledger
        labels = ["plan", "resource"]

        def gauge(name: str, doc: str, labels: list[str] = labels) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=labels)

        requested = gauge(
            "wmla_plan_requested",
            "Requested now: max request of pending and running jobs in the plan's subtree "
            "(gpu devices, cpu cores, memory bytes).",
        )
        used = gauge(
            "wmla_plan_used",
            "Used now: resources held by the workers of running jobs in the plan's subtree.",
        )
        deserved = gauge("wmla_plan_deserved", "Deserved share from the last scheduling cycle.")
        limit = gauge(
            "wmla_plan_limit", "The plan's limit (resources without a limit are left out)."
        )
        demand = gauge(
            "wmla_plan_demand",
            "Demand capped by the plan's limit, as the scheduler counted it in the last cycle.",
        )
        jobs = gauge(
            "wmla_plan_jobs", "Pending and running jobs in the plan's subtree.", ["plan", "state"]
        )
        preemptions = CounterMetricFamily(
            "wmla_preemptions", "Jobs preempted in the plan's subtree.", labels=["plan"]
        )
        for path in sorted(self._shown(set(ledger.nodes) | set(m.figures))):
            node = ledger.nodes.get(path)
            if node is not None:
                for name, r, u, scale in zip(
                    RESOURCES, node.requested.current(), node.used.current(), PROM_SCALE
                ):
                    requested.add_metric([path, name], r / scale)
                    used.add_metric([path, name], u / scale)
                preemptions.add_metric([path], node.preemptions)
            fig = m.figures.get(path)
            if fig is not None:
                for i, (name, scale) in enumerate(zip(RESOURCES, CORE_SCALE)):
                    deserved.add_metric([path, name], fig.deserved[i] / scale)
                    demand.add_metric([path, name], fig.demand[i] / scale)
                    if not math.isinf(fig.limit[i]):
                        limit.add_metric([path, name], fig.limit[i] / scale)
                jobs.add_metric([path, "pending"], fig.pending)
                jobs.add_metric([path, "running"], fig.running)
        return [requested, used, deserved, limit, demand, jobs, preemptions]


def _measured_families(sampler: UtilizationSampler) -> list:
    """Per running job on this machine: the last sample of its processes' CPU, memory, GPU."""
    labels = ["job", "plan"]
    cpu = GaugeMetricFamily(
        "wmla_job_measured_cpu_cores",
        "Measured: cores busy in the job's worker processes (psutil), last sample.",
        labels=labels,
    )
    mem = GaugeMetricFamily(
        "wmla_job_measured_memory_bytes",
        "Measured: resident memory of the job's worker processes, last sample.",
        labels=labels,
    )
    gpu = GaugeMetricFamily(
        "wmla_job_measured_gpu_utilization",
        "Measured: utilization (0..1) of the GPUs the job's processes use (NVML).",
        labels=labels,
    )
    for job_id, sample in sampler.latest().items():
        leaf = sampler.leaves.get(job_id, ROOT)
        cpu.add_metric([job_id, leaf], sample.cpu_cores)
        mem.add_metric([job_id, leaf], sample.memory_bytes)
        if sample.gpu_utilization is not None:
            gpu.add_metric([job_id, leaf], sample.gpu_utilization)
    return [cpu, mem, gpu]


def _leaves(scheduler: Any) -> set[str]:
    plans = getattr(scheduler, "plans", None)
    return {p.path for p in plans if p.user_leaf} if plans is not None else set()


logging.getLogger(__name__).addHandler(logging.NullHandler())
