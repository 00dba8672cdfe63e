"""OpenAPI 3 paths and schemas of the fair-share API (``shares.py``), merged into the service's
document."""

from __future__ import annotations

from typing import Any

PLAN_QUERY = {
    "name": "plan",
    "in": "query",
    "required": False,
    "schema": {"type": "string", "example": "/project1"},
}
NUMBERS = {"type": "array", "items": {"type": "number"}}


def _answer(description: str, schema: str) -> dict:
    ref = {"$ref": f"#/components/schemas/{schema}"}
    return {"description": description, "content": {"application/json": {"schema": ref}}}


def _error(description: str) -> dict:
    ref = {"$ref": "#/components/schemas/Error"}
    return {"description": description, "content": {"application/json": {"schema": ref}}}


SETTINGS = {
    "history": {"type": "boolean", "description": "false: fair_share_half_life is 0"},
    "half_life": {"type": "number", "description": "seconds (0: history off)"},
    "reset_period": {"type": "number", "description": "seconds (0: never)"},
    "weights": {
        "type": "object",
        "description": "usage per second of one GPU, one CPU core, one GiB",
        "properties": {k: {"type": "number"} for k in ("gpu", "cpu", "memory")},
    },
    "unit": {
        "type": "string",
        "description": "GPU-seconds with the default weights, else weighted resource-seconds",
    },
    "message": {"type": "string", "description": "what the figures mean, or why all 0"},
    "at": {"type": "number", "description": "the moment the usage is decayed to"},
    "plan": {"type": "string", "description": "the plan asked for ('/': all)"},
}
ROW = {
    "type": "object",
    "required": ["plan", "share", "normalized_share", "raw_usage", "effective_usage",
                 "fair_share_factor"],
    "properties": {
        "plan": {"type": "string", "example": "/project1/dev-team"},
        "parent": {"type": "string"},
        "user_leaf": {"type": "boolean"},
        "share": {"type": "number", "description": "sshare's RawShares"},
        "normalized_share": {"type": "number", "description": "S: share over siblings'"},
        "raw_usage": {"type": "number", "description": "the subtree's decayed usage"},
        "effective_usage": {"type": "number", "description": "U: part of siblings' usage"},
        "fair_share_factor": {"type": "number", "description": "2^(-U/S), 1 unused"},
        "usage_over_share": {"type": "number", "description": "U/S: 3.2 is 3.2x"},
    },
    "additionalProperties": False,
}  # fmt: skip
SERIES = {
    "type": "object",
    "properties": {
        "plan": {"type": "string"},
        "raw_usage": NUMBERS,
        "fair_share_factor": NUMBERS,
    },
}


def shares_schemas() -> dict[str, Any]:
    """``Shares`` and ``SharesHistory`` (each with the settings in effect)."""
    return {
        "Shares": {
            "type": "object",
            "required": ["history", "half_life", "weights", "plans"],
            "properties": {
                **SETTINGS,
                "plans": {"type": "array", "items": ROW},
                "hidden_user_leaves": {"type": "integer", "description": "other users' leaves"},
            },
        },
        "SharesHistory": {
            "type": "object",
            "required": ["history", "t", "plans"],
            "properties": {
                **SETTINGS,
                "interval": {"type": "number", "nullable": True},
                "t": NUMBERS,
                "plans": {"type": "array", "items": SERIES},
            },
        },
    }


def shares_paths() -> dict[str, Any]:
    """``/shares``, ``/shares/history``, ``/shares/reset``."""
    errors = {
        "400": _error("an unknown parameter or a malformed plan path"),
        "403": _error("not authenticated (reset: not a plan admin)"),
        "404": _error("no such plan (or another user's leaf)"),
    }
    return {
        "/shares": {
            "get": {
                "summary": "sshare's columns for every plan under 'plan' (itself included): "
                "share, normalized share, raw and effective usage, fair-share factor; a "
                "non-admin sees only their own user leaf",
                "parameters": [PLAN_QUERY],
                "responses": {"200": _answer("the rows", "Shares"), **errors},
            }
        },
        "/shares/history": {
            "get": {
                "summary": "usage and fair-share factor of each child of 'plan' sampled over "
                "about one half-life, then now (the admin page's chart)",
                "parameters": [PLAN_QUERY],
                "responses": {"200": _answer("the series", "SharesHistory"), **errors},
            }
        },
        "/shares/reset": {
            "post": {
                "summary": "forget all usage now (plan admins)",
                "responses": {
                    "200": _answer("the rows after the reset", "Shares"),
                    **errors,
                    "409": _error("the usage history is off: nothing to reset"),
                },
            }
        },
    }
