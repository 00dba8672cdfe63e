"""Exact step functions of time over (gpu, cpu, memory), with downsampling of old history.

Everything is integer arithmetic so that resource-hours are exact and the sum of the leaves is
*equal* (not close) to their parent at every time and over every range:

- time is integer **milliseconds** since the epoch;
- a value is a triple of ints: gpu in **milli-devices**, cpu in **millicores**, memory in **bytes**
  (the core's units, with the GPU scaled by 1000 so fractional devices stay exact);
- an integral is a triple of ints in unit x milliseconds.

A ``StepSeries`` holds two regions. From its ``horizon`` on, every change point is kept (full
resolution): ``times``, the value from each time on, and the cumulative integral up to each time,
so the integral over any range is two binary searches. Before the horizon only the cumulative
integral at every bucket boundary is kept (``bucket`` ms apart): integrals between bucket
boundaries stay exact; a range edge that falls inside an old bucket is apportioned linearly
(as an exact ``Fraction``, so additivity still holds). ``compact(horizon)`` moves the horizon
forward; every series of one ledger is compacted to the same horizon on the same grid.
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

    __slots__ = ("bucket", "b0", "bcum", "times", "values", "cum")

    def __init__(self, bucket: int) -> None:
        if bucket <= 0:
            raise ValueError("bucket must be a positive number of milliseconds")
        self.bucket = bucket
        self.b0 = 0  # index of the first bucket boundary in bcum
        self.bcum: list[Vec] = []  # integral up to boundary (b0 + j) * bucket
        self.times: list[int] = []
        self.values: list[Vec] = []
        self.cum: list[Vec] = []  # integral up to times[i]

    # -- reading ---------------------------------------------------------------------------------
    @property
    def horizon(self) -> int | None:
        """Start of the full-resolution region (None: nothing was compacted yet)."""
        if not self.bcum:
            return None
        return (self.b0 + len(self.bcum) - 1) * self.bucket

    def current(self) -> Vec:
        return self.values[-1] if self.values else ZERO

    def integral_to(self, t: int) -> tuple:
        """Integral from the beginning of time up to ``t`` (ints, or Fractions inside an old
        bucket)."""
        horizon = self.horizon
        if horizon is not None and t < horizon:
            origin = self.b0 * self.bucket
            if t <= origin:  # before what is kept (zero, or dropped by retention)
                return self.bcum[0]
            j, rest = divmod(t - origin, self.bucket)
            low = self.bcum[j]
            if rest == 0:
                return low
            d = sub(self.bcum[j + 1], low)
            f = Fraction(rest, self.bucket)
            return (low[0] + d[0] * f, low[1] + d[1] * f, low[2] + d[2] * f)
        times = self.times
        k = bisect_right(times, t) - 1
        if k < 0:
            return ZERO
        c, v, dt = self.cum[k], self.values[k], t - times[k]
        return (c[0] + v[0] * dt, c[1] + v[1] * dt, c[2] + v[2] * dt)

    def integrals(self, bounds: list[int]) -> list[tuple]:
        """``integral_to`` at each of ascending ``bounds``."""
        out: list[tuple] = []
        times, values, cum = self.times, self.values, self.cum
        horizon = self.horizon
        bucket, bcum = self.bucket, self.bcum
        origin = self.b0 * bucket
        k = 0
        for t in bounds:
            if horizon is not None and t < horizon:
                j, rest = divmod(t - origin, bucket)
                if rest == 0 and j >= 0:  # on the grid: read it off
                    out.append(bcum[j])
                else:
                    out.append(self.integral_to(t))
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
        """Forget the buckets before ``cutoff`` (retention); the integral before what is kept
        reads as constant, so no range counts anything from before ``cutoff``."""
        if not self.bcum:
            return
        drop = min((cutoff - self.b0 * self.bucket) // self.bucket, len(self.bcum) - 1)
        if drop > 0:
            del self.bcum[:drop]
            self.b0 += drop

    def compact(self, horizon: int) -> None:
        """Keep only bucket integrals before ``horizon`` (a multiple of ``bucket``)."""
        if horizon % self.bucket:
            raise ValueError("the horizon must lie on the bucket grid")
        current = self.horizon
        if current is not None and horizon <= current:
            return
        if not self.times:
            return  # never had a value: nothing to keep
        if current is None:
            if self.times[0] >= horizon:
                return  # all of it is still recent
            self.b0 = self.times[0] // self.bucket
            self.bcum = [ZERO]
            current = self.b0 * self.bucket
        boundaries = list(range(current + self.bucket, horizon + 1, self.bucket))
        self.bcum.extend(self.integrals(boundaries))
        k = bisect_right(self.times, horizon) - 1
        if self.times[k] == horizon:
            keep = k
        else:
            self.times[k] = horizon
            self.cum[k] = self.bcum[-1]
            keep = k
        del self.times[:keep], self.values[:keep], self.cum[:keep]
