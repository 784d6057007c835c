"""What the cross-rank analysis says: a :class:`CrossRankReport` (every rank's summary, the waiting
per rank and step as a :class:`WaitTable`, the waiting each rank caused (:class:`WaitCaused`), the
stragglers, each a :class:`Straggler`), as plain rows first
(:meth:`CrossRankReport.breakdown_rows`, :meth:`~CrossRankReport.step_rows`) and text second."""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Mapping
from typing import Any

import attrs

from omniprof.analysis.crossrank.distribution import DurationRow, duration_rows
from omniprof.analysis.crossrank.summary import RankSummary

__all__ = ["WaitCaused", "Straggler", "CrossRankReport", "WaitTable", "REPORT_VERSION"]

#: version of :meth:`CrossRankReport.to_dict`'s shape (``docs/schema/cross-rank.schema.json``)
REPORT_VERSION = 1


@attrs.frozen
class WaitCaused:
    """The waiting one rank cost the others: in every collective compared (seen on every rank), on
    the ranks' aligned clock, the rank(s) that arrived last (started it last; arrivals within the
    two clocks' uncertainty of the last count as last too) are charged the other ranks' waiting in
    it, shared evenly when several arrived last.

    Attributes:
        rank: the rank.
        wait_caused_ns: the other ranks' waiting charged to it, in all.
        last_in: collectives it arrived last at (alone or tied); ``compared``: collectives compared.
        by_step: ``{step: ns}`` charged to it in each of its steps (a collective outside every step
            counts in the total only).
        by_collective: ``(name, times last, ns)`` per collective name, most ns first.
    """

    rank: int
    wait_caused_ns: int
    last_in: int
    compared: int
    by_step: dict[int, int]
    by_collective: tuple[tuple[str, int, int], ...]


@attrs.frozen
class Straggler:
    """A rank that cost the others the most waiting (:class:`WaitCaused`, the first figure), with
    its own time (step minus its own waiting on peers, the second figure) beside the median rank's.

    ``slow_steps``: the steps in which it cost the others waiting (of ``steps`` present on every
    rank); ``own_ns``, ``median_own_ns``, ``step_ns``: ``{step: ns}`` of its own time, the median
    rank's, and its step durations, in those of them present on every rank; ``top_ops``: its
    slowest ops over those steps (``(name, total_ns)``), and ``outside_ops_ns`` its host time
    outside any op there.
    """

    rank: int
    wait_caused_ns: int
    last_in: int
    compared: int
    by_collective: tuple[tuple[str, int, int], ...]
    wait_caused_by_step: dict[int, int]
    slow_steps: tuple[int, ...]
    steps: int
    own_ns: dict[int, int]
    median_own_ns: dict[int, int]
    step_ns: dict[int, int]
    top_ops: tuple[tuple[str, int], ...]
    outside_ops_ns: int


@attrs.frozen
class CrossRankReport:
    """Every rank's summary, per-step per-rank waiting, the waiting each rank caused, and the
    stragglers found.

    ``wait_ns[(rank, step)]``: time the rank waited in collectives for slower peers during the step.
    ``wait_caused``: per rank that cost the others any waiting, most first (:class:`WaitCaused`).
    ``notes``: what could not be matched (unequal collective counts, missing ranks), never silent.
    """

    ranks: tuple[RankSummary, ...]
    wait_ns: Mapping[tuple[int, int], int]
    stragglers: tuple[Straggler, ...]
    notes: tuple[str, ...] = ()
    wait_caused: tuple[WaitCaused, ...] = ()

    def rank(self, rank: int) -> RankSummary:
        for r in self.ranks:
            if r.rank == rank:
                return r
        raise KeyError(f"no rank {rank} (ranks: {[r.rank for r in self.ranks]})")

    def breakdown_rows(self) -> list[dict[str, Any]]:
        """One row per rank: the temporal breakdown in ns and % of the window."""
        rows = []
        for r in self.ranks:
            rows.append({"rank": r.rank, "host": r.host, "source": r.source, "window_ns": r.window_ns,
                         "compute_ns": r.compute_ns, "exposed_communication_ns": r.exposed_communication_ns,
                         "exposed_memory_ns": r.exposed_memory_ns, "idle_ns": r.idle_ns,
                         "compute_pct": r.pct(r.compute_ns),
                         "exposed_communication_pct": r.pct(r.exposed_communication_ns),
                         "exposed_memory_pct": r.pct(r.exposed_memory_ns), "idle_pct": r.pct(r.idle_ns),
                         "communication_ns": r.communication_ns, "overlap_ns": r.overlap_ns,
                         "overlap_pct": r.overlap_pct, "clock_offset_ns": r.clock_offset_ns,
                         "clock_uncertainty_ns": r.clock_uncertainty_ns})
        return rows

    def step_rows(self) -> list[dict[str, Any]]:
        """One row per (step, rank): duration, waiting on peers, own time."""
        rows = []
        wait = self.wait_ns
        for r in self.ranks:
            t = r.steps
            ws = wait.column(r.rank) if isinstance(wait, WaitTable) else [wait.get((r.rank, st), 0) for st in t.step]
            for st, d, w, c, m, i in zip(t.step, t.dur_ns, ws, t.compute_ns, t.communication_ns, t.idle_ns):
                rows.append({"step": st, "rank": r.rank, "dur_ns": d, "wait_ns": w, "own_ns": d - w, "compute_ns": c,
                             "communication_ns": m, "idle_ns": i})
        rows.sort(key=lambda x: (x["step"], x["rank"]))
        return rows

    def to_dict(self) -> dict[str, Any]:
        """The report as plain JSON data (``docs/schema/cross-rank.schema.json``, ``version``
        :data:`REPORT_VERSION`): the breakdown per rank, the per-step wait/own table, the waiting
        each rank caused, the stragglers, every kernel's (op's) duration distribution, the notes.
        Times in integer ns."""
        def steps(d: Mapping[int, int]) -> list[dict[str, int]]:
            return [{"step": st, "ns": v} for st, v in d.items()]

        def names(rows: tuple[tuple[str, int, int], ...]) -> list[dict[str, Any]]:
            return [{"name": n, "times_last": c, "ns": v} for n, c, v in rows]

        ranks = [{**row, "idle_causes": dict(r.idle_causes)} for row, r in zip(self.breakdown_rows(), self.ranks)]
        return {
            "version": REPORT_VERSION,
            "ranks": ranks,
            "steps": self.step_rows(),
            "wait_caused": [{"rank": x.rank, "wait_caused_ns": x.wait_caused_ns, "last_in": x.last_in,
                             "compared": x.compared, "by_step": steps(x.by_step),
                             "by_collective": names(x.by_collective)} for x in self.wait_caused],
            "stragglers": [{"rank": s.rank, "wait_caused_ns": s.wait_caused_ns, "last_in": s.last_in,
                            "compared": s.compared, "by_step": steps(s.wait_caused_by_step),
                            "by_collective": names(s.by_collective), "steps_compared": s.steps,
                            "own": [{"step": st, "step_ns": s.step_ns[st], "own_ns": s.own_ns[st],
                                     "median_own_ns": s.median_own_ns[st]} for st in s.own_ns],
                            "top_ops": [{"name": n, "total_ns": v} for n, v in s.top_ops],
                            "outside_ops_ns": s.outside_ops_ns} for s in self.stragglers],
            "durations": [{"name": d.name, "total_ns": d.total_ns, "slowest_rank": d.slowest_rank,
                           "fastest_rank": d.fastest_rank, "missing_ranks": list(d.missing_ranks),
                           "per_rank": [attrs.asdict(x) for x in d.per_rank]} for d in self.durations()],
            "notes": list(self.notes),
        }

    def to_text(self, width: int | None = None) -> str:
        """The report as text (tables through the one renderer, lines wrapped at ``width``; None: nothing cut)."""
        from omniprof.analysis.crossrank.text import format_text

        return format_text(self, width)

    def durations(self, top: int | None = None) -> list[DurationRow]:
        """Each kernel's (GPU ranks) or op's (CPU ranks) duration distribution across ranks, the
        kernels with the most total time (all ranks) first; ``top`` keeps that many."""
        return duration_rows(self.ranks, top)


class WaitTable(Mapping[tuple[int, int], int]):
    """``{(rank, step): ns}`` waited in collectives for slower peers, held as one array per rank
    aligned with its :class:`StepTable` (a key exists where a compared collective fell in the step)."""

    def __init__(self, per_rank: dict[int, tuple[array[int], array[int], bytearray]]) -> None:
        self._cols = per_rank  # rank -> (step numbers, wait per step, whether the step holds a compared collective)
        self._index: dict[int, dict[int, int]] = {}

    def column(self, rank: int) -> array[int]:
        """The rank's waiting per step, in its steps' order."""
        return self._cols[rank][1]

    def __getitem__(self, key: tuple[int, int]) -> int:
        rank, step = key
        cols = self._cols.get(rank)
        if cols is None:
            raise KeyError(key)
        idx = self._index.get(rank)
        if idx is None:
            idx = self._index[rank] = {st: i for i, st in enumerate(cols[0])}
        i = idx.get(step)
        if i is None or not cols[2][i]:
            raise KeyError(key)
        return cols[1][i]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        for rank in sorted(self._cols):
            steps, _, has = self._cols[rank]
            for st, h in zip(steps, has):
                if h:
                    yield (rank, st)

    def __len__(self) -> int:
        return sum(sum(has) for _, _, has in self._cols.values())

    def __repr__(self) -> str:
        return f"WaitTable({dict(self.items())!r})"

