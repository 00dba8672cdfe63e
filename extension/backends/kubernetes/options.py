"""The backend's options, each from the constructor, else the ``WMLA_K8S_<OPTION>`` environment
variable (set in the Helm values), else the default docs/kubernetes.md lists."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import manifests as m
from .api import JOB_KINDS, JobKind


@dataclass(frozen=True)
class Options:
    """Where jobs go and what their objects look like."""

    job_kind: JobKind
    prefix: str
    namespace: str
    instance_name: str
    image: str
    image_pull_policy: str | None
    storage_claim: str
    storage_root: str
    mount_path: str
    gpu_resource: str
    priority_class: str | None
    grace: float
    elastic_launcher: list[str] = field(default_factory=list)
    service_account: str | None = None
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict] = field(default_factory=list)
    ttl: int | None = 3600
    run_as_uid_base: int | None = None  # pods as the user's uid (manifests.pod_uid); None: image's


def resolve(
    *,
    namespace: str | None = None,
    instance: str | None = None,
    name_prefix: str | None = None,
    job_kind: str | None = None,
    image: str | None = None,
    image_pull_policy: str | None = None,
    storage_claim: str | None = None,
    storage_root: str | None = None,
    mount_path: str | None = None,
    gpu_resource: str | None = None,
    priority_class: str | None = None,
    grace: float = 30.0,
    elastic_launcher: Sequence[str] | None = None,
    service_account: str | None = None,
    node_selector: Mapping[str, str] | None = None,
    tolerations: Sequence[dict] = (),
    ttl_seconds_after_finished: int | None = 3600,
    run_as_uid_base: int | None = None,
) -> Options:
    """The options, the constructor's names in, each left at None filled in from the
    environment, then from its default."""
    kind = _job_kind(job_kind)
    prefix = _option("name_prefix", name_prefix, "wmla")
    m.queue_name("/", prefix)  # validates the prefix now, not at the first job
    return Options(
        job_kind=kind,
        prefix=prefix,
        namespace=_option("namespace", namespace, _current_namespace()),
        instance_name=_option("instance", instance, "wmla"),
        image=_option("image", image, "pytorch/pytorch:2.3.1-cuda12.1-cudnn8-runtime"),
        image_pull_policy=_option("image_pull_policy", image_pull_policy, None),
        storage_claim=_option("storage_claim", storage_claim, "wmla-user-data"),
        storage_root=_option("storage_root", storage_root, "/gpfs/myresultfs"),
        mount_path=_option("mount_path", mount_path, "/gpfs/myresultfs/{user}"),
        gpu_resource=_option("gpu_resource", gpu_resource, m.DEFAULT_GPU_RESOURCE),
        priority_class=_option("priority_class", priority_class, None),
        grace=grace,
        elastic_launcher=list(elastic_launcher or ()),
        service_account=_option("service_account", service_account, None),
        node_selector=dict(node_selector or {}),
        tolerations=list(tolerations),
        ttl=ttl_seconds_after_finished,
        run_as_uid_base=_uid_base(run_as_uid_base),
    )


def _option(name: str, given: Any, default: Any) -> Any:
    if given is not None:
        return given
    return os.environ.get(f"WMLA_K8S_{name.upper()}", default) or default


def _uid_base(given: int | None) -> int | None:
    """``run_as_uid_base``: each user's pods run as ``manifests.pod_uid(user, base)``."""
    value = _option("run_as_uid_base", given, None)
    if value is None:
        return None
    try:
        base = int(value)
        m.pod_uid("check", base)
    except (TypeError, ValueError, m.ManifestError):
        raise ValueError(
            f"run_as_uid_base {value!r} must be a whole number between 1 and {m.MAX_UID - 1}, "
            "above the machine's own accounts (e.g. 200000)"
        ) from None
    return base


def _job_kind(given: str | None) -> JobKind:
    """The kind a job becomes (the ``job_kind`` option: ``pytorchjob`` or ``volcanojob``)."""
    job_kind = _option("job_kind", given, "pytorchjob")
    for kind in JOB_KINDS:
        if kind.option == job_kind:
            return kind
    raise ValueError(f"job_kind {job_kind!r} must be 'pytorchjob' or 'volcanojob'")


def _current_namespace() -> str:
    """The pod's own namespace in a cluster, else ``default``."""
    path = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
    with contextlib.suppress(OSError):
        with open(path, encoding="utf-8") as f:
            return f.read().strip() or "default"
    return "default"
