"""XLA's op table from ``xla_op`` spans: one row per (module, op), by self time under the one
nesting rule (:data:`omniprof.analysis.nesting.XLA`).

The xplane reader (:mod:`omniprof.formats.xplane`) uses xprof's ``framework_op_stats`` where it has
rows (GPU/TPU traces); on CPU traces, where xprof holds only an IDLE row, the reader's caller passes
:func:`op_stats_table` to build it here (a reader never calls an analysis itself).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from omniprof.analysis.nesting import XLA, self_times
from omniprof.core.results import Span, Table
from omniprof.formats.xplane import OP_STATS_COLUMNS

__all__ = ["op_stats_rows", "op_stats_table"]


def _op_type(name: str) -> str:
    base = re.sub(r"[.\d_]+$", "", name) or name
    return "fusion" if base.endswith("fusion") else base


def _self_times(spans: Sequence[Span]) -> dict[int, int]:
    """Self time of each span (by index): by the one nesting rule (:data:`omniprof.analysis.nesting.XLA`),
    floored at 0 (only sibling spans that overlap inside one parent go below)."""
    return {i: max(v, 0) for i, v in self_times(spans, XLA).items()}


def op_stats_rows(spans: Iterable[Span], costs: Mapping[str, Mapping[str, float]] | None = None) -> list[dict[str, Any]]:
    """Framework/XLA op statistics from ``xla_op`` spans: one row per (module, op), by self time.

    ``costs`` maps an op name to ``{"flops": .., "bytes_accessed": ..}`` per execution, when known
    (for rates and the bound-by column); without it those columns are None (unknown).
    """
    ops = [s for s in spans if s.category == "xla_op"]
    self_ns = _self_times(ops)
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for i, s in enumerate(ops):
        op = str(s.args.get("hlo_op", s.name))
        module = str(s.args.get("hlo_module", ""))
        g = groups.get((module, op))
        if g is None:
            g = groups[(module, op)] = {"name": op, "op_type": _op_type(op), "runs_on": "Device",
                                        "calls": 0, "total_ns": 0, "self_ns": 0, "hlo_module": module}
        g["calls"] += 1
        g["total_ns"] += s.dur_ns
        g["self_ns"] += self_ns[i]
    all_self = sum(g["self_ns"] for g in groups.values()) or 1
    rows = []
    for g in groups.values():
        g["avg_self_ns"] = g["self_ns"] // g["calls"]
        g["self_share_pct"] = round(100.0 * g["self_ns"] / all_self, 2)
        cost = (costs or {}).get(g["name"])
        bw = rate = None
        bound = None
        if cost and g["self_ns"] > 0:
            secs = g["self_ns"] / 1e9
            if cost.get("bytes_accessed") is not None:
                bw = cost["bytes_accessed"] * g["calls"] / secs
            if cost.get("flops") is not None:
                rate = cost["flops"] * g["calls"] / secs
        g["memory_bandwidth_bytes_per_s"] = bw
        g["flops_per_s"] = rate
        g["bound_by"] = bound
        rows.append({c: g[c] for c in OP_STATS_COLUMNS})
    rows.sort(key=lambda r: (-r["self_ns"], r["name"]))
    return rows


def op_stats_table(spans: Iterable[Span], costs: Mapping[str, Mapping[str, float]] | None = None) -> Table:
    rows = op_stats_rows(spans, costs)
    return Table("op_stats", OP_STATS_COLUMNS, [tuple(r[c] for c in OP_STATS_COLUMNS) for r in rows],
                 title="Framework op statistics")
