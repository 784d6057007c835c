"""A fixed-size, mergeable summary of a set of durations: exact count, total, min and max; quantiles
exact while the set has few distinct values, else within a stated relative error.

:class:`DurationSketch` keeps every distinct duration with its count while there are at most
:data:`EXACT_VALUES` of them (its quantiles are then exact: the same as over the raw values). Past
that it switches, once and for good, to log-spaced buckets: bucket ``j`` holds the durations in
``(GAMMA**(j-1), GAMMA**j]`` ns, with ``GAMMA = (1 + RELATIVE_ERROR) / (1 - RELATIVE_ERROR)``, and
stands for ``2 * GAMMA**j / (GAMMA + 1)``, which is within ``RELATIVE_ERROR`` (1 %) of every
duration in it. A positive int64 needs at most 2,200 buckets, so a sketch never holds more than
that many (bucket, count) pairs whatever the number of durations: nothing is ever dropped or
collapsed. Durations <= 0 share one bucket that stands for 0.

Quantiles interpolate linearly between the two order statistics around the position
``q * (count - 1)``, as numpy's default method does; each order statistic is known to within
``RELATIVE_ERROR`` (and clamped to the exact min and max), so the interpolated quantile is within
``RELATIVE_ERROR`` of numpy's over the raw durations (plus 0.5 ns of rounding to integer ns).

Two sketches merge into the sketch of the union of their durations (the same error bound holds).

.. versionadded:: 0.2
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable

import attrs

__all__ = ["DurationSketch", "RELATIVE_ERROR", "EXACT_VALUES", "GAMMA", "bucket_of"]

#: the relative error of a quantile once a sketch holds buckets (an exact sketch has none)
RELATIVE_ERROR = 0.01
#: distinct durations kept exactly before a sketch switches to buckets
EXACT_VALUES = 1024
GAMMA = (1 + RELATIVE_ERROR) / (1 - RELATIVE_ERROR)
_LN_GAMMA = math.log(GAMMA)
# the bucket of durations <= 0 (bucket 0 holds (1/GAMMA, 1] ns: a duration >= 1 ns is in a bucket >= 0)
_NONPOSITIVE = -1


def bucket_of(d: int) -> int:
    """The bucket a duration (ns) falls in: ``j`` with ``GAMMA**(j-1) < d <= GAMMA**j``."""
    return math.ceil(math.log(d) / _LN_GAMMA) if d > 0 else _NONPOSITIVE


def _bucket_value(j: int) -> float:
    return 0.0 if j == _NONPOSITIVE else 2.0 * GAMMA ** j / (GAMMA + 1.0)


def _to_buckets(keys: Iterable[int], counts: Iterable[int], into: dict[int, int]) -> dict[int, int]:
    for k, c in zip(keys, counts):
        j = bucket_of(k)
        into[j] = into.get(j, 0) + c
    return into


def _frozen(table: dict[int, int]) -> tuple[array[int], array[int]]:
    keys = sorted(table)
    return array("q", keys), array("q", (table[k] for k in keys))


@attrs.frozen
class DurationSketch:
    """Durations (ns) summarised: ``count``, ``total_ns``, ``min_ns``, ``max_ns`` exact; ``keys``
    and ``counts`` (ascending keys) are the distinct durations with their counts when ``exact``,
    else the buckets (see the module docs) with theirs. Build one with :meth:`of`, combine with
    :meth:`merge`, read with :meth:`quantile` / :meth:`stats`."""

    count: int
    total_ns: int
    min_ns: int
    max_ns: int
    exact: bool
    keys: array[int] = attrs.field(factory=lambda: array("q"))
    counts: array[int] = attrs.field(factory=lambda: array("q"))

    @classmethod
    def of(cls, durations_ns: Iterable[int]) -> DurationSketch:
        """The sketch of some durations, in one pass; it never holds more than
        ``max(EXACT_VALUES + 1, buckets)`` entries however many durations there are."""
        exact: dict[int, int] | None = {}
        buckets: dict[int, int] = {}
        n = total = 0
        lo = hi = 0
        for d in durations_ns:
            if n == 0:
                lo = hi = d
            elif d < lo:
                lo = d
            elif d > hi:
                hi = d
            n += 1
            total += d
            if exact is not None:
                exact[d] = exact.get(d, 0) + 1
                if len(exact) > EXACT_VALUES:
                    _to_buckets(exact.keys(), exact.values(), buckets)
                    exact = None
            else:
                j = math.ceil(math.log(d) / _LN_GAMMA) if d > 0 else _NONPOSITIVE
                buckets[j] = buckets.get(j, 0) + 1
        keys, counts = _frozen(exact if exact is not None else buckets)
        return cls(n, total, lo, hi, exact is not None, keys, counts)

    @property
    def relative_error(self) -> float:
        """The bound on a quantile's relative error: 0 while exact, else :data:`RELATIVE_ERROR`."""
        return 0.0 if self.exact else RELATIVE_ERROR

    def merge(self, other: DurationSketch) -> DurationSketch:
        """The sketch of both sets of durations together."""
        if not other.count:
            return self
        if not self.count:
            return other
        table: dict[int, int] = {}
        exact = self.exact and other.exact
        if exact:
            for k, c in zip(self.keys, self.counts):
                table[k] = c
            for k, c in zip(other.keys, other.counts):
                table[k] = table.get(k, 0) + c
            if len(table) > EXACT_VALUES:
                exact = False
                table = _to_buckets(table.keys(), table.values(), {})
        else:
            for s in (self, other):
                if s.exact:
                    _to_buckets(s.keys, s.counts, table)
                else:
                    for k, c in zip(s.keys, s.counts):
                        table[k] = table.get(k, 0) + c
        keys, counts = _frozen(table)
        return DurationSketch(self.count + other.count, self.total_ns + other.total_ns, min(self.min_ns, other.min_ns),
                              max(self.max_ns, other.max_ns), exact, keys, counts)

    def _values_at(self, ranks: list[int]) -> list[float]:
        """The order statistics at these 0-based ranks (ascending), each exact or within the error."""
        out: list[float] = []
        i = 0
        seen = 0
        for k, c in zip(self.keys, self.counts):
            seen += c
            while i < len(ranks) and ranks[i] < seen:
                v = float(k) if self.exact else _bucket_value(k)
                out.append(min(max(v, self.min_ns), self.max_ns))
                i += 1
            if i == len(ranks):
                break
        return out

    def quantile(self, q: float) -> int:
        """The ``q`` quantile (0..1), interpolated as numpy's default method does, in integer ns."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile {q} is not in [0, 1]")
        if not self.count:
            return 0
        pos = q * (self.count - 1)
        lo = int(pos)
        hi = min(lo + 1, self.count - 1)
        a, b = self._values_at([lo, hi])
        return round(a + (b - a) * (pos - lo))

    def stats(self) -> tuple[int, int, int, int, int]:
        """``(count, median_ns, p90_ns, max_ns, total_ns)``."""
        return (self.count, self.quantile(0.5), self.quantile(0.9), self.max_ns, self.total_ns)

    @property
    def entries(self) -> int:
        """(value or bucket, count) pairs held: what bounds the sketch's size."""
        return len(self.keys)
