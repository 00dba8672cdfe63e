"""The OpenAPI 3.0 document of the wmla REST API, served at ``<prefix>api/v1/openapi.json``."""

from __future__ import annotations

from typing import Any

from extension.metering.openapi import metering_paths
from extension.storage.openapi import storage_paths, storage_schemas

from . import runtime_limits as rt
from .paging import DEFAULT_LIMIT, MAX_LIMIT
from .shares_openapi import shares_paths, shares_schemas

RESOURCES = {
    "type": "object",
    "description": "gpu: whole devices; cpu: cores (2, 0.5) or millicores ('500m'); memory: "
    "bytes or a Kubernetes quantity ('4Gi'). Responses use devices, millicores and bytes.",
    "properties": {
        "gpu": {"oneOf": [{"type": "integer", "minimum": 0}, {"type": "string"}]},
        "cpu": {"oneOf": [{"type": "number", "minimum": 0}, {"type": "string"}]},
        "memory": {"oneOf": [{"type": "number", "minimum": 0}, {"type": "string"}]},
    },
    "additionalProperties": False,
}

FIGURES = {
    "deserved": {"$ref": "#/components/schemas/Amounts"},
    "allocated": {"$ref": "#/components/schemas/Amounts"},
    "demand": {"$ref": "#/components/schemas/Amounts"},
    "pending": {"type": "integer"},
    "running": {"type": "integer"},
}


def _error(description: str) -> dict:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def _ok(description: str, schema: dict, status: str = "200") -> dict:
    return {
        status: {"description": description, "content": {"application/json": {"schema": schema}}}
    }


ERRORS = {
    "400": _error("malformed or invalid input; the message says what and how to fix it"),
    "403": _error("not authenticated, or not allowed (e.g. not a plan admin, not a plan member)"),
    "404": _error("no such plan, or no such job of yours"),
    "503": {
        **_error(
            "the service's database is unavailable (locked, read-only, unreachable) and nothing "
            "was changed, or the service is restarting; try again after Retry-After seconds"
        ),
        "headers": {"Retry-After": {"schema": {"type": "integer"}}},
    },
}
THROTTLED = {
    **_error(
        "the user made more requests than c.RequestRate allows (a burst, then a rate per "
        "second); nothing was done; try again after Retry-After seconds"
    ),
    "headers": {"Retry-After": {"schema": {"type": "integer"}}},
}
ERRORS["429"] = THROTTLED
IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": "1-128 characters of A-Z a-z 0-9 . _ : - (e.g. a UUID), one per submission: "
    "a retry with the same key and body returns the job the first try made (200), with "
    "another body a 422. The wmla client, CLI and magics send one and retry on 502/503/504 "
    "and on a 429 with Retry-After.",
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$"},
}
JOB_ID = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}


def openapi_document(prefix: str = "/services/wmla/") -> dict[str, Any]:
    job_ref = {"$ref": "#/components/schemas/Job"}
    plan_ref = {"$ref": "#/components/schemas/Plan"}
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "wmla: resource plans and gang-scheduled training for JupyterHub",
            "version": "1",
            "description": "Authenticate with a JupyterHub API token: "
            "'Authorization: token <token>'. Plan changes need the custom:wmla:admin scope or "
            "hub admin. A user sees only their own jobs; another user's job answers 404.",
        },
        "servers": [{"url": prefix + "api/v1"}],
        "components": {
            "securitySchemes": {
                "hubToken": {"type": "apiKey", "in": "header", "name": "Authorization"}
            },
            "schemas": {**_schemas(), **shares_schemas(), **storage_schemas()},
        },
        "security": [{"hubToken": []}],
        "paths": {
            **_misc_paths(),
            **_plan_paths(plan_ref),
            **_job_paths(job_ref),
            **metering_paths(),  # /usage (extension/metering/openapi.py)
            **shares_paths(),  # /shares (shares_openapi.py)
            **storage_paths(),  # /storage (extension/storage/openapi.py)
        },
    }


def _schemas() -> dict[str, Any]:
    """The request and answer bodies."""
    return {
        "Error": {
            "type": "object",
            "required": ["error", "status"],
            "properties": {
                "error": {"type": "string"},
                "status": {"type": "integer"},
                "retry_after": {
                    "type": "integer",
                    "description": "503 only: seconds to wait before trying again",
                },
                "source": {
                    "type": "string",
                    "description": "'proxy' when the hub's proxy answered for a service "
                    "that is not answering (it is restarting); the request may have "
                    "reached it",
                },
            },
        },
        "Resources": RESOURCES,
        "Amounts": {
            "type": "object",
            "description": "gpu devices, cpu millicores, memory bytes; an absent key "
            "in a limit means unlimited",
            "properties": {k: {"type": "number"} for k in ("gpu", "cpu", "memory")},
        },
        "PlanInput": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "example": "/project1/dev-team"},
                "share": {"type": "number", "exclusiveMinimum": True, "minimum": 0},
                "limit": {
                    "allOf": [RESOURCES],
                    "description": "replaces the whole limit; resources left out are unlimited",
                },
                "members": {
                    "type": "object",
                    "description": "hub users and groups allowed to submit here (and "
                    "below); a plan nobody on its path restricts is open to all",
                    "properties": {
                        "users": {"type": "array", "items": {"type": "string"}},
                        "groups": {"type": "array", "items": {"type": "string"}},
                    },
                },
                **rt.OPENAPI_PLAN_INPUT,
            },
            "additionalProperties": False,
        },
        "Plan": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "name": {"type": "string"},
                "share": {"type": "number"},
                "limit": {"$ref": "#/components/schemas/Amounts"},
                "user_leaf": {"type": "boolean"},
                "user_leaves": {
                    "type": "integer",
                    "description": "how many user leaves the plan has; a non-admin "
                    "sees only their own leaf among its children, and only their own "
                    "name among members.users",
                },
                "members": {"type": "object"},
                **rt.OPENAPI_PLAN,
                **FIGURES,
                "children": {
                    "type": "array",
                    "items": {"$ref": "#/components/schemas/Plan"},
                },
            },
        },
        "JobInput": {
            "type": "object",
            "required": ["plan", "command"],
            "additionalProperties": False,
            "properties": {
                "plan": {"type": "string", "example": "/sample-project/training"},
                "name": {"type": "string", "maxLength": 100},
                "workers": {
                    "description": "a rigid gang (2), or elastic: '1:4' or {'min': 1, 'max': 4}",
                    "oneOf": [
                        {"type": "integer", "minimum": 1},
                        {"type": "string", "pattern": "^\\d+(:\\d+)?$"},
                        {
                            "type": "object",
                            "properties": {
                                "min": {"type": "integer"},
                                "max": {"type": "integer"},
                            },
                        },
                    ],
                },
                "resources": {
                    "allOf": [RESOURCES],
                    "description": "per-worker request; omitted ones take the "
                    "instance limit range's default_request",
                },
                "limits": {"allOf": [RESOURCES], "description": "per-worker limits"},
                "priority": {"type": "integer"},
                "preemptible": {"type": "boolean"},
                "kind": {"type": "string", "enum": ["train", "notebook"]},
                "command": {
                    "type": "object",
                    "required": ["model_main"],
                    "additionalProperties": False,
                    "properties": {
                        "model_dir": {
                            "type": "string",
                            "description": "inside <storage_root>/<user>",
                        },
                        "model_main": {
                            "type": "string",
                            "description": "the script, inside model_dir",
                        },
                        "args": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "env": {"type": "object", "additionalProperties": {"type": "string"}},
                **rt.OPENAPI_JOB_INPUT,
            },
        },
        "Job": {
            "type": "object",
            "properties": {
                "id": {"type": "string"},
                "name": {"type": "string"},
                "user": {"type": "string"},
                "plan": {"type": "string"},
                "leaf": {"type": "string", "description": "the user leaf charged"},
                "kind": {"type": "string"},
                "state": {
                    "type": "string",
                    "enum": [
                        "PENDING",
                        "RUNNING",
                        "FINISHED",
                        "FAILED",
                        "REJECTED",
                        "CANCELLED",
                        "TIMEOUT",  # stopped by the service at its runtime limit
                    ],
                },
                "reason": {"type": "string", "description": "why it waits or ended"},
                "workers": {"type": "object"},
                "resources": {"$ref": "#/components/schemas/Amounts"},
                "limits": {"$ref": "#/components/schemas/Amounts"},
                "priority": {"type": "integer"},
                "preemptible": {"type": "boolean"},
                "command": {"type": "array", "items": {"type": "string"}},
                "workdir": {"type": "string"},
                "submitted": {"type": "number"},
                "started": {"type": "number", "nullable": True},
                "ended": {"type": "number", "nullable": True},
                "placement": {"type": "array", "items": {"type": "string"}},
                "exit_code": {"type": "integer", "nullable": True},
                "preemptions": {"type": "integer"},
                "checkpoint": {
                    "type": "object",
                    "nullable": True,
                    "description": "the last checkpoint its runtime reported (null: none): "
                    "when it was written, and the progress figure the script gave with it. "
                    "Reclaim prefers victims that lose the least work since then",
                    "properties": {
                        "at": {"type": "number", "description": "seconds since the epoch"},
                        "progress": {"type": "number", "nullable": True},
                    },
                },
                **rt.OPENAPI_JOB,
                "devices": {
                    "type": "array",
                    "nullable": True,
                    "items": {"type": "array", "items": {"type": "integer"}},
                    "description": "a running notebook job's GPU indexes by worker, which its "
                    "server may open (null: none held here)",
                },
                "queue": {"$ref": "#/components/schemas/Queue"},
            },
        },
        "Queue": {
            "type": "object",
            "nullable": True,
            "description": "a pending job's place in line, why it waits and when it should "
            "start (null unless PENDING; docs/service.md 'Why a job waits, and until when'). "
            "Refreshed off the scheduling loop after cycles: a job submitted a moment ago has "
            "no position or estimate yet",
            "properties": {
                "position": {
                    "type": "object",
                    "nullable": True,
                    "description": "1-based places in the order the scheduler will start "
                    "the pending jobs: among its user's in the leaf, in its plan, instance-wide",
                    "properties": {
                        "leaf": {"type": "integer"},
                        "plan": {"type": "integer"},
                        "instance": {"type": "integer"},
                    },
                },
                "plan": {"type": "string"},
                "reason": {
                    "type": "string",
                    "description": "e.g. '3rd in line in /project1/qa-team; qa-team holds 8 "
                    "of its 8 deserved GPUs; waiting for capacity: ...'",
                },
                "estimate": {
                    "type": "object",
                    "nullable": True,
                    "properties": {
                        "start": {
                            "type": "number",
                            "nullable": True,
                            "description": "seconds since the epoch; null: not within the "
                            "estimate's horizon",
                        },
                        "in_seconds": {"type": "integer", "nullable": True},
                        "text": {"type": "string", "description": "e.g. 'in about 12 minutes'"},
                        "assumption": {"type": "string"},
                        "exact": {
                            "type": "boolean",
                            "description": "every event was simulated (no binning); the "
                            "assumption still holds",
                        },
                    },
                },
                "updated": {"type": "number", "description": "when it was worked out"},
            },
        },
    }


def _misc_paths() -> dict[str, Any]:
    """Who am I, health, this document, the instance."""
    return {
        "/": {
            "get": {
                "summary": "who am I: name, groups, plan admin, plans I may submit to "
                "(plan admins: ?user=&groups= for what another user may use)",
                "parameters": [
                    {"name": "user", "in": "query", "schema": {"type": "string"}},
                    {"name": "groups", "in": "query", "schema": {"type": "string"}},
                ],
                "responses": {**_ok("the caller", {"type": "object"}), **ERRORS},
            }
        },
        "/health": {
            "get": {
                "summary": "liveness (no authentication)",
                "security": [],
                "responses": _ok("alive", {"type": "object"}),
            }
        },
        "/openapi.json": {
            "get": {
                "summary": "this document (no authentication)",
                "security": [],
                "responses": _ok("the document", {"type": "object"}),
            }
        },
        "/instance": {
            "get": {
                "summary": "nodes, capacity, quota, limit range, what is allocated",
                "responses": {**_ok("the instance", {"type": "object"}), **ERRORS},
            }
        },
    }


def _plan_paths(plan_ref: dict) -> dict[str, Any]:
    """The plan tree (changes need a plan admin)."""
    return {
        "/plans": {
            "get": {
                "summary": "the plan tree with share, limit, deserved, allocated, demand",
                "responses": {
                    **_ok(
                        "the tree under 'root', and every plan in 'plans'",
                        {
                            "type": "object",
                            "properties": {
                                "root": plan_ref,
                                "plans": {"type": "array", "items": plan_ref},
                            },
                        },
                    ),
                    **ERRORS,
                },
            },
            "post": {
                "summary": "create a plan (plan admins)",
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/PlanInput"}}
                    },
                },
                "responses": {
                    **_ok("created", plan_ref, "201"),
                    **ERRORS,
                    "409": _error("the plan exists"),
                },
            },
        },
        "/plans/{path}": {
            "parameters": [
                {
                    "name": "path",
                    "in": "path",
                    "required": True,
                    "description": "the plan path without its leading '/', e.g. project1/dev-team",
                    "schema": {"type": "string"},
                }
            ],
            "get": {
                "summary": "one plan",
                "responses": {**_ok("the plan", plan_ref), **ERRORS},
            },
            "patch": {
                "summary": "change share, limit, members or runtime limits (plan admins)",
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/PlanInput"}}
                    },
                },
                "responses": {**_ok("the changed plan", plan_ref), **ERRORS},
            },
            "delete": {
                "summary": "delete a plan with no child plans and no live jobs (plan admins)",
                "responses": {
                    "204": {"description": "deleted, with its user leaves"},
                    **ERRORS,
                    "409": _error("it still has pending or running jobs"),
                },
            },
        },
    }


def _job_paths(job_ref: dict) -> dict[str, Any]:
    """Jobs: submit, list, one, cancel, logs, metrics, history."""
    return {
        "/jobs": {
            "get": {
                "summary": "your jobs in submission order, a page at a time (plan admins: "
                "everyone's, or ?user=)",
                "parameters": [
                    {"name": "state", "in": "query", "schema": {"type": "string"}},
                    {"name": "user", "in": "query", "schema": {"type": "string"}},
                    {
                        "name": "limit",
                        "in": "query",
                        "description": "jobs in this page",
                        "schema": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": MAX_LIMIT,
                            "default": DEFAULT_LIMIT,
                        },
                    },
                    {
                        "name": "after",
                        "in": "query",
                        "description": "the previous page's next (absent: the first page)",
                        "schema": {"type": "string"},
                    },
                ],
                "responses": {
                    **_ok(
                        "a page of the jobs",
                        {
                            "type": "object",
                            "properties": {
                                "jobs": {"type": "array", "items": job_ref},
                                "next": {
                                    "type": "string",
                                    "nullable": True,
                                    "description": "pass as after for the jobs after this "
                                    "page; null: this was the last",
                                },
                            },
                        },
                    ),
                    **ERRORS,
                },
            },
            "post": {
                "summary": "submit a job",
                "parameters": [IDEMPOTENCY_KEY],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/JobInput"}}
                    },
                },
                "responses": {
                    **_ok("accepted (PENDING or already RUNNING)", job_ref, "201"),
                    **_ok("the job an earlier try with this Idempotency-Key made", job_ref),
                    **ERRORS,
                    "422": _error(
                        "rejected: it can never run as asked; the message names the plan, "
                        "the resource, the limit and the request"
                    ),
                    "429": {
                        **_error(
                            "the user already has c.WmlaService.max_pending_per_user pending "
                            "jobs (no Retry-After: final), or made more requests than "
                            "c.RequestRate allows (Retry-After: try again then); nothing was "
                            "stored"
                        ),
                        "headers": THROTTLED["headers"],
                    },
                },
            },
        },
        "/jobs/{job_id}": {
            "parameters": [JOB_ID],
            "get": {"summary": "one job", "responses": {**_ok("the job", job_ref), **ERRORS}},
            "delete": {
                "summary": "cancel the job (its workers get SIGTERM, a grace, then SIGKILL)",
                "responses": {
                    **_ok("the job, cancelled or cancelling", job_ref),
                    **ERRORS,
                    "409": _error("the job already ended"),
                },
            },
        },
        "/jobs/{job_id}/logs": {
            "parameters": [
                JOB_ID,
                {"name": "worker", "in": "query", "schema": {"type": "integer"}},
                {"name": "tail", "in": "query", "schema": {"type": "integer"}},
            ],
            "get": {
                "summary": "the job's log: one worker's, or all prefixed by worker",
                "responses": {**_ok("logs", {"type": "object"}), **ERRORS},
            },
        },
        "/jobs/{job_id}/metrics": {
            "parameters": [
                JOB_ID,
                {"name": "since", "in": "query", "schema": {"type": "integer"}},
            ],
            "get": {
                "summary": "metrics the runtime reported ($WMLA_JOB_DIR/metrics.jsonl), "
                "from line 'since'; 'next' is where to continue",
                "responses": {**_ok("metrics", {"type": "object"}), **ERRORS},
            },
        },
        "/jobs/{job_id}/history": {
            "parameters": [JOB_ID],
            "get": {
                "summary": "every state and allocation change of the job, with times",
                "responses": {**_ok("transitions", {"type": "object"}), **ERRORS},
            },
        },
    }
