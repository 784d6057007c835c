"""One op-table column vocabulary (omniprof.core.opstats): torch's and XLA's op tables use it, results
saved with the older column names read as the vocabulary, and diff compares by it without guessing.

The old result files in tests/data/legacy_results/ were saved by omniprof before the vocabulary
(main at 1cd1da6: a torch run at host level 3 and a jax CPU run); their values are checked here
against the raw JSON read with the json module.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

import omniprof
from omniprof.analysis.diff import diff, format_diff
from omniprof.core import opstats
from omniprof.core.results import BackendResult, ProfileResult, Table, load

LEGACY = Path(__file__).resolve().parents[2] / "data" / "legacy_results"
TORCH_RENAMES = {"total_cpu_ns": "total_ns", "self_cpu_ns": "self_ns", "avg_cpu_ns": "avg_ns",
                 "total_device_ns": "device_total_ns", "self_device_ns": "device_self_ns",
                 "total_cpu_memory_bytes": "cpu_memory_total_bytes", "self_cpu_memory_bytes": "cpu_memory_self_bytes",
                 "total_device_memory_bytes": "device_memory_total_bytes",
                 "self_device_memory_bytes": "device_memory_self_bytes"}
XLA_RENAMES = {"operation": "name", "type": "op_type", "host_or_device": "runs_on", "occurrences": "calls",
               "total_self_ns": "self_ns", "device_pct": "self_share_pct",
               "memory_bw_bytes_per_s": "memory_bandwidth_bytes_per_s", "flop_rate_per_s": "flops_per_s"}


def _raw_table(path: Path, backend: str) -> dict:
    data = json.loads(gzip.decompress(path.read_bytes()))
    part = next(p for p in data["parts"] if p["backend"] == backend)
    return next(t for t in part["tables"] if t["name"] == "op_stats")


def test_builders_name_their_columns_from_the_vocabulary():
    from omniprof.analysis import torch_ops
    from omniprof.formats import xplane

    for cols in (torch_ops.OP_STATS_COLUMNS, xplane.OP_STATS_COLUMNS, opstats.ROOFLINE_COLUMNS):
        assert set(cols) <= set(opstats.COLUMNS)
        assert cols[0] == "name" and {"calls", "self_ns"} <= set(cols)
    with pytest.raises(ValueError, match="self_cpu_ns"):
        opstats.columns("name", "self_cpu_ns")


@pytest.mark.parametrize(("file", "backend", "renames"), [("torch_v0_op_stats.json.gz", "torch", TORCH_RENAMES),
                                                          ("xla_v0_op_stats.json.gz", "xla", XLA_RENAMES)])
def test_old_result_files_load_with_the_vocabulary(file, backend, renames):
    """A result saved with the old column names loads with the vocabulary's, every value unchanged."""
    raw = _raw_table(LEGACY / file, backend)
    assert set(renames) <= set(raw["columns"])  # it really is an old file
    table = load(LEGACY / file).part(backend).table("op_stats")
    assert set(table.columns) <= set(opstats.COLUMNS)
    assert table.columns == tuple(renames.get(c, c) for c in raw["columns"])
    for old_row, row in zip(raw["rows"], table.records()):
        for old_col, value in zip(raw["columns"], old_row):
            assert row[renames.get(old_col, old_col)] == value


def test_old_roofline_columns_load_with_the_vocabulary():
    """XLA's roofline table (xprof's roofline_model, GPU/TPU only: no real one can be recorded here) had
    xprof-style names; a result holding one reads with the vocabulary's, values in place."""
    old = ("operation", "category", "occurrences", "total_self_ns", "flop_rate_per_s", "memory_bw_bytes_per_s",
           "operational_intensity_flops_per_byte", "bound_by")
    r = ProfileResult(parts=(BackendResult("xla", tables=(Table("roofline", old, [("dot", "Dot", 2, 900, 1e12, 1e11,
                                                                                   10.0, "Compute")]),)),))
    t = ProfileResult.from_dict(r.to_dict()).part("xla").table("roofline")
    assert set(t.columns) <= set(opstats.COLUMNS) and t.records()[0]["self_ns"] == 900
    assert t.records()[0]["name"] == "dot" and t.records()[0]["memory_bandwidth_bytes_per_s"] == 1e11


def test_other_tables_named_op_stats_keep_their_columns():
    t = Table("op_stats", ("name", "count", "total_cpu_ns"), [("a", 1, 5)])
    r = ProfileResult(parts=(BackendResult("x", tables=(t,)),))
    assert ProfileResult.from_dict(r.to_dict()).parts[0].tables[0].columns == ("name", "count", "total_cpu_ns")


def test_diff_an_old_result_against_a_new_one():
    """An op table saved before the vocabulary diffs against one built now: the same keys (op names)
    and self time on both sides, no table skipped."""
    torch = pytest.importorskip("torch")
    old = load(LEGACY / "torch_v0_op_stats.json.gz")
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x = torch.randn(4, 8)
    m(x).sum().backward()
    opts = omniprof.ProfileOptions(host_tracer_level=3, device_tracer_level=0)
    with omniprof.Profiler(backend="torch", options=opts) as prof:
        for _ in range(2):
            m(x).sum().backward()
    d = diff(old, prof.result, threshold_pct=1e9)
    t = next(t for t in d.tables if t.name == "op_stats")
    assert t.time_column == "self_ns" and not any("op_stats" in s for s in d.skipped)
    rows = {r.key: r for r in t.rows}
    raw = _raw_table(LEGACY / "torch_v0_op_stats.json.gz", "torch")
    old_self = {r[0]: r[raw["columns"].index("self_cpu_ns")] for r in raw["rows"]}
    assert rows["aten::addmm"].a_ns == old_self["aten::addmm"] and rows["aten::addmm"].status != "vanished"
    assert sum(r.a_ns for k, r in rows.items() if k != "(total)") == sum(old_self.values())
    assert d.regressions == [], format_diff(d)


def test_diff_compares_declared_columns_only():
    """A table without the vocabulary's name and time columns is listed as not compared, never guessed
    at (an earlier diff took its first text column and any column ending in _ns)."""
    t = Table("latency", ("op", "p99_ns"), [("a", 5)])
    r = ProfileResult(parts=(BackendResult("x", tables=(t,)),))
    d = diff(r, r)
    assert d.tables == () and d.skipped == ("x/latency: no common key and time columns (name, self_ns / total_ns)",)
    # op tables compare by self time, grouping keys included in the row key
    g = Table("op_stats_by_stack", ("name", "stack", "calls", "total_ns", "self_ns"),
              [("mm", '["a.py(1): f"]', 1, 10, 4), ("mm", '["b.py(2): g"]', 1, 20, 6)])
    r = ProfileResult(parts=(BackendResult("torch", tables=(g,)),))
    t = diff(r, r).tables[0]
    assert t.time_column == "self_ns"
    assert {row.key: row.a_ns for row in t.rows} == {"(total)": 10, 'mm  ["a.py(1): f"]': 4, 'mm  ["b.py(2): g"]': 6}
