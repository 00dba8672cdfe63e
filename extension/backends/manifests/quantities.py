"""Amounts in Kubernetes' words: ``Resources`` (gpu devices, cpu millicores, memory bytes, as
in ``extension.scheduler.resources``) as ResourceList strings."""

from __future__ import annotations

from extension.scheduler import UNLIMITED, Resources

from .names import DEFAULT_GPU_RESOURCE, ManifestError


def format_cpu(millicores: float) -> str:
    """2000 -> ``"2"``, 500 -> ``"500m"``."""
    m = int(round(millicores))
    return str(m // 1000) if m % 1000 == 0 else f"{m}m"


def format_memory(num_bytes: float) -> str:
    """4 GiB -> ``"4Gi"``; amounts that are not whole binary units stay plain bytes."""
    b = int(round(num_bytes))
    for suffix, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if b and b % size == 0:
            return f"{b // size}{suffix}"
    return str(b)


def resource_list(
    amounts: Resources,
    gpu_resource: str = DEFAULT_GPU_RESOURCE,
    prefix: str = "",
    skip_zero: bool = True,
) -> dict[str, str]:
    """``Resources`` as a Kubernetes ResourceList; unlimited entries are left out.

    ``prefix="requests."`` gives ResourceQuota keys (``requests.cpu``, ``requests.nvidia.com/gpu``).
    """
    out: dict[str, str] = {}
    gpu, cpu, memory = amounts
    if cpu != UNLIMITED and not (skip_zero and cpu == 0):
        out[f"{prefix}cpu"] = format_cpu(cpu)
    if memory != UNLIMITED and not (skip_zero and memory == 0):
        out[f"{prefix}memory"] = format_memory(memory)
    if gpu != UNLIMITED and not (skip_zero and gpu == 0):
        if gpu != int(gpu):
            raise ManifestError(f"gpu must be whole devices, got {gpu}")
        out[f"{prefix}{gpu_resource}"] = str(int(gpu))
    return out
