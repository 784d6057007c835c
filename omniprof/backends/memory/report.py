"""Allocation reports: plain rows first (tables in the result), text second.

Weights: ``by="bytes"`` uses ``size_bytes * count`` (the estimate each sampled allocation stands
for), ``by="count"`` uses ``count``.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Callable
from typing import IO, Any

from omniprof.core.results import Allocation, BackendResult, Frame, ProfileResult, Table
from omniprof.core.units import format_bytes as _fmt_bytes

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
                                "alive_count": 0}
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
    """Depth-first call tree of allocations (root first), weights summed over callees."""
    w = _weight(by)
    root: dict[str, Any] = {"children": {}, "weight": 0, "self": 0}
    for a in part.allocations:
        node = root
        node["weight"] += w(a)
        for fid in part.stacks[a.stack_id]:
            node = node["children"].setdefault(fid, {"children": {}, "weight": 0, "self": 0, "fid": fid})
            node["weight"] += w(a)
        node["self"] += w(a)
    total = root["weight"] or 1
    out: list[dict[str, Any]] = []

    def visit(node: dict[str, Any], depth: int) -> None:
        for child in sorted(node["children"].values(), key=lambda n: -n["weight"]):
            pct = 100.0 * child["weight"] / total
            if pct < noisefloor_pct:
                continue
            f = part.frames[child["fid"]]
            out.append({"depth": depth, "weight": child["weight"], "self": child["self"], "percent": round(pct, 2),
                        "function": f.name, "location": f"{f.file}:{f.line}" if f.file else ""})
            if maxdepth is None or depth + 1 < maxdepth:
                visit(child, depth + 1)

    visit(root, 0)
    return out


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
    width = cols or (os.get_terminal_size().columns if out.isatty() else 120)
    fmt = _fmt_bytes if by == "bytes" else str
    buf = io.StringIO()
    s = part.summaries.get("memory", {})
    buf.write(f"allocations: {s.get('allocations', '?')} ({_fmt_bytes(s['allocated_bytes']) if 'allocated_bytes' in s else '?'})"
              f", sampled {len(part.allocations)} at sample_rate {s.get('sample_rate')}, engine {s.get('engine')}\n")
    if format == "flat":
        buf.write(f"{by:>12}  {'%':>6}  {'alive':>10}  function  location\n")
        for r in flat_rows(part, by):
            if r["count"] < mincount:
                continue
            buf.write(f"{fmt(r[by]):>12}  {r['share_pct']:6.2f}  {_fmt_bytes(r['alive_bytes']):>10}  "
                      f"{r['function']}  {r['location']}\n")
    else:
        for r in tree_rows(part, by, maxdepth, noisefloor):
            buf.write(f"{fmt(r['weight']):>12}  {r['percent']:6.2f}  {'  ' * r['depth']}{r['function']}  {r['location']}\n")
    for line in buf.getvalue().splitlines():
        out.write((line if len(line) <= width else line[: width - 3] + "...") + "\n")
