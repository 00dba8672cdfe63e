"""Scenario files (SCENARIO-FORMAT.md, format 1): read and validate, or say exactly what is wrong.

Every problem is a ``ScenarioError`` naming the file, the key and the problem; nothing is run
from a file that has one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from extension.scheduler import (
    Instance,
    Node,
    PlanError,
    PlanTree,
    QuantityError,
    Resources,
    SchedulerConfig,
)
from extension.scheduler.resources import UNLIMITED

from .fairshare import FairShare, FairShareError, parse_span
from .timing import Timing, parse_timing


class ScenarioError(ValueError):
    """A scenario file that cannot be run; the message names the file, the key and the problem."""


@dataclass(frozen=True)
class ScenarioJob:
    id: str
    at: float
    user: str
    plan: str
    min_workers: int
    max_workers: int
    per_worker: Resources
    duration: float
    priority: int = 0
    preemptible: bool = True


@dataclass(frozen=True)
class Cancel:
    id: str
    at: float
    cancel: str


@dataclass
class Scenario:
    instance: Instance
    plans: PlanTree
    config: SchedulerConfig
    checkpoint_every: float
    jobs: list[ScenarioJob] = field(default_factory=list)
    cancels: list[Cancel] = field(default_factory=list)
    until: float = 10_000.0
    # when cycles run and how long the backend takes (timing.py); the default is the
    # simulator's own model, ``PRESETS["service"]`` the service's
    timing: Timing = Timing()
    # usage history's reset period (fairshare.py); the half-life and the starved-gang bound
    # are ``config``'s (SchedulerConfig.fair_share_half_life, max_gang_wait)
    usage_reset_period: float = 0.0

    def with_fair_share(self, fair: FairShare) -> None:
        """Usage history and the starved-gang bound as ``fair`` says (both off: unchanged)."""
        self.config = fair.config(self.config)
        self.usage_reset_period = fair.reset_period


TOP_KEYS = {"format", "capacity", "config", "plans", "jobs", "until", "limit_range", "expect"}
# what a scenario file may say it expects of a run (tests/sim/test_scenarios.py checks it);
# the simulator itself ignores it
EXPECT_KEYS = {"jobs", "summary", "running_at"}
JOB_KEYS = {"id", "at", "user", "plan", "workers", "per_worker", "duration", "priority"}
JOB_KEYS |= {"preemptible"}
CONFIG_KEYS = {"grace", "min_runtime", "checkpoint_every", "timing"}
FAIR_KEYS = ("fair_share_half_life", "max_gang_wait", "usage_reset_period")  # fairshare.py
CONFIG_KEYS |= set(FAIR_KEYS)
_WORKERS = re.compile(r"^\s*(\d+)\s*:\s*(\d+)\s*$")


def load_scenario(path: str | Path) -> Scenario:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ScenarioError(f"{path}: cannot read the file: {err.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ScenarioError(f"{path}: not valid YAML: {err}") from None
    return parse_scenario(data, str(path))


def parse_scenario(data: Any, where: str = "scenario") -> Scenario:
    def fail(key: str, problem: str) -> ScenarioError:
        return ScenarioError(f"{where}: {key}: {problem}")

    if not isinstance(data, dict):
        raise ScenarioError(
            f"{where}: the file must be a mapping with format, capacity, plans, jobs"
        )
    _no_unknown(data, TOP_KEYS, "", fail)
    expect = data.get("expect")
    if expect is not None:
        if not isinstance(expect, dict):
            raise fail("expect", "must be a mapping of jobs, summary, running_at")
        _no_unknown(expect, EXPECT_KEYS, "expect.", fail)
    if data.get("format") != 1:
        raise fail("format", f"must be 1, got {data.get('format')!r}")
    default = _limit_range_default(data.get("limit_range"), fail)
    instance = _capacity(data.get("capacity"), fail)
    config, checkpoint_every, timing = _config(data.get("config") or {}, fail)
    fair = _fair_share(data.get("config") or {}, fail)
    plans_spec = data.get("plans") or {}
    if not isinstance(plans_spec, dict):
        raise fail("plans", "must be a mapping of plan path to {share, limit}")
    for key, spec in plans_spec.items():
        if spec is not None and not isinstance(spec, dict):
            raise fail(f"plans.{key}", "must be a mapping such as {share: 1, limit: {gpu: 4}}")
        _no_unknown(spec or {}, {"share", "limit"}, f"plans.{key}.", fail)
    try:
        tree = PlanTree.from_dict(plans_spec)
    except (PlanError, QuantityError) as err:
        raise fail("plans", str(err)) from None
    until = _number(data.get("until", 10_000), "until", fail)
    scenario = Scenario(instance, tree, config, checkpoint_every, until=until, timing=timing)
    scenario.with_fair_share(fair)
    seen: set[str] = set()
    entries = data.get("jobs") or []
    if not isinstance(entries, list):
        raise fail("jobs", "must be a list of jobs and cancel events")
    for n, entry in enumerate(entries):
        key = f"jobs[{n}]"
        if not isinstance(entry, dict):
            raise fail(key, "must be a mapping with id, at, user, plan, workers, ...")
        if "id" not in entry:
            raise fail(key, "needs an id")
        job_id = str(entry["id"])
        if job_id in seen:
            raise fail(f"{key}.id", f"{job_id!r} is used twice; ids must be unique")
        seen.add(job_id)
        at = _number(entry.get("at", 0), f"{key}.at", fail)
        if "cancel" in entry:
            _no_unknown(entry, {"id", "at", "cancel"}, f"{key}.", fail)
            scenario.cancels.append(Cancel(job_id, at, str(entry["cancel"])))
            continue
        scenario.jobs.append(_job(entry, key, job_id, at, tree, default, fail))
    ids = {j.id for j in scenario.jobs}
    for c in scenario.cancels:
        if c.cancel not in ids:
            raise fail("jobs", f"cancel event {c.id!r} names job {c.cancel!r}, which is not there")
    return scenario


def _job(entry: dict, key: str, job_id: str, at: float, tree: PlanTree, default, fail):
    _no_unknown(entry, JOB_KEYS, f"{key}.", fail)
    for needed in ("user", "plan", "duration"):
        if needed not in entry:
            raise fail(f"{key}.{needed}", "is missing")
    plan = str(entry["plan"])
    if plan not in tree:
        raise fail(f"{key}.plan", f"{plan!r} is not in plans; list it (and its ancestors)")
    low, high = _workers(entry.get("workers", 1), f"{key}.workers", fail)
    try:
        given = Resources.from_mapping(entry.get("per_worker") or {}, -1, where=f"{key}.per_worker")
    except QuantityError as err:
        raise fail(f"{key}.per_worker", str(err)) from None
    per_worker = Resources(*(d if g == -1 else g for g, d in zip(given, default)))
    duration = _number(entry["duration"], f"{key}.duration", fail)
    if duration <= 0:
        raise fail(f"{key}.duration", "must be above 0 seconds")
    priority = entry.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise fail(f"{key}.priority", f"must be a whole number, got {priority!r}")
    preemptible = entry.get("preemptible", True)
    if not isinstance(preemptible, bool):
        raise fail(f"{key}.preemptible", f"must be true or false, got {preemptible!r}")
    user = str(entry["user"])
    if not re.fullmatch(r"[A-Za-z0-9._-]+", user) or user in (".", ".."):
        raise fail(f"{key}.user", f"{user!r} is not a user name; use letters, digits, . _ -")
    return ScenarioJob(
        job_id, at, user, plan, low, high, per_worker, duration, priority, preemptible
    )


def _capacity(spec: Any, fail) -> Instance:
    if not isinstance(spec, dict):
        raise fail("capacity", "is missing; give nodes and per_node, or a list of nodes")
    _no_unknown(spec, {"nodes", "per_node", "quota", "max_jobs"}, "capacity.", fail)
    nodes_spec = spec.get("nodes")
    try:
        if isinstance(nodes_spec, int) and not isinstance(nodes_spec, bool):
            if nodes_spec < 1:
                raise fail("capacity.nodes", f"must be at least 1, got {nodes_spec}")
            per = Resources.from_mapping(spec.get("per_node"), where="capacity.per_node")
            width = len(str(nodes_spec))
            nodes = tuple(Node(f"node{i + 1:0{width}d}", per) for i in range(nodes_spec))
        elif isinstance(nodes_spec, list) and nodes_spec:
            if "per_node" in spec:
                raise fail("capacity.per_node", "goes with a node count, not a list of nodes")
            nodes = []
            for n, item in enumerate(nodes_spec):
                if not isinstance(item, dict) or "name" not in item:
                    raise fail(f"capacity.nodes[{n}]", "must be a mapping with a name")
                rest = {k: v for k, v in item.items() if k != "name"}
                res = Resources.from_mapping(rest, where=f"capacity.nodes[{n}]")
                nodes.append(Node(str(item["name"]), res))
            names = [n.name for n in nodes]
            if len(set(names)) != len(names):
                raise fail("capacity.nodes", "node names must be unique")
            nodes = tuple(nodes)
        else:
            raise fail("capacity.nodes", f"must be a count or a list of nodes, got {nodes_spec!r}")
        quota = Resources.from_mapping(spec.get("quota"), UNLIMITED, where="capacity.quota")
    except QuantityError as err:
        raise fail("capacity", str(err)) from None
    max_jobs = spec.get("max_jobs")
    if max_jobs is not None and (not isinstance(max_jobs, int) or max_jobs < 1):
        raise fail("capacity.max_jobs", f"must be a whole number above 0, got {max_jobs!r}")
    return Instance(nodes, quota, max_jobs)


def _config(spec: Any, fail) -> tuple[SchedulerConfig, float, Timing]:
    if not isinstance(spec, dict):
        raise fail("config", "must be a mapping of grace, min_runtime, checkpoint_every, timing")
    _no_unknown(spec, CONFIG_KEYS, "config.", fail)
    values = {
        k: _number(spec.get(k, d), f"config.{k}", fail)
        for k, d in (("grace", 0), ("min_runtime", 0), ("checkpoint_every", 60))
    }
    timing = parse_timing(spec["timing"], fail, "config.timing") if "timing" in spec else Timing()
    config = SchedulerConfig(values["grace"], values["min_runtime"])
    return config, values["checkpoint_every"], timing


def _fair_share(spec: dict, fail) -> FairShare:
    """``config``'s fair-share keys: seconds or durations (``7d``), 0 or absent for off."""
    values = {}
    for key in FAIR_KEYS:
        try:
            values[key] = parse_span(spec.get(key, 0), key)
        except FairShareError as problem:
            raise fail(f"config.{key}", str(problem)) from None
    try:
        return FairShare(*values.values())
    except FairShareError as problem:
        raise fail("config.usage_reset_period", str(problem)) from None


def _limit_range_default(spec: Any, fail) -> Resources:
    if spec is None:
        return Resources(0, 0, 0)
    if not isinstance(spec, dict):
        raise fail("limit_range", "must be a mapping with default: {cpu, memory}")
    _no_unknown(spec, {"default"}, "limit_range.", fail)
    try:
        return Resources.from_mapping(spec.get("default") or {}, where="limit_range.default")
    except QuantityError as err:
        raise fail("limit_range.default", str(err)) from None


def _workers(value: Any, key: str, fail) -> tuple[int, int]:
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise fail(key, f"must be at least 1, got {value}")
        return value, value
    match = _WORKERS.match(str(value))
    if not match:
        raise fail(key, f'must be a count (4) or min:max ("1:4"), got {value!r}')
    low, high = int(match.group(1)), int(match.group(2))
    if low < 1 or high < low:
        raise fail(key, f"min:max needs 1 <= min <= max, got {value!r}")
    return low, high


def _number(value: Any, key: str, fail) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail(key, f"must be a number of seconds, got {value!r}")
    if value < 0:
        raise fail(key, f"must not be negative, got {value!r}")
    return float(value)


def _no_unknown(spec: dict, known: set[str], prefix: str, fail) -> None:
    for key in spec:
        if key not in known:
            raise fail(
                f"{prefix}{key}", f"unknown key; the keys here are {', '.join(sorted(known))}"
            )
