"""The plan tree as Volcano queues: one hierarchical queue per plan under the instance's own,
a plan's share as the queue's weight and its limit as the queue's capability."""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from typing import Any

from extension.scheduler import Resources

from .names import (
    DEFAULT_GPU_RESOURCE,
    QUEUE_API,
    VOLCANO_ROOT_QUEUE,
    ManifestError,
    _object,
    make_annotations,
    make_labels,
    queue_name,
)
from .quantities import resource_list


def share_to_weight(share: float) -> int:
    """Volcano weights are integers 1..65535: a share becomes ``round(share * 100)``, so 4:2:2
    stays 400:200:200 and shares down to 0.01 keep their ratio."""
    if not share > 0:
        raise ManifestError(f"share must be positive, got {share}")
    return max(1, min(65535, int(round(share * 100))))


def make_queue(
    *,
    name: str,
    parent: str | None,
    weight: int,
    labels: Mapping[str, str],
    annotations: Mapping[str, str] | None = None,
    capability: Resources | None = None,
    gpu_resource: str = DEFAULT_GPU_RESOURCE,
    reclaimable: bool = True,
) -> dict:
    """A Volcano Queue (cluster scoped): ``weight`` = the plan's share, ``capability`` = its
    limit (finite entries only), ``parent`` = the parent plan's queue (hierarchical queues)."""
    spec: dict[str, Any] = {"weight": int(weight), "reclaimable": reclaimable}
    if parent:
        spec["parent"] = parent
    if capability is not None:
        caps = resource_list(capability, gpu_resource, skip_zero=False)
        if caps:
            spec["capability"] = caps
    obj = _object(QUEUE_API, name, None, labels, annotations)
    obj["spec"] = spec
    return obj


def make_plan_queues(
    plans: Sequence[Any],
    *,
    instance: str,
    prefix: str = "wmla",
    instance_capability: Resources | None = None,
    gpu_resource: str = DEFAULT_GPU_RESOURCE,
) -> list[dict]:
    """The whole plan tree as queues, parents first: the instance's queue under Volcano's
    ``root``, then one per plan (``plans`` are ``Plan``-like: ``path``, ``share``, ``limit``)."""
    queues = [
        make_queue(
            name=queue_name("/", prefix),
            parent=VOLCANO_ROOT_QUEUE,
            weight=1,
            labels=make_labels(instance=instance),
            annotations=make_annotations(plan="/"),
            capability=instance_capability,
            gpu_resource=gpu_resource,
        )
    ]
    for plan in sorted(plans, key=lambda p: (p.path.count("/"), p.path)):
        parent = posixpath.dirname(plan.path) or "/"
        queues.append(
            make_queue(
                name=queue_name(plan.path, prefix),
                parent=queue_name(parent, prefix),
                weight=share_to_weight(plan.share),
                labels=make_labels(instance=instance),
                annotations=make_annotations(plan=plan.path),
                # no plan can hold more than the instance; Volcano also refuses a child queue
                # whose capability is above its parent's
                capability=(
                    plan.limit
                    if instance_capability is None
                    else plan.limit.cap(instance_capability)
                ),
                gpu_resource=gpu_resource,
            )
        )
    return queues
