"""The Grafana dashboard and the Prometheus scrape example refer to what the service exposes;
the measured-utilization sampler reads real processes."""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import time
from pathlib import Path

import yaml
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from extension.metering.meter import Metering
from extension.metering.utilization import UtilizationSampler
from extension.scheduler import UNLIMITED, PlanFigures, Resources
from extension.service.store import Store
from extension.storage.images import UserImages
from extension.storage.limits import QuotaPolicy, StorageLimits
from extension.storage.quotas import QuotaReport, QuotaState, StorageQuotas
from extension.storage.web import StorageCollector

GRAFANA = Path(__file__).resolve().parents[2] / "hub_config" / "grafana"


def _panels(panels: list[dict]):
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def _one_quota(folder: Path) -> StorageQuotas:
    """Storage quotas with one user's last check (the collector reads only that)."""
    limits = StorageLimits(2**30, 1000, 2**29, 1000)
    quotas = StorageQuotas(
        QuotaPolicy(limits, {}), UserImages(folder, folder), lambda user: [], logging.getLogger()
    )
    quotas.latest["u"] = QuotaReport(
        "u", str(folder / "u"), 5, 1, limits, 2**30, 1000, None, QuotaState.UNDER
    )
    return quotas


def _exposed(store_url: str) -> tuple[set[str], str]:
    """Every family and sample name a service with one plan, one cycle and one sample shows."""
    store = Store.open(store_url)
    try:
        meter = Metering(store=store)
        figures = PlanFigures(
            "/p",
            1,
            Resources(4, UNLIMITED, UNLIMITED),
            Resources(2, 0, 0),
            Resources(),
            Resources(),
            1,
            0,
        )
        meter.on_cycle(type("Result", (), {"plans": {"/p": figures}})(), time.time(), 0.01)
        meter.sampler.sample({"job-1": ("/p/u", [os.getpid()])}, time.time())
        meter.registry.register(StorageCollector(_one_quota(Path(tempfile.mkdtemp()))))
        text = generate_latest(meter.registry).decode()
    finally:
        store.close()
    names = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(s.name for s in family.samples)
    return names, text


def test_dashboard_queries_only_exposed_metrics_and_defined_variables(store_url: str) -> None:
    dash = json.loads((GRAFANA / "wmla-metering.json").read_text())
    names, text = _exposed(store_url)
    variables = {v["name"] for v in dash["templating"]["list"]}
    exprs = [t["expr"] for p in _panels(dash["panels"]) for t in p.get("targets", [])]
    assert exprs
    for expr in exprs:
        for metric in re.findall(r"\bwmla_[a-z_]+", expr):
            assert metric in names, f"{metric} in {expr!r} is not exposed"
        for var in re.findall(r"\$\{?([a-z]+)", expr):
            assert var in variables, f"${var} in {expr!r} is not a dashboard variable"
    # the seed's chart: requested against used, per plan
    first = next(p for p in _panels(dash["panels"]) if p["type"] == "timeseries")
    assert [t["expr"].split(" (")[2].split("{")[0] for t in first["targets"][:2]] == [
        "wmla_plan_requested",
        "wmla_plan_used",
    ]
    assert first.get("repeat") == "plan"
    assert 'wmla_plan_deserved{plan="/p",resource="gpu"} 2.0' in text


def test_prometheus_example_scrapes_the_metrics_path_with_a_token() -> None:
    config = yaml.safe_load((GRAFANA / "prometheus.yml").read_text())
    job = config["scrape_configs"][0]
    assert job["metrics_path"] == "/services/wmla/metrics"
    assert job["authorization"]["type"] == "token"  # JupyterHub reads "Authorization: token x"
    for name in ("datasource.yaml", "dashboards.yaml"):
        assert yaml.safe_load((GRAFANA / "provisioning" / name).read_text())["apiVersion"] == 1


def test_sampler_measures_cpu_and_memory_of_real_processes() -> None:
    sampler = UtilizationSampler(keep=3, gpu=False)
    pid = os.getpid()
    sampler.sample({"job-1": ("/p/u", [pid])}, time.time())
    spent = time.process_time() + 0.05
    while time.process_time() < spent:  # busy: CPU time grows between the two samples
        pass
    second = sampler.sample({"job-1": ("/p/u", [pid])}, time.time())["job-1"]
    assert second.cpu_cores > 0 and second.memory_bytes > 0
    assert second.gpu_utilization is None  # no NVML asked for
    for _ in range(5):
        sampler.sample({"job-1": ("/p/u", [pid])}, time.time())
    assert len(sampler.series["job-1"]) == 3  # a ring buffer
    sampler.sample({}, time.time())  # the job ended: forgotten
    assert sampler.latest() == {}
    gone = sampler.sample({"job-2": ("/p/u", [2**22 + 12345])}, time.time())["job-2"]
    assert gone.memory_bytes == 0  # a pid that is not there measures nothing, and no error


class _FakeNvml:
    """Stand-in for the pynvml module: no GPU and no NVML library on this machine. It answers the
    five calls the sampler makes with one device at 40% running the given pid."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"dev{i}"

    def nvmlDeviceGetUtilizationRates(self, handle: str):
        return type("Rates", (), {"gpu": 40})()

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str):
        return [type("Proc", (), {"pid": self.pid, "usedGpuMemory": 2**30})()]


def test_sampler_reads_gpu_figures_through_nvml(monkeypatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "pynvml", _FakeNvml(os.getpid()))
    sampler = UtilizationSampler(gpu=True)
    assert sampler.gpu_available
    sample = sampler.sample({"job-1": ("/p/u", [os.getpid()])}, time.time())["job-1"]
    assert sample.gpu_utilization == 0.4 and sample.gpu_memory_bytes == 2**30
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: GPU sampling is off
    assert not UtilizationSampler(gpu=True).gpu_available
