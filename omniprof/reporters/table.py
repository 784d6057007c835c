"""Reporter ``table``: a terminal report of every kind of data a result holds.

Rows are built first (:func:`tree_rows`, :func:`flat_rows_for`, :func:`table_rows`), then
formatted: with rich when writing to a terminal, as plain aligned text otherwise.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from typing import IO, Any

import attrs

from omniprof.analysis import stackreport, stacktree
from omniprof.core import validators as v
from omniprof.core.results import BackendResult, Frame, ProfileResult, Table
from omniprof.core.text import printable
from omniprof.core.units import format_bytes as _fmt_bytes
from omniprof.core.units import format_ns as _fmt_ns
from omniprof.plugin import Reporter

__all__ = ["TableReporter", "TableOptions", "tree_rows", "flat_rows_for", "frame_label", "span_rows", "counter_rows",
           "instant_rows", "allocation_rows"]


@attrs.frozen(kw_only=True)
class TableOptions:
    """Options of the ``table`` reporter.

    Attributes:
        format: ``"both"`` (tree then flat), ``"tree"`` or ``"flat"``.
        max_rows: most rows per flat list or derived table.
        max_depth: deepest call-tree level shown (None: all).
        min_percent: hide tree nodes under this share of the total (noise floor).
        width: line width (None: the terminal's, or 120 when not a terminal).
        color: ``"auto"`` (rich on a terminal), ``"always"`` or ``"never"``.
        groupby: sampled stacks per ``"thread"``, ``"task"``, both (``["thread", "task"]``) or
            ``"none"`` (see :class:`omniprof.analysis.stackreport.PrintOptions`).
        native: show native (C) frames when the part has them.
    """

    format: str = attrs.field(default="both", validator=v.one_of("both", "tree", "flat"))
    max_rows: int = attrs.field(default=30, validator=v.int_in_range(1))
    max_depth: int | None = attrs.field(default=None, validator=v.int_in_range(1, optional=True))
    min_percent: float = attrs.field(default=0.5, validator=v.number_in_range(0.0, 100.0))
    width: int | None = attrs.field(default=None, validator=v.int_in_range(20, optional=True))
    color: str = attrs.field(default="auto", validator=v.one_of("auto", "always", "never"))
    groupby: Any = attrs.field(default="none", converter=stackreport._groupby,
                               validator=v.one_of(*stackreport.GROUPBYS))
    native: bool = attrs.field(default=True, validator=v.is_bool)


def frame_label(frame: Frame) -> str:
    where = f"{_short_path(frame.file)}:{frame.line}" if frame.file else (frame.module or "")
    return f"{frame.name}  {where}" if where else frame.name


def _short_path(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path


@attrs.frozen
class TreeRow:
    depth: int
    percent: float
    self_percent: float
    total_ns: int
    self_ns: int
    count: int
    frame: Frame


def _print_opts(opts: TableOptions, fmt: str, sortedby: str) -> stackreport.PrintOptions:
    return stackreport.PrintOptions(format=fmt, sortedby=sortedby, maxdepth=opts.max_depth, native=opts.native,
                                    groupby=opts.groupby)


def tree_rows(part: BackendResult, opts: TableOptions = TableOptions(),
              group: stackreport.GroupReport | None = None) -> list[TreeRow]:
    """Call-tree rows (children by sample count), hiding nodes under ``min_percent`` of the time."""
    if group is None:
        groups = stackreport.build_report(part, _print_opts(attrs.evolve(opts, groupby="none"), "tree", "count"))
        if not groups:
            return []
        group = groups[0]
    total = group.total_ns or 1
    rows = []
    hidden_depth: int | None = None
    for r in group.tree:
        if hidden_depth is not None and r.depth > hidden_depth:
            continue
        hidden_depth = None
        pct = 100.0 * r.total_ns / total
        if pct < opts.min_percent:
            hidden_depth = r.depth
            continue
        rows.append(TreeRow(r.depth, pct, 100.0 * r.self_ns / total, r.total_ns, r.self_ns, r.count, r.frame))
    return rows


def flat_rows_for(part: BackendResult, opts: TableOptions = TableOptions(),
                  group: stackreport.GroupReport | None = None) -> list[stacktree.FlatRow]:
    """Flat rows by self time, at most ``max_rows``."""
    if group is None:
        groups = stackreport.build_report(part, _print_opts(attrs.evolve(opts, groupby="none"), "flat", "overhead"))
        if not groups:
            return []
        group = groups[0]
    rows = sorted(group.flat, key=lambda r: (-r.self_ns, -r.total_ns, r.frame.name))
    return [stacktree.FlatRow(r.frame, r.total_ns, r.self_ns, r.count, r.self_count) for r in rows[: opts.max_rows]]


def _fmt_cell(col: str, value: Any) -> str:
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


class _Out:
    """Block builder: plain lines and grids, kept as blocks so a grid can be drawn as a rich table
    on a terminal or as aligned plain text otherwise. Everything fits ``width`` columns: a grid's
    widest text column is shortened (ending in ``...``) before any line is cut."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.lines: list[str] = []
        # ("line", text) or ("grid", header, rows, align); lines[] is the plain rendering.
        self.blocks: list[tuple[Any, ...]] = []

    def line(self, text: str = "") -> None:
        text = "\n".join(printable(x) for x in text.split("\n"))  # names from traces: no raw escape sequences
        self.blocks.append(("line", text))
        self.lines.append(_cut(text, self.width))

    def grid(self, header: Sequence[str], rows: Sequence[Sequence[str]], align: str) -> None:
        header = [printable(h) for h in header]
        rows = [[printable(c) for c in r] for r in rows]
        self.blocks.append(("grid", header, rows, align))
        widths = [len(h) for h in header]
        for r in rows:
            widths = [max(w, len(c)) for w, c in zip(widths, r)]
        widths = _fit_widths(widths, header, align, self.width)

        def fmt(cells: Sequence[str]) -> str:
            cells = [_cut(c, w) for c, w in zip(cells, widths)]
            parts = [c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(cells, widths, align)]
            return "  ".join(parts).rstrip()

        self.lines.append(_cut(fmt(header), self.width))
        self.lines.append(_cut(fmt(["-" * w for w in widths]), self.width))
        for r in rows:
            self.lines.append(_cut(fmt(r), self.width))


def _display_column(name: str) -> str:
    """A column header for people: cells already carry the unit, so ``total_ns`` shows as ``total``."""
    for suffix, shown in (("_ns", ""), ("_bytes", ""), ("_pct", " %")):
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)] + shown
    return name


def _fits(header: Sequence[str], rows: Sequence[Sequence[str]], align: str, width: int) -> bool:
    widths = [len(h) for h in header]
    for r in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, r)]
    widths = _fit_widths(widths, header, align, width)
    return sum(widths) + 2 * (len(widths) - 1) <= width


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else (text[: width - 3] + "..." if width > 3 else text[:width])


def _fit_widths(widths: list[int], header: Sequence[str], align: str, width: int) -> list[int]:
    """Shrink left-aligned (text) columns, widest first, until the row fits ``width``."""
    widths = list(widths)
    gaps = 2 * (len(widths) - 1)
    excess = sum(widths) + gaps - width
    while excess > 0:
        text_cols = [i for i, a in enumerate(align) if a == "l" and widths[i] > max(len(header[i]), 8)]
        if not text_cols:
            break
        i = max(text_cols, key=lambda k: widths[k])
        floor = max(len(header[i]), 8)
        others = sorted((widths[k] for k in text_cols if k != i), reverse=True)
        target = max(floor, widths[i] - excess, others[0] if others else floor)
        if target >= widths[i]:
            target = widths[i] - 1
        excess -= widths[i] - target
        widths[i] = target
    return widths


class TableReporter(Reporter):
    """Call tree, flat profile, derived tables, summaries and losses, sized to the terminal."""

    name = "table"
    output = "stream"
    summary = "terminal report: call tree, flat list, op/kernel tables, summaries, losses"
    Options = TableOptions

    def report(self, result: ProfileResult, dest: IO[str]) -> None:  # type: ignore[override]
        opts = self.options
        isatty = bool(getattr(dest, "isatty", lambda: False)())
        width = opts.width or (shutil.get_terminal_size((120, 24)).columns if isatty else 120)
        out = _Out(width)
        self.build(result, out)
        use_rich = opts.color == "always" or (opts.color == "auto" and isatty and not os.environ.get("NO_COLOR"))
        if use_rich:
            _render_rich(out, dest, width, force=opts.color == "always")
        else:
            dest.write("\n".join(out.lines) + "\n")

    def build(self, result: ProfileResult, out: _Out) -> None:
        md = result.metadata
        dur = (md.end_ns - md.start_ns) / 1e9 if md.end_ns else 0.0
        out.line(f"== omniprof {', '.join(md.backends) or '-'}  {dur:.3f} s  host {md.host or '-'} pid {md.pid}"
                 + ("  [PARTIAL]" if result.partial else ""))
        for err in result.errors:
            out.line(f"! {err.source} failed at {err.phase}: {err.type}: {err.message}")
        for loss in result.losses:
            out.line(f"! {loss.source}: {loss.count} {loss.unit} not recorded ({loss.kind}) {loss.detail}".rstrip())
        for part in result.parts:
            self._part(part, out)

    def _part(self, part: BackendResult, out: _Out) -> None:
        opts = self.options
        out.line()
        out.line(f"== backend {part.backend}")
        for ln in stackreport.overhead_lines(part):
            out.line("   " + ln)
        if part.samples:
            tree_groups = flat_groups = None
            if opts.format in ("both", "tree"):
                tree_groups = stackreport.build_report(part, _print_opts(opts, "tree", "count"))
            if opts.format in ("both", "flat"):
                flat_groups = stackreport.build_report(part, _print_opts(opts, "flat", "overhead"))
            groups = tree_groups if tree_groups is not None else flat_groups
            for gi, g in enumerate(groups or []):
                total = g.total_ns or 1
                if g.path:
                    out.line()
                    out.line(" / ".join(f"{k} {i} ({n})" for k, i, n in g.path) + f": {g.samples} samples")
                if tree_groups is not None:
                    out.line()
                    out.line(f"Call tree (share of {_fmt_ns(total)} sampled; nodes under {opts.min_percent}% hidden)")
                    rows = tree_rows(part, opts, tree_groups[gi])
                    out.grid(["total%", "self%", "samples", "function"],
                             [[f"{r.percent:.1f}", f"{r.self_percent:.1f}", str(r.count),
                               "  " * r.depth + frame_label(r.frame)] for r in rows], "rrrl")
                if flat_groups is not None:
                    out.line()
                    out.line("Flat (by self time)")
                    frows = flat_rows_for(part, opts, flat_groups[gi])
                    out.grid(["self%", "total%", "self", "total", "samples", "function"],
                             [[f"{100 * r.self_ns / total:.1f}", f"{100 * r.total_ns / total:.1f}", _fmt_ns(r.self_ns),
                               _fmt_ns(r.total_ns), str(r.count), frame_label(r.frame)] for r in frows], "rrrrrl")
        self._spans(part, out)
        for table in part.tables:
            self._table(table, out)
        for name, summary in part.summaries.items():
            if name == "overhead":
                continue
            out.line()
            out.line(f"{name.replace('_', ' ').capitalize()} summary")
            out.grid(["key", "value"], [[k, _fmt_cell(k, val)] for k, val in summary.items()], "ll")
        self._counters(part, out)
        self._instants(part, out)
        self._allocations(part, out)
        self._artifacts(part, out)

    def _table(self, table: Table, out: _Out) -> None:
        out.line()
        shown = table.rows[: self.options.max_rows]
        more = len(table.rows) - len(shown)
        out.line((table.title or table.name) + (f" (top {len(shown)} of {len(table.rows)})" if more else ""))
        cells = [[_fmt_cell(c, val) for c, val in zip(table.columns, row)] for row in shown]
        align = "".join("r" if any(isinstance(r[i], (int, float)) and not isinstance(r[i], bool) for r in shown) else "l"
                        for i in range(len(table.columns)))
        header = [_display_column(c) for c in table.columns]
        keep = list(range(len(header)))
        # Too wide even with text columns shortened: leave out columns from the right, and say so.
        while len(keep) > 2 and not _fits([header[i] for i in keep], [[r[i] for i in keep] for r in cells],
                                          "".join(align[i] for i in keep), out.width):
            keep.pop()
        out.grid([header[i] for i in keep], [[r[i] for i in keep] for r in cells], "".join(align[i] for i in keep))
        hidden = [table.columns[i] for i in range(len(header)) if i not in keep]
        if hidden:
            out.line(f"  (not shown, too wide: {', '.join(hidden)})")

    # -- every other kind of data (kept apart from the call tree / flat code) ------------------------
    def _spans(self, part: BackendResult, out: _Out) -> None:
        rows = span_rows(part)
        if not rows:
            return
        shown = rows[: self.options.max_rows]
        out.line()
        out.line(f"Spans by total time ({len(part.spans)} spans, {len(rows)} names"
                 + (f", top {len(shown)}" if len(shown) < len(rows) else "") + ")")
        out.grid(["total", "count", "mean", "max", "category", "name"],
                 [[_fmt_ns(r.total_ns), str(r.count), _fmt_ns(r.total_ns / r.count), _fmt_ns(r.max_ns), r.category,
                   r.name] for r in shown], "rrrrll")

    def _counters(self, part: BackendResult, out: _Out) -> None:
        rows = counter_rows(part)
        if not rows:
            return
        out.line()
        out.line("Counters")
        out.grid(["counter", "unit", "points", "min", "mean", "max", "last"],
                 [[r.name, r.unit, str(r.points)] + [_fmt_num(x) for x in (r.min, r.mean, r.max, r.last)]
                  for r in rows], "llrrrrr")

    def _instants(self, part: BackendResult, out: _Out) -> None:
        if not part.instants and not part.flows:
            return
        out.line()
        if part.instants:
            rows = instant_rows(part)
            shown = rows[: self.options.max_rows]
            out.line(f"Instant events ({len(part.instants)}"
                     + (f", top {len(shown)} of {len(rows)} names" if len(shown) < len(rows) else "") + ")")
            out.grid(["count", "first at", "category", "name"],
                     [[str(r.count), _fmt_ns(r.first_ns), r.category, r.name] for r in shown], "rrll")
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
        out.grid(["allocated", "objects", "in use", "function"],
                 [[_fmt_bytes(r.size_bytes), str(r.count), _fmt_bytes(r.in_use_bytes), r.label] for r in shown], "rrrl")

    def _artifacts(self, part: BackendResult, out: _Out) -> None:
        facts = {k: val for k, val in part.metadata.items() if isinstance(val, (str, int, float, bool))}
        if part.threads or part.tasks or facts:
            out.line()
            if part.threads or part.tasks:
                out.line(f"Threads: {len(part.threads)} ({', '.join(t.name for t in part.threads)})"
                         + (f"; tasks: {len(part.tasks)}" if part.tasks else ""))
            if facts:
                out.line("Metadata: " + ", ".join(f"{k}={val}" for k, val in facts.items()))
        if part.artifacts:
            out.line()
            out.line("Artifacts")
            out.grid(["kind", "path", "description"], [[a.kind, a.path, a.description] for a in part.artifacts], "lll")


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


def allocation_rows(part: BackendResult) -> list[AllocationRow]:
    """Allocations grouped by allocating function (the stack's leaf frame), most bytes first."""
    agg: dict[str, list[int]] = {}
    for a in part.allocations:
        stack = part.stacks[a.stack_id] if 0 <= a.stack_id < len(part.stacks) else ()
        label = frame_label(part.frames[stack[-1]]) if stack else "[unknown stack]"
        acc = agg.setdefault(label, [0, 0, 0])
        acc[0] += a.count
        acc[1] += a.size_bytes * a.count
        acc[2] += a.size_bytes * a.count if a.alive_at_end else 0
    rows = [AllocationRow(k, v[0], v[1], v[2]) for k, v in agg.items()]
    rows.sort(key=lambda r: (-r.size_bytes, r.label))
    return rows


def _fmt_num(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.4g}" if abs(x) < 1e6 else f"{x:.3e}"


def _render_rich(out: _Out, dest: IO[str], width: int, *, force: bool) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table as RichTable
    from rich.text import Text

    console = Console(file=dest, width=width, force_terminal=force or None, highlight=False)
    for block in out.blocks:
        if block[0] == "line":
            ln = block[1]
            style = "bold" if ln.startswith("== ") else ("yellow" if ln.startswith("! ") else "")
            console.print(Text(_cut(ln, width), style=style), soft_wrap=True)
            continue
        _, header, rows, align = block
        t = RichTable(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
        for h, a in zip(header, align):
            t.add_column(h, justify="right" if a == "r" else "left", no_wrap=True, overflow="ellipsis")
        for r in rows:
            t.add_row(*r)
        console.print(t)
