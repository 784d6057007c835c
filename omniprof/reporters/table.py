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

from omniprof.core import stackreport, stacktree
from omniprof.core import validators as v
from omniprof.core.results import BackendResult, Frame, ProfileResult, Table
from omniprof.reporters.base import Reporter

__all__ = ["TableReporter", "TableOptions", "tree_rows", "flat_rows_for", "frame_label"]


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
            ``"none"`` (see :class:`omniprof.core.stackreport.PrintOptions`).
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


def _fmt_ns(ns: float) -> str:
    if ns >= 1e9:
        return f"{ns / 1e9:.3f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.2f} us"
    return f"{ns:.0f} ns"


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


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


class _Out:
    """Plain-text block builder; rich is used only for the final print on a terminal."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.lines: list[str] = []

    def line(self, text: str = "") -> None:
        self.lines.append(text if len(text) <= self.width else text[: self.width - 3] + "...")

    def grid(self, header: Sequence[str], rows: Sequence[Sequence[str]], align: str) -> None:
        widths = [len(h) for h in header]
        for r in rows:
            widths = [max(w, len(c)) for w, c in zip(widths, r)]

        def fmt(cells: Sequence[str]) -> str:
            parts = [c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(cells, widths, align)]
            return "  ".join(parts).rstrip()

        self.line(fmt(header))
        self.line(fmt(["-" * w for w in widths]))
        for r in rows:
            self.line(fmt(r))


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
        text = "\n".join(out.lines) + "\n"
        use_rich = opts.color == "always" or (opts.color == "auto" and isatty and not os.environ.get("NO_COLOR"))
        if use_rich:
            from rich.console import Console
            from rich.text import Text

            console = Console(file=dest, width=width, force_terminal=opts.color == "always" or None, highlight=False)
            for ln in out.lines:
                style = "bold" if ln.startswith("== ") else ("yellow" if ln.startswith("! ") else None)
                console.print(Text(ln, style=style or ""), soft_wrap=True)
        else:
            dest.write(text)

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
            for gi in range(len(tree_groups or flat_groups or [])):
                g = (tree_groups or flat_groups)[gi]  # type: ignore[index]
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
        elif part.spans and not part.tables:
            out.line()
            out.line("Spans (by total time)")
            agg: dict[str, list[int]] = {}
            for s in part.spans:
                a = agg.setdefault(s.name, [0, 0])
                a[0] += s.dur_ns
                a[1] += 1
            top = sorted(agg.items(), key=lambda kv: -kv[1][0])[: opts.max_rows]
            out.grid(["total", "count", "name"], [[_fmt_ns(a[0]), str(a[1]), n] for n, a in top], "rrl")
        for table in part.tables:
            self._table(table, out)
        for name, summary in part.summaries.items():
            if name == "overhead":
                continue
            out.line()
            out.line(f"{name.replace('_', ' ').capitalize()} summary")
            out.grid(["key", "value"], [[k, _fmt_cell(k, val)] for k, val in summary.items()], "ll")
        for c in part.counters:
            if c.values:
                out.line(f"counter {c.name} [{c.unit}]: n={len(c.values)} min={min(c.values):.4g} "
                         f"max={max(c.values):.4g} mean={sum(c.values) / len(c.values):.4g}")

    def _table(self, table: Table, out: _Out) -> None:
        out.line()
        shown = table.rows[: self.options.max_rows]
        more = len(table.rows) - len(shown)
        out.line((table.title or table.name) + (f" (top {len(shown)} of {len(table.rows)})" if more else ""))
        cells = [[_fmt_cell(c, val) for c, val in zip(table.columns, row)] for row in shown]
        align = "".join("r" if any(isinstance(r[i], (int, float)) and not isinstance(r[i], bool) for r in shown) else "l"
                        for i in range(len(table.columns)))
        out.grid(list(table.columns), cells, align)
