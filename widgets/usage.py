"""The metering widget ``%wmla_usage`` shows: requested vs used GPU and CPU over time for a plan
subtree (or one user), a plan picker, a time range, auto-refresh, and GPU-hours per child.

It reads ``GET /services/wmla/api/v1/usage?plan=&user=&start=&end=&step=`` through the client;
the figure and the table come from :mod:`widgets.figures` (pure).
"""

from __future__ import annotations

import html
import threading
import time
from typing import Any

import ipywidgets as w

from extension.storage.warning import quota_warning

from . import figures
from .plotly_widget import figure_widget, update

RANGES = {  # label -> (seconds back, step seconds): steps fine enough to draw runs as they were
    label: (back, figures.fine_step(back))
    for label, back in (
        ("last hour", 3600),
        ("last 6 hours", 6 * 3600),
        ("last 24 hours", 86400),
        ("last 7 days", 7 * 86400),
        ("last 30 days", 30 * 86400),
    )
}
RECENT = "my recent jobs"  # from a little before the recent jobs started to now


class UsageWidget(w.VBox):
    """Usage of ``plan`` (default: the plans of your recent jobs) over ``time_range`` (default:
    a window showing those jobs; "last 24 hours" when there are none)."""

    def __init__(
        self,
        client: Any,
        plan: str | None = None,
        user: str | None = None,
        time_range: str | None = None,
        refresh_seconds: int = 30,
        now: Any = time.time,
        **kwargs: Any,
    ) -> None:
        self.client = client
        self.user = user
        self.now = now
        self.usage: dict = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.recent = figures.recent_jobs(self._jobs(), float(now()))
        try:
            options = figures.plan_options(client.plans())
        except Exception:  # still usable for a given plan when plans cannot be listed
            options = []
        plan = plan or figures.common_plan(j["plan"] for j in self.recent if j.get("plan"))
        if plan and plan not in options:
            options = [plan, *options]
        self.plan = w.Dropdown(options=options, value=plan or (options[0] if options else None),
                               description="plan")  # fmt: skip
        ranges = ([RECENT] if self.recent else []) + list(RANGES)
        time_range = time_range or (RECENT if self.recent else "last 24 hours")
        if time_range not in ranges:
            raise ValueError(f"time_range must be one of {', '.join(ranges)}")
        self.range = w.Dropdown(options=ranges, value=time_range, description="range")
        self.auto = w.Checkbox(value=False, description=f"auto-refresh every {refresh_seconds}s")
        self.refresh_seconds = refresh_seconds
        self.refresh_button = w.Button(description="Refresh", icon="refresh")
        self.message = w.HTML("")
        self.quota = w.HTML("")  # the user's storage quota, from 90 % of a limit on
        self.table = w.HTML("")
        self.chart = figure_widget(figures.usage_figure(figures.normalise_usage({})))
        self.refresh_button.on_click(lambda _b: self.refresh())
        self.plan.observe(lambda _c: self.refresh(), names="value")
        self.range.observe(lambda _c: self.refresh(), names="value")
        self.auto.observe(self._on_auto, names="value")
        rows: list[w.Widget] = [
            w.HBox([self.plan, self.range]),
            w.HBox([self.auto, self.refresh_button]),
            self.message,
            self.quota,
        ]
        if self.chart is not None:
            rows.append(self.chart)
        rows.append(self.table)
        super().__init__(children=rows, **kwargs)

    def _jobs(self) -> list[dict]:
        """The user's jobs (for a plan admin without ``user``: their own, not everyone's)."""
        try:
            name = self.user or self.client.whoami().get("name")
            return list(self.client.jobs(user=name))
        except Exception:  # the defaults are a nicety; the widget works without them
            return []

    def window(self) -> tuple[float, float, float]:
        """(start, end, step) of the chosen range, ending now."""
        end = float(self.now())
        if self.range.value == RECENT:
            start, end = figures.recent_window(self.recent, end) or (end - 86400, end)
            return start, end, figures.fine_step(end - start)
        back, step = RANGES[self.range.value]
        return end - back, end, step

    def refresh(self) -> dict:
        start, end, step = self.window()
        with self._lock:
            try:
                answer = self.client.usage(
                    plan=self.plan.value, user=self.user, start=start, end=end, step=step
                )
            except Exception as err:
                self.message.value = f'<span style="color:#c62828">{html.escape(str(err))}</span>'
                return {}
            self.usage = figures.normalise_usage(answer)
            who = f" for {self.user}" if self.user else ""
            self.message.value = html.escape(
                f"{self.plan.value}{who}: {self.usage['totals']['gpu_hours']:.3f} GPU-hours, "
                f"{self.usage['totals']['cpu_hours']:.3f} CPU-hours ({self.range.value})"
            )
            fig = figures.usage_figure(self.usage, title=f"{self.plan.value}{who}")
            update(self.chart, fig)
            self.table.value = figures.hours_table_html(self.usage)
            self.quota.value = self._quota_html()
            return self.usage

    def _quota_html(self) -> str:
        """The storage quota's warning (``extension.storage.warning``), or nothing."""
        try:
            rows = self.client.storage().get("users") or []
        except Exception:  # a nicety: the chart is what the widget is for
            return ""
        text = quota_warning(rows[0]) if rows else None
        return f'<span style="color:#b45309">{html.escape(text)}</span>' if text else ""

    def _on_auto(self, change: dict) -> None:
        if change["new"]:
            self._stop.clear()

            def loop() -> None:
                while not self._stop.wait(self.refresh_seconds):
                    self.refresh()

            self._thread = threading.Thread(target=loop, name="wmla-usage", daemon=True)
            self._thread.start()
        else:
            self._stop.set()
