"""Cluster job traces (CSV) as simulation scenarios.

The schema is that of ``shared/data/traces/`` (SOURCES.md there)::

    job_id,submit_s,duration_s,gpus,team,user,status

How a row becomes a job (docs/simulate.md says the same for users):
- ``team`` becomes the plan ``/<team>`` under the root, share 1 unless a shares file says
  otherwise; a row without a team goes to ``/unassigned``;
- ``user`` becomes the user leaf ``/<team>/<user>``; a row without a user is charged to
  ``/<team>/anonymous``;
- a job of at most one node's GPUs (the largest node's) is one worker with all its GPUs; a
  larger job becomes a gang of whole nodes: ceil(gpus / G) workers of G GPUs each, G the largest
  node's GPUs (a 12-GPU job on 8-GPU nodes asks for 2 x 8, as a cluster that hands out whole
  nodes to multi-node jobs would);
- ``duration_s`` is the run time at full size; ``status`` is kept for the record but not used
  (a failed job still held its GPUs for its duration).

Every problem is a ``TraceError`` naming the file, the line and the column; nothing is run from
a trace that has one.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path

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
from extension.scheduler.names import is_segment, is_user_name
from extension.scheduler.resources import UNLIMITED

from .scenario import Scenario, ScenarioJob
from .timing import Timing

COLUMNS = ("job_id", "submit_s", "duration_s", "gpus", "team", "user", "status")
NO_TEAM = "unassigned"
NO_USER = "anonymous"
_LAYOUT = re.compile(r"^\s*(\d+)\s*x\s*(\d+)\s*$")


class TraceError(ValueError):
    """A trace, shares file or capacity that cannot be replayed; the message says how to fix it."""


@dataclass(frozen=True)
class TraceRow:
    job_id: str
    submit: float
    duration: float
    gpus: int
    team: str
    user: str
    status: str


def read_trace(path: str | Path) -> list[TraceRow]:
    """Read and check every row; rows come back in file order."""
    path = Path(path)
    try:
        handle = path.open(newline="")
    except OSError as err:
        raise TraceError(f"{path}: cannot read the trace: {err.strerror}") from None
    rows: list[TraceRow] = []
    seen: set[str] = set()
    with handle:
        reader = csv.reader(handle)
        try:
            header = next(reader)
        except StopIteration:
            raise TraceError(f"{path}: the file is empty; expected a header line") from None
        except (csv.Error, UnicodeDecodeError) as err:
            raise TraceError(f"{path}: not a CSV file: {err}") from None
        header = [h.strip() for h in header]
        missing = [c for c in COLUMNS if c not in header]
        if missing:
            raise TraceError(
                f"{path}: line 1: missing column(s) {', '.join(missing)}; the header must name "
                f"{','.join(COLUMNS)}"
            )
        at = {c: header.index(c) for c in COLUMNS}
        try:
            for line, fields in enumerate(reader, start=2):
                if not fields or all(not f.strip() for f in fields):
                    continue
                if len(fields) < len(header):
                    raise TraceError(
                        f"{path}: line {line}: {len(fields)} fields, the header has {len(header)}"
                    )
                rows.append(_row(path, line, fields, at, seen))
        except (csv.Error, UnicodeDecodeError) as err:
            raise TraceError(f"{path}: not a readable CSV file: {err}") from None
    if not rows:
        raise TraceError(f"{path}: the trace has a header but no jobs")
    return rows


def _row(path: Path, line: int, fields: list[str], at: dict, seen: set[str]) -> TraceRow:
    def get(col: str) -> str:
        return fields[at[col]].strip()

    def fail(col: str, problem: str) -> TraceError:
        return TraceError(f"{path}: line {line}: column {col}: {problem}")

    job_id = get("job_id")
    if not job_id:
        raise fail("job_id", "is empty; every job needs an id")
    if job_id in seen:
        raise fail("job_id", f"{job_id!r} is used twice; ids must be unique")
    seen.add(job_id)
    numbers = {}
    for col in ("submit_s", "duration_s", "gpus"):
        text = get(col)
        try:
            value = float(text)
        except ValueError:
            raise fail(col, f"must be a number, got {text!r}") from None
        if not math.isfinite(value) or value < 0:
            raise fail(col, f"must be a finite number of at least 0, got {text!r}")
        numbers[col] = value
    if numbers["duration_s"] <= 0:
        raise fail("duration_s", f"must be above 0 seconds, got {get('duration_s')!r}")
    gpus = numbers["gpus"]
    if gpus < 1 or gpus != int(gpus):
        raise fail("gpus", f"must be a whole number of at least 1, got {get('gpus')!r}")
    team = get("team") or NO_TEAM
    if not is_segment(team):
        raise fail("team", f"{team!r} cannot name a plan; use letters, digits, '.', '_', '-'")
    user = get("user") or NO_USER
    if not is_user_name(user):
        raise fail("user", f"{user!r} cannot name a user leaf; use letters, digits, '.', '_', '-'")
    return TraceRow(
        job_id, numbers["submit_s"], numbers["duration_s"], int(gpus), team, user, get("status")
    )


def parse_nodes(nodes: str | int, gpus_per_node: int | None) -> tuple[Node, ...]:
    """``--nodes 311 --gpus-per-node 8``, or a layout ``--nodes 231x8,321x2`` (count x GPUs,
    comma separated) for clusters with mixed machines."""
    text = str(nodes).strip()
    groups: list[tuple[int, int]] = []
    if text.isdigit():
        if gpus_per_node is None:
            raise TraceError(
                "--nodes: a node count needs --gpus-per-node (e.g. --nodes 311 "
                "--gpus-per-node 8), or give a layout such as --nodes 231x8,321x2"
            )
        groups.append((int(text), gpus_per_node))
    else:
        if gpus_per_node is not None:
            raise TraceError(
                f"--nodes {text!r}: a layout already says the GPUs per node; drop "
                f"--gpus-per-node or give a plain node count"
            )
        for part in text.split(","):
            match = _LAYOUT.match(part)
            if not match:
                raise TraceError(
                    f"--nodes {text!r}: expected a count (311) or a layout of COUNTxGPUS parts "
                    f"separated by commas (231x8,321x2)"
                )
            groups.append((int(match.group(1)), int(match.group(2))))
    for count, gpus in groups:
        if count < 1:
            raise TraceError(f"--nodes: the node count must be at least 1, got {count}")
        if gpus < 1:
            raise TraceError(f"--gpus-per-node: must be at least 1, got {gpus}")
    total = sum(c for c, _ in groups)
    width = len(str(total))
    out = []
    for count, gpus in groups:
        for _ in range(count):
            out.append(Node(f"node{len(out) + 1:0{width}d}", Resources(gpus, 0, 0)))
    return tuple(out)


def read_shares(path: str | Path) -> dict[str, dict[str, float]]:
    """A YAML or JSON mapping of team to share (``ee9e8c: 4``) or to ``{share: 4, limit: 64}``
    (limit in GPUs). Teams not named keep share 1 and no limit."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as err:
        raise TraceError(f"{path}: cannot read the shares file: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise TraceError(f"{path}: not valid YAML or JSON: {err}") from None
    if not isinstance(data, dict) or not data:
        raise TraceError(
            f"{path}: the shares file must map team names to shares, e.g. 'ee9e8c: 4' or "
            f"'ee9e8c: {{share: 4, limit: 64}}'"
        )
    out: dict[str, dict[str, float]] = {}
    for team, spec in data.items():
        team = str(team)
        if not isinstance(spec, dict):
            spec = {"share": spec}
        unknown = sorted(set(spec) - {"share", "limit"})
        if unknown:
            raise TraceError(f"{path}: {team}: unknown key {unknown[0]!r}; use share and limit")
        share = spec.get("share", 1)
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not share > 0:
            raise TraceError(f"{path}: {team}: share must be a number above 0, got {share!r}")
        if share == UNLIMITED:
            raise TraceError(f"{path}: {team}: share must be finite")
        limit = spec.get("limit", UNLIMITED)
        if isinstance(limit, bool) or not isinstance(limit, (int, float)) or limit < 0:
            raise TraceError(
                f"{path}: {team}: limit must be a number of GPUs of at least 0, got {limit!r}"
            )
        out[team] = {"share": float(share), "limit": float(limit)}
    return out


@dataclass
class TraceOptions:
    grace: float = 30.0  # SIGTERM to SIGKILL for a victim, as the service's default
    min_runtime: float = 0.0
    checkpoint_every: float = 600.0  # a training job checkpoints every 10 minutes
    timing: Timing = Timing()  # when cycles run, how long the backend takes (timing.py)


def trace_scenario(
    rows: list[TraceRow],
    nodes: tuple[Node, ...],
    shares: dict[str, dict[str, float]] | None = None,
    options: TraceOptions | None = None,
) -> Scenario:
    """The scenario the replay runs: plans per team, jobs per row (module docstring)."""
    options = options or TraceOptions()
    shares = shares or {}
    teams = sorted({r.team for r in rows})
    unknown = sorted(set(shares) - set(teams))
    if unknown:
        raise TraceError(
            f"shares file: team {unknown[0]!r} is not in the trace; the teams are "
            f"{', '.join(teams[:12])}{' ...' if len(teams) > 12 else ''}"
        )
    spec = {}
    for team in teams:
        s = shares.get(team, {"share": 1.0, "limit": UNLIMITED})
        limit = {"gpu": s["limit"]} if s["limit"] != UNLIMITED else None
        spec[f"/{team}"] = {"share": s["share"], "limit": limit}
    try:
        tree = PlanTree.from_dict(spec)
    except (PlanError, QuantityError) as err:
        raise TraceError(f"shares: {err}") from None
    node_gpus = max(n.capacity.gpu for n in nodes)
    instance = Instance(nodes)
    config = SchedulerConfig(grace=options.grace, min_runtime=options.min_runtime)
    scenario = Scenario(
        instance, tree, config, options.checkpoint_every, until=math.inf, timing=options.timing
    )
    order = sorted(range(len(rows)), key=lambda i: (rows[i].submit, i))
    for i in order:
        r = rows[i]
        if r.gpus <= node_gpus:
            workers, per = 1, r.gpus
        else:
            workers, per = -(-r.gpus // int(node_gpus)), node_gpus
        scenario.jobs.append(
            ScenarioJob(
                id=r.job_id,
                at=r.submit,
                user=r.user,
                plan=f"/{r.team}",
                min_workers=workers,
                max_workers=workers,
                per_worker=Resources(per, 0, 0),
                duration=r.duration,
            )
        )
    return scenario


def load_trace_scenario(
    path: str | Path,
    nodes: str | int,
    gpus_per_node: int | None,
    shares_file: str | Path | None = None,
    options: TraceOptions | None = None,
) -> Scenario:
    """Everything ``wmla simulate --trace`` reads, checked before anything runs."""
    node_list = parse_nodes(nodes, gpus_per_node)
    shares = read_shares(shares_file) if shares_file else None
    return trace_scenario(read_trace(path), node_list, shares, options)


def team_of(plan_path: str) -> str:
    """The team (top-level plan) of a plan path."""
    return plan_path.split("/", 2)[1]
