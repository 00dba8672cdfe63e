"""Usage over days: each leaf's decayed usage and every plan's fair-share factor
(docs/scheduling.md "Deserved share 2: usage history").

Usage is charged as what a leaf held times how long it held it, weighted per resource
(``UsageWeights``: by default GPU-seconds only), and decays by half every ``half_life``
seconds, as Slurm's ``PriorityDecayHalfLife``, Kueue's ``usageHalfLifeTime`` and Run:ai's
time-based fair share do. ``UsageHistory`` keeps it for a caller (the service, the
simulator); the core only reads it, as ``Snapshot.usage``, so a cycle stays pure.

Among siblings, a plan's fair-share factor is Slurm's classic ``F = 2 ** (-U / S)``: ``U`` its
part of its siblings' usage, ``S`` its part of their shares. Its weight in the water-filling of
the deserved share is ``share * F ** PAYBACK`` (``2 ** (-3 U / S)``): a plan that used
exactly its part keeps its siblings' relative weights, one that used more deserves less while
the others contend, and the difference decays with the usage. With no usage at a level every
factor is 1.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

GIB = float(1 << 30)
# usage under this is dropped: a leaf idle for ~40 half-lives is forgotten, so the history
# holds the leaves that ran recently, not every leaf that ever did
FORGOTTEN = 1e-9
# a factor never falls below this: a plan's weight stays positive however much it used, so
# it still deserves a sliver of what nobody else wants (and water-filling never divides by 0)
LEAST_FACTOR = 2.0**-20
# the weight in the water-filling is share * F ** PAYBACK = share * 2 ** (-3 U / S): with
# Slurm's F alone a plan never weighs below 2 ** (-1 / S) of its share (1/8 with three equal
# siblings), too little to repay a team that had the cluster alone while a queue only grows
# (docs/scheduling.md "Deserved share 2", issue 41)
PAYBACK = 3


@dataclass(frozen=True)
class UsageWeights:
    """What one second of each resource counts as usage: per GPU, per CPU core, per GiB."""

    gpu: float = 1.0
    cpu: float = 0.0
    memory: float = 0.0

    def __post_init__(self) -> None:
        for name in ("gpu", "cpu", "memory"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(
                    f"fair-share weight for {name} must be a finite number >= 0, got {value!r}"
                )
        if not (self.gpu or self.cpu or self.memory):
            raise ValueError("fair-share weights are all 0: give at least one resource a weight")

    def rate(self, held: tuple) -> float:
        """Usage per second of ``held`` (gpu devices, cpu millicores, memory bytes)."""
        return self.gpu * held[0] + self.cpu * held[1] / 1000.0 + self.memory * held[2] / GIB


@dataclass
class UsageHistory:
    """Decayed usage per user leaf, advanced by the caller at each cycle with what every leaf
    held since the one before (held amounts are constant between cycles, so the integral is
    exact). ``reset_period`` > 0 clears it at every multiple of that many seconds since the
    epoch (Slurm's ``PriorityUsageResetPeriod``)."""

    half_life: float
    weights: UsageWeights = field(default_factory=UsageWeights)
    reset_period: float = 0.0
    usage: dict[str, float] = field(default_factory=dict)
    at: float | None = None  # the time ``usage`` is decayed to

    def __post_init__(self) -> None:
        if not (math.isfinite(self.half_life) and self.half_life > 0):
            raise ValueError(
                f"half-life must be a positive number of seconds, got {self.half_life}"
            )
        if not (math.isfinite(self.reset_period) and self.reset_period >= 0):
            raise ValueError(f"reset period must be >= 0 seconds, got {self.reset_period}")

    def advance(self, now: float, held: Iterable[tuple[str, tuple]]) -> None:
        """Decay to ``now`` and charge each ``(leaf, held)`` for the time since the last
        advance (a leaf may come more than once: its amounts add up)."""
        if self.at is None or now <= self.at:
            self.at = now if self.at is None else self.at
            return
        since = self.at
        if self.reset_period > 0:
            boundary = math.floor(now / self.reset_period) * self.reset_period
            if boundary > since:
                self.usage.clear()
                since = boundary
        keep = decay(now - since, self.half_life)
        charged = charge(now - since, self.half_life)
        usage = self.usage
        if keep < 1.0:
            for leaf in list(usage):
                value = usage[leaf] * keep
                if value < FORGOTTEN:
                    del usage[leaf]
                else:
                    usage[leaf] = value
        for leaf, amounts in held:
            rate = self.weights.rate(amounts)
            if rate > 0:
                usage[leaf] = usage.get(leaf, 0.0) + rate * charged
        self.at = now

    def reset(self, now: float) -> None:
        """Forget all usage (an admin's reset, as Slurm's ``sacctmgr modify ... RawUsage=0``)."""
        self.usage.clear()
        self.at = now

    def decayed(self, now: float) -> dict[str, float]:
        """The usage as it will be at ``now`` with nothing more charged."""
        if self.at is None or now <= self.at:
            return dict(self.usage)
        keep = decay(now - self.at, self.half_life)
        return {leaf: value * keep for leaf, value in self.usage.items()}

    def to_json(self) -> dict:
        return {"at": self.at, "usage": dict(self.usage)}

    def load(self, saved: Mapping) -> None:
        """Take back what ``to_json`` gave (the service keeps it across restarts)."""
        at = saved.get("at")
        usage = saved.get("usage") or {}
        self.at = float(at) if at is not None else None
        self.usage = {str(k): float(v) for k, v in usage.items() if float(v) >= FORGOTTEN}


def decay(seconds: float, half_life: float) -> float:
    """What is left of one unit of usage after ``seconds``: ``0.5 ** (seconds / half_life)``."""
    return 0.5 ** (seconds / half_life)


def charge(seconds: float, half_life: float) -> float:
    """The decayed usage of a rate of 1 held for ``seconds`` up to now: the integral of
    ``0.5 ** ((now - t) / half_life)`` over those seconds."""
    return half_life / math.log(2) * (1.0 - decay(seconds, half_life))


def factor(usage_part: float, share_part: float) -> float:
    """Slurm's classic fair-share factor ``2 ** (-U / S)``: 1 with no usage, 1/2 at exactly
    one's part, 1/4 at twice it."""
    if share_part <= 0:
        return LEAST_FACTOR
    return max(2.0 ** (-usage_part / share_part), LEAST_FACTOR)


@dataclass(frozen=True)
class PlanStanding:
    """One plan among its siblings (``wmla shares``' row, sshare's columns)."""

    path: str
    share: float
    normalized_share: float  # S: its share over its siblings' (and its own)
    raw_usage: float  # its subtree's decayed usage
    effective_usage: float  # U: its part of its siblings' usage
    factor: float  # 2 ** (-U / S)

    @property
    def weight(self) -> float:
        """Its weight in the water-filling of the deserved share (Deserved share 2)."""
        return self.share * self.factor**PAYBACK

    @property
    def usage_over_share(self) -> float:
        """U / S: 1 is exactly its part; 3.2 is 3.2 times its share."""
        return self.effective_usage / self.normalized_share if self.normalized_share else 0.0


def standings(
    children: Mapping[str, list[tuple[str, float]]], raw: Mapping[str, float]
) -> dict[str, PlanStanding]:
    """Every plan's standing among its siblings. ``children``: parent path -> [(child path,
    share)] for the whole tree; ``raw``: each plan's subtree usage (``subtree_usage``)."""
    out: dict[str, PlanStanding] = {}
    for kids in children.values():
        total_share = sum(s for _, s in kids)
        total_usage = sum(raw.get(p, 0.0) for p, _ in kids)
        for path, share in kids:
            s = share / total_share if total_share > 0 else 0.0
            u = raw.get(path, 0.0) / total_usage if total_usage > 0 else 0.0
            f = factor(u, s) if total_usage > 0 else 1.0
            out[path] = PlanStanding(path, share, s, raw.get(path, 0.0), u, f)
    return out


def subtree_usage(plans: Iterable[str], leaf_usage: Mapping[str, float]) -> dict[str, float]:
    """Usage summed up the tree: every plan's is its own (a leaf's) plus its children's. A
    usage path that is no plan's any more (a deleted leaf) counts in the nearest plan above
    it that exists."""
    known = set(plans) | {"/"}
    raw: dict[str, float] = {}
    for path, value in leaf_usage.items():
        at = path
        while at not in known:
            at = at.rsplit("/", 1)[0] or "/"
        while True:
            raw[at] = raw.get(at, 0.0) + value
            if at == "/":
                break
            at = at.rsplit("/", 1)[0] or "/"
    return raw


def tree_standings(bottom_up: list, leaf_usage: Mapping[str, float]) -> dict[str, PlanStanding]:
    """``standings`` over a cycle's plan vertices (``PlanNode``: ``path``, ``share``,
    ``children``)."""
    raw = subtree_usage((p.path for p in bottom_up), leaf_usage)
    children = {p.path: [(c.path, c.share) for c in p.children] for p in bottom_up if p.children}
    return standings(children, raw)


def over_used(standing: Mapping[str, PlanStanding], paths: Iterable[str]) -> bool:
    """Some plan of ``paths`` (a plan's path up the tree) used more than its share among its
    siblings: ``U/S`` above 1 (Admission 6 passes its borrowing gangs over, issue 41)."""
    for path in paths:
        got = standing.get(path)
        if got is not None and got.usage_over_share > 1.0:
            return True
    return False
