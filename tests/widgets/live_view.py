"""What an open view of a plotly ``FigureWidget`` shows, without a browser.

A view draws ``_widget_data``/``_widget_layout`` once when it opens and from then on only replays
the ``_py2js_*`` messages through plotly.js (the bundle's ``do_addTraces``, ``do_restyle``,
``do_relayout``, ``do_update``...; later syncs of ``_widget_data`` are ignored by it). This replays
them the way plotly.js does, including its refusal of a relayout that sets a container and one
of its leaves together: plotly.js throws ("cannot set yaxis2.side and a parent attribute
simultaneously") and the view keeps its old layout.
"""

from __future__ import annotations

from copy import deepcopy
from typing import Any

MESSAGES = (
    "_py2js_addTraces",
    "_py2js_deleteTraces",
    "_py2js_moveTraces",
    "_py2js_restyle",
    "_py2js_relayout",
    "_py2js_update",
    "_py2js_removeLayoutProps",
    "_py2js_removeTraceProps",
)


class LiveView:
    def __init__(self, widget: Any) -> None:
        self.data: list[dict] = deepcopy(list(widget._widget_data))
        self.layout: dict = deepcopy(dict(widget._widget_layout))
        self.errors: list[str] = []
        widget.observe(self._on_message, names=list(MESSAGES))

    def figure(self) -> dict:
        return {"data": self.data, "layout": self.layout}

    def _on_message(self, change: dict) -> None:
        msg = change["new"]
        if msg is None:  # plotly resets each message trait right after sending it
            return
        kind = change["name"].removeprefix("_py2js_")
        try:
            if kind == "addTraces":
                self.data.extend(deepcopy(msg["trace_data"]))
            elif kind == "deleteTraces":
                for i in sorted(msg["delete_inds"], reverse=True):
                    del self.data[i]
            elif kind == "moveTraces":
                moved = [self.data[i] for i in msg["current_trace_inds"]]
                rest = [t for i, t in enumerate(self.data) if i not in msg["current_trace_inds"]]
                for i, trace in sorted(zip(msg["new_trace_inds"], moved), key=lambda p: p[0]):
                    rest.insert(i, trace)
                self.data = rest
            elif kind == "restyle":
                self._restyle(msg["restyle_data"], msg["restyle_traces"])
            elif kind == "relayout":
                self._relayout(msg["relayout_data"])
            elif kind == "update":
                _refuse_parent_and_leaf(msg["layout_data"])  # plotly.js checks before drawing
                self._restyle(msg["style_data"], msg["style_traces"])
                self._relayout(msg["layout_data"])
            else:
                raise NotImplementedError(kind)
        except ValueError as err:
            self.errors.append(f"{kind}: {err}")

    def _restyle(self, data: dict, traces: list[int] | None) -> None:
        indexes = range(len(self.data)) if traces is None else traces
        for key, value in data.items():
            for n, i in enumerate(indexes):
                one = value[n % len(value)] if isinstance(value, list) else value
                _set(self.data[i], key, deepcopy(one))

    def _relayout(self, data: dict) -> None:
        _refuse_parent_and_leaf(data)
        for key, value in data.items():
            _set(self.layout, key, deepcopy(value))


def leaves(tree: dict, prefix: str = "") -> dict:
    """``{"yaxis2": {"side": "right"}}`` as ``{"yaxis2.side": "right"}``, lists as lists."""
    out: dict = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = list(value) if isinstance(value, (list, tuple)) else value
    return out


def _refuse_parent_and_leaf(data: dict) -> None:
    for key in data:
        parts = key.split(".")
        for i in range(1, len(parts)):
            if ".".join(parts[:i]) in data:
                raise ValueError(f"cannot set {key} and a parent attribute simultaneously")


def _set(tree: dict, path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    for part in parents:
        tree = tree.setdefault(part, {})
    if value is None:
        tree.pop(leaf, None)
    else:
        tree[leaf] = value
