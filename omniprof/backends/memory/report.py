"""Allocation reports: plain rows first (tables in the result), text second.

Weights: ``by="bytes"`` uses ``size_bytes * count`` (the estimate each sampled allocation stands
for), ``by="count"`` uses ``count``.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import Any

import attrs

from omniprof.analysis import calltree
from omniprof.analysis.render import Column, render_table
from omniprof.analysis.stackreport import (build_report, frame_where, group_title, print_options, tree_indent,
                                          where_and_name)
from omniprof.core.results import Allocation, BackendResult, Frame, ProfileResult, StackSample, Table
from omniprof.core.units import format_bytes as _fmt_bytes

__all__ = ["allocation_tables", "tree_rows", "flat_rows", "format_allocs"]


def _weight(by: str) -> Callable[[Allocation], int]:
    if by == "bytes":
        return lambda a: a.size_bytes * a.count
    if by == "count":
        return lambda a: a.count
    raise ValueError(f"'by' must be one of bytes, count (got {by!r})")


def _site(part: BackendResult, a: Allocation) -> Frame | None:
    stack = part.stacks[a.stack_id]
    return part.frames[stack[-1]] if stack else None


def _loc(f: Frame | None) -> tuple[str, str]:
    if f is None:
        return "<no Python frame>", ""
    return f.name, f"{f.file}:{f.line}" if f.file else ""


def flat_rows(part: BackendResult, by: str = "bytes") -> list[dict[str, Any]]:
    """One row per allocation site (leaf frame): estimated bytes and count, alive share."""
    w = _weight(by)
    sites: dict[Any, dict[str, Any]] = {}
    total = sum(w(a) for a in part.allocations) or 1
    for a in part.allocations:
        f = _site(part, a)
        key = (f.name, f.file, f.line) if f else None
        row = sites.get(key)
        if row is None:
            name, loc = _loc(f)
            row = sites[key] = {"function": name, "location": loc, "bytes": 0, "count": 0, "alive_bytes": 0,
                                "alive_count": 0, "where": calltree.frame_where(f) if f else ""}
        row["bytes"] += a.size_bytes * a.count
        row["count"] += a.count
        if a.alive_at_end:
            row["alive_bytes"] += a.size_bytes * a.count
            row["alive_count"] += a.count
    rows = list(sites.values())
    key = "bytes" if by == "bytes" else "count"
    for r in rows:
        r["share_pct"] = round(100.0 * r[key] / total, 2)
    rows.sort(key=lambda r: (-r[key], r["function"]))
    return rows


def tree_rows(part: BackendResult, by: str = "bytes", maxdepth: int | None = None,
              noisefloor_pct: float = 0.0) -> list[dict[str, Any]]:
    """Depth-first call tree of allocations (root first), weights summed over callees (the one
    call tree, :mod:`omniprof.analysis.calltree`, weighted by bytes or count)."""
    _weight(by)
    root = calltree.build_tree(calltree.allocation_stacks(part, by))
    total = root.total or 1
    return [{"depth": r.depth, "weight": r.total_ns, "self": r.self_ns, "percent": round(100.0 * r.total_ns / total, 2),
             "function": r.frame.name, "location": f"{r.frame.file}:{r.frame.line}" if r.frame.file else "",
             "frame": r.frame}
            for r in calltree.tree_rows(root, sort="time", maxdepth=maxdepth, min_share=noisefloor_pct / 100.0)]


def allocation_tables(part: BackendResult, largest: int = 20) -> tuple[Table, ...]:
    """The derived tables stored in a memory result: by site, largest, leak candidates."""
    if not part.allocations:
        return ()
    rows = flat_rows(part, "bytes")
    by_site = Table("alloc_by_site", ("function", "location", "allocated_bytes", "allocations", "share_pct", "alive_bytes"),
                    [(r["function"], r["location"], r["bytes"], r["count"], r["share_pct"], r["alive_bytes"])
                     for r in rows], title="Allocations by site (estimated from samples)")
    big = sorted(part.allocations, key=lambda a: -a.size_bytes)[:largest]
    largest_t = Table("largest_allocations", ("size_bytes", "function", "location", "alive_at_end"),
                      [(a.size_bytes, *_loc(_site(part, a)), a.alive_at_end) for a in big],
                      title="Largest sampled allocations")
    leaks = sorted((r for r in rows if r["alive_bytes"]), key=lambda r: -r["alive_bytes"])
    leak_t = Table("leak_candidates", ("function", "location", "alive_bytes", "alive_allocations"),
                   [(r["function"], r["location"], r["alive_bytes"], r["alive_count"]) for r in leaks],
                   title="Still alive at the end (leak candidates, estimated)")
    return (by_site, largest_t, leak_t)


def format_allocs(result: ProfileResult | BackendResult, *, by: str = "bytes", **options: Any) -> list[str]:
    """Text lines of an allocation report, with the options of ``omniprof.cpu.print``.

    Each recorded allocation is one "sample" of its stack, so ``format``, ``C``, ``combine``,
    ``maxdepth``, ``sortedby``, ``groupby``, ``noisefloor``, ``mincount``, ``recur``, ``threads``
    and ``cols`` mean what they mean there; Count is recorded allocations. Beside it, ``by``
    ("bytes" or "count") is the estimate each row stands for: bytes (``size * count``) or
    allocations (``count``).
    """
    w = _weight(by)
    opts = print_options(options)
    part = result.part("memory") if isinstance(result, ProfileResult) else result
    if part is None:
        raise ValueError("no 'memory' part in this result: profile with omniprof.memory.profile() or backend='memory'")
    cols = opts.cols or 120
    fmt = _fmt_bytes if by == "bytes" else str
    pseudo = attrs.evolve(part, samples=[StackSample(a.t_ns, a.thread_id or 0, a.stack_id, w(a))
                                         for a in part.allocations], allocations=(), tables=(), counters=())
    groups = build_report(pseudo, opts)
    s = part.summaries.get("memory", {})
    lines = []
    head = f"allocations: {s.get('allocations', '?')}"
    if "allocated_bytes" in s:
        head += f" ({_fmt_bytes(s['allocated_bytes'])})"
    head += f", recorded {len(part.allocations)} at sample_rate {s.get('sample_rate')}, engine {s.get('engine')}"
    if "est_allocated_bytes" in s:
        head += (f"; estimated {_fmt_bytes(s['est_allocated_bytes'])}"
                 f" +/- {_fmt_bytes(s.get('est_allocated_bytes_stderr', 0))} (standard error)")
    lines += _wrap(head, cols)
    for loss in part.losses:
        lines += _wrap(f"! {loss.count} {loss.unit} not recorded ({loss.kind}): {loss.detail}", cols)
    if not groups:
        lines.append("No allocations recorded (raise sample_rate, or profile longer).")
        return lines
    grand = sum(g.samples for g in groups)
    label = "Bytes" if by == "bytes" else "Allocs"
    for gi, g in enumerate(groups):
        if g.path:
            if gi:
                lines.append("")
            lines.extend(x.split("  Total snapshots")[0][:cols] for x in group_title(g, grand))
        if opts.format == "tree":
            wc = max([len(str(r.count)) for r in g.tree] + [5])
            wb = max([len(fmt(r.total_ns)) for r in g.tree] + [len(label)])
            lines.append(f"{label:>{wb}} {'Count':>{wc}} ╎ [+additional indent] File:Line; Function"[:cols])
            lines.append("=" * min(cols, wb + wc + 45))
            for r in g.tree:
                where = frame_where(r.frame)
                lead = f"{fmt(r.total_ns):>{wb}} {r.count:>{wc}} ╎{tree_indent(r.depth)}"
                lines.append((lead + where_and_name(where, r.frame.name, cols - len(lead)))[:cols])
        else:
            lines += _flat_table(g.flat, fmt, label, cols)
    return lines


def _wrap(line: str, cols: int) -> list[str]:
    """``line`` wrapped at words within ``cols``, never inside a word or a number."""
    return textwrap.wrap(line, cols, subsequent_indent="    ", break_long_words=False, break_on_hyphens=False) or [""]


def _flat_table(rows: list[calltree.FlatRow], fmt: Callable[[int], str], label: str, cols: int) -> list[str]:
    """The flat list through the one renderer: paths cut at their start, names in their middle."""
    columns = [Column("Count", kind="num"), Column("Self", kind="num"), Column(label, kind="num"),
               Column("Self" + label.lower(), kind="num"), Column("File", min_width=16, cut="start"),
               Column("Line", kind="num"), Column("Function", min_width=20)]
    cells = [[str(r.count), str(r.self_count), fmt(r.total_ns), fmt(r.self_ns),
              calltree.short_path(r.frame.file) if r.frame.file else (r.frame.module or ""),
              str(r.frame.line) if r.frame.file else "?", r.frame.name] for r in rows]
    return render_table(columns, cells, width=cols).splitlines()
