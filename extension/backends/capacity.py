"""What the local machine can hold, as scheduler nodes.

GPUs are found through NVML (``nvidia-ml-py``) or ``nvidia-smi``; on a machine without GPUs
virtual devices stand in, so the whole flow can be tried on a laptop. A layout such as ``4x8``
splits the machine into 4 virtual nodes of 8 devices each, to rehearse a cluster's gang
placement and fairness on one box.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from extension.scheduler import Node, Resources

_LAYOUT = re.compile(r"^\s*(\d+)\s*x\s*(\d+)\s*$")


def physical_gpus() -> int:
    """Number of NVIDIA GPUs this machine has (0 when there is no driver)."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no library or no driver: ask nvidia-smi, then give up
        pass
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return len([line for line in out.splitlines() if line.strip()])


def parse_layout(layout: str) -> tuple[int, int]:
    """``"4x8"`` -> (4 nodes, 8 devices each); a clear error otherwise."""
    match = _LAYOUT.match(layout or "")
    if not match or int(match.group(1)) < 1:
        raise ValueError(f"device layout {layout!r} is not NODESxDEVICES; write it like 1x4 or 4x8")
    return int(match.group(1)), int(match.group(2))


def detect_nodes(
    layout: str | None = None,
    cpu_millicores: int | None = None,
    memory_bytes: int | None = None,
    default_virtual: str = "1x4",
) -> list[Node]:
    """Nodes for the local backend.

    ``layout`` None: real GPUs as one node when there are any, else ``default_virtual``
    virtual devices. The machine's cores and memory are split evenly across the nodes.
    """
    if layout is None:
        gpus = physical_gpus()
        layout = f"1x{gpus}" if gpus else default_virtual
    count, devices = parse_layout(layout)
    cpu = cpu_millicores if cpu_millicores is not None else (os.cpu_count() or 1) * 1000
    memory = memory_bytes if memory_bytes is not None else _memory_bytes()
    width = len(str(count))
    return [
        Node(
            "local" if count == 1 else f"local-{i + 1:0{width}d}",
            Resources(devices, cpu // count, memory // count),
        )
        for i in range(count)
    ]


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 8 * 2**30
