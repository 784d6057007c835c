"""Interval algebra of the cross-rank analysis: sorted, disjoint, half-open ``[start, end)`` sets of
integer nanoseconds, held as two int64 columns (16 bytes an interval, not a tuple of two ints: what
a rank's reduction holds of its busy time at its peak).

>>> union([(5, 9), (0, 3), (2, 4), (7, 7)])
[(0, 4), (5, 9)]
>>> a, b = iv_of(array("q", [0, 10]), array("q", [5, 20])), iv_of(array("q", [3]), array("q", [12]))
>>> iv_union(a, b).pairs(), iv_overlap(a, b), iv_clip(a, 4, 15).pairs()
([(0, 20)], 4, [(4, 5), (10, 15)])
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterable

__all__ = ["Intervals", "union", "Iv", "iv_of", "iv_union", "iv_overlap", "iv_clip", "Within", "UnionBuilder", "CHUNK"]

Intervals = list[tuple[int, int]]
#: intervals a :class:`UnionBuilder` buffers before it merges them into the union so far
CHUNK = 1 << 16


def union(intervals: Iterable[tuple[int, int]]) -> Intervals:
    """Sorted, disjoint union of half-open intervals ``(start, end)``; empty ones dropped."""
    out: Intervals = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


class Iv:
    """Sorted, disjoint half-open intervals as two int64 columns ``s`` (starts) and ``e`` (ends)."""

    __slots__ = ("s", "e")

    def __init__(self, s: array[int] | None = None, e: array[int] | None = None) -> None:
        self.s = s if s is not None else array("q")
        self.e = e if e is not None else array("q")

    def __len__(self) -> int:
        return len(self.s)

    def length(self) -> int:
        return sum(self.e) - sum(self.s)

    def pairs(self) -> Intervals:
        return list(zip(self.s, self.e))


def iv_of(starts: array[int], ends: array[int]) -> Iv:
    """The union of (unsorted, possibly overlapping, non-empty) intervals."""
    out = Iv()
    os_, oe = out.s, out.e
    for i in sorted(range(len(starts)), key=starts.__getitem__):
        a, b = starts[i], ends[i]
        if oe and a <= oe[-1]:
            if b > oe[-1]:
                oe[-1] = b
        else:
            os_.append(a)
            oe.append(b)
    return out


def iv_union(x: Iv, y: Iv) -> Iv:
    """The union of two sorted disjoint sets, in one merge pass."""
    out = Iv()
    os_, oe = out.s, out.e
    xs, xe, ys, ye = x.s, x.e, y.s, y.e
    i = j = 0
    nx, ny = len(xs), len(ys)
    while i < nx or j < ny:
        if j >= ny or (i < nx and xs[i] <= ys[j]):
            a, b = xs[i], xe[i]
            i += 1
        else:
            a, b = ys[j], ye[j]
            j += 1
        if oe and a <= oe[-1]:
            if b > oe[-1]:
                oe[-1] = b
        else:
            os_.append(a)
            oe.append(b)
    return out


def iv_overlap(x: Iv, y: Iv) -> int:
    """Length of the intersection of two sorted disjoint sets (nothing built)."""
    xs, xe, ys, ye = x.s, x.e, y.s, y.e
    i = j = total = 0
    nx, ny = len(xs), len(ys)
    while i < nx and j < ny:
        a = xs[i] if xs[i] > ys[j] else ys[j]
        b = xe[i] if xe[i] < ye[j] else ye[j]
        if a < b:
            total += b - a
        if xe[i] < ye[j]:
            i += 1
        else:
            j += 1
    return total


def iv_clip(u: Iv, lo: int, hi: int) -> Iv:
    """The part of ``u`` inside ``[lo, hi)`` (``u`` itself when all of it is inside: no copy)."""
    if hi <= lo:
        return Iv()
    if not u.s or (u.s[0] >= lo and u.e[-1] <= hi):
        return u
    i = max(0, bisect.bisect_right(u.s, lo) - 1)
    out = Iv()
    while i < len(u.s) and u.s[i] < hi:
        a, b = max(u.s[i], lo), min(u.e[i], hi)
        if a < b:
            out.s.append(a)
            out.e.append(b)
        i += 1
    return out


class Within:
    """Length of a sorted disjoint union inside a window, found by bisection (per-step figures
    cost O(log n + intervals in the step), not a pass over the whole union per step)."""

    __slots__ = ("u",)

    def __init__(self, u: Iv) -> None:
        self.u = u

    def length(self, lo: int, hi: int) -> int:
        s, e = self.u.s, self.u.e
        i = max(0, bisect.bisect_right(s, lo) - 1)
        total = 0
        while i < len(s) and s[i] < hi:
            a, b = s[i], e[i]
            if b > lo:
                total += min(b, hi) - max(a, lo)
            i += 1
        return total


class UnionBuilder:
    """A union of intervals built as they stream in (any order): a buffer of two int64 columns,
    merged every :data:`CHUNK` intervals, so memory follows the number of disjoint busy stretches,
    not of events. ``lo``/``hi``: the first start and last end of every interval added, empty ones
    included."""

    __slots__ = ("merged", "bs", "be", "lo", "hi")

    def __init__(self) -> None:
        self.merged = Iv()
        self.bs = array("q")
        self.be = array("q")
        self.lo: int | None = None
        self.hi: int | None = None

    def add(self, a: int, b: int) -> None:
        if self.lo is None or a < self.lo:
            self.lo = a
        if self.hi is None or b > self.hi:
            self.hi = b
        if b > a:
            self.bs.append(a)
            self.be.append(b)
            if len(self.bs) >= CHUNK:
                self._flush()

    def _flush(self) -> None:
        self.merged = iv_union(self.merged, iv_of(self.bs, self.be))
        self.bs = array("q")
        self.be = array("q")

    def result(self) -> Iv:
        if self.bs:
            self._flush()
        return self.merged
