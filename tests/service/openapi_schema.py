"""Checking API answers against the service's own OpenAPI document (tests of the API)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _json_schema(node: Any) -> Any:
    """OpenAPI 3.0's ``nullable`` as JSON Schema: the node, or null (also for a ``$ref``)."""
    if isinstance(node, dict):
        node = {k: _json_schema(v) for k, v in node.items()}
        if node.pop("nullable", False):
            node = {"anyOf": [node, {"type": "null"}]}
    elif isinstance(node, list):
        node = [_json_schema(v) for v in node]
    return node


def schema_checker(doc: dict) -> Callable[[Any, str], None]:
    """``check(instance, "Job")`` validates against ``doc``'s component of that name (raises
    ``jsonschema.ValidationError``)."""
    import jsonschema

    components = _json_schema(doc["components"])

    def check(instance: Any, name: str) -> None:
        schema = {"$ref": f"#/components/schemas/{name}", "components": components}
        jsonschema.validate(instance, schema)

    return check
