"""Exact step functions of time over (gpu, cpu, memory), with downsampling of old history.

Everything is integer arithmetic so that resource-hours are exact and the sum of the leaves is
*equal* (not close) to their parent at every time and over every range:

- time is integer **milliseconds** since the epoch;
- a value is a triple of ints: gpu in **milli-devices**, cpu in **millicores**, memory in **bytes**
  (the core's units, with the GPU scaled by 1000 so fractional devices stay exact);
- an integral is a triple of ints in unit x milliseconds.

A ``StepSeries`` holds two regions. From its ``horizon`` on, every change point is kept (full
resolution): ``times``, the value from each time on, and the cumulative integral up to each time,
so the integral over any range is two binary searches. Before the horizon only each bucket's
integral is kept (``bucket`` ms wide), and only where it differs from the bucket before (a run of
equal buckets, such as a month of idleness, is one entry): integrals between bucket boundaries
stay exact; a range edge that falls inside an old bucket is apportioned linearly (as an exact
``Fraction``, so additivity still holds). ``compact(horizon)`` moves the horizon forward and
``trim(cutoff)`` forgets what is older than the retention; every series of one ledger is
compacted to the same horizon on the same grid.

Full resolution costs memory in the number of changes, so in the number of jobs run within the
window (docs/service.md "Memory over 100,000 jobs"): only the newest ``HOT`` to ``HOT + CHUNK``
points are kept as Python objects; older ones are sealed, ``CHUNK`` at a time, into a
``_Chunk``: the times, the values and the integrals from the chunk's first point as 64-bit
columns, compressed, and the integral up to that first point as exact ints (a chunk whose
integrals would not fit in 64 bits keeps values only and sums them when read; one whose values
would not fit is not sealed). A change that arrives later than the newest points unseals the
chunks after it first; a read opens the chunk it needs (the last ``OPENED`` are kept open). The
chunks' bytes are kept in blocks (``blocks.py``): in memory, or in the service's spill file.
"""

from __future__ import annotations

import zlib
from array import array
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from fractions import Fraction
from itertools import accumulate
from operator import mul

from .blocks import MEMORY, Block, Blocks

Vec = tuple[int, int, int]
ZERO: Vec = (0, 0, 0)


def add(a: Vec, b: Vec) -> Vec:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


def sub(a: Vec, b: Vec) -> Vec:
    return (a[0] - b[0], a[1] - b[1], a[2] - b[2])


def scale(a: Vec, k: int) -> Vec:
    return (a[0] * k, a[1] * k, a[2] * k)


HOT = 64  # the newest points kept as Python objects (late changes land among them)
CHUNK = 128  # points sealed into one chunk at a time
OPENED = 64  # chunks kept open for reading (about 7 KB each)
Points = tuple[list[int], list[Vec], list[Vec]]  # times, values, integrals up to each time


class _Chunk:
    """``n`` full-resolution points, sealed (the first one's time is also the series'
    ``firsts`` entry): the integral up to the first, then the times, values and integrals from
    the first as int64 columns, compressed."""

    __slots__ = ("n", "block", "at", "size")

    def __init__(self, n: int, data: bytes, blocks: Blocks) -> None:
        placed = blocks.put(data)
        self.n, self.size = n, len(data)
        self.block: Block = placed.block
        self.at = placed.at

    def __del__(self) -> None:
        block = getattr(self, "block", None)  # None: its bytes were never written
        if block is not None:
            block.release()

    @property
    def data(self) -> bytes | memoryview:
        return self.block.read(self.at, self.size)

    @classmethod
    def of(cls, times: list[int], values: list[Vec], cum0: Vec, blocks: Blocks) -> _Chunk | None:
        """The chunk of these points (None: a figure beyond 64 bits, kept as it is)."""
        columns = list(times)
        for r in range(3):
            columns += [v[r] for v in values]
        head = ",".join(map(str, cum0)).encode() + b";"  # exact whatever its size
        # the integral up to each point from the first, so that a read finds it in one look
        for r in range(3):
            columns += accumulate(
                (v[r] * (b - a) for v, a, b in zip(values, times, times[1:])), initial=0
            )
        for width in (7, 4):  # without the integrals if they overflow
            try:
                packed = array("q", columns[: width * len(times)]).tobytes()
            except OverflowError:
                continue
            return cls(len(times), zlib.compress(head + packed, 6), blocks)
        return None

    def points(self) -> Points:
        """The points, decoded (new lists)."""
        opened = _Open(self)
        times, values = list(opened.times), list(zip(*opened.columns))
        if opened.cum:
            return times, values, [opened.integral(k, t) for k, t in enumerate(times)]
        g, c, m = opened.cum0
        cum = [(g, c, m)]
        for i in range(1, self.n):
            (vg, vc, vm), dt = values[i - 1], times[i] - times[i - 1]
            g, c, m = g + vg * dt, c + vc * dt, m + vm * dt
            cum.append((g, c, m))
        return times, values, cum


class _Open:
    """A sealed chunk opened for reading: its times, value columns and integral columns (or,
    for figures too big for those, each integral summed when asked for)."""

    __slots__ = ("times", "columns", "cum0", "cum")

    def __init__(self, chunk: _Chunk) -> None:
        head, _, packed = zlib.decompress(chunk.data).partition(b";")
        columns = array("q")
        columns.frombytes(packed)
        n = chunk.n
        self.times = columns[:n]
        self.columns = [columns[n * r : n * (r + 1)] for r in (1, 2, 3)]
        self.cum = [columns[n * r : n * (r + 1)] for r in (4, 5, 6) if len(columns) == 7 * n]
        g, c, m = (int(x) for x in head.split(b","))
        self.cum0 = (g, c, m)

    def value(self, k: int) -> Vec:
        g, c, m = self.columns
        return (g[k], c[k], m[k])

    def integral(self, k: int, t: int) -> Vec:
        """The integral up to ``t``, from point ``k`` (the last at or before it)."""
        dt = t - self.times[k]
        g, c, m = self.columns
        if self.cum:
            cg, cc, cm = self.cum
            g0, c0, m0 = self.cum0
            return (g0 + cg[k] + g[k] * dt, c0 + cc[k] + c[k] * dt, m0 + cm[k] + m[k] * dt)
        times = self.times
        steps = [b - a for a, b in zip(times[:k], times[1 : k + 1])]
        g, c, m = (
            c0 + sum(map(mul, column[:k], steps)) + column[k] * dt
            for column, c0 in zip(self.columns, self.cum0)
        )
        return (g, c, m)


class _Newest:
    """The newest points (the series' own lists), read as an ``_Open`` chunk is."""

    __slots__ = ("times", "values", "cum")

    def __init__(self, times: list[int], values: list[Vec], cum: list[Vec]) -> None:
        self.times, self.values, self.cum = times, values, cum

    def value(self, k: int) -> Vec:
        return self.values[k]

    def integral(self, k: int, t: int) -> Vec:
        c, v, dt = self.cum[k], self.values[k], t - self.times[k]
        return (c[0] + v[0] * dt, c[1] + v[1] * dt, c[2] + v[2] * dt)


_opened: OrderedDict[_Chunk, _Open] = OrderedDict()  # the last chunks read, newest last


def _read(chunk: _Chunk) -> _Open:
    """A chunk opened, from the few kept open."""
    found = _opened.get(chunk)
    if found is None:
        found = _opened[chunk] = _Open(chunk)
        while len(_opened) > OPENED:
            _opened.popitem(last=False)
    else:
        _opened.move_to_end(chunk)
    return found


class StepSeries:
    """A right-continuous step function, zero before its first change."""

    __slots__ = (
        "bucket", "old_end", "otimes", "orates", "ocum", "times", "values", "cum", "sealed",
        "firsts", "blocks",
    )  # fmt: skip

    def __init__(self, bucket: int, blocks: Blocks = MEMORY) -> None:
        if bucket <= 0:
            raise ValueError("bucket must be a positive number of milliseconds")
        self.bucket = bucket
        self.blocks = blocks  # where sealed chunks' bytes go
        # downsampled history, before old_end: from otimes[i] (a bucket boundary) on, every
        # bucket's integral is orates[i], until the next entry; ocum[i] is the integral up to
        # otimes[i]. An entry is added only when the per-bucket integral changes, so an idle
        # stretch costs nothing however long it is.
        self.old_end: int | None = None
        self.otimes: list[int] = []
        self.orates: list[Vec] = []
        self.ocum: list[Vec] = []
        # full resolution, from old_end on: the sealed chunks (oldest first; ``firsts``: each
        # one's first time), then the newest points
        self.sealed: list[_Chunk] = []
        self.firsts: list[int] = []
        self.times: list[int] = []
        self.values: list[Vec] = []
        self.cum: list[Vec] = []  # integral up to times[i]

    # -- reading ---------------------------------------------------------------------------------
    @property
    def horizon(self) -> int | None:
        """Start of the full-resolution region (None: nothing was compacted yet)."""
        return self.old_end

    @property
    def points(self) -> int:
        """How many full-resolution change points it keeps, sealed or not."""
        return sum(chunk.n for chunk in self.sealed) + len(self.times)

    def current(self) -> Vec:
        if self.values:
            return self.values[-1]
        return _read(self.sealed[-1]).value(-1) if self.sealed else ZERO

    def _chunk_at(self, t: int) -> int | None:
        """Index of the sealed chunk that holds the last point at or before ``t`` (the first
        chunk when there is none); None: the newest points do."""
        if not self.sealed or (self.times and t >= self.times[0]):
            return None
        return max(0, bisect_right(self.firsts, t) - 1)

    def _lists(self, t: int) -> _Open | _Newest:
        """The full-resolution points around ``t``: a sealed chunk's, or the newest."""
        i = self._chunk_at(t)
        return _Newest(self.times, self.values, self.cum) if i is None else _read(self.sealed[i])

    def _value_and_next(self, t: int) -> tuple[Vec, int | None]:
        """The value in effect at ``t`` and the time of the next change after it (None:
        none)."""
        i = self._chunk_at(t)
        points = self._lists(t)
        times = points.times
        k = bisect_right(times, t) - 1
        v = points.value(k) if k >= 0 else ZERO
        if k + 1 < len(times):
            return v, times[k + 1]
        if i is None:
            return v, None
        following = self.firsts[i + 1] if i + 1 < len(self.sealed) else None
        return v, following if following is not None else (self.times or [None])[0]

    def _old(self, t: int) -> tuple:
        """Integral up to ``t`` inside the downsampled region (exact on bucket boundaries;
        inside a bucket its integral is spread evenly, as an exact Fraction)."""
        k = bisect_right(self.otimes, t) - 1
        if k < 0:  # before what is kept (nothing, or dropped by retention)
            return self.ocum[0] if self.ocum else ZERO
        base, r = self.ocum[k], self.orates[k]
        q, rest = divmod(t - self.otimes[k], self.bucket)
        if rest == 0 or r == ZERO:
            return (base[0] + r[0] * q, base[1] + r[1] * q, base[2] + r[2] * q)
        f = Fraction(t - self.otimes[k], self.bucket)
        return (base[0] + r[0] * f, base[1] + r[1] * f, base[2] + r[2] * f)

    def _points(self, t: int) -> Vec:
        """Integral up to ``t`` from the full-resolution points (``t`` at or after them)."""
        points = self._lists(t)
        k = bisect_right(points.times, t) - 1
        return points.integral(k, t) if k >= 0 else ZERO

    def integral_to(self, t: int) -> tuple:
        """Integral from the beginning of time up to ``t`` (ints, or Fractions inside an old
        bucket)."""
        if self.old_end is not None and t < self.old_end:
            return self._old(t)
        return self._points(t)

    def integrals(self, bounds: list[int]) -> list[tuple]:
        """``integral_to`` at each of ascending ``bounds``."""
        out: list[tuple] = []
        times, values, cum = self.times, self.values, self.cum
        otimes, orates, ocum, bucket = self.otimes, self.orates, self.ocum, self.bucket
        old_end = self.old_end
        # before the newest points: the sealed chunks
        newest = (times[0] if times else bounds[-1] + 1) if self.sealed and bounds else None
        k = j = 0
        for t in bounds:
            if newest is not None and t < newest and (old_end is None or t >= old_end):
                out.append(self._points(t))
                continue
            if old_end is not None and t < old_end:
                j = bisect_right(otimes, t, j) - 1
                if j < 0:
                    j = 0
                    out.append(ocum[0] if ocum else ZERO)
                    continue
                base, r = ocum[j], orates[j]
                q, rest = divmod(t - otimes[j], bucket)
                if rest and r != ZERO:  # inside a bucket: spread evenly (rare: off the grid)
                    out.append(self._old(t))
                else:
                    out.append((base[0] + r[0] * q, base[1] + r[1] * q, base[2] + r[2] * q))
                continue
            # a binary search from where the last bound was found: O(log n) per bound
            k = bisect_right(times, t, k) - 1
            if k < 0:
                k = 0
                out.append(ZERO)
                continue
            c, v, dt = cum[k], values[k], t - times[k]
            out.append((c[0] + v[0] * dt, c[1] + v[1] * dt, c[2] + v[2] * dt))
        return out

    # -- writing ---------------------------------------------------------------------------------
    def add_delta(self, t: int, delta: Vec) -> None:
        """The value changes by ``delta`` from time ``t`` on.

        A change before the horizon (history already downsampled) is moved to the horizon: old
        buckets are never rewritten. Changes normally arrive in time order; one that arrives late
        is inserted and the integrals after it are recomputed.
        """
        if delta == ZERO:
            return
        times, values, cum = self.times, self.values, self.cum
        horizon = self.horizon
        if horizon is not None and t < horizon:
            t = horizon
        if self._chunk_at(t) is not None:  # later than sealed points: they are newest again
            self._unseal(t)
        if not times:
            times.append(t)
            values.append(delta)
            cum.append(ZERO)
            return
        last = times[-1]
        if t > last:
            v = values[-1]
            c = cum[-1]
            dt = t - last
            times.append(t)
            cum.append((c[0] + v[0] * dt, c[1] + v[1] * dt, c[2] + v[2] * dt))
            values.append(add(v, delta))
            if len(times) > HOT + CHUNK:
                self._seal()
            return
        if t == last:
            values[-1] = add(values[-1], delta)
            return
        # late: insert (or merge) at t, then shift every later value and recompute integrals
        k = bisect_right(times, t) - 1
        if k >= 0 and times[k] == t:
            i = k
        else:
            i = k + 1
            before = values[k] if k >= 0 else ZERO
            c = cum[k] if k >= 0 else ZERO
            dt = t - times[k] if k >= 0 else 0
            times.insert(i, t)
            values.insert(i, before)
            cum.insert(i, add(c, scale(before, dt)) if k >= 0 else ZERO)
        for j in range(i, len(values)):
            values[j] = add(values[j], delta)
        for j in range(i + 1, len(times)):
            cum[j] = add(cum[j - 1], scale(values[j - 1], times[j] - times[j - 1]))

    def _seal(self) -> None:
        """Seal the oldest of the newest points, ``CHUNK`` at a time, until ``HOT`` to ``HOT +
        CHUNK`` are left."""
        times, values, cum = self.times, self.values, self.cum
        while len(times) > HOT + CHUNK:
            chunk = _Chunk.of(times[:CHUNK], values[:CHUNK], cum[0], self.blocks)
            if chunk is None:
                return
            self.sealed.append(chunk)
            self.firsts.append(times[0])
            del times[:CHUNK], values[:CHUNK], cum[:CHUNK]

    def _unseal(self, t: int) -> None:
        """Make the points from the chunk that holds ``t`` on the newest again (a late change
        shifts every value after it)."""
        i = self._chunk_at(t)
        if i is None:
            return
        for chunk in reversed(self.sealed[i:]):
            times, values, cum = chunk.points()
            self.times[:0], self.values[:0], self.cum[:0] = times, values, cum
        del self.sealed[i:], self.firsts[i:]

    def trim(self, cutoff: int) -> None:
        """Forget downsampled history before ``cutoff`` (retention; on the bucket grid, not past
        the horizon): the integral before what is kept reads as constant, so no range counts
        anything from before ``cutoff``."""
        if not self.otimes or cutoff <= self.otimes[0]:
            return
        if self.old_end is not None:
            cutoff = min(cutoff, self.old_end)
        k = bisect_right(self.otimes, cutoff) - 1
        base = self._old(cutoff)
        self.otimes[k], self.ocum[k] = cutoff, base
        del self.otimes[:k], self.orates[:k], self.ocum[:k]

    def compact(self, horizon: int) -> None:
        """Downsample everything before ``horizon`` (a multiple of ``bucket``)."""
        bucket = self.bucket
        if horizon % bucket:
            raise ValueError("the horizon must lie on the bucket grid")
        current = self.old_end
        if current is not None and horizon <= current:
            return
        first = self.firsts[0] if self.sealed else (self.times or [None])[0]
        if first is None:
            return  # never had a value: nothing to keep
        if current is None:
            if first >= horizon:
                return  # all of it is still recent
            current = first // bucket * bucket
        b = current
        while b < horizon:
            v, nxt = self._value_and_next(b)
            if nxt is None or nxt >= b + bucket:
                # no change inside the next whole buckets: one rate for all of them
                rate = scale(v, bucket)
                end = horizon if nxt is None else min(horizon, nxt // bucket * bucket)
            else:
                rate = sub(self._points(b + bucket), self._points(b))
                end = b + bucket
            if not self.orates or self.orates[-1] != rate:
                self.otimes.append(b)
                self.orates.append(rate)
                self.ocum.append(self._points(b))
            b = end
        self._cut(horizon, self._points(horizon))
        self.old_end = horizon

    def _cut(self, horizon: int, at_horizon: Vec) -> None:
        """Drop the full-resolution points before ``horizon`` but the one in effect there,
        which moves to it (with ``at_horizon``, the integral up to it)."""
        i = self._chunk_at(horizon)
        if i is None:
            times, cum = self.times, self.cum
            k = bisect_right(times, horizon) - 1
            times[k], cum[k] = horizon, at_horizon  # the value in effect at the horizon
            del times[:k], self.values[:k], cum[:k], self.sealed[:], self.firsts[:]
            return
        times, values, _ = self.sealed[i].points()
        k = bisect_right(times, horizon) - 1
        chunk = _Chunk.of([horizon, *times[k + 1 :]], values[k:], at_horizon, self.blocks)
        assert chunk is not None  # its figures were sealed once already
        self.sealed[: i + 1], self.firsts[: i + 1] = [chunk], [horizon]

    # -- reading the change points (usage.py's ``changes``) --------------------------------------
    def _lists_between(self, t0: int, t1: int) -> list[list[int]]:
        """The times of the full-resolution lists that may hold a change in ``(t0, t1)``."""
        lo = max(0, bisect_right(self.firsts, t0) - 1)
        lists = [_read(chunk).times for chunk in self.sealed[lo : bisect_left(self.firsts, t1)]]
        return [*lists, self.times]

    def times_between(self, t0: int, t1: int) -> list[int]:
        """The times of full-resolution changes strictly between ``t0`` and ``t1``."""
        out: list[int] = []
        for times in self._lists_between(t0, t1):
            out += times[bisect_right(times, t0) : bisect_left(times, t1)]
        return out

    def count_between(self, t0: int, t1: int) -> int:
        """How many full-resolution changes lie strictly between ``t0`` and ``t1`` (a sealed
        chunk wholly inside is counted without being read)."""
        n = 0
        firsts = [*self.firsts, self.times[0] if self.times else None]
        lo = max(0, bisect_right(self.firsts, t0) - 1)
        for i in range(lo, bisect_left(self.firsts, t1)):
            following = firsts[i + 1]  # after the chunk's last point
            if firsts[i] > t0 and following is not None and following <= t1:
                n += self.sealed[i].n
            else:
                times = _read(self.sealed[i]).times
                n += bisect_left(times, t1) - bisect_right(times, t0)
        times = self.times
        return n + max(0, bisect_left(times, t1) - bisect_right(times, t0))

    def values_at(self, order: list[int]) -> list[tuple]:
        """The amount from each of ascending ``order`` on (before the horizon: the average of
        the time's bucket)."""
        out: list[tuple] = []
        otimes, orates, old_end, bucket = self.otimes, self.orates, self.old_end, self.bucket
        j = 0
        for t in order:
            if old_end is not None and t < old_end:
                j = bisect_right(otimes, t, j)
                out.append(tuple(v / bucket for v in orates[j - 1]) if j else ZERO)
            else:
                points = self._lists(t)
                k = bisect_right(points.times, t)
                out.append(points.value(k - 1) if k else ZERO)
        return out
