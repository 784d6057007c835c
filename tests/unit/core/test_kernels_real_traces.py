"""Kernel statistics on real GPU traces (Kineto files recorded on A100s), read through read_any."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict

import pytest

from omniprof.formats.kernels import KERNEL_STATS_COLUMNS, kernel_stats, kernel_stats_table
from omniprof.core.readers import read_any
from tests.tools import shared_data

TRACES = ["alexnet_cuda_trace.json.gz", "triton_cuda_trace.json.gz"]


def _read(name: str):
    return read_any(shared_data("kineto", name))


def _raw_kernels(name: str) -> list[dict]:
    data = json.loads(gzip.decompress(shared_data("kineto", name).read_bytes()))
    return [e for e in data["traceEvents"] if e.get("cat") == "kernel" and e.get("ph") == "X"]


@pytest.mark.parametrize("name", TRACES)
def test_kernel_stats_from_read_trace_match_the_raw_events(name):
    """Occurrences, totals and min/max per kernel name equal what the raw Kineto kernel events say."""
    result = _read(name)
    spans = [s for p in result.parts for s in p.spans if s.category == "kernel"]
    raw = _raw_kernels(name)
    assert len(spans) == len(raw)
    rows = kernel_stats(spans)
    by_name: dict[str, list[int]] = defaultdict(list)
    for e in raw:
        by_name[e["name"]].append(int(round(float(e["dur"]) * 1000)))
    got: dict[str, list[int]] = defaultdict(lambda: [0, 0, 1 << 62, 0])
    for r in rows:
        g = got[r["kernel_name"]]
        g[0] += r["occurrences"]
        g[1] += r["total_ns"]
        g[2] = min(g[2], r["min_ns"])
        g[3] = max(g[3], r["max_ns"])
    for kname, durs in by_name.items():
        assert got[kname] == [len(durs), sum(durs), min(durs), max(durs)], kname
    table = kernel_stats_table(spans)
    assert table.columns == KERNEL_STATS_COLUMNS and len(table.rows) == len(rows)
    assert all(r["block_dim"] and r["grid_dim"] for r in rows)


def test_alexnet_kernels_carry_launch_shape_and_occupancy():
    """The read AlexNet kernels keep Kineto's grid, block, shared memory and occupancy in the table."""
    result = _read("alexnet_cuda_trace.json.gz")
    spans = [s for p in result.parts for s in p.spans if s.category == "kernel"]
    rows = {r["kernel_name"]: r for r in kernel_stats(spans)}
    sgemm = rows["ampere_sgemm_32x32_sliced1x4_tn"]
    assert sgemm["block_dim"] == "128,1,1" and sgemm["static_shared_memory_bytes"] == 32768
    assert any(r["tensor_core"] for r in rows.values())
    assert any(r["occupancy_pct"] for r in rows.values())
