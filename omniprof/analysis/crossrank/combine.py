"""Rank summaries brought together: a :class:`Combiner` folds them in as they arrive, matches each
collective across ranks, works out every rank's waiting and own time per step, and names the
stragglers."""

from __future__ import annotations

import bisect
import statistics
from array import array
from collections.abc import Iterable, Sequence

from omniprof.analysis.crossrank.reduce import TOP_OPS
from omniprof.analysis.crossrank.report import CrossRankReport, Straggler, WaitTable
from omniprof.analysis.crossrank.summary import RankSummary
from omniprof.analysis.crossrank.text import ms
from omniprof.errors import TraceReadError

__all__ = ["Combiner", "combine"]


class Combiner:
    """Rank summaries brought together as they arrive, in any order: each collective's shortest
    duration on any rank so far is kept per name and occurrence (one array per name, folded with
    each arrival, never one entry per rank), and each rank's summary, whose size does not depend on
    its number of events. :meth:`report` works out waiting, own time and stragglers.

    .. versionadded:: 0.2
    """

    def __init__(self, source: str = "") -> None:
        self.source = source
        self.summaries: dict[int, RankSummary] = {}
        self.shortest: dict[str, array[int]] = {}
        self.counts: dict[str, dict[int, int]] = {}

    def add(self, s: RankSummary) -> None:
        if s.rank in self.summaries:
            where = f"{self.source}: several files claim" if self.source else "several summaries claim"
            raise TraceReadError(f"{where} rank(s) [{s.rank}]; keep one trace per rank in the directory")
        self.summaries[s.rank] = s
        c = s.collectives
        seen = [0] * len(c.names)
        tables = [self.shortest.setdefault(name, array("q")) for name in c.names]
        for n, d in zip(c.name, c.dur_ns):
            k = seen[n]
            seen[n] = k + 1
            t = tables[n]
            if k < len(t):
                if d < t[k]:
                    t[k] = d
            else:
                t.append(d)
        for name, n in zip(c.names, seen):
            self.counts.setdefault(name, {})[s.rank] = n

    def report(self, *, threshold: float = 0.2, min_excess_ns: int = 1_000_000) -> CrossRankReport:
        ranks = tuple(self.summaries[r] for r in sorted(self.summaries))
        notes: list[str] = []
        common: dict[str, int] = {}  # per name: occurrences seen on every rank (those compared)
        for name, per in sorted(self.counts.items()):
            if len(set(per.values())) > 1 or len(per) != len(ranks):
                notes.append(f"collective {name!r} occurs {dict(sorted(per.items()))} times by rank; only occurrences "
                             f"seen on every rank are compared")
            common[name] = min(per.values()) if len(per) == len(ranks) and len(ranks) >= 2 else 0
        cols: dict[int, tuple[array[int], array[int], bytearray]] = {}
        for r in ranks:
            st = r.steps
            wait = array("q", bytes(8 * len(st)))
            has = bytearray(len(st))
            c = r.collectives
            seen = [0] * len(c.names)
            limit = [common.get(name, 0) for name in c.names]
            shortest = [self.shortest[name] for name in c.names]
            starts, durs = st.start_ns, st.dur_ns
            for n, a, d in zip(c.name, c.start_ns, c.dur_ns):
                k = seen[n]
                seen[n] = k + 1
                if k >= limit[n]:
                    continue
                i = bisect.bisect_right(starts, a) - 1
                if i < 0 or a >= starts[i] + durs[i]:
                    continue
                wait[i] += d - shortest[n][k]
                has[i] = 1
            cols[r.rank] = (st.step, wait, has)
        table = WaitTable(cols)
        stragglers = _stragglers(ranks, table, threshold, min_excess_ns)
        for r in ranks:
            if r.durations_left_out and r.durations_other is not None:
                o = r.durations_other
                notes.append(f"rank {r.rank} ran more than {len(r.durations)} distinct kernel/op names: the "
                             f"{r.durations_left_out} with the least total time are summed as one row out of the "
                             f"duration distribution ({o.count:,} runs, {ms(o.total_ns)} ms)")
        notes += [n for r in ranks for n in r.read_notes]
        return CrossRankReport(ranks, table, tuple(stragglers), tuple(notes))


def combine(summaries: Iterable[RankSummary], *, threshold: float = 0.2, min_excess_ns: int = 1_000_000) -> CrossRankReport:
    """Match collectives across ranks, work out waiting and own time per step, name stragglers
    (a :class:`Combiner` fed every summary)."""
    c = Combiner()
    for s in summaries:
        c.add(s)
    return c.report(threshold=threshold, min_excess_ns=min_excess_ns)


def _stragglers(ranks: Sequence[RankSummary], wait: WaitTable, threshold: float,
                min_excess_ns: int) -> list[Straggler]:
    if len(ranks) < 2:
        return []
    n = len(ranks)
    present: dict[int, int] = {}
    for r in ranks:
        for st in r.steps.step:
            present[st] = present.get(st, 0) + 1
    common = sorted(st for st, k in present.items() if k == n)
    del present
    if not common:
        return []
    col = {st: c for c, st in enumerate(common)}
    own = array("q", bytes(8 * len(common) * n))  # own[c * n + i]: rank i's own time in common step c
    wait_sum = array("q", bytes(8 * len(common)))  # all ranks' waiting in common step c
    for i, r in enumerate(ranks):
        w = wait.column(r.rank)
        for st, d, x in zip(r.steps.step, r.steps.dur_ns, w):
            c = col.get(st)
            if c is not None:
                own[c * n + i] = d - x
                wait_sum[c] += x
    median = [int(statistics.median(own[c * n:(c + 1) * n])) for c in range(len(common))]
    out = []
    for i, r in enumerate(ranks):
        slow = [c for c in range(len(common))
                if own[c * n + i] - median[c] > max(min_excess_ns, threshold * median[c])]
        if not slow or 2 * len(slow) < len(common):
            continue
        w = wait.column(r.rank)
        by_step = {st: k for k, st in enumerate(r.steps.step)}
        top: dict[str, int] = {}
        outside = others = 0
        for c in slow:
            row = r.steps[by_step[common[c]]]
            for name, ns in row.top_ops:
                top[name] = top.get(name, 0) + ns
            outside += row.idle_ns
            others += wait_sum[c] - w[by_step[common[c]]]
        slow_steps = [common[c] for c in slow]
        out.append(Straggler(rank=r.rank, slow_steps=tuple(slow_steps), steps=len(common),
                             own_ns={common[c]: own[c * n + i] for c in slow},
                             median_own_ns={common[c]: median[c] for c in slow},
                             step_ns={st: r.steps.dur_ns[by_step[st]] for st in slow_steps}, others_wait_ns=others,
                             top_ops=tuple(sorted(top.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_OPS]),
                             outside_ops_ns=outside))
    return out

