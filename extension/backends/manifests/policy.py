"""Namespace policy objects (ResourceQuota, LimitRange), for examples and tests: the backend
reads them from the cluster, it never writes them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def make_resource_quota(*, name: str, namespace: str, hard: Mapping[str, Any]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"hard": {k: str(v) for k, v in hard.items()}},
    }


def make_limit_range(*, name: str, namespace: str, limits: Sequence[Mapping[str, Any]]) -> dict:
    def strs(item: Mapping[str, Any]) -> dict:
        return {
            k: ({r: str(q) for r, q in v.items()} if isinstance(v, Mapping) else v)
            for k, v in item.items()
        }

    return {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"limits": [strs(item) for item in limits]},
    }
