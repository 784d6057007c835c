"""Kernel statistics, shared by every backend that records GPU kernels (cupti, torch, xla).

Input is the result schema's kernel spans (``category == "kernel"``) with these ``args``
(every key optional; see docs/results.md, "Span conventions"):

    grid: [x, y, z]              block: [x, y, z]
    static_shared_memory_bytes   dynamic_shared_memory_bytes   registers_per_thread
    occupancy_pct                (estimated achieved occupancy, 0-100)
    tensor_core: bool            device: int   stream: int   correlation_id: int

Output is a :class:`~omniprof.core.results.Table` named ``"kernel_stats"`` with the columns of
Reactant's KERNEL STATISTICS table, one row per (kernel name, launch configuration), sorted by
total time.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from omniprof.core.results import BackendResult, Span, Table

__all__ = ["KERNEL_STATS_COLUMNS", "kernel_stats", "kernel_stats_table", "add_kernel_stats"]

KERNEL_STATS_COLUMNS = (
    "kernel_name", "occurrences", "total_ns", "avg_ns", "min_ns", "max_ns", "static_shared_memory_bytes",
    "block_dim", "grid_dim", "tensor_core", "occupancy_pct",
)

_TC_HINTS = ("wgmma", "hmma", "imma", "mma_", "_tensorop", "tensorop", "s16816", "s1688", "h16816", "xmma",
             "cutlass_80_tensorop", "sm90_xmma", "gemm_bf16", "bf16gemm", "_tc_")


def _whole(x: Any) -> int | None:
    """``x`` as a whole number, or None for anything else (a trace may hold any JSON there)."""
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return x
    if isinstance(x, float) and x.is_integer():
        return int(x)
    return None


def _dim(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return ",".join(str(_whole(x)) if _whole(x) is not None else str(x)[:40] for x in v)
    return "" if v is None else str(v)[:40]


def _uses_tensor_core(name: str, args: dict[str, Any]) -> bool:
    if "tensor_core" in args:
        return bool(args["tensor_core"])
    low = name.lower()
    return any(h in low for h in _TC_HINTS)


def kernel_stats(spans: Iterable[Span]) -> list[dict[str, Any]]:
    """Plain rows (dicts keyed by :data:`KERNEL_STATS_COLUMNS`) from kernel spans."""
    groups: dict[tuple[str, str, str, int], dict[str, Any]] = {}
    for s in spans:
        if s.category != "kernel":
            continue
        a = s.args
        smem = _whole(a.get("static_shared_memory_bytes")) or 0
        key = (s.name, _dim(a.get("block")), _dim(a.get("grid")), smem)
        g = groups.get(key)
        if g is None:
            g = groups[key] = {"kernel_name": s.name, "occurrences": 0, "total_ns": 0, "min_ns": None, "max_ns": 0,
                               "static_shared_memory_bytes": smem, "block_dim": key[1], "grid_dim": key[2],
                               "tensor_core": _uses_tensor_core(s.name, dict(a)), "_occ_sum": 0.0, "_occ_n": 0}
        d = int(s.dur_ns)
        g["occurrences"] += 1
        g["total_ns"] += d
        g["min_ns"] = d if g["min_ns"] is None else min(g["min_ns"], d)
        g["max_ns"] = max(g["max_ns"], d)
        occ = a.get("occupancy_pct")
        if isinstance(occ, (int, float)) and not isinstance(occ, bool):
            g["_occ_sum"] += float(occ) * d
            g["_occ_n"] += d
    rows = []
    for g in groups.values():
        occ_n = g.pop("_occ_n")
        occ_sum = g.pop("_occ_sum")
        g["avg_ns"] = g["total_ns"] // g["occurrences"]
        # Occupancy weighted by duration: long launches matter more than short ones.
        g["occupancy_pct"] = round(occ_sum / occ_n, 2) if occ_n else None
        rows.append({c: g[c] for c in KERNEL_STATS_COLUMNS})
    rows.sort(key=lambda r: (-r["total_ns"], r["kernel_name"]))
    return rows


def kernel_stats_table(spans: Iterable[Span]) -> Table:
    rows = kernel_stats(spans)
    return Table("kernel_stats", KERNEL_STATS_COLUMNS, [tuple(r[c] for c in KERNEL_STATS_COLUMNS) for r in rows],
                 title="Kernel statistics")


def add_kernel_stats(part: BackendResult) -> BackendResult:
    """``part`` with a ``kernel_stats`` table added (replacing an old one) when it has kernel spans."""
    import attrs

    if not any(s.category == "kernel" for s in part.spans):
        return part
    tables = tuple(t for t in part.tables if t.name != "kernel_stats") + (kernel_stats_table(part.spans),)
    return attrs.evolve(part, tables=tables)
