"""The cycle's ledger: the one place the cycle's capacity arithmetic lives.

Per node, three rows over (gpu, cpu, memory): ``free``; ``incoming``, held by terminating jobs
and free once their grace period ends; and during reclaim ``pool``, free plus incoming. Beside
them the totals (``total_free`` with the quota applied, ``total_incoming``), each plan's
allocation (``PlanNode.alloc``, charged here) and what reclaim promised plans this cycle
(``promised``: claims add, victims' releases subtract).

Every change goes through a verb: ``hold`` (running jobs at the start), ``take`` (a gang or a
grown worker starts), ``charge`` (a plan chain holds more), ``reserve`` (Admission 4),
``claim`` and ``claim_amount`` (a reclaimer's share of free and incoming capacity, Reclaim 2)
and a ``Release``: the victims a reclaim would stop, kept tentatively until the search is done,
then committed whole or dropped (Volcano's Statement; docs/scheduling.md "Reclaim 5").
"""

from __future__ import annotations

from collections import Counter
from itertools import chain

from .held import HoldKept
from .index import NodeFigures, PlanNode
from .kept import FitCarry
from .model import Job
from .placement import FitIndex, fit_count, gang_room

EPS = 1e-9
_MANY = 32  # a running job of more workers than this is held per node, not per worker


class Ledger:
    __slots__ = (
        "names",
        "free",
        "incoming",
        "pool",
        "total_free",
        "total_incoming",
        "promised",
        "fits",
        "carry",
        "touched",
        "kept",
        "changed",
        "_rooms",
    )

    def __init__(
        self,
        nodes: NodeFigures,
        free: list,
        incoming: list,
        pool: list,
        carry: FitCarry,
        kept: HoldKept | None = None,
    ) -> None:
        self.names = nodes.names
        # rows kept by PlanIndex, as the last cycle left them until ``hold`` writes them
        self.free, self.incoming, self.pool = free, incoming, pool
        self.kept = HoldKept() if kept is None else kept  # the rows after the last hold
        self.changed: set[int] | None = None  # nodes whose rows hold changed, None: any
        self.total_free = [0, 0, 0]
        self.total_incoming = [0, 0, 0]
        self.promised: dict[str, list[float]] = {}  # plan path -> alloc change promised
        # during admission, per worker shape tried: the nodes by how many such workers they
        # hold (placement.FitIndex), kept in step by take and reserve
        self.fits: dict[tuple, FitIndex] = {}
        self.carry = carry  # the fit indexes kept between cycles (kept.FitCarry)
        # nodes whose rows were written since hold (admission, reclaim, growth, a victim's
        # release; kept after a rewind): kept.FitCarry's indexes and the next cycle's hold
        # bring these up
        self.touched: set[int] = set()
        self._rooms: dict[tuple, float] = {}  # pool_room answers until the pool changes

    # the start of the cycle ---------------------------------------------------------------
    def hold(self, running: list[Job], leaves: list[PlanNode], nodes: NodeFigures) -> None:
        """Running jobs hold their workers' nodes (a terminating job's are incoming too) and
        are charged to their leaf (to the ancestors in the demand phase); then the totals,
        cut down by the quota, which can be below the machines. The rows come from the last
        cycle's by the jobs that changed where every amount is an int (held.HoldKept)."""
        changed = self.changed = self.kept.hold(
            running, nodes, self.free, self.incoming, self.touched
        )
        if changed is None:
            self._hold_afresh(running, nodes)
            total = [sum(column) for column in zip(*self.free)] or [0, 0, 0]
        else:
            total = self.kept.total[:]
        for job, leaf in zip(running, leaves):
            w0, w1, w2 = job.per_worker
            k = job.workers
            a = leaf.alloc
            a[0] += w0 * k
            a[1] += w1 * k
            a[2] += w2 * k
        self.total_free = total
        for r in range(3):
            used = nodes.machines[r] - total[r]
            total[r] = min(total[r], nodes.total[r] - used)

    def _hold_afresh(self, running: list[Job], nodes: NodeFigures) -> None:
        """Every node's rows from its capacity, less every running job's workers."""
        free, incoming, node_at = self.free, self.incoming, nodes.node_at
        for row, cap in zip(free, nodes.capacity):
            row[:] = cap
        for row in incoming:
            row[:] = (0, 0, 0)
        whole = nodes.integral  # every row whole numbers so far: a node's workers at once
        for job in running:  # the hot loop: locals, one lookup per question
            w0, w1, w2 = job.per_worker
            placement = job.placement
            if whole and not (type(w0) is int and type(w1) is int and type(w2) is int):
                whole = False  # from here on node by node, as rows may hold fractions
            if whole and len(placement) > _MANY:
                self._hold_grouped(job, node_at)
                placement = ()
            for name in placement:
                i = node_at.get(name)
                if i is None:
                    continue
                row = free[i]
                row[0] -= w0
                row[1] -= w1
                row[2] -= w2
                if job.terminating:
                    inc = incoming[i]
                    inc[0] += w0
                    inc[1] += w1
                    inc[2] += w2

    def _hold_grouped(self, job: Job, node_at: dict[str, int]) -> None:
        """``hold`` for a job of many workers (an aggregated group in the simulator): per node
        its workers at once, exact as every amount and row is a whole number (an int)."""
        w0, w1, w2 = job.per_worker
        free, incoming, terminating = self.free, self.incoming, job.terminating
        for name, k in Counter(job.placement).items():
            i = node_at.get(name)
            if i is None:
                continue
            row = free[i]
            row[0] -= w0 * k
            row[1] -= w1 * k
            row[2] -= w2 * k
            if terminating:
                inc = incoming[i]
                inc[0] += w0 * k
                inc[1] += w1 * k
                inc[2] += w2 * k

    def mark(self) -> tuple[list, list, list, list]:
        """The rows and totals as ``hold`` left them, for ``rewind`` (Reclaim 6's reruns):
        flat lists of numbers, three per node (the kept ones' copies where hold kept them)."""
        if self.changed is not None:
            free, incoming = self.kept.free[:], self.kept.incoming[:]
        else:
            free = list(chain.from_iterable(self.free))
            incoming = list(chain.from_iterable(self.incoming))
        return free, incoming, self.total_free[:], self.total_incoming[:]

    def rewind(self, mark: tuple[list, list, list, list]) -> None:
        """Back to ``mark``: what admission took, reserved and claimed and what reclaim
        released is undone whole, and nothing is promised. The pool needs no undoing: reclaim
        fills it (``open_pool``) before it reads it."""
        free, incoming, total_free, total_incoming = mark
        for n, row in enumerate(self.free):
            row[:] = free[3 * n : 3 * n + 3]
        for n, row in enumerate(self.incoming):
            row[:] = incoming[3 * n : 3 * n + 3]
        self.total_free[:], self.total_incoming[:] = total_free, total_incoming
        self.promised = {}
        self.fits = {}
        self._rooms = {}
        # ``touched`` stays: every row is as hold left it again, but the fit indexes kept
        # between cycles (kept.FitCarry) saw what admission wrote, and are brought up by it

    # admission and growth -----------------------------------------------------------------
    def take(self, placement: list[int], w: tuple) -> None:
        """A gang (or a grown worker) starts on ``placement``: one worker per entry."""
        for i in placement:
            row = self.free[i]
            row[0] -= w[0]
            row[1] -= w[1]
            row[2] -= w[2]
        n = len(placement)
        tf = self.total_free
        tf[0] -= w[0] * n
        tf[1] -= w[1] * n
        tf[2] -= w[2] * n
        self.touched.update(placement)
        for fits in self.fits.values():
            for i in dict.fromkeys(placement):
                fits.update(i)

    @staticmethod
    def charge(leaf: PlanNode, w: tuple, count: int) -> None:
        """``leaf`` and its ancestors hold ``count`` more workers of ``w``."""
        gpu, cpu, mem = w[0] * count, w[1] * count, w[2] * count
        for p in leaf.chain:
            a = p.alloc
            a[0] += gpu
            a[1] += cpu
            a[2] += mem

    def fit_index(self, w: tuple) -> FitIndex:
        fits = self.fits.get(w)
        if fits is None:
            fits = self.fits[w] = self.carry.index(w, self.free, self.names, self.touched)
        return fits

    def reserve(self, i: int, w: tuple) -> None:
        """Admission 4: hold for the reservation what is free on node ``i``, up to a worker."""
        row = self.free[i]
        take = [max(0, min(row[r], w[r])) for r in range(3)]
        for r in range(3):
            row[r] -= take[r]
            self.total_free[r] -= take[r]
        self.touched.add(i)
        for fits in self.fits.values():
            fits.update(i)

    # reclaim -------------------------------------------------------------------------------
    def open_pool(self) -> None:
        """Reclaim starts: per node, what is free plus what terminating jobs will free."""
        self.total_incoming = [sum(row[r] for row in self.incoming) for r in range(3)]
        for row, f, i in zip(self.pool, self.free, self.incoming):
            row[0] = f[0] + i[0]
            row[1] = f[1] + i[1]
            row[2] = f[2] + i[2]
        self._rooms.clear()

    def pool_changed(self) -> None:
        """Forget the pool_room answers: the pool is about to change (a reclaim's commit)."""
        self._rooms.clear()

    def alloc(self, plan: PlanNode, r: int) -> float:
        """What ``plan`` holds of resource ``r`` once this cycle's promises are kept."""
        d = self.promised.get(plan.path)
        return plan.alloc[r] + (d[r] if d else 0)

    def pool_room(self, w: tuple, count: int) -> float:
        """gang_room of the pool, remembered until the pool changes (a claim or a victim):
        most reclaimers of a busy tick ask about the same few shapes."""
        key = (w, count)
        room = self._rooms.get(key)
        if room is None:
            room = self._rooms[key] = gang_room(self.pool, w, count)
        return room

    def within_totals(self, need: list, extra: list | None = None) -> bool:
        """``need`` fits in free plus incoming capacity (plus ``extra``), every resource."""
        tf, ti = self.total_free, self.total_incoming
        if extra is None:
            return all(need[r] <= tf[r] + ti[r] for r in range(3))
        return all(need[r] <= tf[r] + ti[r] + extra[r] for r in range(3))

    def claim_amount(self, need: list) -> None:
        """Reclaim 2: capacity on its way covers ``need``; take it from the total on its way
        without saying on which nodes (where it lands is checked when it has landed)."""
        for r in range(3):
            self.total_incoming[r] -= need[r]

    def claim(self, placement: list[int], w: tuple, leaf: PlanNode) -> None:
        """Reclaim 2: hold what the reclaimer will use on ``placement``, free capacity first,
        then what is being released: not free for growth or another reclaimer this cycle."""
        self._rooms.clear()
        self.touched.update(placement)
        free, incoming, pool = self.free, self.incoming, self.pool
        tf, ti = self.total_free, self.total_incoming
        for i in placement:
            row, inc, room = free[i], incoming[i], pool[i]
            for r in range(3):
                from_free = max(0, min(row[r], w[r]))
                from_incoming = min(inc[r], w[r] - from_free)
                row[r] -= from_free
                inc[r] -= from_incoming
                room[r] -= from_free + from_incoming
                tf[r] -= from_free
                ti[r] -= from_incoming
        self._promise(leaf, w, len(placement))

    def _promise(self, leaf: PlanNode, w: tuple, count: int) -> None:
        d = self.promised.setdefault
        for p in leaf.chain:
            dp = d(p.path, [0.0, 0.0, 0.0])
            for r in range(3):
                dp[r] += w[r] * count

    def release(self) -> Release:
        """A tentative set of victims' releases, for one reclaimer's search."""
        return Release(self)


class Release:
    """What a reclaim's victims would let go, tentatively (Volcano's Statement): each step is
    ``(victim, its leaf, node indexes released)``. ``covers`` and ``room`` answer what the
    capacity would be if the steps were taken; ``commit`` takes them, and a Release that is
    never committed changes nothing."""

    __slots__ = ("ledger", "steps", "gained")

    def __init__(self, ledger: Ledger, steps: list[tuple] = ()) -> None:
        self.ledger = ledger
        self.steps: list[tuple] = []
        self.gained = [0.0, 0.0, 0.0]  # what the steps release, every resource
        for step in steps:
            self.add(step)

    def add(self, step: tuple) -> None:
        victim, _, nodes = step
        for r in range(3):
            self.gained[r] += victim.per_worker[r] * len(nodes)
        self.steps.append(step)

    def without(self, step: tuple) -> Release:
        return Release(self.ledger, [s for s in self.steps if s is not step])

    def covers(self, w: tuple, count: int) -> bool:
        """In total, what is free, what is on its way and not promised yet, and what the steps
        would release cover ``count`` workers (the resources the worker asks for). A claim by
        amount takes from the totals alone, so the per-node pool by itself could promise the
        same released capacity twice."""
        ledger = self.ledger
        for r in range(3):
            if w[r]:
                have = ledger.total_free[r] + ledger.total_incoming[r]
                have += sum(v.per_worker[r] * len(nodes) for v, _, nodes in self.steps)
                if w[r] * count > have + EPS:
                    return False
        return True

    def room(self, w: tuple, count: int, base: float) -> float:
        """gang_room of the pool once the steps let go; ``base`` is the pool's own room. Only
        the nodes the victims free are recounted, so a step costs its victims, not the nodes."""
        pool = self.ledger.pool
        touched: dict[int, list] = {}
        for victim, _, nodes in self.steps:
            vw = victim.per_worker
            for i in nodes:
                row = touched.get(i)
                if row is None:
                    row = touched[i] = pool[i][:]
                row[0] += vw[0]
                row[1] += vw[1]
                row[2] += vw[2]
        for i, row in touched.items():
            base += min(fit_count(row, w), count) - min(fit_count(pool[i], w), count)
        return base

    def merged(self) -> Release:
        """Shrink steps and a later stop of the same job become the stop alone."""
        out: dict[str, tuple] = {}
        for victim, vleaf, nodes in self.steps:
            if victim.id in out and len(nodes) == victim.workers:
                out[victim.id] = (victim, vleaf, list(nodes))
            elif victim.id in out:
                v, vl, have = out[victim.id]
                if len(have) < victim.workers:
                    out[victim.id] = (v, vl, have + list(nodes))
            else:
                out[victim.id] = (victim, vleaf, list(nodes))
        return Release(self.ledger, list(out.values()))

    def commit(self) -> None:
        """Take the steps: a victim's released workers are incoming (free after its grace
        period, like any terminating job's) and its plans' allocation is promised down."""
        ledger = self.ledger
        ledger.pool_changed()
        incoming, pool, ti = ledger.incoming, ledger.pool, ledger.total_incoming
        for victim, vleaf, nodes in self.steps:
            ledger.touched.update(nodes)
            count = len(nodes)
            vw = victim.per_worker
            for i in nodes:
                for r in range(3):
                    incoming[i][r] += vw[r]
                    ti[r] += vw[r]
                    pool[i][r] += vw[r]
            for p in vleaf.chain:
                d = ledger.promised.setdefault(p.path, [0.0, 0.0, 0.0])
                for r in range(3):
                    d[r] -= victim.per_worker[r] * count
