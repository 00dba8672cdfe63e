"""OpenAPI 3 paths of the metering API, merged into the service's document (``/usage``).

``<prefix>metrics`` (Prometheus text format) lies outside ``api/v1`` and is described in
docs/metering.md.
"""

from __future__ import annotations

from typing import Any


def _query(name: str, description: str, schema: dict | None = None) -> dict:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema or {"type": "string"},
    }


def _error(description: str) -> dict:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


AMOUNTS = {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "number"}}}
HOURS = {
    "type": "object",
    "description": "resource-hours over the range; the flat figures are the used ones",
    "properties": {
        "gpu_hours": {"type": "number"},
        "cpu_hours": {"type": "number"},
        "memory_gib_hours": {"type": "number"},
        "requested": {"type": "object"},
        "used": {"type": "object"},
    },
}

CHURN = {
    "type": "object",
    "properties": {
        "plans": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "preemptions": {"type": "integer"},
                    "preempted_gpu_seconds": {
                        "type": "number",
                        "description": "GPU-seconds the victims had held since they (re)started "
                        "(0 for victims without GPUs)",
                    },
                    "lost_gpu_seconds": {
                        "type": "number",
                        "description": "GPU-seconds since the victims' last reported checkpoint, "
                        "or their (re)start when later or none: the work preemption cost",
                    },
                    "steady_state_preemptions": {
                        "type": "integer",
                        "description": "preemptions decided while every plan was within one "
                        "gang (the reclaimer's minimum) of its deserved share",
                    },
                },
            },
        },
        "units": {"type": "object"},
    },
}


def metering_paths() -> dict[str, Any]:
    return {
        "/usage": {
            "get": {
                "summary": "requested and used resources per child of a plan: series and totals "
                "(GPU-hours, CPU-hours); users see their own leaves only, plan admins all",
                "parameters": [
                    _query("plan", "plan path (default /)"),
                    _query("user", "only this user's leaves (users: only themselves)"),
                    _query("start", "epoch seconds, ISO 8601, 'now' or 'now-7d' (default end-1d)"),
                    _query("end", "as start (default now)"),
                    _query("step", "seconds or 90s, 5m, 1h, 1d (default: at most 500 steps)"),
                    _query("format", "json (default) or csv", {"enum": ["json", "csv"]}),
                ],
                "responses": {
                    "200": {
                        "description": "series (gpu devices, cpu millicores, memory bytes: the "
                        "average over each step) and totals, for the plan and per child",
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "properties": {
                                        "plan": {"type": "string"},
                                        "start": {"type": "number"},
                                        "end": {"type": "number"},
                                        "step": {"type": "number"},
                                        "series": {
                                            "type": "object",
                                            "properties": {
                                                "t": {"type": "array", "items": {"type": "number"}},
                                                "requested": AMOUNTS,
                                                "used": AMOUNTS,
                                            },
                                        },
                                        "changes": {
                                            "type": "object",
                                            "nullable": True,
                                            "description": "the step function itself: the "
                                            "amount from each time t on (at start and at every "
                                            "change; exact from exact_from, one average per "
                                            "downsampled bucket before it); null above 5,000 "
                                            "change points (draw the series instead)",
                                            "properties": {
                                                "t": {"type": "array", "items": {"type": "number"}},
                                                "requested": AMOUNTS,
                                                "used": AMOUNTS,
                                            },
                                        },
                                        "totals": HOURS,
                                        "children": {"type": "array", "items": {"type": "object"}},
                                    },
                                }
                            },
                            "text/csv": {"schema": {"type": "string"}},
                        },
                    },
                    "400": _error("a bad parameter; the message says which and how to fix it"),
                    "403": _error("not authenticated, or another user's usage"),
                    "404": _error("no such plan"),
                },
            }
        },
        "/churn": {
            "get": {
                "summary": "what preemptions cost, per plan (the victim's user leaf and every "
                "plan above it), counted from the stored decisions (they survive restarts); "
                "plan admins see every plan, users their own leaves",
                "responses": {
                    "200": {
                        "description": "the counters of every plan with a preemption in its "
                        "subtree (plan / is the total)",
                        "content": {"application/json": {"schema": CHURN}},
                    },
                    "403": _error("not authenticated"),
                },
            }
        },
        "/usage/jobs/{job_id}": {
            "parameters": [
                {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}
            ],
            "get": {
                "summary": "measured utilization of a running job, sampled (cpu cores, memory, "
                "and GPU utilization where NVML answers); the job's owner or a plan admin",
                "responses": {
                    "200": {
                        "description": "samples, oldest first",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    },
                    "403": _error("not authenticated"),
                    "404": _error("no such job of yours"),
                },
            },
        },
    }
