"""OpenAPI 3 path and schema of ``GET /storage`` (web.py), merged into the service's document."""

from __future__ import annotations

from typing import Any

USER = {
    "type": "object",
    "required": ["user", "folder", "used_bytes", "used_files", "enforced", "state"],
    "properties": {
        "user": {"type": "string"},
        "folder": {"type": "string", "description": "<storage_root>/<user>"},
        "used_bytes": {"type": "integer"},
        "used_files": {"type": "integer", "description": "inodes"},
        "storage": {"type": "integer", "description": "hard byte limit"},
        "soft_storage": {"type": "integer", "description": "soft byte limit"},
        "files": {"type": "integer", "description": "hard files limit"},
        "soft_files": {"type": "integer", "description": "soft files limit"},
        "grace": {"type": "number", "description": "seconds over a soft limit allowed"},
        "held_bytes": {
            "type": "integer",
            "description": "the byte limit the kernel holds now (soft once the grace expired)",
        },
        "held_files": {"type": "integer"},
        "over_soft_since": {"type": ["number", "null"]},
        "grace_left": {"type": ["number", "null"], "description": "seconds; null: not over"},
        "state": {
            "type": "string",
            "enum": ["under", "near", "over soft limit, in grace",
                     "over soft limit, grace expired", "at hard limit"],
        },
        "enforced": {"type": "boolean"},
        "reason": {"type": "string", "description": "why not enforced"},
    },
}  # fmt: skip


def storage_schemas() -> dict[str, Any]:
    return {
        "Storage": {
            "type": "object",
            "required": ["enforced", "users"],
            "properties": {
                "enforced": {"type": "boolean", "description": "quotas are held here"},
                "reason": {"type": "string", "description": "why not"},
                "users": {"type": "array", "items": USER},
                "units": {"type": "object"},
            },
        }
    }


def storage_paths() -> dict[str, Any]:
    ok = {"$ref": "#/components/schemas/Storage"}
    error = {"$ref": "#/components/schemas/Error"}
    return {
        "/storage": {
            "get": {
                "summary": "storage quotas (mmlsquota's columns): the caller's; a plan admin's "
                "answer has every user's (mmrepquota), or one with 'user'",
                "parameters": [
                    {"name": "user", "in": "query", "required": False, "schema": {"type": "string"}}
                ],
                "responses": {
                    "200": {"description": "the quotas",
                            "content": {"application/json": {"schema": ok}}},
                    "403": {"description": "another user's, not as a plan admin",
                            "content": {"application/json": {"schema": error}}},
                },
            }
        },
        "/storage/plans": {
            "get": {
                "summary": "the plans with storage limits (their user leaves' limits), from "
                           "the configuration or set by a plan admin",
                "responses": {"200": {"description": "{plans: [{plan, source, storage, ...}]}"}},
            }
        },
        "/storage/plans/{path}": {
            "parameters": [{"name": "path", "in": "path", "required": True,
                            "schema": {"type": "string", "example": "/research"}}],
            "put": {
                "summary": "set a plan's storage limits (plan admins), held at once where the "
                           "users' images have room: {storage, files, soft_storage, "
                           "soft_files, grace}",
                "responses": {"200": {"description": "the plans with limits"},
                              "400": {"description": "a limit that cannot be held"},
                              "403": {"description": "not a plan admin"},
                              "404": {"description": "no such plan"}},
            },
            "delete": {
                "summary": "remove a plan admin's limits (back to the configured ones)",
                "responses": {"200": {"description": "the plans with limits"}},
            },
        },
    }  # fmt: skip
