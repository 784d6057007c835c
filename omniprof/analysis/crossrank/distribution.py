"""The duration distribution of each kernel (GPU ranks) or op (CPU ranks) across ranks: per rank a
bounded :class:`~omniprof.analysis.sketch.DurationSketch` per name (made by the reducer), met here
as one :class:`DurationRow` per name."""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from omniprof.analysis.crossrank.summary import RankSummary

__all__ = ["duration_stats", "RankDurations", "DurationRow", "duration_rows"]


def duration_stats(durations_ns: Sequence[int]) -> tuple[int, int, int, int, int]:
    """``(count, median_ns, p90_ns, max_ns, total_ns)``; the median and the 90th percentile
    interpolate linearly between the two nearest values (numpy's default method), rounded to
    the ns.

    >>> duration_stats([10, 20, 30, 40])
    (4, 25, 37, 40, 100)
    """
    xs = sorted(durations_ns)
    n = len(xs)
    if not n:
        return (0, 0, 0, 0, 0)

    def q(frac: float) -> int:
        pos = frac * (n - 1)
        lo = int(pos)
        hi = min(lo + 1, n - 1)
        return round(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))

    return (n, q(0.5), q(0.9), xs[-1], sum(xs))


@attrs.frozen
class RankDurations:
    """One kernel on one rank: ``count`` runs, their ``median_ns``, ``p90_ns``, ``max_ns``, ``total_ns``.
    ``exact``: False where the median and p90 come from a bucketed sketch (within
    :data:`omniprof.analysis.sketch.RELATIVE_ERROR`, 1 %); count, max and total are always exact."""

    rank: int
    count: int
    median_ns: int
    p90_ns: int
    max_ns: int
    total_ns: int
    exact: bool = True


@attrs.frozen
class DurationRow:
    """One kernel (or op) across ranks: ``per_rank`` (ranks that ran it, by rank), ``total_ns`` on
    all ranks, ``slowest_rank`` (the highest median; ties: higher p90, then lower rank),
    ``fastest_rank`` (the lowest median), and ``missing_ranks`` (ranks of the run that never ran it).
    ``spread`` is the slowest rank's median over the fastest's (1.0: every rank alike)."""

    name: str
    per_rank: tuple[RankDurations, ...]
    total_ns: int
    slowest_rank: int
    fastest_rank: int
    missing_ranks: tuple[int, ...] = ()

    @property
    def spread(self) -> float:
        by = {r.rank: r for r in self.per_rank}
        fast = by[self.fastest_rank].median_ns
        return by[self.slowest_rank].median_ns / fast if fast else float("inf")

    def rank(self, rank: int) -> RankDurations:
        for r in self.per_rank:
            if r.rank == rank:
                return r
        raise KeyError(f"{self.name!r} did not run on rank {rank} (ranks: {[r.rank for r in self.per_rank]})")


def duration_rows(ranks: Sequence[RankSummary], top: int | None = None) -> list[DurationRow]:
    """:meth:`CrossRankReport.durations` over rank summaries."""
    names: dict[str, list[RankDurations]] = {}
    for r in ranks:
        for name, sketch in r.durations.items():
            names.setdefault(name, []).append(RankDurations(r.rank, *sketch.stats(), exact=sketch.exact))
    all_ranks = {r.rank for r in ranks}
    rows = []
    for name, per in names.items():
        per.sort(key=lambda x: x.rank)
        slow = max(per, key=lambda x: (x.median_ns, x.p90_ns, -x.rank))
        fast = min(per, key=lambda x: (x.median_ns, x.p90_ns, x.rank))
        rows.append(DurationRow(name, tuple(per), sum(x.total_ns for x in per), slow.rank, fast.rank,
                                tuple(sorted(all_ranks - {x.rank for x in per}))))
    rows.sort(key=lambda x: (-x.total_ns, x.name))
    return rows if top is None else rows[:top]
