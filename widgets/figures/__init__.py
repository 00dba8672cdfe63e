"""Pure functions from API answers to plotly figure dicts and display texts.

No widgets, no network: the job monitor and the metering widget call these and assign the
results, and tests compare them with literal values. Figures are plain dicts
(``{"data": [...], "layout": {...}}``) that ``plotly.graph_objects.FigureWidget`` accepts.

The parts, one concern each (every name below is importable from ``widgets.figures``):

- ``training``: the training chart (losses left, accuracies right);
- ``progress``: how far a job is, for the monitor's progress bar (epochs, steps, phases);
- ``job_text``: the monitor's texts (state, queue place, workers, the cancel button);
- ``usage_chart``: the metering widget's chart and table (the usage API's answer, normalised);
- ``usage_defaults``: the metering widget's defaults (recent jobs, their plan, range, step);
- ``common``: what they share (the final states, number and time coercions).
"""

from __future__ import annotations

from .common import ENDED_STYLES, FINAL, STATE_COLOURS
from .job_text import cancel_button_state, state_html, workers_text
from .progress import (
    epochs_done,
    epochs_from_args,
    latest_step,
    progress_fraction,
    progress_phase,
    script_args,
    steps_per_epoch,
    total_epochs,
)
from .training import BOOKKEEPING, accuracy_range, metric_names, metric_series, metrics_figure
from .usage_chart import (
    RESOURCES,
    UNIT,
    hours_table_html,
    normalise_usage,
    step_points,
    usage_figure,
)
from .usage_defaults import (
    RECENT_DAYS,
    RECENT_JOBS,
    common_plan,
    fine_step,
    plan_options,
    recent_jobs,
    recent_window,
)

__all__ = [
    "BOOKKEEPING",
    "ENDED_STYLES",
    "FINAL",
    "RECENT_DAYS",
    "RECENT_JOBS",
    "RESOURCES",
    "STATE_COLOURS",
    "UNIT",
    "accuracy_range",
    "cancel_button_state",
    "common_plan",
    "epochs_done",
    "epochs_from_args",
    "fine_step",
    "hours_table_html",
    "latest_step",
    "metric_names",
    "metric_series",
    "metrics_figure",
    "normalise_usage",
    "plan_options",
    "progress_fraction",
    "progress_phase",
    "recent_jobs",
    "recent_window",
    "script_args",
    "state_html",
    "step_points",
    "steps_per_epoch",
    "total_epochs",
    "usage_figure",
    "workers_text",
]
