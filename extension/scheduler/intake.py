"""Phase 1, intake: the one pass over the snapshot's jobs (the hot loop of a busy cycle).

Each job is found its user leaf (docs/scheduling.md "Words": user leaf), then
- pending: rejected at once when it can never run (phase 2, ``reject``), else put in its
  leaf's bucket of jobs of one shape ``(worker, min, max)``: a bucket exists only for a shape
  its leaf can run, so the Admission 3 answer is asked once per leaf and shape;
- running: listed with its leaf, for the ledger to hold its nodes and for reclaim;
- finished, failed, ...: passed over (their leaf is still found: a made-up leaf is made).

Most jobs of a busy cycle are pending rigid jobs whose (plan, user, shape) an earlier job of
the same cycle already had: one look-up (``seen``) sends such a job to its bucket, and the
leaves' pending counts are added up per bucket afterwards (docs/scheduling.md "Cost").

A cycle whose jobs are the last cycle's, each in the same state, takes the last answer
instead (``Kept``): on a settled cluster that reads one field of each job instead of six.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from operator import attrgetter, is_

from .decisions import Reject
from .index import PlanNode
from .model import Job, JobState
from .reject import impossible
from .state import CycleState

_state_of = attrgetter("state")
_pending_of, _running_of = attrgetter("pending"), attrgetter("running")


def intake(state: CycleState, extra: Iterable[Job] = ()) -> None:
    """Phase 1 (and 2): every job of the snapshot (and ``extra``) to its leaf's bucket, the
    running list or a Reject; the last cycle's answer when its jobs are the same (``Kept``)."""
    index, snapshot = state.index, state.snapshot
    kept = index.intake_kept
    if not extra and isinstance(kept, Kept) and kept.holds(snapshot.jobs, snapshot.reserved):
        kept.restore(state)
        return
    index.intake_kept = None
    index.empty_buckets()
    state.jobs = [*snapshot.jobs, *extra]
    _read(state, state.jobs)
    if not extra:
        index.intake_kept = Kept(state, state.jobs)


def _read(state: CycleState, jobs: list[Job]) -> None:
    """Every job of ``jobs`` to its leaf's bucket, the running list or a Reject."""
    leaves, leaf_of = state.index.leaves, state.index.leaf_of
    elastic = state.elastic
    running, running_leaves = state.running, state.running_leaves
    pending_state, running_state = JobState.PENDING, JobState.RUNNING
    wanted = state.snapshot.reserved
    # (plan, user, worker, min, max) -> the bucket of a rigid pending job this cycle, and every
    # bucket filled this cycle with its leaf (the leaves' pending counts, after the loop)
    seen: dict[tuple, list[Job]] = {}
    filled: list[tuple[list[Job], PlanNode]] = []
    running_jobs = 0
    for job in jobs:  # locals, one lookup per question
        now_in = job.state
        if now_in is pending_state:
            key = (job.plan, job.user, job.per_worker, job.min_workers, job.max_workers)
            bucket = seen.get(key)
            if bucket is not None:  # the common case: a shape this leaf already has
                bucket.append(job)
                if wanted is not None and job.id == wanted:
                    state.holder = (job, leaves[key[:2]][0])
                continue
        found = leaves.get((job.plan, job.user))
        if found is None:
            found = leaf_of(job)
        leaf = found[0]
        if now_in is pending_state:
            _enqueue(state, job, found, key, seen, filled)
        elif now_in is not running_state or leaf is None:
            continue
        else:
            running_jobs += 1
            leaf.running += 1
            running.append(job)
            running_leaves.append(leaf)
            if job.max_workers > job.min_workers:
                elastic.append((job, leaf))
    for bucket, leaf in filled:
        leaf.pending += len(bucket)
    state.running_jobs = running_jobs


def _enqueue(
    state: CycleState,
    job: Job,
    found: tuple[PlanNode | None, str | None],
    key: tuple,
    seen: dict[tuple, list[Job]],
    filled: list[tuple[list[Job], PlanNode]],
) -> None:
    """A pending job whose (plan, user, shape) ``seen`` does not have yet, or an elastic one:
    rejected (no leaf, or a shape its leaf can never run), else into its leaf's bucket."""
    leaf, problem = found
    if leaf is None:  # no such plan, or not a leaf one may submit to
        state.decisions.append(Reject(job.id, problem))
        return
    shape = key[2:]  # (worker, min, max)
    bucket = leaf.buckets.get(shape)
    if bucket is None:
        problem = impossible(state, job, leaf)
        if problem:
            state.decisions.append(Reject(job.id, problem))
            return
        bucket = leaf.buckets[shape] = []
    if not bucket:  # emptied by the index's reset: its first job this cycle
        filled.append((bucket, leaf))
    bucket.append(job)
    if job.max_workers > job.min_workers:
        state.elastic.append((job, leaf))  # in job order with the running ones: never seen
    else:
        seen[key] = bucket
    if job.id == state.snapshot.reserved:
        state.holder = (job, leaf)


class Kept:
    """What intake derived from one snapshot's jobs, kept on the index for the next cycle
    (docs/scheduling.md "Cost"): when that cycle's jobs are the very same objects in the same
    order, each in the same state, with the same reservation, intake's answer is the same,
    and the cycle takes it from here instead of reading every job's plan, user and shape.
    A job's id, plan, user, shape, priority and submission time never change once it is made
    (model.Job); intake reads nothing else of a job but its state."""

    __slots__ = ("jobs", "states", "reserved", "leaves", "pending", "running", "running_jobs")
    __slots__ += ("runners", "runners_in", "elastic", "holder", "rejects")

    def __init__(self, state: CycleState, jobs: list[Job]) -> None:
        self.jobs = jobs
        self.states = list(map(_state_of, jobs))
        self.reserved = state.snapshot.reserved
        # the leaves' counts as columns: no object per leaf for the garbage collector
        self.leaves = [p for p in state.index.plans.values() if p.pending or p.running]
        self.pending = list(map(_pending_of, self.leaves))
        self.running = list(map(_running_of, self.leaves))
        self.runners, self.runners_in = list(state.running), list(state.running_leaves)
        self.elastic = list(state.elastic)
        self.holder, self.running_jobs = state.holder, state.running_jobs
        self.rejects = list(state.decisions)

    def holds(self, jobs: Sequence[Job], reserved: str | None) -> bool:
        """The same jobs in the same order, each in the same state, and the same reservation.
        Lists compare their items by identity first, so only the states are read; an item
        that is another but equal Job (every field alike) gives intake the same answer. Jobs
        that are all copies (the first or last is another object) are read afresh at once
        rather than compared field by field."""
        kept = self.jobs
        if reserved != self.reserved or len(jobs) != len(kept) or not kept:
            return False
        if jobs[0] is not kept[0] or jobs[-1] is not kept[-1]:
            return False
        if jobs.__class__ is not list:
            jobs = list(jobs)
        return jobs == kept and all(map(is_, map(_state_of, jobs), self.states))

    def restore(self, state: CycleState) -> None:
        """Intake's answer again, on a state whose index ``reset`` zeroed. The buckets hold
        these jobs still; those the last cycle sorted go back to intake order."""
        state.index.sorted.unsort()
        for plan, pending, running in zip(self.leaves, self.pending, self.running):
            plan.pending, plan.running = pending, running
        state.running[:], state.running_leaves[:] = self.runners, self.runners_in
        state.elastic[:] = self.elastic
        state.holder, state.running_jobs = self.holder, self.running_jobs
        state.decisions += self.rejects
        state.jobs = self.jobs
