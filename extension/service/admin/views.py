"""What the admin page shows and changes, computed from the service's ``Scheduler``.

Pure functions over the scheduler's state (no tornado): the plan rows with their share bars, the
form fields turned into the REST API's plan body (so validation and messages are the API's), a
preview of the deserved shares that runs the same core (``extension.scheduler.schedule``) on a
copy of the tree and the current jobs, the records of a move, and the instance view.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from extension.durations import format_duration
from extension.scheduler import (
    UNLIMITED,
    IndexCache,
    Job,
    PlanError,
    PlanTree,
    Resources,
    Snapshot,
    schedule,
)
from extension.scheduler.plans import ROOT, parent_of, split_path
from extension.scheduler.resources import RESOURCES, format_amount
from extension.storage.quotas import QuotaReport, QuotaState
from extension.tables import format_seconds, size_text

from ..actions import plans_after
from ..scheduling import Scheduler
from ..store import PlanRecord

ACTIONS = ("create", "update", "move", "delete")


def amount(resource: str, value: float | None) -> str:
    """``4``, ``500m``/``2`` cores, ``4Gi``; unlimited is ``-`` (the page says so in a title)."""
    if value is None or value == UNLIMITED:
        return "-"
    if value == 0:
        return "0"
    if resource == "memory":  # for reading: 23.5Gi rather than the exact 24683652Ki
        for suffix, unit in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
            if value >= unit:
                return f"{round(value / unit, 1):g}{suffix}"
        return str(int(value))
    return format_amount(resource, value).rsplit(" ", 1)[0]


def vector(res: Resources | Mapping[str, float] | None, unlimited: bool = False) -> dict:
    """Formatted gpu/cpu/memory of a vector (a ``Resources`` or the API's dict)."""
    if res is None:
        res = Resources()
    if isinstance(res, Mapping):
        fill = UNLIMITED if unlimited else 0
        res = Resources(*(res.get(r, fill) for r in RESOURCES))
    return {r: amount(r, v) for r, v in zip(RESOURCES, res)}


def limit_form_value(resource: str, value: float) -> str:
    """A limit as the form shows it (what the API accepts back): gpu count, cores, bytes."""
    if value == UNLIMITED:
        return ""
    text = format_amount(resource, value)  # exact, so saving the form unchanged changes nothing
    if text.endswith(" bytes memory"):  # not a whole number of Ki: plain bytes
        return str(int(value))
    return text.rsplit(" ", 1)[0]


def churn_cells(churn: Any, path: str) -> dict:
    """A plan's churn counters as the page shows them (``churn``: metering's ``Churn``, or None
    when metering is not loaded: zeros)."""
    figures = churn.of(path) if churn is not None else None
    if figures is None:
        return {"preemptions": 0, "preempted": "0", "lost": "0", "steady": 0}
    return {
        "preemptions": figures.preemptions,
        "preempted": f"{figures.preempted_gpu_seconds:.1f}",
        "lost": f"{figures.lost_gpu_seconds:.1f}",
        "steady": figures.steady_state_preemptions,
    }


def plan_rows(sched: Scheduler, churn: Any = None) -> list[dict]:
    """The tree depth first, parents before children, each row with its figures and, for a plan
    with children, ``bar``: each child's share as a percentage of the siblings' total; with
    ``churn`` (metering's counters) each row's churn cells."""
    rows: list[dict] = []

    def visit(path: str, depth: int) -> None:
        children = sched.plans.children(path)
        total = sum(c.share for c in children) or 1.0
        for child in children:
            users, groups = sched.members.get(child.path, ([], []))
            fig = sched.figures.get(child.path)
            grand = sched.plans.children(child.path)
            gtotal = sum(g.share for g in grand) or 1.0
            rows.append(
                {
                    "path": child.path,
                    "name": child.name,
                    "parent": path,
                    "depth": depth,
                    "share": _num(child.share),
                    "share_pct": round(100.0 * child.share / total, 1),
                    "limit": vector(child.limit),
                    "limit_raw": child.limit,
                    "user_leaf": child.user_leaf,
                    "users": list(users),
                    "groups": list(groups),
                    "deserved": vector(fig.deserved if fig else None),
                    "allocated": vector(fig.allocated if fig else None),
                    "demand": vector(fig.demand if fig else None),
                    "pending": fig.pending if fig else 0,
                    "running": fig.running if fig else 0,
                    "churn": churn_cells(churn, child.path),
                    "bar": [
                        {
                            "name": g.name,
                            "path": g.path,
                            "share": _num(g.share),
                            "pct": round(100.0 * g.share / gtotal, 1),
                            "user_leaf": g.user_leaf,
                        }
                        for g in grand
                    ],
                }
            )
            visit(child.path, depth + 1)

    visit(ROOT, 0)
    return rows


def root_bar(sched: Scheduler) -> list[dict]:
    """The top-level plans' shares of the instance."""
    top = sched.plans.children(ROOT)
    total = sum(p.share for p in top) or 1.0
    return [
        {"name": p.name, "path": p.path, "share": _num(p.share),
         "pct": round(100.0 * p.share / total, 1), "user_leaf": p.user_leaf}
        for p in top
    ]  # fmt: skip


def _num(value: float) -> float | int:
    return int(value) if value == int(value) else value


# -- forms -> the API's plan body --------------------------------------------------------------
def _share(text: str) -> Any:
    """A number when it reads as one; else the text itself, so the core's message names it."""
    text = (text or "").strip()
    if not text:
        return 1
    try:
        value = float(text)
    except ValueError:
        return text
    return int(value) if value.is_integer() else value


def _names(text: str) -> list[str]:
    return [n for n in (p.strip() for p in (text or "").replace("\n", ",").split(",")) if n]


RUNTIME_FIELDS = ("runtime_default", "runtime_max")


def plan_body(form: Mapping[str, str], with_path: bool) -> dict:
    """The REST API's plan body from the form's fields (empty limit fields: unlimited)."""
    body: dict[str, Any] = {"share": _share(form.get("share", ""))}
    if with_path:
        body["path"] = (form.get("path") or "").strip()
    body["limit"] = {r: form[r].strip() for r in RESOURCES if (form.get(r) or "").strip()}
    body["members"] = {"users": _names(form.get("users", "")),
                       "groups": _names(form.get("groups", ""))}  # fmt: skip
    for key in RUNTIME_FIELDS:  # "2h", "90m", seconds; empty: none on this plan (null)
        if key in form:
            body[key] = (form.get(key) or "").strip() or None
    return body


def form_values(sched: Scheduler, path: str) -> dict[str, str]:
    """The edit form of an existing plan, prefilled."""
    rec = sched.record(path)
    values = {
        "path": path,
        "share": str(_num(rec.share)),
        "users": ", ".join(rec.users),
        "groups": ", ".join(rec.groups),
        "parent": parent_of(path),
    }
    for r, v in zip(RESOURCES, rec.limit):
        values[r] = limit_form_value(r, v)
    for key in RUNTIME_FIELDS:  # as the API reads it back: 1h30m, 2h, 1d
        seconds = getattr(rec, key)
        values[key] = "" if seconds is None else format_duration(seconds)
    return values


# -- move ------------------------------------------------------------------------------------
def move_plan(sched: Scheduler, path: str, new_parent: str) -> tuple[list[PlanRecord], list[str]]:
    """Records that re-create ``path``'s subtree under ``new_parent``, and the old paths to
    delete (deepest first). User leaves are dropped: they come back on a user's next submission,
    as when a plan is deleted. Refused (PlanError) when it would go under itself."""
    new_parent = (new_parent or "").strip() or ROOT
    if new_parent != ROOT:
        split_path(new_parent)  # the core's message for a malformed path
        if new_parent not in sched.plans:
            raise PlanError(f"there is no plan {new_parent!r} to move {path} under")
    if new_parent == path or new_parent.startswith(path + "/"):
        raise PlanError(f"cannot move {path} under itself ({new_parent})")
    if new_parent == parent_of(path):
        raise PlanError(f"{path} is already under {new_parent}")
    prefix = (new_parent.rstrip("/") if new_parent != ROOT else "") + "/" + path.rsplit("/", 1)[1]
    subtree = [p for p in sched.plans if p.path == path or p.path.startswith(path + "/")]
    records = []
    for plan in subtree:  # sorted by path: parents first
        if plan.user_leaf:
            continue
        users, groups = sched.members.get(plan.path, ([], []))
        new_path = prefix + plan.path[len(path) :]
        if new_path in sched.plans:
            raise PlanError(f"cannot move {path} to {prefix}: plan {new_path} already exists")
        default, most = sched.limits.plans.get(plan.path, (None, None))
        records.append(
            PlanRecord(new_path, plan.share, plan.limit, False, users, groups, default, most)
        )
    delete = [p.path for p in sorted(subtree, key=lambda p: -p.path.count("/"))]
    return records, delete


# -- preview -----------------------------------------------------------------------------------
def apply_to_copy(
    tree: PlanTree, records: list[PlanRecord], create: bool, delete: list[str]
) -> PlanTree:
    """The change on a copy of the tree, validated by the core exactly as change_plans does."""
    return plans_after(tree, records, create, delete)


def preview(
    sched: Any,
    records: list[PlanRecord],
    create: bool,
    delete: list[str],
    now: float,
    cache: IndexCache | None = None,
) -> list[dict]:
    """Deserved shares before and after the change, from the same core on a copy of the tree
    and of the current jobs (jobs under deleted plans leave with them). Each row: path, share of
    its parent (%) before and after, deserved gpu/cpu before and after, changed. ``sched``: the
    Scheduler or what preview.py copied of it; ``cache``: the index cache of the caller's
    thread (none: one for this preview only)."""
    cache = IndexCache() if cache is None else cache
    after_tree = apply_to_copy(sched.plans, records, create, delete)
    gone = tuple(delete)
    jobs = [
        replace(j)
        for j in sched.jobs.values()
        if j.plan in after_tree and not any(j.leaf == d or j.leaf.startswith(d + "/") for d in gone)
    ]
    result = schedule(Snapshot(after_tree, sched.instance, jobs, sched.config), now, cache)
    before, after = sched.figures, result.plans
    busy_before = saturated(sched.plans, sched, now, cache)
    busy_after = saturated(after_tree, sched, now, cache)
    paths = sorted({p.path for p in sched.plans} | {p.path for p in after_tree})
    rows = []
    for path in paths:
        b, a = before.get(path), after.get(path)
        pb = _pct(sched.plans, path)
        pa = _pct(after_tree, path)
        row = {
            "path": path,
            "pct_before": pb,
            "pct_after": pa,
            "gpu_before": amount("gpu", b.deserved.gpu) if b else "",
            "gpu_after": amount("gpu", a.deserved.gpu) if a else "",
            "cpu_before": amount("cpu", b.deserved.cpu) if b else "",
            "cpu_after": amount("cpu", a.deserved.cpu) if a else "",
            "busy_before": amount("gpu", busy_before[path]) if path in busy_before else "",
            "busy_after": amount("gpu", busy_after[path]) if path in busy_after else "",
            "state": "removed" if path not in after_tree else
                     "new" if path not in sched.plans else "",
        }  # fmt: skip
        row["changed"] = bool(row["state"]) or any(
            row[f"{k}_before"] != row[f"{k}_after"] for k in ("pct", "gpu", "cpu", "busy")
        )
        rows.append(row)
    return rows


def saturated(tree: PlanTree, sched: Any, now: float, cache: IndexCache) -> dict[str, float]:
    """Deserved GPUs if every plan wanted all it may take: the same core, on the instance, with
    one elastic job per plan that takes jobs (no child plans but its users' leaves) asking for
    one device per worker up to the plan's limit (synthetic jobs, never stored). Empty when the
    instance has no GPUs."""
    capacity = int(sched.instance.capacity.gpu)
    if capacity < 1:
        return {}
    jobs = []
    for plan in tree:
        # a plan whose users have submitted has their leaves as children: it still takes jobs
        if plan.user_leaf or any(not child.user_leaf for child in tree.children(plan.path)):
            continue
        cap = min([capacity, *(p.limit.gpu for p in tree.ancestors(plan.path))])
        if cap < 1:
            continue
        jobs.append(
            Job(f"preview-{len(jobs)}", "preview", plan.path, Resources(1, 0, 0), 1, int(cap),
                submitted=0.0)
        )  # fmt: skip
    result = schedule(Snapshot(tree, sched.instance, jobs, sched.config), now, cache)
    return {path: fig.deserved.gpu for path, fig in result.plans.items()}


def _pct(tree: PlanTree, path: str) -> float | None:
    if path not in tree:
        return None
    siblings = tree.children(parent_of(path))
    total = sum(p.share for p in siblings) or 1.0
    return round(100.0 * tree.get(path).share / total, 1)


# -- instance ----------------------------------------------------------------------------------
def instance_view(sched: Scheduler, limit_range: Mapping[str, Any]) -> dict:
    """Capacity, quota, limit-range defaults, and per node: capacity, held, free devices."""
    inst = sched.instance
    held: dict[str, Resources] = {n.name: Resources() for n in inst.nodes}
    for job in sched.jobs.values():
        for node in job.placement:
            if node in held:
                held[node] = held[node].plus(job.per_worker)
    nodes = []
    for n in inst.nodes:
        free = n.capacity.minus(held[n.name])
        nodes.append(
            {
                "name": n.name,
                "capacity": vector(n.capacity),
                "held": vector(held[n.name]),
                "free": vector(Resources(*(max(0, v) for v in free))),
                "gpu_total": int(n.capacity.gpu),
                "gpu_free": max(0, int(free.gpu)),
            }
        )
    # a missing min is 0; a missing max, default or default request is "-" (none)
    lr = {
        k: vector(limit_range.get(k) or {}, unlimited=k != "min")
        for k in ("min", "max", "default", "default_request")
    }
    root = sched.figures.get(ROOT)
    return {
        "capacity": vector(inst.capacity),
        "quota": vector(inst.quota),
        "max_jobs": inst.max_jobs,
        "limit_range": lr,
        "ratio": dict(limit_range.get("max_limit_request_ratio") or {}),
        "nodes": nodes,
        "allocated": vector(root.allocated if root else None),
        "demand": vector(root.demand if root else None),
        "running": root.running if root else 0,
        "pending": root.pending if root else 0,
    }


def quota_row(report: QuotaReport, now: float) -> dict[str, Any]:
    """One user folder's storage for the instance page: figures as text, and whether it is over
    a limit (the row is marked)."""
    left = report.grace_left(now)
    return {
        "user": report.user,
        "enforced": report.enforced,
        "reason": report.reason,
        "used": size_text(report.used_bytes),
        "soft": size_text(report.limits.bytes_soft),
        "hard": size_text(report.limits.bytes_hard),
        "files": f"{report.used_files} / {report.limits.files_hard}",
        "grace": "-" if left is None else ("expired" if left <= 0 else format_seconds(left)),
        "state": report.state.value,
        "over": report.state not in (QuotaState.UNDER, QuotaState.NEAR),
    }


def storage_spec(form: Mapping[str, str]) -> dict[str, Any]:
    """A plan's storage limits from the Instance page's form: the filled fields, with files
    counts as numbers (parse_limits says what is wrong with any of them)."""
    spec: dict[str, Any] = {}
    for key in ("storage", "soft_storage", "grace"):
        if form.get(key):
            spec[key] = form[key]
    for key in ("files", "soft_files"):
        if form.get(key):
            spec[key] = int(form[key]) if form[key].isdigit() else form[key]
    return spec


def home_job(row: Any) -> dict[str, str]:
    """One of a user's jobs on their home page: the reason cut to a line."""
    reason = (row.reason or "").strip().splitlines()
    return {
        "id": row.id,
        "name": row.name or "",
        "plan": row.plan,
        "state": row.state,
        "submitted": time.strftime("%Y-%m-%d %H:%M", time.localtime(row.submitted)),
        "reason": (reason[0][:160] if reason else ""),
    }


def quota_line(row: Mapping[str, Any]) -> str:
    """``3.2 GiB of 10 GiB used, 1200 files of 655360`` (nothing where no quota is held)."""
    if not row or not row.get("enforced"):
        return ""
    return (f"{size_text(row['used_bytes'])} of {size_text(row['held_bytes'])} used, "
            f"{row['used_files']} files of {row['held_files']}")  # fmt: skip
