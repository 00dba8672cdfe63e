"""plotly ``FigureWidget`` helpers shared by the widgets.

A displayed ``FigureWidget`` is drawn once from its ``_widget_data``/``_widget_layout`` traits;
after that the live view only replays the messages Python sends (addTraces, deleteTraces,
restyle, relayout, update) through plotly.js. :func:`update` makes those messages bring the live
view to exactly the figure a fresh draw of ``fig`` gives:

- the layout goes first, as leaf paths (``yaxis2.side``): plotly.js refuses a relayout that sets
  a container and one of its leaves at once ("cannot set yaxis2.side and a parent attribute
  simultaneously"), which is what ``layout.update`` inside ``batch_update`` sends for a new axis;
  the whole update is then dropped and the accuracy axis stays on the left, over the loss axis;
- axes exist before traces that refer to them are added;
- traces are matched by name: new names are appended (or the traces rebuilt when the order
  changed) and every changed property is restyled (``mode`` too, not only ``x`` and ``y``).

plotly syncs ``_widget_data`` and ``_widget_layout`` only when the widget is created, so a saved
notebook (``store_widget_state``) or a second view would show the first, empty chart;
:func:`update` syncs them after every change as well.
"""

from __future__ import annotations

from collections.abc import Mapping
from copy import deepcopy
from typing import Any

# Layout keys plotly fills in itself; a figure dict never names them, so they are never removed.
OWN_LAYOUT_KEYS = ("template",)


def figure_widget(fig: dict) -> Any:
    """A ``FigureWidget`` for ``fig``, or None where plotly's widget cannot load (no anywidget)."""
    try:
        import plotly.graph_objects as go

        return go.FigureWidget(fig)
    except Exception:  # pragma: no cover - plotly or anywidget missing
        return None


def update(widget: Any, fig: dict) -> None:
    """Make ``widget`` (its live views and its saved state) show ``fig``."""
    if widget is None:
        return
    _relayout(widget, fig.get("layout") or {})
    traces = list(fig.get("data") or [])
    names = [t.name for t in widget.data]
    wanted = [t.get("name") for t in traces]
    if names == wanted[: len(names)]:
        _restyle(widget, traces[: len(names)])
        if len(wanted) > len(names):
            widget.add_traces(traces[len(names) :])
    else:  # a series moved (losses sort first): rebuild rather than move traces one by one
        widget.data = ()
        widget.add_traces(traces)
    sync_saved_state(widget)


def sync_saved_state(widget: Any) -> None:
    """Copy the figure into the traits a new view or a saved notebook draws from."""
    widget._widget_data = deepcopy(widget._data)
    widget._widget_layout = deepcopy(widget._layout_obj._props)


def layout_changes(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any]:
    """Relayout data (leaf paths only) taking layout ``current`` to ``wanted``; removed leaves
    map to None. Keys plotly owns (the template) are left alone."""
    current = {k: v for k, v in current.items() if k not in OWN_LAYOUT_KEYS}
    have = leaves(current)
    # a container the layout does not have yet is set whole (see _relayout)
    want = {
        **{k: _plain(v) for k, v in wanted.items() if k not in current},
        **leaves({k: v for k, v in wanted.items() if k in current}),
    }
    return _diff(have, want)


def trace_changes(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any]:
    """Leaf paths of one trace that differ (removed ones map to None); plotly's uid stays."""
    have = leaves({k: v for k, v in current.items() if k != "uid"})
    want = leaves(wanted)
    return _diff(have, want)


def leaves(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"yaxis2": {"side": "right"}}`` as ``{"yaxis2.side": "right"}``; lists (and tuples,
    as plotly stores them) are leaf values, compared as lists."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(leaves(value, path + "."))
        else:
            out[path] = _plain(value)
    return out


def _relayout(widget: Any, layout: Mapping[str, Any]) -> None:
    """Layout changes as plotly.js accepts them: a new top-level container (``yaxis2``: plotly
    knows a subplot's axis only once it is assigned) as one whole value, then leaf paths."""
    changes = layout_changes(widget.layout.to_plotly_json(), layout)
    for key in [k for k in changes if "." not in k]:
        widget.layout[key] = changes.pop(key)
    if changes:
        widget.plotly_relayout(changes)


def _restyle(widget: Any, traces: list[dict]) -> None:
    """One restyle message for every property that changed in any of the first traces."""
    per_trace = [trace_changes(t.to_plotly_json(), new) for t, new in zip(widget.data, traces)]
    keys = sorted({k for changes in per_trace for k in changes})
    if not keys:
        return
    wanted = [leaves(new) for new in traces]
    # restyle data is one value per trace; a trace whose value did not change gets it again
    data = {k: [w.get(k) for w in wanted] for k in keys}
    widget.plotly_restyle(data, trace_indexes=list(range(len(traces))))


def _diff(have: dict[str, Any], want: dict[str, Any]) -> dict[str, Any]:
    """Leaf paths to set (removed ones to None), never a path together with its parent."""
    changes: dict[str, Any] = {k: v for k, v in want.items() if have.get(k, _MISSING) != v}
    for key in have:
        if key not in want and not _has_parent(key, want):
            changes[key] = None
    return {k: v for k, v in changes.items() if not _has_parent(k, changes)}


def _has_parent(key: str, paths: Mapping[str, Any]) -> bool:
    parts = key.split(".")
    return any(".".join(parts[:i]) in paths for i in range(1, len(parts)))


def _plain(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


_MISSING = object()
