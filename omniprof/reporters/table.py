"""Reporter ``table``: a terminal report of every kind of data a result holds.

Rows are built first (the call tree by :mod:`omniprof.analysis.calltree`, the sections by
:func:`span_rows` & co.), then drawn by the one table renderer (:mod:`omniprof.analysis.render`):
in colour on a terminal, as plain text otherwise (piped output is never cut).
"""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from collections.abc import Sequence
from typing import IO, Any

import attrs

from omniprof.analysis import calltree, stackreport
from omniprof.analysis.render import Column, Indented, Labeled, print_table
from omniprof.analysis.stackreport import GROUPBYS, _groupby
from omniprof.core import validators as v
from omniprof.core.results import BackendResult, Frame, ProfileResult, Table
from omniprof.core.text import printable
from omniprof.core.units import format_bytes as _fmt_bytes
from omniprof.core.units import format_ns as _fmt_ns
from omniprof.plugin import Reporter

__all__ = ["TableReporter", "TableOptions", "frame_label", "format_cell", "display_column", "span_rows",
           "counter_rows", "instant_rows", "allocation_rows"]


@attrs.frozen(kw_only=True)
class TableOptions:
    """Options of the ``table`` reporter.

    Attributes:
        format: ``"both"`` (tree then flat), ``"tree"`` or ``"flat"``.
        max_rows: most rows per flat list or derived table.
        max_depth: deepest call-tree level shown (None: all).
        min_percent: hide tree nodes under this share of the total (noise floor).
        width: line width (None: the terminal's; piped output is never cut).
        color: ``"auto"`` (rich colours on a terminal), ``"always"`` or ``"never"``.
        groupby: sampled stacks per ``"thread"`` (default: busiest thread first, idle threads
            marked), ``"task"``, both (``["thread", "task"]``) or ``"none"`` (one tree).
        native: show native (C) frames when the part has them.
        include_rank_parts: for a merged distributed result, show each rank's parts after the
            cross-rank section (False: the cross-rank section alone, for many ranks).
        recur: ``"flat"`` (default: recursion folded, a frame re-entered goes back to its first
            place on the path) or ``"off"`` (every level kept).
        lines: ``False`` (default): one row per function; ``True``: one per line (drill-down).
        idle: ``"hide"`` (default: waits -- sleep, lock, join, select -- left out and their time
            stated) or ``"show"`` (kept and marked ``[idle]``).
        counts: add a ``samples`` column (times and shares are always shown).
        own: keep omniprof's own frames (engine, CLI runner, ``runpy``); hidden by default.
        group_by_input_shape: torch op tables one row per op and input shapes (torch's
            ``key_averages(group_by_input_shape=True)``), in place of ``op_stats``.
        group_by_stack_n: torch op tables one row per op and top N frames of its Python stack
            (torch's ``key_averages(group_by_stack_n=N)``), in place of ``op_stats``; 0: off.
    """

    format: str = attrs.field(default="both", validator=v.one_of("both", "tree", "flat"))
    max_rows: int = attrs.field(default=30, validator=v.int_in_range(1))
    max_depth: int | None = attrs.field(default=None, validator=v.int_in_range(1, optional=True))
    min_percent: float = attrs.field(default=0.5, validator=v.number_in_range(0.0, 100.0))
    width: int | None = attrs.field(default=None, validator=v.int_in_range(20, optional=True))
    color: str = attrs.field(default="auto", validator=v.one_of("auto", "always", "never"))
    groupby: Any = attrs.field(default="thread", converter=_groupby, validator=v.one_of(*GROUPBYS))
    native: bool = attrs.field(default=True, validator=v.is_bool)
    include_rank_parts: bool = attrs.field(default=True, validator=v.is_bool)
    recur: str = attrs.field(default="flat", validator=v.one_of("flat", "off"))
    lines: bool = attrs.field(default=False, validator=v.is_bool)
    idle: str = attrs.field(default="hide", validator=v.one_of("hide", "show"))
    counts: bool = attrs.field(default=False, validator=v.is_bool)
    own: bool = attrs.field(default=False, validator=v.is_bool)
    group_by_input_shape: bool = attrs.field(default=False, validator=v.is_bool)
    group_by_stack_n: int = attrs.field(default=0, validator=v.int_in_range(0))


def frame_label(frame: Frame) -> str:
    """``name  file:line`` (see :func:`omniprof.analysis.calltree.frame_label`)."""
    return calltree.frame_label(frame)


def format_cell(col: str, value: Any) -> str:
    """A result table's cell for people: ``_ns`` columns as durations, ``_bytes`` as sizes."""
    if value is None:
        return "-"
    if isinstance(value, float):
        if col.endswith("_ns"):
            return _fmt_ns(value)
        return f"{value:.4g}" if abs(value) < 1e6 else f"{value:.3e}"
    if isinstance(value, int) and not isinstance(value, bool) and col.endswith("_ns"):
        return _fmt_ns(value)
    if isinstance(value, int) and not isinstance(value, bool) and col.endswith("_bytes"):
        return _fmt_bytes(value)
    return str(value)


def _printable_cell(cell: Any) -> Any:
    """A table cell safe for a terminal: control characters in names escaped (a tree's indent kept)."""
    if isinstance(cell, Indented):
        return attrs.evolve(cell, text=_printable_cell(cell.text))
    if isinstance(cell, Labeled):
        return Labeled(printable(cell.name), printable(cell.where))
    return printable(cell) if isinstance(cell, str) else cell


class _Out:
    """Blocks of a report: plain lines and tables, drawn at the end by the one renderer
    (:mod:`omniprof.analysis.render`) in colour on a terminal or as plain text."""

    def __init__(self, width: int | None) -> None:
        self.width = width
        self.blocks: list[tuple[Any, ...]] = []

    def line(self, text: str = "") -> None:
        text = "\n".join(printable(x) for x in text.split("\n"))  # names from traces: no raw escape sequences
        self.blocks.append(("line", text))

    def table(self, columns: Sequence[Column], rows: Sequence[Sequence[Any]], styles: dict[int, str] | None = None
              ) -> None:
        # Names from traces: no raw escape sequences reach the terminal.
        self.blocks.append(("table", [attrs.evolve(c, header=printable(c.header)) for c in columns],
                            [[_printable_cell(c) for c in r] for r in rows], styles or {}))

    def write(self, dest: IO[str], *, color: bool) -> None:
        if color:
            from rich.console import Console
            from rich.text import Text

            console = Console(file=dest, width=self.width or 120, force_terminal=True, highlight=False,
                              markup=False, emoji=False, force_jupyter=False)
        for block in self.blocks:
            if block[0] == "line":
                ln = block[1]
                width = console.width if color else self.width
                # Words wrap (a figure is never cut); continuation lines are indented under the
                # line's own indent, on a terminal as in piped text.
                wrapped = _wrap(ln, width) if width and len(ln) > width else [ln]
                if color:
                    style = "bold" if ln.startswith("== ") else ("yellow" if ln.startswith("! ") else "")
                    for piece in wrapped:
                        console.print(Text(piece, style=style))
                else:
                    dest.write("\n".join(wrapped) + "\n")
                continue
            _, columns, rows, styles = block
            print_table(dest, columns, rows, width=self.width, color=color, style=styles if color else None)


def _wrap(line: str, width: int) -> list[str]:
    """``line`` wrapped at words to ``width``; continuation lines indented 4 more than the line."""
    indent = line[: len(line) - len(line.lstrip(" "))]
    return textwrap.wrap(line, width, subsequent_indent=indent + "    ", break_long_words=False,
                         break_on_hyphens=False) or [line]


def display_column(name: str) -> str:
    """A column header for people: cells already carry the unit, so ``total_ns`` shows as ``total``."""
    for suffix, shown in (("_ns", ""), ("_bytes", ""), ("_pct", " %")):
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)] + shown
    return name


def _cut(column: str) -> str:
    """Where a result table's text column is shortened: paths keep their end (``app.py:12``)."""
    return "start" if column in ("location", "file", "path", "where", "source_file") else "middle"


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f}" if whole else "-"


def _indent(depth: int) -> str:
    # Two spaces a level; past 20 levels the depth is written as a number instead.
    return "  " * depth if depth <= 20 else "  " * 18 + f"+{depth} "


class TableReporter(Reporter):
    """Call tree, flat profile, derived tables, summaries and losses, sized to the terminal."""

    name = "table"
    output = "stream"
    summary = "terminal report: call tree, flat list, op/kernel tables, summaries, losses"
    Options = TableOptions

    def report(self, result: ProfileResult, dest: IO[str]) -> None:  # type: ignore[override]
        opts = self.options
        isatty = bool(getattr(dest, "isatty", lambda: False)())
        color = opts.color == "always" or (opts.color == "auto" and isatty and not os.environ.get("NO_COLOR"))
        width = opts.width or (shutil.get_terminal_size((120, 24)).columns if isatty else None)
        out = _Out(width)
        self.build(result, out)
        out.write(dest, color=color)

    def build(self, result: ProfileResult, out: _Out) -> None:
        md = result.metadata
        dur = (md.end_ns - md.start_ns) / 1e9 if md.end_ns else 0.0
        out.line(f"== omniprof {', '.join(md.backends) or '-'}  {dur:.3f} s  host {md.host or '-'} pid {md.pid}"
                 + ("  [PARTIAL]" if result.partial else ""))
        for err in result.errors:
            out.line(f"! {err.source} failed at {err.phase}: {err.what}")
        for loss in result.losses:
            out.line(f"! {loss.source}: {loss.count} {loss.unit} not recorded ({loss.kind}) {loss.detail}".rstrip())
        if md.distributed.get("merged"):
            self._cross_rank(result, out)
            if not self.options.include_rank_parts:
                return
        for part in result.parts:
            self._part(part, out)

    def _cross_rank(self, result: ProfileResult, out: _Out) -> None:
        from omniprof.analysis import crossrank

        d = result.metadata.distributed
        out.line(f"== distributed run {d.get('run') or ''}: {d.get('world_size')} ranks".replace("run :", "run:"))
        out.line()
        for block in crossrank.text_blocks(crossrank.analyze_result(result)):
            if block[0] == "table":
                out.table(block[1], block[2])
            elif not block[1]:
                out.line()
            else:
                out.line(block[1])  # the renderer wraps it at words when the width is known

    def _stacks(self, part: BackendResult) -> tuple[list[calltree.Stack], int]:
        """The part's sample stacks after the report's filters, and the idle time left out."""
        opts = self.options
        return calltree.report_stacks(part, native=opts.native, own=opts.own, lines=opts.lines, idle=opts.idle)

    def _groups(self, part: BackendResult, stacks: list[calltree.Stack]
                ) -> list[tuple[str | None, list[calltree.Stack]]]:
        mode = self.options.groupby
        if mode == "none":
            return [(None, stacks)]
        kinds = (mode,) if isinstance(mode, str) else tuple(mode)
        tasks = {t.task_id: t.name for t in part.tasks}
        groups: list[tuple[str | None, list[calltree.Stack]]] = []
        threads = calltree.by_thread(part, stacks)
        if kinds[0] == "thread":
            for g in threads:
                title = f"Thread {g.name}" + (" [idle]" if g.idle_only else "")
                if len(kinds) == 1:
                    groups.append((title, list(g.stacks)))
                    continue
                for tid, ss in _by_task(g.stacks):
                    groups.append((f"{title} / task {tasks.get(tid, tid) if tid is not None else '(none)'}", ss))
        else:
            names = {g.thread_id: g.name for g in threads}
            for tid, ss in _by_task(stacks):
                title = f"Task {tasks.get(tid, tid)}" if tid is not None else "No task"
                if len(kinds) == 1:
                    groups.append((title, ss))
                    continue
                for g in calltree.by_thread(part, ss):
                    groups.append((f"{title} / thread {names.get(g.thread_id, g.name)}", list(g.stacks)))
        if len(groups) == 1:
            return [(None, groups[0][1])]
        return groups

    def _samples(self, part: BackendResult, out: _Out) -> None:
        opts = self.options
        stacks, idle_ns = self._stacks(part)
        grand = sum(s.weight for s in stacks) + idle_ns
        if idle_ns:
            out.line()
            out.line(f"Idle time left out: {_fmt_ns(idle_ns)} of {_fmt_ns(grand)} sampled "
                     "(threads waiting in sleep, lock, join, select; -R table.idle=show keeps it)")
        for title, group in self._groups(part, stacks):
            total = sum(s.weight for s in group)
            if title is not None:
                out.line()
                out.line(f"-- {title}: {_fmt_ns(total)} sampled ({sum(s.count for s in group)} samples)")
            if opts.format in ("both", "tree"):
                self._tree(group, total, out)
            if opts.format in ("both", "flat"):
                self._flat(group, total, out)

    def _tree(self, stacks: list[calltree.Stack], total: int, out: _Out) -> None:
        opts = self.options
        shown = calltree.fold_recursion(stacks) if opts.recur == "flat" else stacks
        root = calltree.build_tree(shown)
        rows = calltree.tree_rows(root, sort="time", maxdepth=opts.max_depth, min_share=opts.min_percent / 100.0)
        out.line()
        out.line(f"Call tree ({_fmt_ns(total)} sampled"
                 + (f"; nodes under {opts.min_percent:g}% hidden" if opts.min_percent else "")
                 + ("; recursion folded" if opts.recur == "flat" else "") + ")")
        cols = [Column("time", kind="num"), Column("%", kind="num"), Column("self", kind="num")]
        if opts.counts:
            cols.append(Column("samples", kind="num", drop=1))
        cols.append(Column("function", min_width=30))
        cells, styles = [], {}
        for i, r in enumerate(rows):
            row = [_fmt_ns(r.total_ns), _pct(r.total_ns, total), _fmt_ns(r.self_ns) if r.self_ns else ""]
            if opts.counts:
                row.append(str(r.count))
            row.append(Indented(_indent(r.depth), self._label(r.frame, r.idle)))
            cells.append(row)
            if r.idle:
                styles[i] = "dim"
        out.table(cols, cells, styles)

    def _flat(self, stacks: list[calltree.Stack], total: int, out: _Out) -> None:
        opts = self.options
        rows = calltree.flat_rows(stacks, sort="self_time")
        shown = rows[: opts.max_rows]
        out.line()
        out.line(f"Flat (by self time, per {'line' if opts.lines else 'function'}"
                 + (f"; top {len(shown)} of {len(rows)}" if len(shown) < len(rows) else "") + ")")
        cols = [Column("self", kind="num"), Column("self %", kind="num"), Column("total", kind="num"),
                Column("total %", kind="num")]
        if opts.counts:
            cols.append(Column("samples", kind="num", drop=1))
        cols.append(Column("function", min_width=30))
        cells, styles = [], {}
        for i, r in enumerate(shown):
            row = [_fmt_ns(r.self_ns), _pct(r.self_ns, total), _fmt_ns(r.total_ns), _pct(r.total_ns, total)]
            if opts.counts:
                row.append(str(r.count))
            row.append(self._label(r.frame, r.idle))
            cells.append(row)
            if r.idle:
                styles[i] = "dim"
        out.table(cols, cells, styles)

    def _label(self, frame: Frame, idle: bool = False) -> Labeled:
        """The frame's name and place, cut apart when they must be shortened (the renderer's rule)."""
        name = (frame.name or "?") + (" [idle]" if idle else "")
        return Labeled(name, calltree.frame_where(frame, line=self.options.lines))

    def _part(self, part: BackendResult, out: _Out) -> None:
        out.line()
        where = f" (rank {part.metadata['rank']}, {part.metadata.get('rank_host') or '-'})" if "rank" in part.metadata else ""
        out.line(f"== backend {part.backend}{where}")
        for ln in stackreport.overhead_lines(part):
            out.line("   " + ln)
        if part.samples:
            self._samples(part, out)
        self._spans(part, out)
        for table in part.tables:
            self._table(self._grouped(part, table, out), out)
        for name, summary in part.summaries.items():
            if name == "overhead":
                continue
            out.line()
            out.line(f"{name.replace('_', ' ').capitalize()} summary")
            out.table([Column("key", kind="label"), Column("value", kind="label")],
                      [[k, format_cell(k, val)] for k, val in summary.items()])
        self._counters(part, out)
        self._instants(part, out)
        self._allocations(part, out)
        self._artifacts(part, out)

    def _grouped(self, part: BackendResult, table: Table, out: _Out) -> Table:
        """A torch part's ``op_stats`` grouped as the options ask (rebuilt from its spans)."""
        o = self.options
        if table.name != "op_stats" or not (o.group_by_input_shape or o.group_by_stack_n):
            return table
        if not any(s.category == "cpu_op" for s in part.spans):
            out.line()
            out.line(f"(op_stats of backend {part.backend} are not grouped: grouping by input shape or stack needs "
                     f"torch ops)")
            return table
        from omniprof.analysis.torch_ops import op_table

        grouped = op_table(part, group_by_input_shape=o.group_by_input_shape, group_by_stack_n=o.group_by_stack_n)
        if grouped is None:
            return table
        if o.group_by_stack_n and not any(s.category == "python" or "call_stack" in s.args for s in part.spans):
            out.line()
            out.line("(no Python stacks were recorded: every op's stack is empty; record them with "
                     "python_tracer_level=1, torch's with_stack)")
        return grouped

    def _table(self, table: Table, out: _Out) -> None:
        out.line()
        shown = table.rows[: self.options.max_rows]
        more = len(table.rows) - len(shown)
        out.line((table.title or table.name) + (f" (top {len(shown)} of {len(table.rows)})" if more else ""))
        names = list(table.columns)
        # A grouped op table's stack goes last, one frame a line under its row, innermost first (as
        # torch's key_averages(group_by_stack_n=N).table() shows its "Source Location").
        si = names.index("stack") if "stack" in names and table.name.startswith("op_stats") else None
        order = [i for i in range(len(names)) if i != si] + ([si] if si is not None else [])
        names = [names[i] for i in order]
        shown = [tuple(row[i] for i in order) for row in shown]
        cells: list[list[Any]] = []
        for row in shown:
            cells.append([format_cell(c, val) for c, val in zip(names, row)])
            if si is not None:
                frames = _stack_frames(row[-1])
                cells[-1][-1] = frames[0] if frames else ""
                cells += [[""] * (len(names) - 1) + [f] for f in frames[1:]]
        numeric = [any(isinstance(r[i], (int, float)) and not isinstance(r[i], bool) for r in shown)
                   for i in range(len(names))]
        first_text = next((i for i, n in enumerate(numeric) if not n), None)
        cols = []
        for i, c in enumerate(names):
            if si is not None and i == len(names) - 1:
                cols.append(Column("stack (innermost first)", min_width=24))
            elif numeric[i]:
                # The first three number columns always stay; further ones may be left out (the
                # right-most first) when even shortened names cannot make room.
                rank = sum(numeric[:i])
                cols.append(Column(display_column(c), kind="num", drop=0 if rank < 3 else i))
            elif i == first_text:
                cols.append(Column(display_column(c), min_width=24, cut=_cut(c)))
            else:
                # A text column that tells apart rows the names alone do not (an op in two XLA modules)
                # always stays; other ones may be left out.
                apart = len({(r[first_text], r[i]) for r in shown}) > len({r[first_text] for r in shown})
                cols.append(Column(display_column(c), min_width=12, drop=0 if apart else i, cut=_cut(c)))
        out.table(cols, cells)

    # -- every other kind of data (kept apart from the call tree / flat code) ------------------------
    def _spans(self, part: BackendResult, out: _Out) -> None:
        rows = span_rows(part)
        if not rows:
            return
        shown = rows[: self.options.max_rows]
        out.line()
        out.line(f"Spans by total time ({len(part.spans)} spans, {len(rows)} names"
                 + (f", top {len(shown)}" if len(shown) < len(rows) else "") + ")")
        out.table([Column("total", kind="num"), Column("count", kind="num"), Column("mean", kind="num", drop=2),
                   Column("max", kind="num"), Column("category", min_width=12, drop=1), Column("name")],
                  [[_fmt_ns(r.total_ns), str(r.count), _fmt_ns(r.total_ns / r.count), _fmt_ns(r.max_ns), r.category,
                    r.name] for r in shown])

    def _counters(self, part: BackendResult, out: _Out) -> None:
        rows = counter_rows(part)
        if not rows:
            return
        out.line()
        out.line("Counters")
        out.table([Column("counter"), Column("unit", kind="label"), Column("points", kind="num"),
                   Column("min", kind="num"), Column("mean", kind="num"), Column("max", kind="num"),
                   Column("last", kind="num")],
                  [[r.name, r.unit, str(r.points)] + [_fmt_num(x) for x in (r.min, r.mean, r.max, r.last)]
                   for r in rows])

    def _instants(self, part: BackendResult, out: _Out) -> None:
        if not part.instants and not part.flows:
            return
        out.line()
        if part.instants:
            rows = instant_rows(part)
            shown = rows[: self.options.max_rows]
            out.line(f"Instant events ({len(part.instants)}"
                     + (f", top {len(shown)} of {len(rows)} names" if len(shown) < len(rows) else "") + ")")
            out.table([Column("count", kind="num"), Column("first at", kind="num"), Column("category", min_width=12),
                       Column("name")],
                      [[str(r.count), _fmt_ns(r.first_ns), r.category, r.name] for r in shown])
        if part.flows:
            linked = sum(1 for s in part.spans if s.flow_ids)
            out.line(f"Flows: {len(part.flows)} ({linked} spans linked)")

    def _allocations(self, part: BackendResult, out: _Out) -> None:
        if not part.allocations:
            return
        total = sum(a.size_bytes * a.count for a in part.allocations)
        live = sum(a.size_bytes * a.count for a in part.allocations if a.alive_at_end)
        objects = sum(a.count for a in part.allocations)
        rows = allocation_rows(part)
        shown = rows[: self.options.max_rows]
        out.line()
        out.line(f"Allocations: {objects} objects in {len(part.allocations)} records, {_fmt_bytes(total)} allocated, "
                 f"{_fmt_bytes(live)} still in use at the end")
        out.table([Column("allocated", kind="num"), Column("objects", kind="num"), Column("in use", kind="num"),
                   Column("function", min_width=30)],
                  [[_fmt_bytes(r.size_bytes), str(r.count), _fmt_bytes(r.in_use_bytes), Labeled(r.name, r.where)]
                   for r in shown])

    def _artifacts(self, part: BackendResult, out: _Out) -> None:
        facts = {k: val for k, val in part.metadata.items() if isinstance(val, (str, int, float, bool))}
        if part.threads or part.tasks or facts:
            out.line()
            if part.threads or part.tasks:
                out.line(f"Threads: {len(part.threads)} ({', '.join(t.name for t in part.threads)})"
                         + (f"; tasks: {len(part.tasks)}" if part.tasks else ""))
            if facts:
                out.line("Metadata: " + ", ".join(f"{k}={val:.6g}" if isinstance(val, float) else f"{k}={val}"
                                                  for k, val in facts.items()))
        if part.artifacts:
            out.line()
            out.line("Artifacts")
            out.table([Column("kind", kind="label"), Column("path", min_width=30), Column("description", min_width=20)],
                      [[a.kind, a.path, a.description] for a in part.artifacts])


def _stack_frames(value: Any) -> list[str]:
    """The frames of a grouped op table's ``stack`` cell (JSON, innermost first)."""
    if value is None:
        return []
    try:
        frames = json.loads(value) if isinstance(value, str) else value
    except ValueError:
        return [str(value)]
    if not isinstance(frames, list):
        return [str(value)]
    return [str(f) for f in frames]


# -- plain rows of the sections above -----------------------------------------------------------------
@attrs.frozen
class SpanRow:
    name: str
    category: str
    count: int
    total_ns: int
    max_ns: int


def span_rows(part: BackendResult) -> list[SpanRow]:
    """Spans grouped by (name, category), by total time, longest first."""
    agg: dict[tuple[str, str], list[int]] = {}
    for s in part.spans:
        a = agg.setdefault((s.name, s.category), [0, 0, 0])
        a[0] += 1
        a[1] += s.dur_ns
        a[2] = max(a[2], s.dur_ns)
    rows = [SpanRow(n, c, a[0], a[1], a[2]) for (n, c), a in agg.items()]
    rows.sort(key=lambda r: (-r.total_ns, r.name))
    return rows


@attrs.frozen
class CounterRow:
    name: str
    unit: str
    track: str
    points: int
    min: float | None
    mean: float | None
    max: float | None
    last: float | None


def counter_rows(part: BackendResult) -> list[CounterRow]:
    """One row per counter series: point count and min / mean / max / last value (NaNs left out)."""
    rows = []
    for c in part.counters:
        vals = [x for x in c.values if x == x]
        if vals:
            rows.append(CounterRow(c.name, c.unit, c.track, len(c.values), min(vals), sum(vals) / len(vals), max(vals),
                                   vals[-1]))
        else:
            rows.append(CounterRow(c.name, c.unit, c.track, len(c.values), None, None, None, None))
    return rows


@attrs.frozen
class InstantRow:
    name: str
    category: str
    count: int
    first_ns: int


def instant_rows(part: BackendResult) -> list[InstantRow]:
    """Instant events grouped by (name, category), most frequent first; ``first_ns`` is relative
    to the part's start."""
    agg: dict[tuple[str, str], list[int]] = {}
    for i in part.instants:
        a = agg.setdefault((i.name, i.category), [0, i.t_ns])
        a[0] += 1
        a[1] = min(a[1], i.t_ns)
    rows = [InstantRow(n, c, a[0], a[1] - part.start_ns) for (n, c), a in agg.items()]
    rows.sort(key=lambda r: (-r.count, r.name))
    return rows


@attrs.frozen
class AllocationRow:
    label: str
    count: int
    size_bytes: int
    in_use_bytes: int
    name: str = ""
    where: str = ""


def allocation_rows(part: BackendResult) -> list[AllocationRow]:
    """Allocations grouped by allocating function (the stack's leaf frame), most bytes first."""
    agg: dict[tuple[str, str], list[int]] = {}
    for a in part.allocations:
        stack = part.stacks[a.stack_id] if 0 <= a.stack_id < len(part.stacks) else ()
        f = part.frames[stack[-1]] if stack else None
        key = (f.name or "?", calltree.frame_where(f)) if f is not None else ("[unknown stack]", "")
        acc = agg.setdefault(key, [0, 0, 0])
        acc[0] += a.count
        acc[1] += a.size_bytes * a.count
        acc[2] += a.size_bytes * a.count if a.alive_at_end else 0
    rows = [AllocationRow(str(Labeled(*k)), v[0], v[1], v[2], *k) for k, v in agg.items()]
    rows.sort(key=lambda r: (-r.size_bytes, r.label))
    return rows


def _fmt_num(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.4g}" if abs(x) < 1e6 else f"{x:.3e}"


def _by_task(stacks: Sequence[calltree.Stack]) -> list[tuple[int | None, list[calltree.Stack]]]:
    groups: dict[int | None, list[calltree.Stack]] = {}
    for s in stacks:
        groups.setdefault(s.task_id, []).append(s)
    return sorted(groups.items(), key=lambda kv: (kv[0] is None, -sum(s.weight for s in kv[1]), kv[0] or 0))
