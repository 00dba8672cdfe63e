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
"""

from __future__ import annotations

from bisect import bisect_right
from fractions import Fraction

Vec = tuple[int, int, int]
ZERO: Vec = (0, 0, 0)


def add(a: Vec, b: Vec) -> Vec:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2])


def sub(a: Vec, b: Vec) -> Vec:
    return (a[0] - b[0], a[1] - b[1], a[2] - b[2])


def scale(a: Vec, k: int) -> Vec:
    return (a[0] * k, a[1] * k, a[2] * k)


class StepSeries:
    """A right-continuous step function, zero before its first change."""

    __slots__ = ("bucket", "old_end", "otimes", "orates", "ocum", "times", "values", "cum")

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
        # full resolution, from old_end on
        self.times: list[int] = []
        self.values: list[Vec] = []
        self.cum: list[Vec] = []  # integral up to times[i]

    # -- reading ---------------------------------------------------------------------------------
    @property
    def horizon(self) -> int | None:
        """Start of the full-resolution region (None: nothing was compacted yet)."""
        return self.old_end

    def current(self) -> Vec:
        return self.values[-1] if self.values else ZERO

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
        k = bisect_right(self.times, t) - 1
        if k < 0:
            return ZERO
        c, v, dt = self.cum[k], self.values[k], t - self.times[k]
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
        k = j = 0
        for t in bounds:
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
        times, values = self.times, self.values
        if not times:
            return  # never had a value: nothing to keep
        if current is None:
            if times[0] >= horizon:
                return  # all of it is still recent
            current = times[0] // bucket * bucket
        n = len(times)
        b = current
        while b < horizon:
            k = bisect_right(times, b) - 1
            nxt = times[k + 1] if k + 1 < n else None
            if nxt is None or nxt >= b + bucket:
                # no change inside the next whole buckets: one rate for all of them
                v = values[k] if k >= 0 else ZERO
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
        at_horizon = self._points(horizon)
        k = bisect_right(times, horizon) - 1
        times[k], self.cum[k] = horizon, at_horizon  # the value in effect at the horizon
        del times[:k], values[:k], self.cum[:k]
        self.old_end = horizon
