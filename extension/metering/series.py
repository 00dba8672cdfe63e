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
``_Chunk``: the times and values as delta-coded 64-bit columns, compressed (the integrals are
recomputed from the values when a chunk is read, so they stay exact ints). A change that
arrives later than the newest points unseals the chunks after it first; a read decodes the
chunk it needs (the last few decoded are kept).
"""

from __future__ import annotations

import zlib
from array import array
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from fractions import Fraction
from itertools import accumulate

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
DECODED = 8  # decoded chunks kept for reading
Points = tuple[list[int], list[Vec], list[Vec]]  # times, values, integrals up to each time


class _Chunk:
    """``n`` full-resolution points, sealed (the first one's time is the series' ``firsts``
    entry): the integral up to the first, then the times and values as delta-coded int64
    columns, compressed (the other integrals follow from the values)."""

    __slots__ = ("n", "data")

    def __init__(self, n: int, data: bytes) -> None:
        self.n, self.data = n, data

    @classmethod
    def of(cls, times: list[int], values: list[Vec], cum0: Vec) -> _Chunk | None:
        """The chunk of these points (None: a figure beyond 64 bits, kept as it is)."""
        columns = [t - p for p, t in zip([0, *times], times)]
        for r in range(3):
            column = [v[r] for v in values]
            columns += [v - p for p, v in zip([0, *column], column)]
        try:
            packed = array("q", columns).tobytes()
        except OverflowError:
            return None
        head = ",".join(map(str, cum0)).encode() + b";"  # exact whatever its size
        return cls(len(times), zlib.compress(head + packed, 1))

    def points(self) -> Points:
        """The points, decoded (new lists)."""
        head, _, packed = zlib.decompress(self.data).partition(b";")
        columns = array("q")
        columns.frombytes(packed)
        n = self.n
        times, gpu, cpu, mem = (list(accumulate(columns[n * r : n * (r + 1)])) for r in range(4))
        values = list(zip(gpu, cpu, mem))
        g, c, m = (int(x) for x in head.split(b","))
        cum = [(g, c, m)]
        for i in range(1, n):
            (vg, vc, vm), dt = values[i - 1], times[i] - times[i - 1]
            g, c, m = g + vg * dt, c + vc * dt, m + vm * dt
            cum.append((g, c, m))
        return times, values, cum


_decoded: OrderedDict[_Chunk, Points] = OrderedDict()  # the last chunks read, newest last


def _read(chunk: _Chunk) -> Points:
    """A chunk's points, from the few kept decoded (callers must not change them)."""
    found = _decoded.get(chunk)
    if found is None:
        found = _decoded[chunk] = chunk.points()
        while len(_decoded) > DECODED:
            _decoded.popitem(last=False)
    else:
        _decoded.move_to_end(chunk)
    return found


class StepSeries:
    """A right-continuous step function, zero before its first change."""

    __slots__ = (
        "bucket", "old_end", "otimes", "orates", "ocum", "times", "values", "cum", "sealed",
        "firsts",
    )  # fmt: skip

    def __init__(self, bucket: int) -> None:
        if bucket <= 0:
            raise ValueError("bucket must be a positive number of milliseconds")
        self.bucket = bucket
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

    def current(self) -> Vec:
        if self.values:
            return self.values[-1]
        return _read(self.sealed[-1])[1][-1] if self.sealed else ZERO

    def _chunk_at(self, t: int) -> int | None:
        """Index of the sealed chunk that holds the last point at or before ``t`` (the first
        chunk when there is none); None: the newest points do."""
        if not self.sealed or (self.times and t >= self.times[0]):
            return None
        return max(0, bisect_right(self.firsts, t) - 1)

    def _lists(self, t: int) -> Points:
        """The full-resolution points around ``t``: a sealed chunk's, or the newest."""
        i = self._chunk_at(t)
        return (self.times, self.values, self.cum) if i is None else _read(self.sealed[i])

    def _value_and_next(self, t: int) -> tuple[Vec, int | None]:
        """The value in effect at ``t`` and the time of the next change after it (None:
        none)."""
        i = self._chunk_at(t)
        times, values, _ = self._lists(t)
        k = bisect_right(times, t) - 1
        v = values[k] if k >= 0 else ZERO
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
        times, values, cum = self._lists(t)
        k = bisect_right(times, t) - 1
        if k < 0:
            return ZERO
        c, v, dt = cum[k], values[k], t - times[k]
        return (c[0] + v[0] * dt, c[1] + v[1] * dt, c[2] + v[2] * dt)

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
            chunk = _Chunk.of(times[:CHUNK], values[:CHUNK], cum[0])
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
        times, values, _ = _read(self.sealed[i])
        k = bisect_right(times, horizon) - 1
        chunk = _Chunk.of([horizon, *times[k + 1 :]], values[k:], at_horizon)
        assert chunk is not None  # its figures were sealed once already
        self.sealed[: i + 1], self.firsts[: i + 1] = [chunk], [horizon]

    # -- reading the change points (usage.py's ``changes``) --------------------------------------
    def _lists_between(self, t0: int, t1: int) -> list[list[int]]:
        """The times of the full-resolution lists that may hold a change in ``(t0, t1)``."""
        lo = max(0, bisect_right(self.firsts, t0) - 1)
        lists = [_read(chunk)[0] for chunk in self.sealed[lo : bisect_left(self.firsts, t1)]]
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
                times = _read(self.sealed[i])[0]
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
                times, values, _ = self._lists(t)
                k = bisect_right(times, t)
                out.append(values[k - 1] if k else ZERO)
        return out
