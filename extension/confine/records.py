"""The records of confinement: what a worker or notebook is granted, what it used, what a
machine can enforce. Standard library only (the hub's spawner and the service both use them)."""

from __future__ import annotations

import enum
import os
import stat
from dataclasses import dataclass, field

DEFAULT_PIDS = 1024  # processes and threads per worker or notebook, like a systemd TasksMax
# Users' work is the OOM killer's first choice: set by root, so the user cannot lower it again
# (the kernel keeps the value a privileged writer set as the task's oom_score_adj_min).
USER_OOM_SCORE_ADJ = 500
CFS_PERIOD_US = 100_000
DEFAULT_GPU_TEMPLATE = "/dev/nvidia{index}"
# The NVIDIA nodes every GPU process opens besides its own GPUs, found beside the GPU nodes.
NVIDIA_CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")


class Control(enum.Enum):
    """What the kernel can hold a process to."""

    CPU = "cpu"
    MEMORY = "memory"
    PIDS = "pids"
    DEVICES = "devices"


class ConfineError(RuntimeError):
    """A cgroup could not be made or entered; the message says what to fix."""


@dataclass(frozen=True)
class DeviceNode:
    """A character device by number, as a devices cgroup names it."""

    major: int
    minor: int

    def rule(self) -> str:
        return f"c {self.major}:{self.minor} rwm"


@dataclass(frozen=True)
class Grant:
    """What one worker or notebook server may use.

    ``cpu_millicores``: the CFS quota (0: no quota, the smallest weight: idle CPU only);
    ``memory_bytes``: a hard limit with no swap beyond it (0: only the users' total cap);
    ``pids``: processes and threads; ``gpus``: the device nodes of its own GPUs (the NVIDIA
    control nodes come with any GPU; none at all without one); ``cpu_weight_millicores``: the
    share of a busy CPU (the request, where the quota is a limit above it, as a notebook
    server's: weighed by what it asked for, held to its ceiling; 0: the quota's)."""

    cpu_millicores: int
    memory_bytes: int
    pids: int = DEFAULT_PIDS
    gpus: tuple[DeviceNode, ...] = ()
    control_nodes: tuple[DeviceNode, ...] = ()
    cpu_weight_millicores: int = 0

    @property
    def weight_millicores(self) -> int:
        """The millicores the CPU weight is made from."""
        return self.cpu_weight_millicores or self.cpu_millicores

    def __post_init__(self) -> None:
        for name in ("cpu_millicores", "memory_bytes", "pids", "cpu_weight_millicores"):
            if int(getattr(self, name)) < 0:
                raise ValueError(f"Grant.{name} must be 0 or more, got {getattr(self, name)}")
        if self.pids < 1:
            raise ValueError(f"Grant.pids must be at least 1, got {self.pids}")


@dataclass(frozen=True)
class Usage:
    """What a cgroup's own accounting says: CPU seconds since it was made, memory now and at
    its peak, and how many of its processes the OOM killer took."""

    cpu_seconds: float = 0.0
    memory_bytes: int = 0
    memory_peak_bytes: int = 0
    oom_kills: int = 0
    memory_limit_bytes: int = 0  # 0: none of its own

    def plus(self, other: Usage) -> Usage:
        return Usage(
            self.cpu_seconds + other.cpu_seconds,
            self.memory_bytes + other.memory_bytes,
            self.memory_peak_bytes + other.memory_peak_bytes,
            self.oom_kills + other.oom_kills,
            self.memory_limit_bytes + other.memory_limit_bytes,
        )


@dataclass(frozen=True)
class Enforced:
    """Whether one control holds on this machine, and how (or why not)."""

    enforced: bool
    how: str

    def as_dict(self) -> dict[str, object]:
        return {"enforced": self.enforced, "how": self.how}


@dataclass(frozen=True)
class Report:
    """What this machine enforces, for the start log and ``GET /instance``'s ``security``."""

    mechanism: str
    controls: dict[Control, Enforced] = field(default_factory=dict)

    def missing(self) -> list[Control]:
        return [c for c in Control if not self.controls.get(c, Enforced(False, "")).enforced]

    def warnings(self) -> list[str]:
        return [
            f"grants are not enforced for {c.value}: {self.controls[c].how}"
            if c in self.controls
            else f"grants are not enforced for {c.value}"
            for c in self.missing()
        ]

    def as_dict(self) -> dict[str, object]:
        return {
            "mechanism": self.mechanism,
            "enforced": {c.value: self.controls[c].as_dict() for c in Control},
        }


def device_node(path: str) -> DeviceNode | None:
    """The numbers of the character device at ``path`` (an admin's configured path, never a
    user's), or None when there is none."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISCHR(info.st_mode):
        return None
    return DeviceNode(os.major(info.st_rdev), os.minor(info.st_rdev))


def gpu_nodes(template: str, indexes: tuple[int, ...]) -> tuple[DeviceNode, ...]:
    """The device nodes of GPUs ``indexes``: ``template`` with ``{index}`` replaced. A GPU whose
    node is missing is left out (a virtual device of a machine without GPUs)."""
    found = (device_node(template.format(index=i)) for i in indexes)
    return tuple(n for n in found if n is not None)


def control_nodes(template: str) -> tuple[DeviceNode, ...]:
    """The NVIDIA control nodes in the folder of the GPU nodes (``/dev`` by default)."""
    folder = os.path.dirname(template.format(index=0)) or "/dev"
    found = (device_node(os.path.join(folder, name)) for name in NVIDIA_CONTROL_NODES)
    return tuple(n for n in found if n is not None)


def gpu_grant(
    cpu_millicores: int,
    memory_bytes: int,
    pids: int,
    template: str,
    indexes: tuple[int, ...],
    cpu_weight_millicores: int = 0,
) -> Grant:
    """A grant with the device nodes of GPUs ``indexes`` (none, and no control node, for 0)."""
    gpus = gpu_nodes(template, indexes)
    return Grant(
        int(cpu_millicores),
        int(memory_bytes),
        int(pids),
        gpus=gpus,
        control_nodes=control_nodes(template) if indexes else (),
        cpu_weight_millicores=int(cpu_weight_millicores),
    )


def check_template(template: str) -> str:
    """A GPU device template, refused unless it names a path by ``{index}``."""
    if "{index}" not in template or not os.path.isabs(template):
        raise ValueError(
            f"gpu_device_template {template!r} must be an absolute path with {{index}}, e.g. "
            f"{DEFAULT_GPU_TEMPLATE!r}"
        )
    try:
        template.format(index=0)
    except (KeyError, IndexError, ValueError) as err:
        raise ValueError(f"gpu_device_template {template!r}: {err}") from None
    return template


def mib(amount: int) -> str:
    """Bytes as people read them: "256 MiB", "1.5 GiB"."""
    if amount >= 1 << 30:
        return f"{amount / (1 << 30):.3g} GiB"
    return f"{amount / (1 << 20):.4g} MiB"


def cfs_quota_us(millicores: int) -> int | None:
    """A grant's CFS quota per ``CFS_PERIOD_US`` (1 ms at least, the kernel's floor); None: no
    quota (a grant of 0 cpu)."""
    return max(1000, millicores * CFS_PERIOD_US // 1000) if millicores else None


def killed_for_memory(usage: Usage, who: str, advice: str, cap_advice: str) -> str:
    """``"<who> was killed for using more than its 256 MiB of memory (peak 256 MiB); <advice>"``
    when the kernel killed a process of the cgroup for memory (``cap_advice`` when it had no
    limit of its own and all users' work together reached the machine's cap); "" otherwise."""
    if not usage.oom_kills:
        return ""
    limit = usage.memory_limit_bytes
    peak = max(usage.memory_peak_bytes, limit)
    if not limit:
        return (
            f"{who} was killed for memory when all users' work together reached the machine's "
            f"cap for it (peak {mib(peak)}); {cap_advice}"
        )
    return (
        f"{who} was killed for using more than its {mib(limit)} of memory (peak {mib(peak)}); "
        f"{advice}"
    )
