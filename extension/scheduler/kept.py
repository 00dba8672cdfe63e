"""What a cycle derives from its pending jobs and keeps for the next cycle on the same index
(docs/scheduling.md "Cost": waiting reasons as changes).

A busy cluster's pending jobs barely change from one cycle to the next, yet every cycle lists
each of them with its reason (``CycleResult.waiting``): at 100,000 pending, reading every
job's id in bucket order (random in memory) and hashing it into a dict was most of a settled
cycle. ``WaitingKept`` keeps, per shape, the buckets' contents it last listed with the dict
it made of them; a shape whose buckets hold the same jobs in the same order with the same
reason reuses its dict, so an unchanged cycle costs one pass comparing references (no job is
read) and one copy of a dict.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import compress, count
from operator import attrgetter, itemgetter, ne

from .model import Job
from .placement import FitIndex

_id_of = attrgetter("id")
KEPT_SHAPES = 8  # fit indexes kept between cycles at most (FitCarry)


class ShapeReasons:
    """One shape's waiting jobs as last listed: copies of its buckets (in the order listed),
    the reason every one of them got, and the dict job id -> that reason."""

    __slots__ = ("parts", "reason", "ids")

    def __init__(self, parts: list[list[Job]], reason: str) -> None:
        ids: list[str] = []
        for jobs in parts:
            ids += map(_id_of, jobs)
        self.parts = [jobs[:] for jobs in parts]
        self.reason = reason
        self.ids = dict.fromkeys(ids, reason)

    def holds(self, parts: list[list[Job]], reason: str) -> bool:
        """The same jobs in the same order with the same reason. Lists compare their items by
        identity first, so an unchanged bucket is compared without reading its jobs; an item
        that is another but equal Job (every field, the id too) lists the same."""
        return reason == self.reason and parts == self.parts


class WaitingKept:
    """Capacity reasons per shape, kept between cycles on one plan index."""

    __slots__ = ("shapes", "merged")

    def __init__(self) -> None:
        self.shapes: dict[tuple, ShapeReasons] = {}
        self.merged: dict[str, str] = {}  # every shape's dict, in shape order

    def reasons(
        self, groups: dict[tuple, list[list[Job]]], reason_of: Callable[[tuple, int], str]
    ) -> dict[str, str]:
        """Job id -> reason for every job of ``groups`` ((worker, count) -> its buckets, in
        the order to list them), shape after shape; ``reason_of(worker, count)`` says why a
        job of that shape waits. The answer is the kept dict itself: copy it before writing."""
        kept, shapes = self.shapes, {}
        same = len(groups) == len(kept)
        for shape, parts in groups.items():
            reason = reason_of(*shape)
            old = kept.get(shape)
            if old is None or not old.holds(parts, reason):
                old, same = ShapeReasons(parts, reason), False
            shapes[shape] = old
        if same and list(shapes) == list(kept):
            return self.merged
        merged: dict[str, str] = {}
        for one in shapes.values():
            merged.update(one.ids)
        self.shapes, self.merged = shapes, merged
        return merged


class SortedKept:
    """Buckets as they were last sorted into the order inside a leaf (``admit.in_order``),
    kept from one cycle to the next: a bucket that holds the jobs it held then, in the same
    intake order, is put in the order it was sorted into then without reading a job (lists
    compare their items by identity first; an item that is another but equal Job, every field
    alike, sorts alike). Every sort of a bucket goes through here, so the buckets one cycle
    sorted are known to the next (``unsort``). What one cycle sorted is kept for the next
    one only."""

    __slots__ = ("last", "now")

    def __init__(self) -> None:
        # id(bucket) -> [bucket, its jobs in intake order, sorted, where each came from]; the
        # bucket is held, so its id names it for as long as the entry lives
        self.last: dict[int, list] = {}
        self.now: dict[int, list] = {}

    def sort(self, jobs: list[Job], order: Callable[[list[Job]], None]) -> None:
        """Put ``jobs`` (two or more) in the order ``order`` sorts them into (in place)."""
        key = id(jobs)
        kept = self.now.get(key) or self.last.get(key)
        if kept is not None and kept[0] is jobs:
            _, before, after, moves = kept
            # the first items first: another order compares no two jobs field by field
            if jobs[0] is before[0] and jobs == before:
                before[:] = jobs  # these very jobs, for ``unsort``
                jobs[:] = itemgetter(*moves)(jobs)  # its own jobs, however alike
                self.now[key] = kept
                return
            if jobs[0] is after[0] and jobs == after:  # sorted already this cycle
                self.now[key] = kept
                return
        before = jobs[:]
        order(jobs)
        at = {id(job): i for i, job in enumerate(before)}
        self.now[key] = [jobs, before, jobs[:], [at[id(job)] for job in jobs]]

    def next_cycle(self) -> None:
        self.last, self.now = self.now, {}

    def unsort(self) -> None:
        """Every bucket the last cycle sorted back in its intake order of then (intake.Kept:
        the same jobs again)."""
        for bucket, before, _, _ in self.last.values():
            if bucket[0] is not before[0] or bucket != before:
                bucket[:] = before


class FitCarry:
    """The fit indexes (placement.FitIndex) of the worker shapes admission used, kept for the
    next cycles on the same index: building one is a Python pass over every node per shape and
    cycle (a third of the Philly month's core), while from one instant to the next few nodes'
    free rows change. Admission changes the index it is handed in step with its takes and
    reserves; what changes the rows after that (reclaim's claims, growth, a victim's release, a
    rewind) is in the ledger's ``touched``, which each ``begin`` keeps for the next. So each
    ``begin`` brings every kept index up to this cycle's rows by the nodes hold changed and the
    nodes the last cycle wrote on, and ``index`` by the nodes written since hold. The
    ``KEPT_SHAPES`` shapes asked for last are kept: users' shapes are many, each index is a row
    per node and is brought up every cycle."""

    __slots__ = ("rows", "kept", "recent", "written")

    def __init__(self) -> None:
        self.rows: list | None = None  # the flat free rows after hold, three numbers a node
        self.kept: dict[tuple, FitIndex] = {}
        self.recent: dict[tuple, None] = {}  # the kept shapes, the last asked last
        self.written: Iterable[int] = ()  # the last ledger's touched: rows written after hold

    def begin(
        self, rows: list, changed: Iterable[int] | None = None, touched: Iterable[int] = ()
    ) -> None:
        """After ``hold``: ``rows`` is the free rows flattened (``Ledger.mark``); ``changed``, when
        hold knows them, the nodes whose rows may differ from the last ``begin``'s (else the
        rows are compared); ``touched``, the set the ledger adds the nodes it writes on to
        from here (kept for the next ``begin``)."""
        last, kept = self.rows, self.kept
        if len(self.recent) > KEPT_SHAPES:
            self.recent = dict.fromkeys(list(self.recent)[-KEPT_SHAPES:])
            for w in [w for w in kept if w not in self.recent]:
                del kept[w]
        if last is None or len(last) != len(rows):
            kept.clear()
            self.recent.clear()
        elif kept:
            if changed is None:
                changed = compress(count(), map(ne, rows, last))
                changed = dict.fromkeys(k // 3 for k in changed)
            nodes = set(changed)
            nodes.update(self.written)
            for index in kept.values():
                for i in nodes:
                    index.update(i)
        self.written = touched
        self.rows = rows

    def index(self, w: tuple, free: list, names: Sequence[str], touched: Iterable[int]) -> FitIndex:
        """The fit index of ``w`` over ``free`` as it is now, for admission to change in step
        with the rows: ``touched`` are the nodes whose rows were written since ``hold``."""
        recent = self.recent
        recent.pop(w, None)
        recent[w] = None
        index = self.kept.get(w)
        if index is None:
            index = self.kept[w] = FitIndex(free, names, w)
            return index
        for i in touched:
            index.update(i)
        return index
