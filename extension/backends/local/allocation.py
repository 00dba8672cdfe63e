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

from .launching import StartError


def _device_table(nodes: Sequence[Node]) -> dict[str, list[int]]:
    """Each node's device indexes, numbered across the nodes in order (see the module doc)."""
    devices: dict[str, list[int]] = {}
    offset = 0
    for node in nodes:
        count = int(node.capacity.gpu)
        devices[node.name] = list(range(offset, offset + count))
        offset += count
    return devices


class _Allocation:
    """Taking and giving back devices and ports.

    A part of ``LocalBackend``: ``backend.py`` sets the attributes declared here.
    """

    master_addr: str
    port_range: tuple[int, int]
    _devices: dict[str, list[int]]
    _used: dict[str, set[int]]
    _recent_ports: list[int]

    def _allocate(self, spec: JobSpec, placement: tuple[str, ...]) -> list[tuple[int, ...]]:
        gpus = spec.per_worker.gpu
        if gpus != int(gpus) or gpus < 0:
            raise StartError(f"job {spec.id}: GPUs per worker must be a whole number, got {gpus}")
        taken: dict[str, set[int]] = {node: set() for node in placement}
        out: list[tuple[int, ...]] = []
        for rank, node in enumerate(placement):
            free = [d for d in self._devices[node] if d not in self._used[node] | taken[node]]
            if len(free) < int(gpus):
                raise StartError(
                    f"job {spec.id}: worker {rank} needs {int(gpus)} GPU(s) on {node} but only "
                    f"{len(free)} of {len(self._devices[node])} are free there"
                )
            mine = tuple(free[: int(gpus)])
            taken[node].update(mine)
            out.append(mine)
        for node, devices in taken.items():
            self._used[node].update(devices)
        return out

    def _free(self, placement: Iterable[str], devices: Iterable[Iterable[int]]) -> None:
        for node, mine in zip(placement, devices):
            self._used.get(node, set()).difference_update(mine)

    def _free_port(self) -> int:
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
            if port in self._recent_ports:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((self.master_addr, port))
                except OSError:
                    continue
            self._recent_ports = [*self._recent_ports[-255:], port]
            return port
        raise StartError(f"no free TCP port in {low}-{high} for the rendezvous")
