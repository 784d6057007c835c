"""Rank summaries brought together: a :class:`Combiner` folds them in as they arrive, matches each
collective across ranks, works out every rank's waiting and own time per step, and names the
stragglers."""

from __future__ import annotations

import bisect
import statistics
from array import array
from collections.abc import Iterable, Iterator, Sequence

from omniprof.analysis.crossrank.reduce import TOP_OPS
from omniprof.analysis.crossrank.report import CrossRankReport, Straggler, WaitCaused, WaitTable
from omniprof.analysis.crossrank.summary import RankSummary
from omniprof.analysis.crossrank.text import ms
from omniprof.errors import TraceReadError

__all__ = ["Combiner", "combine", "FAIR_SHARE", "MIN_CAUSED_NS"]

#: a straggler cost the others more than this many times an even share (1/N) of all the waiting caused
FAIR_SHARE = 1.5
#: ... and at least this much waiting for each other rank, on average
MIN_CAUSED_NS = 1_000_000


class Combiner:
    """Rank summaries brought together as they arrive, in any order: each collective's shortest
    duration on any rank so far is kept per name and occurrence (one array per name, folded with
    each arrival, never one entry per rank), and each rank's summary, whose size does not depend on
    its number of events. :meth:`report` works out waiting, own time, the waiting each rank caused
    and the stragglers.

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

    def report(self, *, fair_share: float = FAIR_SHARE, min_caused_ns: int = MIN_CAUSED_NS) -> CrossRankReport:
        """Waiting, own time, the waiting each rank caused, and the stragglers: the ranks that cost
        the others more than ``fair_share`` times an even share (1/N) of all the waiting caused,
        and at least ``min_caused_ns`` for each other rank on average."""
        ranks = tuple(self.summaries[r] for r in sorted(self.summaries))
        notes: list[str] = []
        common: dict[str, int] = {}  # per name: occurrences seen on every rank (those compared)
        for name, per in sorted(self.counts.items()):
            if len(set(per.values())) > 1 or len(per) != len(ranks):
                notes.append(f"collective {name!r} occurs {dict(sorted(per.items()))} times by rank; only occurrences "
                             f"seen on every rank are compared")
            common[name] = min(per.values()) if len(per) == len(ranks) and len(ranks) >= 2 else 0
        occ = {name: _Occurrences(k) for name, k in common.items() if k}
        for r in ranks:  # who arrived last at each collective
            for name, k, a, _, _ in _compared(r, common):
                occ[name].arrive(k, a, r.clock_uncertainty_ns)
        cols: dict[int, tuple[array[int], array[int], bytearray]] = {}
        for r in ranks:  # each rank's waiting, per step and per collective
            st = r.steps
            wait = array("q", bytes(8 * len(st)))
            has = bytearray(len(st))
            for name, k, a, d, i in _compared(r, common):
                o = occ[name]
                w = d - self.shortest[name][k]
                o.wait_all[k] += w
                if o.is_last(k, a, r.clock_uncertainty_ns):
                    o.n_last[k] += 1
                    o.wait_last[k] += w
                if i >= 0:
                    wait[i] += w
                    has[i] = 1
            cols[r.rank] = (st.step, wait, has)
        table = WaitTable(cols)
        caused = _wait_caused(ranks, common, occ)
        stragglers = _stragglers(ranks, table, caused, fair_share, min_caused_ns)
        for r in ranks:
            if r.durations_left_out and r.durations_other is not None:
                other = r.durations_other
                notes.append(f"rank {r.rank} ran more than {len(r.durations)} distinct kernel/op names: the "
                             f"{r.durations_left_out} with the least total time are summed as one row out of the "
                             f"duration distribution ({other.count:,} runs, {ms(other.total_ns)} ms)")
        notes += [n for r in ranks for n in r.read_notes]
        return CrossRankReport(ranks, table, tuple(stragglers), tuple(notes), tuple(caused))


def combine(summaries: Iterable[RankSummary], *, fair_share: float = FAIR_SHARE,
            min_caused_ns: int = MIN_CAUSED_NS) -> CrossRankReport:
    """Match collectives across ranks, work out waiting and own time per step and the waiting each
    rank caused, name stragglers (a :class:`Combiner` fed every summary; see :meth:`Combiner.report`)."""
    c = Combiner()
    for s in summaries:
        c.add(s)
    return c.report(fair_share=fair_share, min_caused_ns=min_caused_ns)


class _Occurrences:
    """One collective name's compared occurrences, one int64 column each: the last arrival (its
    start on the aligned clock) and that rank's clock uncertainty; every rank's waiting in it, and
    the number and waiting of the ranks that arrived last."""

    __slots__ = ("last", "last_unc", "wait_all", "n_last", "wait_last")

    def __init__(self, n: int) -> None:
        self.last = array("q", [-(1 << 63)] * n)
        self.last_unc = array("q", bytes(8 * n))
        self.wait_all = array("q", bytes(8 * n))
        self.n_last = array("q", bytes(8 * n))
        self.wait_last = array("q", bytes(8 * n))

    def arrive(self, k: int, start_ns: int, uncertainty_ns: int) -> None:
        if start_ns > self.last[k] or (start_ns == self.last[k] and uncertainty_ns > self.last_unc[k]):
            self.last[k] = start_ns
            self.last_unc[k] = uncertainty_ns

    def is_last(self, k: int, start_ns: int, uncertainty_ns: int) -> bool:
        """Whether an arrival at ``start_ns`` may be the last one: within both clocks' uncertainty of it."""
        return start_ns >= self.last[k] - (uncertainty_ns + self.last_unc[k])


def _compared(r: RankSummary, common: dict[str, int]) -> Iterator[tuple[str, int, int, int, int]]:
    """A rank's compared collectives: ``(name, occurrence, start, duration, index of the step its
    start falls in or -1)``."""
    c = r.collectives
    seen = [0] * len(c.names)
    limit = [common.get(name, 0) for name in c.names]
    starts, durs = r.steps.start_ns, r.steps.dur_ns
    for n, a, d in zip(c.name, c.start_ns, c.dur_ns):
        k = seen[n]
        seen[n] = k + 1
        if k >= limit[n]:
            continue
        i = bisect.bisect_right(starts, a) - 1
        yield c.names[n], k, a, d, (i if i >= 0 and a < starts[i] + durs[i] else -1)


def _wait_caused(ranks: Sequence[RankSummary], common: dict[str, int], occ: dict[str, _Occurrences]
                 ) -> list[WaitCaused]:
    """Each collective's waiting of the ranks that did not arrive last, charged to those that did
    (shared evenly): per rank, in all, per step and per collective name."""
    compared = sum(common.values())
    out = []
    for r in ranks:
        total = last_in = 0
        by_step: dict[int, int] = {}
        by_name: dict[str, list[int]] = {}
        for name, k, a, _, i in _compared(r, common):
            o = occ[name]
            if not o.is_last(k, a, r.clock_uncertainty_ns):
                continue
            share = (o.wait_all[k] - o.wait_last[k]) // o.n_last[k]
            last_in += 1
            total += share
            if i >= 0:
                st = r.steps.step[i]
                by_step[st] = by_step.get(st, 0) + share
            x = by_name.setdefault(name, [0, 0])
            x[0] += 1
            x[1] += share
        if total > 0:
            rows = tuple(sorted(((n, c, v) for n, (c, v) in by_name.items() if v > 0), key=lambda x: (-x[2], x[0])))
            out.append(WaitCaused(r.rank, total, last_in, compared, {st: v for st, v in sorted(by_step.items()) if v},
                                  rows))
    out.sort(key=lambda x: (-x.wait_caused_ns, x.rank))
    return out


def _own_times(ranks: Sequence[RankSummary], wait: WaitTable) -> tuple[list[int], array[int], list[int]]:
    """The steps present on every rank, each rank's own time in them (``own[c * n + i]``: rank ``i``
    in common step ``c``) and the median rank's."""
    n = len(ranks)
    present: dict[int, int] = {}
    for r in ranks:
        for st in r.steps.step:
            present[st] = present.get(st, 0) + 1
    common = sorted(st for st, k in present.items() if k == n)
    col = {st: c for c, st in enumerate(common)}
    own = array("q", bytes(8 * len(common) * n))
    for i, r in enumerate(ranks):
        for st, d, x in zip(r.steps.step, r.steps.dur_ns, wait.column(r.rank)):
            c = col.get(st)
            if c is not None:
                own[c * n + i] = d - x
    median = [int(statistics.median(own[c * n:(c + 1) * n])) for c in range(len(common))]
    return common, own, median


def _stragglers(ranks: Sequence[RankSummary], wait: WaitTable, caused: Sequence[WaitCaused], fair_share: float,
                min_caused_ns: int) -> list[Straggler]:
    n = len(ranks)
    total = sum(x.wait_caused_ns for x in caused)
    named = [x for x in caused if n >= 2 and x.wait_caused_ns * n > fair_share * total
             and x.wait_caused_ns >= min_caused_ns * (n - 1)]
    if not named:
        return []
    common, own, median = _own_times(ranks, wait)
    col = {st: c for c, st in enumerate(common)}
    index = {r.rank: i for i, r in enumerate(ranks)}
    out = []
    for x in named:
        i = index[x.rank]
        r = ranks[i]
        by_step = {st: k for k, st in enumerate(r.steps.step)}
        slow = tuple(x.by_step)
        top: dict[str, int] = {}
        outside = 0
        for st in slow:
            row = r.steps[by_step[st]]
            for name, ns in row.top_ops:
                top[name] = top.get(name, 0) + ns
            outside += row.idle_ns
        both = [st for st in slow if st in col]
        out.append(Straggler(rank=r.rank, wait_caused_ns=x.wait_caused_ns, last_in=x.last_in, compared=x.compared,
                             by_collective=x.by_collective, wait_caused_by_step=dict(x.by_step), slow_steps=slow,
                             steps=len(common), own_ns={st: own[col[st] * n + i] for st in both},
                             median_own_ns={st: median[col[st]] for st in both},
                             step_ns={st: r.steps.dur_ns[by_step[st]] for st in slow},
                             top_ops=tuple(sorted(top.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_OPS]),
                             outside_ops_ns=outside))
    return out
