"""The node rows as ``Ledger.hold`` leaves them, kept between cycles on one plan index
(docs/scheduling.md "Cost": the ledger's rows kept between cycles).

Every cycle the ledger's rows start from the nodes' capacity and every running job's workers
are subtracted from them: a Python step per worker (per node for a job of many workers), and a
refill of every node's rows, though from one instant to the next one or two jobs start or end.
``HoldKept`` keeps the rows after ``hold`` (flat, three numbers a node) and what each running
job held, and brings them up to the next cycle's running jobs by the jobs that came, went or
changed only; then it writes back to the ledger's rows the nodes that changed and the nodes
the last cycle's admission, reclaim and growth wrote on (the last ledger's ``touched``).

Only while every amount is an int (``NodeFigures.integral`` and every worker's amounts): then
the rows are exactly what subtracting worker by worker in job order gives, in any order. Any
other cycle (a fraction, a job id twice) is held afresh by the ledger, and the kept rows are
dropped until the next cycle they can be kept in.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Protocol

from .model import Job


class NodeFigures(Protocol):
    """What hold reads of ``index.NodeFigures`` (index.py keeps a HoldKept on every plan
    index, so this module does not import it)."""

    node_at: dict[str, int]
    capacity: list[list]
    integral: bool
    machines: tuple


class Held:
    """What one running job held as last seen: the job object, its placement (a tuple never
    changes in place), its worker's amounts, whether it was terminating, workers per node."""

    __slots__ = ("job", "placement", "worker", "per_worker", "terminating", "counts")

    def __init__(self, job: Job) -> None:
        self.job = job
        self.placement = job.placement
        self.worker = job.per_worker
        self.per_worker = tuple(job.per_worker)
        self.terminating = job.terminating
        self.counts: Counter = Counter(job.placement)

    def kind(self) -> tuple:
        """What each held worker takes, and where (free only, or incoming too)."""
        return self.per_worker, self.terminating


def _whole(w: Sequence) -> bool:
    return type(w[0]) is int and type(w[1]) is int and type(w[2]) is int


class HoldKept:
    """The rows after the last ``hold`` and what each running job held then (module
    docstring). ``written`` is the last ledger's ``touched``: the nodes whose rows it changed
    after its hold, which the next hold writes back."""

    __slots__ = ("nodes", "free", "incoming", "total", "held", "written")

    def __init__(self) -> None:
        self.nodes: NodeFigures | None = None  # what the rows are of; None: nothing kept
        self.free: list[int] = []  # after hold, flat: three numbers a node
        self.incoming: list[int] = []
        self.total = [0, 0, 0]  # the column sums of free (before the quota)
        self.held: dict[str, Held] = {}  # job id -> what it held
        self.written: set[int] = set()

    def drop(self) -> None:
        """Keep nothing: the next hold that can keep the rows starts from the capacity."""
        self.nodes = None
        self.held = {}

    def hold(
        self,
        running: list[Job],
        nodes: NodeFigures,
        free: list[list],
        incoming: list[list],
        touched: set[int],
    ) -> set[int] | None:
        """The ledger's rows ``free`` and ``incoming`` as holding every job of ``running``
        from the nodes' capacity would leave them; the nodes whose rows may differ from the
        last hold's (every node after a start afresh), or None when they cannot be kept (the
        ledger holds afresh then). ``touched``: the set the ledger adds the nodes it writes to
        after hold."""
        if not nodes.integral:
            self.drop()
            return None
        changed: set[int] = set()
        if self.nodes is not nodes:
            self._start(nodes, free, incoming)
            changed.update(range(len(free)))
        held = self.held
        now: dict[str, Job] = {}
        for job in running:
            key = job.id
            if key in now:
                self.drop()
                return None
            now[key] = job
            was = held.get(key)
            if (  # the very job, same placement tuple (a list can change in place), worker
                was is not None
                and was.job is job
                and job.placement is was.placement
                and type(was.placement) is tuple
                and job.per_worker is was.worker
                and job.terminating == was.terminating
            ):  # and state: it holds what it held
                continue
            if not _whole(job.per_worker):
                self.drop()
                return None
            held[key] = self._change(was, Held(job), nodes.node_at, changed)
        if len(held) > len(now):
            for key in [key for key in held if key not in now]:
                self._change(held.pop(key), None, nodes.node_at, changed)
        self._write_back(changed | self.written, free, incoming)
        self.written = touched
        return changed

    def _start(self, nodes: NodeFigures, free: list[list], incoming: list[list]) -> None:
        """Nothing held yet: the rows are the capacity, every node written back."""
        self.nodes = nodes
        self.free = [v for row in nodes.capacity for v in row]
        self.incoming = [0] * len(self.free)
        self.total = list(nodes.machines)
        self.held = {}
        self.written = set(range(len(free)))

    def _change(
        self, was: Held | None, new: Held | None, node_at: dict, changed: set
    ) -> Held | None:
        """From ``was`` holding to ``new`` holding (either may be None): per node the
        difference; where both have the same worker and state, only the nodes whose count
        changed (a set difference of the counts, in C)."""
        if was is None or new is None or was.kind() != new.kind():
            if was is not None:
                self._add(was, {name: -k for name, k in was.counts.items()}, node_at, changed)
            if new is not None:
                self._add(new, new.counts, node_at, changed)
            return new
        before, after = was.counts, new.counts
        names = {name for name, _ in before.items() ^ after.items()}
        self._add(new, {name: after[name] - before[name] for name in names}, node_at, changed)
        return new

    def _add(self, one: Held, counts: dict, node_at: dict, changed: set) -> None:
        """``one``'s worker held ``k`` more times on each node of ``counts`` (fewer if k < 0)."""
        w0, w1, w2 = one.per_worker
        free, incoming, total = self.free, self.incoming, self.total
        for name, k in counts.items():
            i = node_at.get(name)
            if i is None or not k:
                continue
            changed.add(i)
            b = 3 * i
            free[b] -= w0 * k
            free[b + 1] -= w1 * k
            free[b + 2] -= w2 * k
            total[0] -= w0 * k
            total[1] -= w1 * k
            total[2] -= w2 * k
            if one.terminating:
                incoming[b] += w0 * k
                incoming[b + 1] += w1 * k
                incoming[b + 2] += w2 * k

    def _write_back(self, nodes: set[int], free: list[list], incoming: list[list]) -> None:
        kept_free, kept_incoming = self.free, self.incoming
        for i in nodes:
            b = 3 * i
            free[i][:] = kept_free[b : b + 3]
            incoming[i][:] = kept_incoming[b : b + 3]
