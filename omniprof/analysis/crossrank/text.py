"""The cross-rank report as text: blocks of lines and tables (:func:`text_blocks`), every table
drawn by the one renderer (:mod:`omniprof.analysis.render`), by the table reporter at the
terminal's width or by :func:`format_text` (:meth:`CrossRankReport.to_text`)."""

from __future__ import annotations

import io
import textwrap
from collections.abc import Sequence
from typing import Any, Protocol

from omniprof.analysis.crossrank.distribution import DurationRow
from omniprof.analysis.crossrank.summary import RankSummary
from omniprof.analysis.render import Column, print_table
from omniprof.analysis.sketch import EXACT_VALUES, RELATIVE_ERROR

__all__ = ["text_blocks", "format_text", "ms", "Report"]


class Report(Protocol):
    """What the text reads of a :class:`~omniprof.analysis.crossrank.report.CrossRankReport` (which
    imports this module for its ``to_text``, so the text names only the shape it reads)."""

    @property
    def ranks(self) -> Sequence[RankSummary]: ...
    @property
    def stragglers(self) -> Sequence[Any]: ...
    @property
    def notes(self) -> Sequence[str]: ...
    @property
    def wait_caused(self) -> Sequence[Any]: ...
    def step_rows(self) -> list[dict[str, Any]]: ...
    def durations(self, top: int | None = None) -> list[DurationRow]: ...

#: more ranks than this: per step, only the slowest ranks by own time; per kernel, its 2 slowest and its fastest
FULL_STEP_RANKS = 8
#: the duration table lists this many kernels (ops), those with the most total time
TOP_KERNELS = 10
#: the waiting-caused table lists this many ranks, those that cost the others most
CAUSED_RANKS = 8
#: lines are wrapped at this width when none is given
LINE_WIDTH = 110
_NAME_WIDTH = 60


def ms(ns: int) -> str:
    """``ns`` in milliseconds, 3 decimals, thousands separated."""
    return f"{ns / 1e6:,.3f}"


def _us(ns: int) -> str:
    return f"{ns / 1e3:,.1f}"


def _num(header: str) -> Column:
    return Column(header, kind="num")


def text_blocks(rep: Report) -> list[tuple[Any, ...]]:
    """The report as blocks: ``("line", text)`` and ``("table", columns, rows)`` (columns of
    :class:`omniprof.analysis.render.Column`, rows of strings): the table reporter draws them at its
    width, :func:`format_text` as plain text."""
    out: list[tuple[Any, ...]] = []
    src = {r.source for r in rep.ranks}
    what = "GPU kernels" if src == {"gpu"} else "CPU ops" if src == {"cpu"} else "GPU kernels or CPU ops (per rank)"
    out.append(("line", f"Cross-rank temporal breakdown: {len(rep.ranks)} ranks, from {what}; % of each rank's "
                        f"window (its profiled steps, else first to last event)"))
    rows = [[str(r.rank), r.host or "-", r.source, ms(r.window_ns), f"{r.pct(r.compute_ns):.1f}",
             f"{r.pct(r.exposed_communication_ns):.1f}", f"{r.pct(r.exposed_memory_ns):.1f}", f"{r.pct(r.idle_ns):.1f}",
             f"{r.overlap_pct:.1f}", f"{r.clock_offset_ns / 1e3:+,.1f} ± {r.clock_uncertainty_ns / 1e3:,.1f}"]
            for r in rep.ranks]
    out.append(("table", [_num("rank"), Column("host", kind="label"), Column("src", kind="label"),
                          *map(_num, ["window ms", "compute%", "comm%", "mem%", "idle%", "overlap%",
                                      "clock offset µs"])], rows))
    out.append(("line", "comm%/mem%: exposed (not under compute); overlap%: share of communication time under "
                        "compute; clock offset: to rank 0, ± its uncertainty"))
    out += _step_blocks(rep)
    out.append(("line", ""))
    out += _caused_blocks(rep)
    causes: dict[str, int] = {}
    for r in rep.ranks:
        for k, v in r.idle_causes.items():
            causes[k] = causes.get(k, 0) + v
    if any(causes.values()):
        out.append(("line", "Idle time by cause, all ranks: " + ", ".join(f"{k} {ms(v)} ms" for k, v in causes.items())))
    out += _duration_blocks(rep)
    for n in rep.notes:
        out.append(("line", f"note: {n}"))
    return out


def _step_blocks(rep: Report) -> list[tuple[Any, ...]]:
    steps = rep.step_rows()
    if not steps:
        return []
    shown = steps
    note = ""
    if len(rep.ranks) > FULL_STEP_RANKS:
        by_step: dict[int, list[dict[str, Any]]] = {}
        for x in steps:
            by_step.setdefault(x["step"], []).append(x)
        shown = [x for st in sorted(by_step) for x in sorted(by_step[st], key=lambda x: -x["own_ns"])[:3]]
        note = f" (the 3 slowest of {len(rep.ranks)} ranks per step)"
    return [("line", ""),
            ("line", f"Per-step time by rank, ms{note}: wait = in collectives for slower peers, own = step - wait"),
            ("table", list(map(_num, ["step", "rank", "step ms", "wait", "own", "compute", "comm", "idle"])),
             [[str(x["step"]), str(x["rank"]), ms(x["dur_ns"]), ms(x["wait_ns"]), ms(x["own_ns"]),
               ms(x["compute_ns"]), ms(x["communication_ns"]), ms(x["idle_ns"])] for x in shown])]


def _caused_blocks(rep: Report) -> list[tuple[Any, ...]]:
    """The waiting each rank cost the others (the ranks that cost most first), then the stragglers:
    what they cost, where, and their own time beside the median rank's."""
    out: list[tuple[Any, ...]] = []
    n = len(rep.ranks)
    if rep.wait_caused:
        shown = rep.wait_caused[:CAUSED_RANKS]
        more = f" (the {len(shown)} that cost most of {len(rep.wait_caused)})" if len(rep.wait_caused) > len(shown) else ""
        out.append(("line", f"Waiting caused, by rank{more}: in each collective, on the ranks' aligned clock, the "
                            f"other ranks' waiting is charged to the rank that arrived last (shared by ranks "
                            f"within their clocks' uncertainty of the last)"))
        rows = [[str(x.rank), ms(x.wait_caused_ns), ms(x.wait_caused_ns // max(n - 1, 1)),
                 f"{x.last_in} of {x.compared}", ", ".join(str(st) for st in list(x.by_step)[:8])
                 + (" …" if len(x.by_step) > 8 else ""),
                 "; ".join(f"{name} {c}x {ms(v)}" for name, c, v in x.by_collective[:2])] for x in shown]
        out.append(("table", [_num("rank"), _num("caused ms"), _num("per other rank"), _num("last in"),
                              Column("steps", min_width=8, drop=2), Column("collectives (times last, ms)", drop=1)],
                    rows))
    if not rep.stragglers:
        out.append(("line", "No straggler: no rank cost the others more than 1.5x an even share of all the waiting "
                            "(and 1 ms for each other rank)."))
        return out
    for s in rep.stragglers:
        where = "; ".join(f"{name} {c}x {ms(v)} ms" for name, c, v in s.by_collective[:3])
        steps = ", ".join(f"{st} ({ms(v)} ms)" for st, v in s.wait_caused_by_step.items())
        out.append(("line", f"Straggler: rank {s.rank} cost the others {ms(s.wait_caused_ns)} ms of waiting "
                            f"({ms(s.wait_caused_ns // max(n - 1, 1))} ms for each other rank on average), the last "
                            f"to arrive at {s.last_in} of {s.compared} collectives ({where})"
                            + (f", in steps {steps}." if steps else ".")))
        own = ", ".join(f"step {st} {ms(s.step_ns[st])} ms, own {ms(s.own_ns[st])} vs median {ms(s.median_own_ns[st])}"
                        for st in s.own_ns)
        if own:
            out.append(("line", f"  its own time (step - its waiting) in those steps: {own}"))
        ops = "; ".join(f"{name} {ms(ns)} ms" for name, ns in s.top_ops)
        out.append(("line", f"  its slowest ops in those steps: {ops or 'none recorded'}; its idle time there "
                            f"(outside any op): {ms(s.outside_ops_ns)} ms"))
    return out


def _duration_blocks(rep: Report) -> list[tuple[Any, ...]]:
    rows = rep.durations(TOP_KERNELS)
    if not rows:
        return []
    src = {r.source for r in rep.ranks}
    what = "kernel" if src == {"gpu"} else "op" if src == {"cpu"} else "kernel/op"
    many = len(rep.ranks) > FULL_STEP_RANKS
    note = " (per kernel: its 2 slowest ranks and its fastest)" if many else ""
    grid = []
    shown_approx = False
    for row in rows:
        per = list(row.per_rank)
        if many:
            by_med = sorted(per, key=lambda x: (-x.median_ns, -x.p90_ns, x.rank))
            keep = {x.rank for x in by_med[:2]} | {row.fastest_rank}
            per = [x for x in per if x.rank in keep]
        name = row.name if len(row.name) <= _NAME_WIDTH else row.name[:_NAME_WIDTH - 1] + "…"
        for i, x in enumerate(per):
            mark = "*" if x.rank == row.slowest_rank and len(row.per_rank) > 1 else ""
            approx = "" if x.exact else "~"
            shown_approx |= not x.exact
            grid.append([name if i == 0 else "", f"{x.rank}{mark}", str(x.count), approx + _us(x.median_ns),
                         approx + _us(x.p90_ns), _us(x.max_ns), ms(x.total_ns), f"{row.spread:.2f}" if i == 0 else ""])
    out: list[tuple[Any, ...]] = [("line", ""), ("line", f"{what.capitalize()} duration by rank, µs: the {len(rows)} "
                                                         f"{what}s with the most total time{note}; * = its slowest "
                                                         f"rank (highest median); spread = slowest median / fastest")]
    out.append(("table", [Column(what), *map(_num, ["rank", "count", "median", "p90", "max", "total ms", "spread"])],
                grid))
    if shown_approx:
        out.append(("line", f"~: within {RELATIVE_ERROR:.0%} (from the rank's log-bucketed sketch of that {what}'s "
                            f"durations; exact up to {EXACT_VALUES:,} distinct durations)"))
    return out


def format_text(rep: Report, width: int | None = None) -> str:
    """:func:`text_blocks` as plain text: lines wrapped at words at ``width`` (default
    :data:`LINE_WIDTH`), tables drawn by the one renderer at ``width`` (None: nothing cut)."""
    buf = io.StringIO()
    for block in text_blocks(rep):
        if block[0] == "line":
            text = block[1]
            lines = textwrap.wrap(text, width or LINE_WIDTH, subsequent_indent="    ") if text else [""]
            buf.write("\n".join(lines) + "\n")
        else:
            print_table(buf, block[1], block[2], width=width)
    return buf.getvalue()
