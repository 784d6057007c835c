"""Allocation reports: plain rows first (tables in the result), text second.

Weights: ``by="bytes"`` uses ``size_bytes * count`` (the estimate each sampled allocation stands
for), ``by="count"`` uses ``count``.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from typing import IO, Any

from omniprof.analysis import calltree
from omniprof.core.results import Allocation, BackendResult, Frame, ProfileResult, Table
from omniprof.core.units import format_bytes as _fmt_bytes
from omniprof.analysis.render import Column, Indented, print_table

__all__ = ["allocation_tables", "tree_rows", "flat_rows", "print_allocs"]


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


def print_allocs(result: ProfileResult | BackendResult, *, format: str = "flat", by: str = "bytes",
                 maxdepth: int | None = None, noisefloor: float = 0.0, mincount: int = 0, cols: int | None = None,
                 io_: IO[str] | None = None) -> None:
    """Print an allocation report (Julia's ``Profile.Allocs`` view, in text).

    Args:
        result: a result from the ``memory`` backend (or its part).
        format: ``"flat"`` (by allocation site) or ``"tree"`` (by call path).
        by: ``"bytes"`` or ``"count"``.
        maxdepth: deepest tree level shown.
        noisefloor: hide tree nodes under this percentage of the total.
        mincount: hide flat rows whose estimated count is below this.
        cols: line width (default: terminal width).
        io_: where to write (default stdout).
    """
    part = result.part("memory") if isinstance(result, ProfileResult) else result
    if format not in ("flat", "tree"):
        raise ValueError(f"'format' must be one of flat, tree (got {format!r})")
    out = io_ or sys.stdout
    width = cols or (shutil.get_terminal_size((120, 24)).columns if out.isatty() else None)
    fmt = _fmt_bytes if by == "bytes" else str
    s = part.summaries.get("memory", {})
    out.write(f"allocations: {s.get('allocations', '?')} "
              f"({_fmt_bytes(s['allocated_bytes']) if 'allocated_bytes' in s else '?'})"
              f", sampled {len(part.allocations)} at sample_rate {s.get('sample_rate')}, engine {s.get('engine')}\n")
    if format == "flat":
        columns = [Column(by, kind="num"), Column("%", kind="num"), Column("alive", kind="num"),
                   Column("function", min_width=30)]
        rows = [[fmt(r[by]), f"{r['share_pct']:.2f}", _fmt_bytes(r["alive_bytes"]),
                 f"{r['function']}  {r['where']}" if r["where"] else r["function"]]
                for r in flat_rows(part, by) if r["count"] >= mincount]
    else:
        columns = [Column(by, kind="num"), Column("%", kind="num"), Column("function", min_width=30)]
        rows = [[fmt(r["weight"]), f"{r['percent']:.2f}", Indented("  " * r["depth"], calltree.frame_label(r["frame"]))]
                for r in tree_rows(part, by, maxdepth, noisefloor)]
    print_table(out, columns, rows, width=width)
