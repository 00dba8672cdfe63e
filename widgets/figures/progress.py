"""How far a job is, for the job monitor's progress bar: its phase (waiting, starting workers,
epoch k of N, done) and the fraction done, from the job and the lines its script reported."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from extension.queue_text import ordinal, starts_text, waiting

from .common import FINAL, is_number


def epochs_from_args(args: Sequence[str]) -> int | None:
    """``--epochs N`` (or ``--epochs=N``) among the script's arguments."""
    args = list(args)
    for i, arg in enumerate(args):
        value = None
        if arg == "--epochs" and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("--epochs="):
            value = arg.split("=", 1)[1]
        if value is not None and value.isdigit() and int(value) > 0:
            return int(value)
    return None


def progress_fraction(
    job: Mapping[str, Any], metrics: Sequence[Mapping[str, Any]], epochs: int | None
) -> float:
    """0..1: 1 when FINISHED; else the runtime's ``progress`` if reported, else the steps done
    of the ``total_steps`` reported, else epochs done of ``epochs`` (within an epoch by its
    steps once one epoch has shown how many it has). Below 1 until the job has finished."""
    if job.get("state") == "FINISHED":
        return 1.0
    for line in reversed(metrics):
        value = line.get("progress")
        if is_number(value):
            return _below_one(float(value))
    step, total_steps = latest_step(metrics), _latest(metrics, ("total_steps",))
    if step is not None and total_steps:
        return _below_one(step / total_steps)
    done = epochs_done(metrics)
    if not epochs or done is None:
        return 0.0
    fraction = done / epochs
    per_epoch = steps_per_epoch(metrics)
    if per_epoch and step is not None:
        fraction = max(fraction, step / (per_epoch * epochs))
    return _below_one(fraction)


def progress_phase(job: Mapping[str, Any], metrics: Sequence[Mapping[str, Any]]) -> dict:
    """What the job is doing, for the progress bar: ``{"text", "fraction"}``.

    waiting (with the service's reason) -> starting workers (RUNNING, no metrics yet) -> first
    step -> epoch k of N (or step s [of M]) -> done. ``fraction`` is None while nothing says how
    far the job is (the bar then shows 0 and the text says why).
    """
    state = job.get("state")
    epochs = total_epochs(job, metrics)
    fraction = progress_fraction(job, metrics, epochs)
    known = measured(metrics, epochs)
    if state in FINAL:
        return {"text": _ended_text(job), "fraction": fraction}
    if state != "RUNNING":  # a preempted job waits again with the progress it had
        text = _waiting_text(job)
        return {"text": text, "fraction": fraction if known else None}
    if not metrics:
        workers = job.get("workers") or {}
        up, wanted = workers.get("running", 0), workers.get("min", 1)
        return {
            "text": f"starting workers ({up} of {wanted} up), waiting for the first step",
            "fraction": None,
        }
    parts = ["first step done"] if _first_step(metrics) else []
    parts.append(_where(metrics, epochs, latest_step(metrics)))
    return {"text": ", ".join(p for p in parts if p), "fraction": fraction if known else None}


def measured(metrics: Sequence[Mapping[str, Any]], epochs: int | None) -> bool:
    """Whether the lines say how far the job is: a ``progress`` or ``total_steps`` reported,
    or the epochs known and an epoch done (or its steps counted). Through the first epoch of a
    script that reports neither, nothing does: its steps are counted, but of no known total, so
    the bar shows no percentage ("step 23 · 0%" would be false)."""
    if _latest(metrics, ("total_steps", "progress")) is not None:
        return True
    if not epochs:
        return False
    done = epochs_done(metrics)
    return bool(done) or steps_per_epoch(metrics) is not None


def _where(metrics: Sequence[Mapping[str, Any]], epochs: int | None, step: int | None) -> str:
    """``epoch 2 of 4, step 120``, ``step 37 of 500`` or ``step 37``."""
    at_step = f"step {step}" if step is not None else ""
    total_steps = _latest(metrics, ("total_steps",))
    if total_steps and at_step:
        at_step += f" of {total_steps}"
    done = epochs_done(metrics)
    if done is None:
        return at_step
    if epochs and done >= epochs:  # the last epoch reported done: final evaluation, saving
        return f"all {epochs} epochs done, finishing"
    of = f" of {epochs}" if epochs else ""
    return ", ".join(p for p in (f"epoch {done + 1}{of}", at_step) if p)


def _ended_text(job: Mapping[str, Any]) -> str:
    state = job.get("state")
    if state == "FINISHED":
        return "done"
    text = str(state).lower()
    if job.get("exit_code") not in (None, 0):
        text += f" (exit code {job['exit_code']})"
    return text


def _first_step(metrics: Sequence[Mapping[str, Any]]) -> bool:
    steps = {line.get("step") for line in metrics if is_number(line.get("step"))}
    return len(steps) <= 1


def total_epochs(job: Mapping[str, Any], metrics: Sequence[Mapping[str, Any]]) -> int | None:
    """The epochs the script runs: what it reported (``epochs=``/``total_epochs=``, which also
    covers its own default), else its ``--epochs`` argument."""
    reported = _latest(metrics, ("total_epochs", "epochs"))
    if reported and reported > 0:
        return int(reported)
    return epochs_from_args(script_args(job))


def epochs_done(metrics: Sequence[Mapping[str, Any]]) -> int | None:
    """Epochs done: the largest ``epoch`` reported (examples/pytorch_mnist reports the epoch
    it is in, counted from 0, with every step, and the epochs done after each)."""
    done = [int(line["epoch"]) for line in metrics if is_number(line.get("epoch"))]
    return max(done) if done else None


def latest_step(metrics: Sequence[Mapping[str, Any]]) -> int | None:
    steps = [int(line["step"]) for line in metrics if is_number(line.get("step"))]
    return max(steps) if steps else None


def steps_per_epoch(metrics: Sequence[Mapping[str, Any]]) -> float | None:
    """Steps of one epoch, from the first line of a later epoch (None during the first)."""
    for line in metrics:
        epoch, step = line.get("epoch"), line.get("step")
        if is_number(epoch) and epoch >= 1 and is_number(step) and step > 0:
            return step / epoch
    return None


def _latest(metrics: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> float | None:
    for line in reversed(metrics):
        for key in keys:
            if is_number(line.get(key)):
                return line[key]
    return None


def _below_one(fraction: float) -> float:
    """Never 100% before the service says FINISHED (the last epoch may still be saving)."""
    return max(0.0, min(0.99, fraction))


def script_args(job: Mapping[str, Any]) -> list[str]:
    """The script's own arguments from the job's command (``python main.py args...``)."""
    command = list(job.get("command") or [])
    for i, part in enumerate(command):
        if str(part).endswith(".py"):
            return [str(a) for a in command[i + 1 :]]
    return []


def _waiting_text(job: Mapping[str, Any]) -> str:
    """``waiting: 3rd in line, starts in about 12 minutes`` from the job's ``queue`` (the
    state line beside it says the rest), else ``waiting: <the service's reason>``."""
    found = waiting(job)
    if found is not None:
        place = f"{ordinal(found.in_plan)} in line" if found.in_plan is not None else ""
        short = ", ".join(p for p in (place, starts_text(found)) if p)
        if short:
            return f"waiting: {short}"
    reason = job.get("reason")
    return f"waiting: {reason}" if reason else "waiting"
