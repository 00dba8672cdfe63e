"""The state of one cycle, declared in one place.

``CycleState`` is what the phases of ``cycle.schedule`` share: each phase reads what the ones
before it wrote and adds its own part (the comments name the phase that writes a field). The
capacity arithmetic lives in ``ledger``; the plan vertices and their per-cycle figures in
``index``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .decisions import Decision
from .history import PlanStanding
from .index import IndexCache, NodeFigures, PlanIndex, PlanMark, PlanNode
from .ledger import Ledger
from .model import Job, SchedulerConfig, Snapshot


@dataclass(slots=True, eq=False)
class CycleState:
    snapshot: Snapshot
    now: float
    config: SchedulerConfig
    index: PlanIndex  # the plan vertices; index.root is the instance
    nodes: NodeFigures
    ledger: Ledger
    # 1. intake: the one pass over the jobs ----------------------------------------------
    # the jobs it read, in order: the snapshot's, or the kept ones equal to them (intake.Kept);
    # every job the cycle holds is one of these
    jobs: list[Job] = field(default_factory=list)
    # running jobs and, in step, their leaves: two lists, not a tuple per job, so a settled
    # cycle leaves the garbage collector nothing to count (docs/scheduling.md "Cost")
    running: list[Job] = field(default_factory=list)
    running_leaves: list[PlanNode] = field(default_factory=list)
    elastic: list[tuple[Job, PlanNode]] = field(default_factory=list)  # pending and running
    holder: tuple[Job, PlanNode] | None = None  # Snapshot.reserved, if it is still pending
    running_jobs: int = 0  # for Instance.max_jobs
    # 2. reject, 6. reclaim: Reject, then Shrink and Preempt, in the order decided
    decisions: list[Decision] = field(default_factory=list)
    # 3. demand: every plan, deepest first, then by path
    bottom_up: list[PlanNode] = field(default_factory=list)
    # 4. deserved, with usage history on (Deserved share 2): every plan's standing among its
    # siblings by path
    standing: dict[str, PlanStanding] = field(default_factory=dict)
    # Reclaim 6, no start the same cycle undoes (set by cycle.schedule's later runs): paths of
    # plans none of whose jobs start this cycle, as they give a victim back in it, and of
    # plans under which no job is a victim this cycle, as one of theirs starts in it
    hold_back: frozenset[str] = frozenset()
    spare: frozenset[str] = frozenset()
    # 5. admit -------------------------------------------------------------------------------
    started: dict[str, list[int]] = field(default_factory=dict)  # job id -> node indexes
    started_in: list[PlanNode] = field(default_factory=list)  # the leaves they started in
    waits: dict[str, str] = field(default_factory=dict)  # job id -> why (other than capacity)
    # capacity-blocked, first of each bucket (leaf and shape) in fair order: the reclaim
    # candidates, keyed by the bucket's identity (no key to build per bucket); a whole bucket
    # stands for its first job until reclaim needs to know which that is
    blocked: dict[int, Job | list[Job]] = field(default_factory=dict)
    failed_shapes: set[tuple] = field(default_factory=set)  # (worker, count) with no room
    # Admission 1, within-share starts first (min_runtime 0): whether the walk defers a start
    # that would borrow, and the buckets it deferred: id(leaf) -> (leaf, [(seq, jobs, index)])
    defer: bool = False
    deferred: dict[int, tuple[PlanNode, list[tuple]]] = field(default_factory=dict)
    unplaced: Job | None = None  # the first of them that found no room (admit._blocked_borrower)
    reserved_for: str | None = None  # Admission 4: the job holding the reservation
    aged: str | None = None  # Admission 6: the starved gang that started first this cycle
    reservation: str = ""  # and what its status says about it
    # 6. reclaim: jobs chosen as victims this cycle -----------------------------------------
    victims: set[str] = field(default_factory=set)
    losing: set[str] = field(default_factory=set)  # paths of the plans they were taken under
    smallest: tuple | None = None  # Admission 4: the smallest gang that could overtake, lazily
    # 7. grow: job id -> (job, node indexes added) ------------------------------------------
    grown: dict[str, tuple[Job, list[int]]] = field(default_factory=dict)


def open_cycle(snapshot: Snapshot, now: float, cache: IndexCache) -> CycleState:
    """A cycle's state over a kept (or new) plan index, its per-cycle figures zeroed."""
    inst = snapshot.instance
    nodes = cache.nodes(inst)
    index = cache.checkout(snapshot.plans, inst)
    index.reset()
    ledger = Ledger(nodes, index.free, index.incoming, index.pool, index.fit_carry, index.hold_kept)
    return CycleState(snapshot, now, snapshot.config, index, nodes, ledger)


@dataclass(slots=True, eq=False)
class PhaseMark:
    """What phases 1-4 left that admission and reclaim change (``mark``), so that a rerun
    of phases 5-6 starts from exactly there (``rerun``)."""

    plans: PlanMark
    ledger: tuple
    decisions: list[Decision]  # the Rejects of intake
    holder: tuple[Job, PlanNode] | None  # admit may drop it
    running_jobs: int  # admit counts its starts on it
    place: dict[int, int] | None = None  # id(job) -> its index in the snapshot, for rerun


def mark(state: CycleState) -> PhaseMark:
    """Taken once per cycle, after phase 4 (deserved); the kept fit indexes are brought up to
    the rows ``hold`` left (kept.FitCarry)."""
    rows = state.ledger.mark()
    ledger = state.ledger
    state.index.fit_carry.begin(rows[0], ledger.changed, ledger.touched)
    return PhaseMark(
        state.index.mark(),
        rows,
        list(state.decisions),
        state.holder,
        state.running_jobs,
    )


def rerun(
    state: CycleState, at: PhaseMark, hold_back: frozenset[str], spare: frozenset[str]
) -> CycleState:
    """A fresh state for phases 5-6 again (Reclaim 6), with ``hold_back`` and ``spare``:
    the plan figures and the ledger rewound to ``at``, and what phases 1-4 wrote carried
    over (none of them reads ``hold_back`` or ``spare``, so they would write the same
    again); every field of phases 5-7 starts empty, as in a new state."""
    if at.place is None:  # the first rerun of the cycle: a job's place in the snapshot
        at.place = {id(job): n for n, job in enumerate(state.jobs)}
    place = at.place
    state.index.rewind(at.plans, lambda job: place[id(job)])
    state.ledger.rewind(at.ledger)
    return CycleState(
        state.snapshot,
        state.now,
        state.config,
        state.index,
        state.nodes,
        state.ledger,
        jobs=state.jobs,
        running=state.running,
        running_leaves=state.running_leaves,
        elastic=state.elastic,
        holder=at.holder,
        running_jobs=at.running_jobs,
        decisions=list(at.decisions),
        bottom_up=state.bottom_up,
        standing=state.standing,
        hold_back=hold_back,
        spare=spare,
    )
