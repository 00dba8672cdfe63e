"""Capacity and admission: what the cluster can hold (its Ready nodes, cut by the namespace's
ResourceQuota: docs/scheduling.md "Words": instance), and whether the namespace's ResourceQuotas and
LimitRanges would refuse a pod of a gang, checked for the whole gang before anything is created
(the API server's own admission would refuse the third pod after two were made)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from extension.scheduler import UNLIMITED, Instance, Node, Resources

from .. import manifests as m
from .api import LIMIT_RANGES, NODES, QUOTAS, JobKind
from .objects import labels_of, name_of, node_capacity, quantity
from .state import Cache, Phase, Tracking

log = logging.getLogger("extension.backends.kubernetes")


def quota_cut(quotas: Iterable[Mapping], gpu_resource: str = m.DEFAULT_GPU_RESOURCE) -> Resources:
    """The tightest request bound the namespace's ResourceQuotas put on (gpu, cpu, memory)."""
    cut = [UNLIMITED, UNLIMITED, UNLIMITED]
    keys = (
        (0, (f"requests.{gpu_resource}",)),
        (1, ("requests.cpu", "cpu")),
        (2, ("requests.memory", "memory")),
    )
    for quota in quotas:
        hard = (quota.get("spec") or {}).get("hard") or {}
        for index, names in keys:
            for key in names:
                if key in hard:
                    cut[index] = min(cut[index], quantity(key, hard[key], gpu_resource))
    return Resources(*cut)


class AdmissionProblem(NamedTuple):
    """Why the namespace would refuse a pod of a gang; ``permanent`` when it never fits (its
    request alone is past a hard limit), else it may fit once others end. A tuple, as the
    ``ChecksAdmission`` protocol declares."""

    message: str
    permanent: bool


@dataclass(frozen=True)
class PodAsk:
    """What one pod of a gang will be charged: effective requests and limits after defaults."""

    requests: dict[str, float]
    limits: dict[str, float]


def effective_pod(
    per_worker: Resources,
    limit_ranges: Iterable[Mapping],
    gpu_resource: str = m.DEFAULT_GPU_RESOURCE,
    ceiling: Resources | None = None,
) -> PodAsk:
    """Requests and limits of one worker pod as the API server will see them.

    The backend writes the job's requests, and its limits (``ceiling``; the requests where
    none); a resource the job leaves at 0 is not written, so a LimitRange
    ``defaultRequest``/``default`` fills it in, and that is what the quota charges.
    """
    requests: dict[str, float] = {}
    limits: dict[str, float] = {}
    top = ceiling or per_worker
    for name, amount, most in (("cpu", per_worker.cpu, top.cpu),
                               ("memory", per_worker.memory, top.memory)):  # fmt: skip
        if amount:
            requests[name] = float(amount)
            limits[name] = float(max(amount, most))
    if per_worker.gpu:
        requests[gpu_resource] = limits[gpu_resource] = float(per_worker.gpu)
    for lr in limit_ranges:
        for item in (lr.get("spec") or {}).get("limits") or []:
            if item.get("type") != "Container":
                continue
            default = item.get("default") or {}
            default_request = item.get("defaultRequest") or {}
            for name in ("cpu", "memory"):
                if name in requests:
                    continue
                if name in default_request:
                    requests[name] = quantity(name, default_request[name], gpu_resource)
                elif name in default:
                    requests[name] = quantity(name, default[name], gpu_resource)
                if name in default and name not in limits:
                    limits[name] = quantity(name, default[name], gpu_resource)
    return PodAsk(requests, limits)


def limit_range_problem(
    ask: PodAsk, limit_ranges: Iterable[Mapping], gpu_resource: str = m.DEFAULT_GPU_RESOURCE
) -> str | None:
    """Why a LimitRange would refuse a one-container worker pod, or None."""
    for lr in limit_ranges:
        where = f"LimitRange {name_of(lr)}"
        for item in (lr.get("spec") or {}).get("limits") or []:
            kind = item.get("type")
            if kind not in ("Container", "Pod"):
                continue
            for name, bound in (item.get("min") or {}).items():
                low = quantity(name, bound, gpu_resource)
                for what, values in (("request", ask.requests), ("limit", ask.limits)):
                    if values.get(name, 0) < low:
                        return (
                            f"{where} refuses the worker pod: {kind} {name} {what} "
                            f"{_show(name, values.get(name, 0))} is below the minimum {bound}"
                        )
            for name, bound in (item.get("max") or {}).items():
                high = quantity(name, bound, gpu_resource)
                if name not in ask.limits:
                    return (
                        f"{where} refuses the worker pod: {kind} {name} has a maximum of {bound} "
                        f"but the pod sets no {name} limit; ask for {name} explicitly"
                    )
                for what, values in (("request", ask.requests), ("limit", ask.limits)):
                    if values.get(name, 0) > high:
                        return (
                            f"{where} refuses the worker pod: {kind} {name} {what} "
                            f"{_show(name, values[name])} is above the maximum {bound}; ask for "
                            f"at most {bound} per worker"
                        )
            for name, ratio in (item.get("maxLimitRequestRatio") or {}).items():
                req, lim = ask.requests.get(name, 0), ask.limits.get(name, 0)
                if req and lim / req > float(ratio) + 1e-9:
                    return (
                        f"{where} refuses the worker pod: {name} limit/request ratio "
                        f"{lim / req:g} is above {ratio}"
                    )
    return None


def quota_problem(
    ask: PodAsk,
    pods: int,
    quotas: Iterable[Mapping],
    in_flight: Mapping[str, float] | None = None,
    gpu_resource: str = m.DEFAULT_GPU_RESOURCE,
    objects: Mapping[str, float] | None = None,
) -> AdmissionProblem | None:
    """Why a ResourceQuota would refuse one of ``pods`` such pods, and whether for ever.

    ``in_flight`` is what our already-created jobs will still charge (pods the operator has not
    created yet), keyed like quota entries; the quota's ``status.used`` does not show it yet.
    ``objects`` are object counts the job adds, e.g. ``{"count/pytorchjobs.kubeflow.org": 1}``.
    """
    need: dict[str, float] = {"pods": float(pods), **(objects or {})}
    for name, value in ask.requests.items():
        need[f"requests.{name}"] = value * pods
    for name, value in ask.limits.items():
        need[f"limits.{name}"] = value * pods
    need["cpu"] = need.get("requests.cpu", 0.0)
    need["memory"] = need.get("requests.memory", 0.0)
    for quota in quotas:
        hard = (quota.get("spec") or {}).get("hard") or {}
        used = (quota.get("status") or {}).get("used") or {}
        for key, bound in sorted(hard.items()):
            if key not in need or not need[key]:
                continue
            limit = quantity(key, bound, gpu_resource)
            in_use = quantity(key, used.get(key, 0), gpu_resource) + (in_flight or {}).get(key, 0)
            if need[key] > limit:
                return AdmissionProblem(
                    f"ResourceQuota {name_of(quota)} refuses the job: {pods} worker(s) need "
                    f"{key} {_show(key, need[key])}, more than the hard limit {bound}; "
                    "ask for fewer workers or less per worker",
                    True,
                )
            if in_use + need[key] > limit:
                return AdmissionProblem(
                    f"ResourceQuota {name_of(quota)} has no room: {key} {_show(key, in_use)} "
                    f"in use + {_show(key, need[key])} asked > hard {bound}",
                    False,
                )
    return None


def _show(key: str, value: float) -> str:
    base = key.split(".", 1)[1] if key.startswith(("requests.", "limits.")) else key
    if base == "cpu":
        return m.format_cpu(value)
    if base == "memory":
        return m.format_memory(value)
    return f"{value:g}"


class Admission:
    """What the cluster can hold and what its namespace would refuse; reads the cache only
    (and the tracked jobs, for the pods their operator has yet to create)."""

    def __init__(
        self,
        cache: Cache,
        tracking: Tracking,
        listed: Callable[[str], bool],
        *,
        gpu_resource: str,
        job_kind: JobKind,
        node_selector: Mapping[str, str],
    ) -> None:
        self.cache = cache
        self.tracking = tracking
        self.listed = listed
        self.gpu_resource = gpu_resource
        self.job_kind = job_kind
        self.node_selector = dict(node_selector)

    def capacity(self) -> list[Node]:
        """Schedulable, Ready nodes (matching ``node_selector``) with their allocatable.

        Read from the cache: ``await open()`` first, or this is empty.
        """
        if not self.listed(NODES):
            log.warning("capacity() before the nodes were listed: await backend.open() first")
        nodes = []
        for obj in self.cache.all(NODES):
            if any(labels_of(obj).get(k) != v for k, v in self.node_selector.items()):
                continue
            node = node_capacity(obj, self.gpu_resource)
            if node is not None:
                nodes.append(node)
        return nodes

    def quota(self) -> Resources:
        """The namespace ResourceQuota's bound on requests (UNLIMITED where none is set)."""
        return quota_cut(self.cache.all(QUOTAS), self.gpu_resource)

    def instance(self) -> Instance:
        """The instance the core schedules: the nodes, cut down by the namespace quota."""
        return Instance(nodes=tuple(self.capacity()), quota=self.quota())

    def limit_ranges(self) -> list[dict]:
        return self.cache.all(LIMIT_RANGES)

    def problem(
        self,
        per_worker: Resources,
        workers: int,
        new_object: bool = True,
        ceiling: Resources | None = None,
    ) -> AdmissionProblem | None:
        """Would the quota or a LimitRange refuse a pod of this gang?

        ``new_object`` false for a grow: the job object exists, only pods are added;
        ``ceiling``: the pods' limits (the requests where None)."""
        ask = effective_pod(per_worker, self.cache.all(LIMIT_RANGES), self.gpu_resource, ceiling)
        problem = limit_range_problem(ask, self.cache.all(LIMIT_RANGES), self.gpu_resource)
        if problem:
            return AdmissionProblem(problem, True)
        return quota_problem(
            ask,
            workers,
            self.cache.all(QUOTAS),
            self.in_flight(),
            self.gpu_resource,
            objects={f"count/{self.job_kind.counted}": 1} if new_object else None,
        )

    def in_flight(self) -> dict[str, float]:
        """Quota our created jobs will still take: pods the operator has not made yet."""
        out: dict[str, float] = {}
        for tracked in self.tracking:
            if tracked.phase is Phase.STOPPING:
                continue
            missing = tracked.workers - len(self.cache.pods_of(tracked.name))
            if missing <= 0:
                continue
            spec = tracked.spec
            ask = effective_pod(
                spec.per_worker, self.cache.all(LIMIT_RANGES), self.gpu_resource, spec.ceiling
            )
            out["pods"] = out.get("pods", 0) + missing
            for name, value in ask.requests.items():
                out[f"requests.{name}"] = out.get(f"requests.{name}", 0) + value * missing
            for name, value in ask.limits.items():
                out[f"limits.{name}"] = out.get(f"limits.{name}", 0) + value * missing
        out["cpu"] = out.get("requests.cpu", 0)
        out["memory"] = out.get("requests.memory", 0)
        return out
