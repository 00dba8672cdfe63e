"""Every sentence the core says to a user: rejections, waits and reclaim reasons.

The words are part of the contract (docs/scheduling.md "Admission 3" quotes them), so each has
one home here and the phases only fill in the figures.
"""

from __future__ import annotations

from .resources import Resources, format_amount

ON_ITS_WAY = "waiting: resources being released by preempted jobs go to it"


def size(w: tuple, n: int) -> str:
    """``4 workers x 1 gpu``."""
    return f"{n} worker{'s' if n > 1 else ''} x {Resources(*w).describe()}"


def amount(name: str, value: float) -> str:
    """``2`` gpu (the unit said once, after the last figure), ``500m cpu``, ``4Gi memory``."""
    return (
        format_amount(name, value).rsplit(" ", 1)[0]
        if name == "gpu"
        else format_amount(name, value)
    )


# Admission 3: the job can never run as asked ------------------------------------------------
def no_such_plan(path: str) -> str:
    return f"there is no plan {path!r}; ask an admin to create it"


def submit_to_parent(path: str, parent: str) -> str:
    return f"{path} is a user leaf; submit to its parent {parent}"


def not_a_user_leaf(path: str) -> str:
    return f"{path} is a plan with children, not a user leaf"


def over_plan_limit(plan: str, name: str, limit: float, req: float, w: tuple, n: int) -> str:
    return (
        f"rejected: plan {plan} has a {name} limit of "
        f"{format_amount(name, limit)} and this job asks for "
        f"{format_amount(name, req)} ({size(w, n)}); ask for at most "
        f"{format_amount(name, limit)} or submit to a plan with a higher limit"
    )


def over_instance(name: str, total: float, req: float, w: tuple, n: int) -> str:
    return (
        f"rejected: the instance has {format_amount(name, total)}"
        f" in all (capacity and quota) and this job asks for "
        f"{format_amount(name, req)} ({size(w, n)})"
    )


def worker_too_big(name: str, asked: float, largest: float) -> str:
    return (
        f"rejected: one worker asks for {format_amount(name, asked)} but the "
        f"largest node has {format_amount(name, largest)}; use more, "
        f"smaller workers"
    )


def cannot_place(w: tuple, n: int, most: float) -> str:
    return (
        f"rejected: the gang of {size(w, n)} cannot be placed: the nodes hold at "
        f"most {int(most)} such workers at once"
    )


# waits (Admission 2, 4; Reclaim) -----------------------------------------------------------
def at_limit(where: str, name: str, held: float, limit: float, req: float) -> str:
    return (
        f"waiting: {where} at its {name} limit: "
        f"{amount(name, held)} of {amount(name, limit)} in use, "
        f"this job needs {amount(name, req)} more"
    )


def job_cap(max_jobs: int) -> str:
    return f"waiting: the instance runs at most {max_jobs} jobs at once"


def for_capacity(w: tuple, n: int, room: float) -> str:
    return (
        f"waiting for capacity: needs {size(w, n)}, each worker on one node; "
        f"room now for {int(room)}"
    )


def holds_reservation(nodes: str) -> str:
    return f"holds the reservation: capacity freed on {nodes} goes to it first"


def starved(waited: float) -> str:
    """Admission 6: the reservation holder was submitted more than ``max_gang_wait`` ago."""
    return f"submitted {span(waited)} ago, the longest of any gang: it goes first"


def used_more(plan: str, times: float, half_life: float, after: str) -> str:
    """Deserved share 2: why a plan's share is smaller than its weight alone would give."""
    name = plan.rsplit("/", 1)[-1] or plan
    other = after.rsplit("/", 1)[-1] or after
    return (
        f"{name} used {times:.1f}x its share over the last {span(half_life)}, "
        f"so it borrows after {other}"
    )


def span(seconds: float) -> str:
    """``7d``, ``12h``, ``90m``, ``45s``: the largest unit that divides it into a whole
    number or one decimal."""
    for unit, size_s in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size_s:
            value = seconds / size_s
            return (
                f"{value:.0f}{unit}" if abs(value - round(value)) < 0.05 else f"{value:.1f}{unit}"
            )
    return f"{seconds:.0f}s"


def held_back(plan: str) -> str:
    return (
        f"waiting: {plan} gives resources back to a plan under its share this cycle, "
        f"so none of its jobs starts in it"
    )


def reclaiming(victims: str, grace: float) -> str:
    return f"waiting: reclaiming from {victims} (grace {grace:g} s)"


def reclaimed_by(leaf: str, job_id: str) -> str:
    return f"reclaimed by {leaf} for job {job_id}"
