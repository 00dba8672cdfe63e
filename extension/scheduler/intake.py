"""Phase 1, intake: the one pass over the snapshot's jobs (the hot loop of a busy cycle).

Each job is found its user leaf (docs/scheduling.md "Words": user leaf), then
- pending: rejected at once when it can never run (phase 2, ``reject``), else put in its
  leaf's bucket of jobs of one shape ``(worker, min, max)``: a bucket exists only for a shape
  its leaf can run, so the Admission 3 answer is asked once per leaf and shape;
- running: listed with its leaf, for the ledger to hold its nodes and for reclaim;
- finished, failed, ...: passed over.
"""

from __future__ import annotations

from collections.abc import Iterable

from .decisions import Reject
from .model import Job, JobState
from .reject import impossible
from .state import CycleState


def intake(state: CycleState, extra: Iterable[Job] = ()) -> None:
    leaves, leaf_of = state.index.leaves, state.index.leaf_of
    decisions, elastic = state.decisions, state.elastic
    running, running_leaves = state.running, state.running_leaves
    pending_state, running_state = JobState.PENDING, JobState.RUNNING
    wanted = state.snapshot.reserved
    running_jobs = 0
    for job in [*state.snapshot.jobs, *extra]:  # locals, one lookup per question
        found = leaves.get((job.plan, job.user))
        if found is None:
            found = leaf_of(job)
        leaf = found[0]
        now_in = job.state
        if now_in is pending_state:
            if leaf is None:  # no such plan, or not a leaf one may submit to
                decisions.append(Reject(job.id, found[1]))
                continue
            key = (job.per_worker, job.min_workers, job.max_workers)
            bucket = leaf.buckets.get(key)
            if bucket is None:
                problem = impossible(state, job, leaf)
                if problem:
                    decisions.append(Reject(job.id, problem))
                    continue
                bucket = leaf.buckets[key] = []
            bucket.append(job)
            leaf.pending += 1
            if job.max_workers > job.min_workers:
                elastic.append((job, leaf))
            if wanted is not None and job.id == wanted:
                state.holder = (job, leaf)
        elif now_in is not running_state or leaf is None:
            continue
        else:
            running_jobs += 1
            leaf.running += 1
            running.append(job)
            running_leaves.append(leaf)
            if job.max_workers > job.min_workers:
                elastic.append((job, leaf))
    state.running_jobs = running_jobs
