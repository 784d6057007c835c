"""Reporter ``markdown``: a short Markdown summary of a result, for pull requests and CI logs.

Sections: the run (backends, duration, host, partial or not), errors and losses, then per backend
the top functions by self time (from stack samples), every derived table (op / kernel statistics),
summaries and counters (min / mean / max). Rows are built first (:func:`sections`) and formatted
second (:func:`to_markdown`).
"""

from __future__ import annotations

from typing import IO, Any

import attrs

from omniprof.analysis import calltree
from omniprof.core import validators as v
from omniprof.core.results import ProfileResult
from omniprof.plugin import Reporter

__all__ = ["MarkdownReporter", "MarkdownOptions", "sections", "to_markdown"]


@attrs.frozen(kw_only=True)
class MarkdownOptions:
    """Options of the ``markdown`` reporter.

    Attributes:
        max_rows: most rows per table (the rest is counted in a note).
        include_counters: add a counter section (min / mean / max of each series).
    """

    max_rows: int = attrs.field(default=15, validator=v.int_in_range(1, 10_000))
    include_counters: bool = attrs.field(default=True, validator=v.is_bool)


@attrs.frozen
class Section:
    """A heading, an optional table (header + rows of strings) and notes."""

    title: str
    header: tuple[str, ...] = ()
    rows: tuple[tuple[str, ...], ...] = ()
    notes: tuple[str, ...] = ()


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f}"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def sections(result: ProfileResult, opts: MarkdownOptions = MarkdownOptions()) -> list[Section]:
    """The report as plain data."""
    md = result.metadata
    dur_ms = (md.end_ns - md.start_ns) / 1e6 if md.end_ns else 0.0
    notes = [f"backends: {', '.join(md.backends) or '-'}", f"duration: {dur_ms:.3f} ms",
             f"host: {md.host or '-'} (pid {md.pid})"]
    if result.partial:
        notes.append("**partial result**")
    notes += [f"error: {e.source} failed at {e.phase}: {e.type}: {e.message}" for e in result.errors]
    notes += [f"lost: {loss.source}: {loss.count} {loss.unit} ({loss.kind}) {loss.detail}".rstrip()
              for loss in result.losses]
    out = [Section("omniprof run", notes=tuple(notes))]
    n = opts.max_rows
    for part in result.parts:
        if part.samples:
            total = sum(s.weight_ns for s in part.samples) or 1
            flat = calltree.flat_profile(part)
            rows = tuple((r.frame.name, f"{r.frame.file}:{r.frame.line}" if r.frame.file else (r.frame.module or ""),
                          _ms(r.self_ns), f"{100 * r.self_ns / total:.1f}", _ms(r.total_ns)) for r in flat[:n])
            more = (f"{len(flat) - n} more functions not shown",) if len(flat) > n else ()
            out.append(Section(f"{part.backend}: top functions by self time",
                               ("function", "where", "self ms", "self %", "total ms"), rows, more))
        for table in part.tables:
            rows = tuple(tuple(_cell(c) for c in r) for r in table.rows[:n])
            more = (f"{len(table.rows) - n} more rows not shown",) if len(table.rows) > n else ()
            out.append(Section(f"{part.backend}: {table.title or table.name}", tuple(table.columns), rows, more))
        for name, summary in part.summaries.items():
            out.append(Section(f"{part.backend}: {name} summary", ("key", "value"),
                               tuple((k, _cell(val)) for k, val in summary.items())))
        if opts.include_counters and part.counters:
            rows = tuple((c.name, c.unit, str(len(c.values)), _cell(min(c.values)),
                          _cell(sum(c.values) / len(c.values)), _cell(max(c.values)))
                         for c in part.counters if c.values)
            out.append(Section(f"{part.backend}: counters", ("counter", "unit", "n", "min", "mean", "max"), rows))
    return out


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def to_markdown(secs: list[Section]) -> str:
    """Format sections as GitHub-flavoured Markdown."""
    lines: list[str] = []
    for i, s in enumerate(secs):
        lines.append(("# " if i == 0 else "## ") + _escape(s.title))
        lines.append("")
        if s.header:
            lines.append("| " + " | ".join(_escape(h) for h in s.header) + " |")
            lines.append("|" + "|".join(" --- " for _ in s.header) + "|")
            for r in s.rows:
                lines.append("| " + " | ".join(_escape(c) for c in r) + " |")
            lines.append("")
        for note in s.notes:
            lines.append(f"- {note}")
        if s.notes:
            lines.append("")
    return "\n".join(lines)


class MarkdownReporter(Reporter):
    """A Markdown summary file (``omniprof-summary.md``)."""

    name = "markdown"
    api_version = 1
    output = "file"
    default_filename = "omniprof-summary.md"
    summary = "Markdown summary: top functions, op/kernel tables, summaries, counters"
    Options = MarkdownOptions

    def report(self, result: ProfileResult, dest: IO[bytes]) -> None:  # type: ignore[override]
        dest.write(to_markdown(sections(result, self.options)).encode("utf-8"))
