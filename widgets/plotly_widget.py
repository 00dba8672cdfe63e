"""plotly ``FigureWidget`` helpers shared by the widgets.

plotly sends in-place trace updates as transient restyle messages and syncs its ``_widget_data``
and ``_widget_layout`` traits only when the widget is created or displayed, so a saved notebook
(``store_widget_state``) or a second view would show the first, empty chart. :func:`update`
applies a figure dict in place (live views animate) and then syncs those traits too.
"""

from __future__ import annotations

from copy import deepcopy
from typing import Any


def figure_widget(fig: dict) -> Any:
    """A ``FigureWidget`` for ``fig``, or None where plotly's widget cannot load (no anywidget)."""
    try:
        import plotly.graph_objects as go

        return go.FigureWidget(fig)
    except Exception:  # pragma: no cover - plotly or anywidget missing
        return None


def update(widget: Any, fig: dict) -> None:
    """Make ``widget`` show ``fig``: same traces updated in place, else replaced."""
    if widget is None:
        return
    with widget.batch_update():
        if len(widget.data) != len(fig["data"]) or any(
            t.name != n.get("name") for t, n in zip(widget.data, fig["data"])
        ):
            widget.data = ()
            for trace in fig["data"]:
                widget.add_trace(trace)
        else:
            for trace, new in zip(widget.data, fig["data"]):
                trace.x, trace.y = new["x"], new["y"]
        widget.layout.update(fig["layout"])
    widget._widget_data = deepcopy(widget._data)
    widget._widget_layout = deepcopy(widget._layout_obj._props)
