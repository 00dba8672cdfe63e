"""The ledger: requested and used resources per plan node and user leaf, exact, from transitions.

Pure (no I/O, no clock): the service feeds it the scheduler's own transition rows
(``extension/service/store.py``), tests feed it scripted ones.

- **used** by a job from a transition on = ``workers x per_worker`` (the workers holding
  resources, as the core counts them: a shrinking or preempting job holds its workers until
  ``resized`` / ``released``);
- **requested** by a job = ``max_workers x per_worker`` while it is PENDING or RUNNING (its
  demand, as in docs/scheduling.md "Words": demand, before any plan limit caps it), else nothing.

Every change of a job is a delta applied to its user leaf *and to every ancestor up to the root*
at the same time, in integer units (see ``series.py``), so a parent's series is exactly the sum
of its children's at every time and over every range, and a query for one plan reads that plan's
children's series only, never the leaves below them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .blocks import MEMORY, Blocks
from .series import ZERO, StepSeries, Vec, sub
from .transitions import Transition

ROOT = "/"
LIVE = frozenset({"PENDING", "RUNNING"})
MS_PER_HOUR = 3_600_000
GIB = 2**30
# internal unit -> one device / one core / one GiB
UNIT_SCALE = (1000, 1000, GIB)
RESOURCES = ("gpu", "cpu", "memory")
KINDS = ("requested", "used")


def ms(seconds: float) -> int:
    return int(round(seconds * 1000))


def vec(gpu: float, cpu: float, memory: float) -> Vec:
    """Core units (devices, millicores, bytes) -> integer units (milli-devices, millicores,
    bytes)."""
    return (int(round(gpu * 1000)), int(round(cpu)), int(round(memory)))


def ancestors(path: str) -> list[str]:
    """``/a/b/c`` -> ``[/a/b/c, /a/b, /a, /]``."""
    out = []
    while path not in ("", ROOT):
        out.append(path)
        path = path.rsplit("/", 1)[0] or ROOT
    out.append(ROOT)
    return out


def parent(path: str) -> str:
    return path.rsplit("/", 1)[0] or ROOT


@dataclass(frozen=True)
class Fact:
    """One transition as metering reads it (a row of ``transitions`` joined with its job)."""

    at: float  # seconds since the epoch
    job_id: str
    leaf: str
    user: str
    event: str
    state: str
    workers: int  # workers holding resources from ``at`` on
    max_workers: int
    gpu: float  # per-worker request, core units
    cpu: float
    memory: float


class Node:
    __slots__ = ("path", "requested", "used", "preemptions", "children")

    def __init__(self, path: str, bucket: int, blocks: Blocks = MEMORY) -> None:
        self.path = path
        self.requested = StepSeries(bucket, blocks)
        self.used = StepSeries(bucket, blocks)
        self.preemptions = 0
        self.children: set[str] = set()

    def series(self, kind: str) -> StepSeries:
        return self.requested if kind == "requested" else self.used


@dataclass
class _Track:
    t: int
    requested: Vec
    used: Vec


class Ledger:
    """All plan nodes' requested and used step functions; see the module docstring."""

    def __init__(
        self,
        bucket_seconds: float = 3600,
        full_resolution_seconds: float = 7 * 86400,
        retention_seconds: float = 400 * 86400,
        blocks: Blocks = MEMORY,
    ) -> None:
        """``blocks``: where the series' sealed chunks are kept (``blocks.py``)."""
        if bucket_seconds <= 0 or full_resolution_seconds < 0:
            raise ValueError("bucket must be > 0 and the full-resolution window >= 0 seconds")
        if retention_seconds < full_resolution_seconds:
            raise ValueError(
                f"retention ({retention_seconds:g} s) must be at least the full-resolution "
                f"window ({full_resolution_seconds:g} s)"
            )
        self.bucket = ms(bucket_seconds)
        self.window = ms(full_resolution_seconds)
        self.retention = ms(retention_seconds)
        self.kept_from = 0  # ms; nothing before it is kept (retention)
        self.blocks = blocks
        self.nodes: dict[str, Node] = {ROOT: Node(ROOT, self.bucket, blocks)}
        self.owners: dict[str, str] = {}  # user leaf -> user
        self._jobs: dict[str, _Track] = {}
        self.horizon = 0  # ms; history before it is kept as buckets only
        self.facts = 0

    # -- feeding ---------------------------------------------------------------------------------
    def node(self, path: str) -> Node:
        found = self.nodes.get(path)
        if found is None:
            found = self.nodes[path] = Node(path, self.bucket, self.blocks)
            up = parent(path)
            self.node(up).children.add(path)
        return found

    def apply(self, fact: Fact) -> None:
        """Fold one transition in (per job in the order they happened)."""
        self.facts += 1
        # history before the horizon is already downsampled: a row that old (it can only be
        # very late) counts from the horizon, the same for every node so sums stay exact
        t = max(ms(fact.at), self.horizon)
        track = self._jobs.get(fact.job_id)
        if track is not None and t < track.t:
            t = track.t  # a job's own changes never go back in time
        per_worker = vec(fact.gpu, fact.cpu, fact.memory)
        live = fact.state in LIVE
        requested = _times(per_worker, fact.max_workers) if live else ZERO
        used = _times(per_worker, fact.workers)
        old_req, old_used = (track.requested, track.used) if track else (ZERO, ZERO)
        d_req, d_used = sub(requested, old_req), sub(used, old_used)
        self.owners.setdefault(fact.leaf, fact.user)
        preempted = fact.event == Transition.PREEMPTING
        if d_req != ZERO or d_used != ZERO or preempted or track is None:
            for path in ancestors(fact.leaf):
                node = self.node(path)
                node.requested.add_delta(t, d_req)
                node.used.add_delta(t, d_used)
                if preempted:
                    node.preemptions += 1
        if not live and used == ZERO:
            self._jobs.pop(fact.job_id, None)  # ended: it holds and asks for nothing any more
        else:
            self._jobs[fact.job_id] = _Track(t, requested, used)

    def extend(self, facts: Iterable[Fact]) -> None:
        for fact in facts:
            self.apply(fact)

    def compact(self, now: float) -> None:
        """Downsample history older than the full-resolution window into buckets; forget what
        is older than the retention."""
        horizon = (ms(now) - self.window) // self.bucket * self.bucket
        if horizon <= self.horizon:
            return
        self.horizon = horizon
        cutoff = max(0, (ms(now) - self.retention) // self.bucket * self.bucket)
        self.kept_from = max(self.kept_from, cutoff)
        for node in self.nodes.values():
            for series in (node.requested, node.used):
                series.compact(horizon)
                series.trim(cutoff)

    # -- reading ---------------------------------------------------------------------------------
    def children(self, path: str) -> list[str]:
        node = self.nodes.get(path)
        return sorted(node.children) if node else []

    def leaves_of(self, path: str, user: str) -> list[str]:
        """The user leaves of ``user`` in the subtree of ``path`` (``path`` itself included)."""
        prefix = path.rstrip("/") + "/"
        return sorted(
            leaf
            for leaf, owner in self.owners.items()
            if owner == user and (leaf == path or leaf.startswith(prefix) or path == ROOT)
        )

    def current(self, path: str, kind: str) -> Vec:
        node = self.nodes.get(path)
        return node.series(kind).current() if node else ZERO

    def integrals(self, path: str, kind: str, bounds: list[int]) -> list[tuple]:
        """Integral from the beginning of time to each bound (ms), in unit x ms."""
        node = self.nodes.get(path)
        if node is None:
            return [ZERO] * len(bounds)
        return node.series(kind).integrals(bounds)


def _times(v: Vec, k: int) -> Vec:
    return (v[0] * k, v[1] * k, v[2] * k)


def hours(amount: tuple) -> dict[str, float]:
    """An integral in unit x ms -> gpu_hours, cpu_hours (core-hours), memory_gib_hours."""
    return {
        # int / int is correctly rounded in Python: exact figures give the nearest float
        f"{name}_hours" if name != "memory" else "memory_gib_hours": float(
            a / (scale * MS_PER_HOUR)
        )
        for name, a, scale in zip(RESOURCES, amount, UNIT_SCALE)
    }


def average(amount: tuple, span_ms: int) -> dict[str, float]:
    """An integral over ``span_ms`` -> the average in devices, cores and bytes."""
    out = {}
    for name, a, scale in zip(RESOURCES, amount, UNIT_SCALE):
        unit = 1 if name == "memory" else scale
        out[name] = float(a / (unit * span_ms)) if span_ms else 0.0
    return out
