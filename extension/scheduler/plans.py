"""The plan tree: paths, shares, limits, and user leaves (docs/scheduling.md "Words", "Plans").

A plan is addressed by its path (``/project1/dev-team``); the root ``/`` is the instance and is
implicit. Every change is validated before anything is written, so a refused change leaves the
tree as it was.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

from .names import ALLOWED, SEGMENT, is_segment, user_name_problem
from .names import MAX_USER_NAME as MAX_USER_NAME  # where it was first defined
from .resources import NO_LIMIT, RESOURCES, UNLIMITED, Resources, format_amount

ROOT = "/"
NAME = SEGMENT  # a plan path segment (names.py)
# Lengths the store keeps (its path columns hold 512 characters, and PostgreSQL refuses more):
# a plan path up to 256, a user name up to 255 (JupyterHub's own), so a user leaf fits.
MAX_PLAN_PATH = 256


class PlanError(ValueError):
    """A plan change or reference that is refused; the message says what and how to fix it."""


@dataclass(frozen=True)
class Plan:
    path: str
    share: float = 1.0
    limit: Resources = NO_LIMIT
    user_leaf: bool = False

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[1]

    @property
    def parent(self) -> str:
        return parent_of(self.path)

    def to_dict(self) -> dict:
        return {
            "path": self.path,
            "share": self.share,
            "limit": self.limit.to_dict(),
            "user_leaf": self.user_leaf,
        }


def check_name(name: str, what: str = "plan name") -> str:
    """Names are ``[A-Za-z0-9._-]+`` and not ``.`` or ``..`` (they would read as paths)."""
    if not is_segment(name):
        raise PlanError(f"{what} {name!r} is not allowed; use {ALLOWED} only")
    return name


def split_path(path: str) -> list[str]:
    """``/a/b`` -> ``["a", "b"]``, refusing anything that is not an absolute plan path."""
    if not isinstance(path, str) or not path.startswith("/") or path == ROOT:
        raise PlanError(f"plan path {path!r} must start with '/' and name a plan, e.g. /project1")
    if path.endswith("/") or "//" in path:
        raise PlanError(f"plan path {path!r} has an empty segment; write it like /project1/dev")
    parts = path[1:].split("/")
    for part in parts:
        check_name(part, what=f"plan path {path!r}: segment")
    return parts


def parent_of(path: str) -> str:
    head = path.rsplit("/", 1)[0]
    return head or ROOT


@functools.lru_cache(maxsize=4096)  # called for every job in every cycle; names repeat
def leaf_path(plan: str, user: str) -> str:
    """The user leaf a submission to ``plan`` by ``user`` is charged to."""
    problem = user_name_problem(user)
    if problem:
        raise PlanError(problem)
    return f"{plan}/{user}"


class PlanTree:
    """Plans by path, with validation on every change."""

    def __init__(self, plans: Iterable[Plan] = ()) -> None:
        self._plans: dict[str, Plan] = {}
        self._children: dict[str, list[str]] = {ROOT: []}
        # bumped by every change: the scheduler keeps its index of a tree until this moves
        self.version = 0
        for plan in sorted(plans, key=lambda p: (p.path.count("/"), p.path)):
            self.add(plan.path, plan.share, plan.limit, user_leaf=plan.user_leaf)

    # -- reading -----------------------------------------------------------------------------
    def __contains__(self, path: object) -> bool:
        return path in self._plans

    def __iter__(self) -> Iterator[Plan]:
        return iter(sorted(self._plans.values(), key=lambda p: p.path))

    def __len__(self) -> int:
        return len(self._plans)

    def get(self, path: str) -> Plan:
        try:
            return self._plans[path]
        except KeyError:
            raise PlanError(f"there is no plan {path!r}; create it first") from None

    def children(self, path: str = ROOT) -> list[Plan]:
        return [self._plans[p] for p in sorted(self._children.get(path, ()))]

    def takes_jobs(self, path: str) -> bool:
        """Whether users may be charged to ``path``: a plan with no child plans but its users'
        leaves. A parent plan's share is split among its child plans, so a user leaf beside
        them would silently take a part of each one's share (docs/scheduling.md "Words")."""
        plan = self._plans.get(path)
        return (
            plan is not None
            and not plan.user_leaf
            and all(self._plans[c].user_leaf for c in self._children.get(path, ()))
        )

    def ancestors(self, path: str) -> list[Plan]:
        """The plans from the top level down to ``path`` itself (all must exist)."""
        parts = split_path(path)
        return [self.get("/" + "/".join(parts[: i + 1])) for i in range(len(parts))]

    def copy(self) -> PlanTree:
        clone = PlanTree()
        clone._plans = dict(self._plans)
        clone._children = {k: list(v) for k, v in self._children.items()}
        return clone

    # -- changing ----------------------------------------------------------------------------
    def add(
        self,
        path: str,
        share: float = 1.0,
        limit: Resources = NO_LIMIT,
        user_leaf: bool = False,
    ) -> Plan:
        split_path(path)
        if not user_leaf and len(path) > MAX_PLAN_PATH:
            raise PlanError(
                f"plan path {path[:40]}... is {len(path)} characters long; at most {MAX_PLAN_PATH}"
            )
        if path in self._plans:
            raise PlanError(f"plan {path} already exists; update it instead")
        parent = parent_of(path)
        if parent != ROOT and parent not in self._plans:
            raise PlanError(f"cannot create {path}: its parent plan {parent} does not exist")
        if parent != ROOT and self._plans[parent].user_leaf:
            raise PlanError(f"cannot create {path}: {parent} is a user leaf and has no children")
        plan = Plan(path, _check_share(path, share), _check_limit(path, limit), user_leaf)
        self._check_against_parent(plan)
        self._plans[path] = plan
        self._children.setdefault(parent, []).append(path)
        self._children.setdefault(path, [])
        self.version += 1
        return plan

    def update(self, path: str, share: float | None = None, limit: Resources | None = None) -> Plan:
        old = self.get(path)
        new = replace(
            old,
            share=old.share if share is None else _check_share(path, share),
            limit=old.limit if limit is None else _check_limit(path, limit),
        )
        self._check_against_parent(new)
        for child in self.children(path):
            _check_child_limit(child, new)
        self._plans[path] = new
        self.version += 1
        return new

    def remove(self, path: str) -> Plan:
        plan = self.get(path)
        if self._children.get(path):
            names = ", ".join(sorted(self._children[path]))
            raise PlanError(
                f"cannot delete {path}: it has child plans ({names}); delete them first"
            )
        del self._plans[path]
        del self._children[path]
        self._children[parent_of(path)].remove(path)
        self.version += 1
        return plan

    def ensure_user_leaf(self, plan: str, user: str) -> Plan:
        """The leaf ``plan/user``, created on first use with share 1."""
        parent = self.get(plan)
        if parent.user_leaf:
            raise PlanError(
                f"{plan} is the user leaf of {parent.name}; submit to its parent {parent.parent}"
            )
        path = leaf_path(plan, user)
        if path in self._plans:
            existing = self._plans[path]
            if not existing.user_leaf and self._children.get(path):
                raise PlanError(f"{path} is a plan with children, not a user leaf")
            return existing
        return self.add(path, 1.0, NO_LIMIT, user_leaf=True)

    def _check_against_parent(self, plan: Plan) -> None:
        parent = plan.parent
        if parent != ROOT:
            _check_child_limit(plan, self._plans[parent])

    @classmethod
    def from_dict(cls, plans: dict[str, dict]) -> PlanTree:
        """``{"/p": {"share": 1, "limit": {"gpu": 4}}}`` (parents may come in any order)."""
        tree = cls()
        for path in sorted(plans, key=lambda p: (str(p).count("/"), str(p))):
            spec = plans[path] or {}
            limit = Resources.from_mapping(spec.get("limit"), UNLIMITED, where=f"{path} limit")
            tree.add(path, spec.get("share", 1), limit, bool(spec.get("user_leaf", False)))
        return tree


MIN_SHARE = 0.001
MAX_SHARE = 1_000_000


def _check_share(path: str, share: float) -> float:
    """A share within [MIN_SHARE, MAX_SHARE]: ratios between siblings then stay within 1e9,
    where water-filling's sums and divisions are exact enough (1e17 or 5e-324 broke them)."""
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not share > 0:
        raise PlanError(f"plan {path}: share must be a number above 0, got {share!r}")
    if not MIN_SHARE <= share <= MAX_SHARE:
        raise PlanError(
            f"plan {path}: share must be from {MIN_SHARE} to {MAX_SHARE:,}, got {share!r}"
        )
    return float(share)


def _check_limit(path: str, limit: Resources) -> Resources:
    limit = Resources(*limit)
    for name, value in zip(RESOURCES, limit):
        if value < 0:
            raise PlanError(f"plan {path}: {name} limit must not be negative, got {value}")
    return limit


def _check_child_limit(child: Plan, parent: Plan) -> None:
    for name, mine, theirs in zip(RESOURCES, child.limit, parent.limit):
        if mine != UNLIMITED and mine > theirs:
            raise PlanError(
                f"plan {child.path}: {name} limit {format_amount(name, mine)} is above the "
                f"limit {format_amount(name, theirs)} of its parent {parent.path}; lower it or "
                f"raise the parent's"
            )
