"""Measured utilization per job, sampled: a separate, optional series beside the exact ledger.

The ledger counts what the scheduler *gave* a job; this records what the job's processes really
*used*, where the hardware says so:

- CPU and memory of a job's local workers from their cgroups' own accounting where the backend
  confines them (``counted``: CPU seconds of every process that ever ran in it, memory charged
  now), exact and one read per worker; else from psutil over the worker processes and their
  children (``/proc``). Cores used = CPU seconds consumed between two samples / wall seconds;
- GPU, from NVML when ``pynvml`` (the ``nvidia-ml-py`` package) imports and a driver answers:
  the memory each worker process holds on a device and the device's utilization.

Samples are kept per job in a ring buffer (``keep`` samples); nothing is stored on disk.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import psutil

from extension.confine import Usage


@dataclass(frozen=True)
class Sample:
    at: float
    cpu_cores: float  # cores busy on average since the previous sample
    memory_bytes: int  # resident set size, all processes of the job
    gpu_utilization: float | None = None  # 0..1 over the devices the job's processes use
    gpu_memory_bytes: int | None = None


class _Nvml:
    """The few NVML calls needed, or nothing when NVML is not there."""

    def __init__(self) -> None:
        self.ok = False
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            self.nv = pynvml
            self.handles = [
                pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())
            ]
            self.ok = bool(self.handles)
        except Exception:  # no package, no driver, no device: GPU sampling is simply off
            self.ok = False

    def per_pid(self) -> dict[int, tuple[float, int]]:
        """pid -> (utilization 0..1 of its device, GPU memory bytes) for compute processes."""
        out: dict[int, tuple[float, int]] = {}
        if not self.ok:
            return out
        nv = self.nv
        for handle in self.handles:
            try:
                util = nv.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0
                procs = nv.nvmlDeviceGetComputeRunningProcesses(handle)
            except Exception:
                continue
            for proc in procs:
                used = int(getattr(proc, "usedGpuMemory", 0) or 0)
                old = out.get(proc.pid, (0.0, 0))
                out[proc.pid] = (max(old[0], util), old[1] + used)
        return out


class UtilizationSampler:
    """Samples the processes of running jobs; ``pids_of(job_id)`` says which (e.g. the local
    backend's ``worker_pids``)."""

    def __init__(self, keep: int = 720, gpu: bool = True) -> None:
        self.keep = keep
        self.series: dict[str, deque[Sample]] = {}
        self.leaves: dict[str, str] = {}
        self._cpu: dict[str, tuple[float, float]] = {}  # job -> (wall, cpu seconds)
        self._procs: dict[int, psutil.Process] = {}
        self.nvml = _Nvml() if gpu else None

    @property
    def gpu_available(self) -> bool:
        return bool(self.nvml and self.nvml.ok)

    def _tree(self, pids: Iterable[int]) -> list[psutil.Process]:
        procs = []
        for pid in pids:
            try:
                proc = self._procs.get(pid) or psutil.Process(pid)
                self._procs[pid] = proc  # the same object keeps psutil's cpu counters
                procs.append(proc)
                procs.extend(proc.children(recursive=True))
            except psutil.Error:
                continue
        return procs

    def sample(
        self,
        jobs: dict[str, tuple[str, list[int]]],
        now: float,
        counted: Mapping[str, Usage] | None = None,
    ) -> dict[str, Sample]:
        """One sample of every job in ``{job_id: (leaf, pids)}``; jobs not listed are dropped.
        ``counted``: the cgroup figures of the jobs that have them (taken instead of psutil's)."""
        gpu = self.nvml.per_pid() if self.nvml and self.nvml.ok else {}
        counted = counted or {}
        out: dict[str, Sample] = {}
        for job_id, (leaf, pids) in jobs.items():
            usage = counted.get(job_id)
            if usage is not None and not gpu:
                cpu_seconds, rss, seen = usage.cpu_seconds, usage.memory_bytes, []
            else:
                cpu_seconds, rss, seen = self._walk(pids)
                if usage is not None:
                    cpu_seconds, rss = usage.cpu_seconds, usage.memory_bytes
            last = self._cpu.get(job_id)
            cores = 0.0
            if last is not None and now > last[0]:
                cores = max(0.0, (cpu_seconds - last[1]) / (now - last[0]))
            self._cpu[job_id] = (now, cpu_seconds)
            util, gmem = None, None
            if self.gpu_available:
                hits = [gpu[p] for p in seen if p in gpu]
                util = max((h[0] for h in hits), default=0.0)
                gmem = sum(h[1] for h in hits)
            sample = Sample(now, cores, rss, util, gmem)
            self.series.setdefault(job_id, deque(maxlen=self.keep)).append(sample)
            self.leaves[job_id] = leaf
            out[job_id] = sample
        for job_id in set(self.series) - set(jobs):  # ended: forget it
            self.series.pop(job_id, None)
            self.leaves.pop(job_id, None)
            self._cpu.pop(job_id, None)
        live = {p.pid for p in self._procs.values() if p.is_running()}
        self._procs = {pid: p for pid, p in self._procs.items() if pid in live}
        return out

    def _walk(self, pids: list[int]) -> tuple[float, int, list[int]]:
        """CPU seconds and resident memory of the processes and their children, and their pids."""
        cpu_seconds, rss, seen = 0.0, 0, []
        for proc in self._tree(pids):
            try:
                times = proc.cpu_times()
                cpu_seconds += times.user + times.system
                rss += proc.memory_info().rss
                seen.append(proc.pid)
            except psutil.Error:
                continue
        return cpu_seconds, rss, seen

    def latest(self) -> dict[str, Sample]:
        return {job: s[-1] for job, s in self.series.items() if s}
