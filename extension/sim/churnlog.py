"""What the preemptions of a replay cost, per plan and in all (docs/simulate.md "Churn").

Every figure is measured by the core's own definitions (extension/scheduler/churn.py), at the
moment the victim gets SIGTERM:
- ``preempted_gpu_s``: ``held_work``, the GPU-seconds the victim had held since it (re)started;
- ``lost_gpu_s``: what the victim really loses: ``lost_work``, the GPU-seconds since its last
  checkpoint (or (re)start), or 0 when it writes a checkpoint on SIGTERM within the grace
  period, or when its work was already done (the stop finds it finished);
- ``at_risk_gpu_s``: ``lost_work`` at the decision by the checkpoint the scheduler knew of
  (none unless ``Timing.report_checkpoints``), whatever the victim does on SIGTERM: what the
  service records as a preemption's ``lost_gpu_seconds`` (it cannot know better then);
- ``steady_state_preemptions``: preemptions decided while ``within_one_gang`` held for the
  previous cycle's plan figures and the reclaiming job's minimum gang: churn the contract says
  should not happen (the policy tells, since only it knows the previous cycle).

A victim without GPUs counts its workers instead (worker-seconds), as the core's functions do; the
service counts such a victim as 0 GPU-seconds (a difference noted in issue 18). Each plan counts the
preemptions of its jobs, its user leaves' and its sub-plans' alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from extension.scheduler import held_work, lost_work

from .jobs import ReplayJob
from .metrics import num


@dataclass
class ChurnFigures:
    preemptions: int = 0
    jobs: set[str] = field(default_factory=set)
    preempted_gpu_s: float = 0.0
    lost_gpu_s: float = 0.0
    at_risk_gpu_s: float = 0.0
    steady: int = 0

    def add(self, job_id: str, preempted: float, lost: float, risk: float, steady: bool) -> None:
        self.preemptions += 1
        self.jobs.add(job_id)
        self.preempted_gpu_s += preempted
        self.lost_gpu_s += lost
        self.at_risk_gpu_s += risk
        self.steady += 1 if steady else 0

    def to_json(self) -> dict:
        return {
            "preemptions": self.preemptions,
            "jobs_preempted": len(self.jobs),
            "preempted_gpu_s": num(self.preempted_gpu_s),
            "lost_gpu_s": num(self.lost_gpu_s),
            "at_risk_gpu_s": num(self.at_risk_gpu_s),
            "steady_state_preemptions": self.steady,
        }


class ChurnLog:
    """The preemptions of one replay, in all and per plan (every plan above the victim's
    user leaf, the leaf included, the root not)."""

    def __init__(self) -> None:
        self.total = ChurnFigures()
        self.plans: dict[str, ChurnFigures] = {}

    def preempted(
        self, job: ReplayJob, now: float, checkpointed: float | None, saved: bool, steady: bool
    ) -> None:
        """``job`` gets SIGTERM at ``now``; ``checkpointed``: its run's last checkpoint, which
        the core may not have been told of; ``saved``: it loses nothing (a checkpoint on
        SIGTERM, or its work was done)."""
        core = job.core
        held = held_work(core, now)
        risk = lost_work(core, now)  # by the checkpoint the scheduler knew of
        lost = 0.0 if saved else lost_work(replace(core, checkpointed=checkpointed), now)
        self.total.add(job.id, held, lost, risk, steady)
        path = job.leaf
        while path != "/":
            figures = self.plans.get(path)
            if figures is None:
                figures = self.plans[path] = ChurnFigures()
            figures.add(job.id, held, lost, risk, steady)
            path = path.rsplit("/", 1)[0] or "/"

    def to_json(self) -> dict:
        """The totals, and ``plans``: the same figures for every plan with a preemption."""
        out = self.total.to_json()
        out["plans"] = {p: f.to_json() for p, f in sorted(self.plans.items())}
        return out
