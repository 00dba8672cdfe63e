"""The job monitor ``%wmla_train`` shows: state, place in line, estimated start and reason (the
job's ``queue``), workers, progress, a live log tail, a live metrics chart fed by the runtime's
``report()``, and a cancel button.

A ``VBox`` whose children are assigned once; ``refresh()`` reads the service through the client
and updates them in place (figures come from :mod:`widgets.figures`). ``watch()`` refreshes on a
background thread until the job ends; ``%wmla_train --wait`` calls ``refresh()`` in its own loop.
"""

from __future__ import annotations

import html
import threading
from typing import Any

import ipywidgets as w

from . import figures
from .plotly_widget import figure_widget, update

LOG_LINES = 40


class JobMonitor(w.VBox):
    """Watch one job. ``client`` is an :class:`extension.client.WmlaClient`."""

    def __init__(self, client: Any, job_id: str, log_lines: int = LOG_LINES, **kwargs: Any):
        self.client = client
        self.job_id = job_id
        self.log_lines = log_lines
        self.job: dict = {}
        self.metrics: list[dict] = []
        self._next = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.title = w.HTML(f"<b>job {html.escape(job_id)}</b>")
        self.state = w.HTML("&hellip;")
        self.workers = w.HTML("")
        self.progress = w.FloatProgress(
            value=0.0, min=0.0, max=100.0, description="progress", bar_style="info"
        )
        self.progress_label = w.Label("reading the job")
        self.cancel_button = w.Button(icon="stop")  # its style follows the job (figures)
        self._show_cancel()
        self.cancel_button.on_click(self._on_cancel)
        self.message = w.HTML("")
        self.logs = w.Textarea(
            value="",
            rows=10,
            disabled=True,
            layout=w.Layout(width="100%"),
            description="",
        )
        self.chart = figure_widget(figures.metrics_figure([]))
        rows: list[w.Widget] = [
            self.title,
            self.state,
            self.workers,
            w.HBox([self.progress, self.progress_label, self.cancel_button]),
            self.message,
        ]
        if self.chart is not None:
            rows.append(self.chart)
        rows.append(w.Accordion(children=[self.logs], titles=("log tail",), selected_index=0))
        super().__init__(children=rows, **kwargs)

    # -- updates -------------------------------------------------------------------------------
    def refresh(self) -> dict:
        """Read the job, its new metrics and its log tail; update every child. Returns the job."""
        with self._lock:
            job = self.client.job(self.job_id)
            new, self._next = self.client.metrics(self.job_id, since=self._next)
            self.metrics.extend(new)
            try:
                logs = self.client.logs(self.job_id, tail=self.log_lines)
            except Exception as err:
                logs = f"(logs unavailable: {err})"
            self._apply(job, logs, bool(new))
            return job

    def _apply(self, job: dict, logs: str, new_metrics: bool) -> None:
        self.job = job
        name = job.get("name") or ""
        self.title.value = (
            f"<b>job {html.escape(self.job_id)}</b> {html.escape(name)} &middot; "
            f"plan {html.escape(str(job.get('plan', '')))} &middot; user "
            f"{html.escape(str(job.get('user', '')))}"
        )
        self.state.value = figures.state_html(job)
        self.workers.value = html.escape(figures.workers_text(job))
        self._show_progress(job)
        state = job.get("state")
        self.progress.bar_style = figures.ENDED_STYLES.get(state, "info")
        self._show_cancel()
        if logs != self.logs.value:
            self.logs.value = logs
        if new_metrics and self.chart is not None:
            fig = figures.metrics_figure(self.metrics, title=f"{name or self.job_id} metrics")
            update(self.chart, fig)

    def _show_progress(self, job: dict) -> None:
        """The bar and the phase (waiting, starting workers, first step, epoch k of N, done)."""
        phase = figures.progress_phase(job, self.metrics)
        fraction = phase["fraction"]
        self.progress.value = round(100.0 * (fraction or 0.0), 1)
        percent = f" · {self.progress.value:g}%" if fraction is not None else ""
        self.progress_label.value = phase["text"] + percent

    def _show_cancel(self) -> None:
        """The cancel button as the last read of the job allows (off, with why, once ended)."""
        for name, value in figures.cancel_button_state(self.job).items():
            setattr(self.cancel_button, name, value)

    def _on_cancel(self, _button: Any = None) -> None:
        self.cancel_button.disabled = True  # one request per click, even a double click
        try:
            job = self.client.cancel(self.job_id)
        except Exception as err:
            self.message.value = f'<span style="color:#c62828">{html.escape(str(err))}</span>'
            self._show_cancel()  # active again only if the job may still be cancelled
            return
        self.message.value = f"cancel requested; the job is {html.escape(job['state'])}"
        self.job = {**self.job, **job, "cancel_requested": True}
        self._show_cancel()

    # -- background watching -------------------------------------------------------------------
    def watch(self, poll: float = 2.0) -> None:
        """Refresh on a daemon thread until the job ends (or ``stop()``)."""
        if self._thread and self._thread.is_alive():
            return
        self._stop.clear()

        def loop() -> None:
            while not self._stop.is_set():
                try:
                    job = self.refresh()
                except Exception as err:
                    self.message.value = html.escape(f"stopped watching: {err}")
                    return
                if job.get("state") in figures.FINAL:
                    return
                self._stop.wait(poll)

        self._thread = threading.Thread(target=loop, name=f"wmla-watch-{self.job_id}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
