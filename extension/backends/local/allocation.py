"""What a gang holds while it runs: device indexes on its nodes, and a rendezvous port.

Devices: node ``k`` owns device indexes ``[offset_k, offset_k + gpus_k)`` where ``offset_k`` is
the sum of the GPUs of the nodes before it, so virtual nodes on one machine never share a device.
A worker asking for ``g`` GPUs on a node takes the ``g`` lowest free indexes there, in rank order;
they are free again when the gang is gone."""

from __future__ import annotations

import random
import socket
from collections.abc import Iterable, Sequence

from extension.backends.base import JobSpec
from extension.scheduler import Node

from .errors import StartError


class DeviceTable:
    """Each node's device indexes and which of them are taken (by gangs and holds alike)."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.devices: dict[str, list[int]] = {}
        offset = 0
        for node in nodes:
            count = int(node.capacity.gpu)
            self.devices[node.name] = list(range(offset, offset + count))
            offset += count
        self.used: dict[str, set[int]] = {n.name: set() for n in nodes}

    def check_placement(self, spec: JobSpec, placement: tuple[str, ...]) -> None:
        """Refuse a placement this backend cannot run before anything is taken."""
        if not placement:
            raise StartError(f"job {spec.id}: the placement is empty; a gang needs 1+ workers")
        unknown = sorted({n for n in placement if n not in self.used})
        if unknown:
            raise StartError(
                f"job {spec.id}: unknown node(s) {', '.join(unknown)}; this backend has "
                f"{', '.join(self.used)}"
            )

    def allocate(self, spec: JobSpec, placement: tuple[str, ...]) -> list[tuple[int, ...]]:
        """Each worker's devices, by rank: the lowest free indexes of its node, now taken."""
        gpus = spec.per_worker.gpu
        if gpus != int(gpus) or gpus < 0:
            raise StartError(f"job {spec.id}: GPUs per worker must be a whole number, got {gpus}")
        taken: dict[str, set[int]] = {node: set() for node in placement}
        out: list[tuple[int, ...]] = []
        for rank, node in enumerate(placement):
            free = [d for d in self.devices[node] if d not in self.used[node] | taken[node]]
            if len(free) < int(gpus):
                raise StartError(
                    f"job {spec.id}: worker {rank} needs {int(gpus)} GPU(s) on {node} but only "
                    f"{len(free)} of {len(self.devices[node])} are free there"
                )
            mine = tuple(free[: int(gpus)])
            taken[node].update(mine)
            out.append(mine)
        for node, devices in taken.items():
            self.used[node].update(devices)
        return out

    def take(self, placement: Iterable[str], devices: Iterable[Iterable[int]]) -> None:
        """Count devices taken before this table knew (a restart's gangs and holds); a node
        this backend no longer has is passed over."""
        for node, mine in zip(placement, devices):
            self.used.get(node, set()).update(mine)

    def free(self, placement: Iterable[str], devices: Iterable[Iterable[int]]) -> None:
        for node, mine in zip(placement, devices):
            self.used.get(node, set()).difference_update(mine)

    def in_use(self) -> dict[str, list[int]]:
        return {node: sorted(used) for node, used in self.used.items() if used}


class RendezvousPorts:
    """Picks the port of a gang's rank 0 (MASTER_PORT) in ``port_range`` on ``master_addr``."""

    def __init__(self, master_addr: str, port_range: tuple[int, int]) -> None:
        if not 1024 <= port_range[0] <= port_range[1] <= 65535:
            raise ValueError(f"port_range {port_range} must be (low, high) within 1024-65535")
        self.master_addr = master_addr
        self.port_range = (int(port_range[0]), int(port_range[1]))
        self.recent: list[int] = []

    def pick(self) -> int:
        """A port nobody listens on, below the kernel's ephemeral range.

        Port 0 would hand out an ephemeral port, the very range where gloo's own connections and
        every client socket on the machine take theirs, so another job could grab it between
        this check and rank 0's bind. Ports in ``port_range`` (default 20000-32767) are only
        ever taken on purpose.
        """
        low, high = self.port_range
        rng = random.Random()
        for _ in range(200):
            port = rng.randint(low, high)
            if port in self.recent:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((self.master_addr, port))
                except OSError:
                    continue
            self.recent = [*self.recent[-255:], port]
            return port
        raise StartError(f"no free TCP port in {low}-{high} for the rendezvous")
