"""The columnar Kineto reader and the tables computed from its columns, against the full reader.

The reference is the full reader (:class:`omniprof.readers.KinetoReader`, whose op table
tests/unit/analysis/test_torch_rule_reference.py checks against torch's own ``key_averages()``): the
columns must hold the same spans (names, tracks, categories, exact ns times, correlation ids) and
give the same ``op_stats`` and ``kernel_stats`` rows, on real traces and on edge cases.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from omniprof.analysis.torch_columns import kernel_stats_from_columns, op_stats_from_columns
from omniprof.errors import TraceReadError
from omniprof.formats import kineto_columns
from omniprof.formats.kineto_columns import read_columns
from omniprof.readers import KinetoReader
from tests.tools import shared_data

ROOT = Path(__file__).resolve().parents[3]
REAL = {
    "alexnet": lambda: shared_data("kineto", "alexnet_cuda_trace.json.gz"),
    "triton": lambda: shared_data("kineto", "triton_cuda_trace.json.gz"),
    "mlp_cpu": lambda: ROOT / "examples" / "traces" / "mlp_cpu.pt.trace.json.gz",
}


def _rows(table):
    return None if table is None else table.rows


def _assert_same(path: Path, fast: bool = True) -> None:
    ref = KinetoReader().read(path).parts[0]
    cols = read_columns(path)
    assert (cols.parser != "full reader") is fast
    # The spans, one by one (the columns keep file order, as the full reader's spans).
    assert len(cols) == len(ref.spans)
    assert [cols.names[i] for i in cols.name_id] == [s.name for s in ref.spans]
    assert [cols.tracks[i] for i in cols.track_id] == [s.track for s in ref.spans]
    assert [cols.categories[i] for i in cols.category_id] == [s.category for s in ref.spans]
    assert cols.start_ns.tolist() == [s.start_ns for s in ref.spans]
    assert cols.dur_ns.tolist() == [s.dur_ns for s in ref.spans]
    assert [c if c >= 0 else None for c in cols.correlation.tolist()] == [
        s.args.get("correlation_id") for s in ref.spans]
    assert cols.bounds_ns == (ref.start_ns, ref.end_ns)
    mem = [i for i in ref.instants if i.category == "memory" and isinstance(i.args.get("bytes"), int)]
    assert cols.mem_t_ns.tolist() == [i.t_ns for i in mem]
    assert cols.mem_bytes.tolist() == [i.args["bytes"] for i in mem]
    # The tables.
    has_memory = bool(len(cols.mem_t_ns)) or bool(ref.metadata.get("profile_memory"))
    assert _rows(op_stats_from_columns(cols, has_memory=has_memory)) == _rows(ref.table("op_stats"))
    assert _rows(kernel_stats_from_columns(cols)) == _rows(ref.table("kernel_stats"))


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_traces_give_the_full_readers_spans_and_tables(name):
    _assert_same(REAL[name]())


@pytest.mark.parametrize("name", sorted(REAL))
def test_the_standard_library_parser_gives_the_same(name, monkeypatch):
    monkeypatch.setattr(kineto_columns, "_decoder", kineto_columns._json_decoder)
    _assert_same(REAL[name]())
    assert read_columns(REAL[name]()).parser == "json"


def test_small_chunks_cut_events_anywhere(monkeypatch, tmp_path):
    # Chunks far smaller than an event: every cut lands inside a string, an args object or a number.
    monkeypatch.setattr(kineto_columns, "CHUNK_BYTES", 97)
    _assert_same(REAL["alexnet"]())


def _write(tmp_path: Path, events: list, **top) -> Path:
    p = tmp_path / "t.pt.trace.json"
    # "@ts" stands for a time with more digits than a float holds, written as Kineto writes it.
    p.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events, **top}, indent=1)
                 .replace('"@ts"', "1695835542481129.123"))
    return p


def _op(name, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def test_edge_cases_fractional_times_memory_steps_folding(tmp_path):
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 1, "tid": 1, "ts": 1.0005, "dur": 100},
        _op("aten::sum", 2.0015, 50.5, **{"External id": 1, "flops": 7}),
        _op("aten::sum", 3, 40, **{"External id": 2}),  # re-dispatch: folded into its parent
        _op("aten::is_leaf", 4, 1),  # hidden by torch's rule
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 5.25, "dur": 2,
         "args": {"correlation": 9}},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 8, "dur": 3.5,
         "args": {"correlation": 9, "device": 0, "stream": 7, "grid": [2, 1, 1], "block": [32, 1, 1],
                  "shared memory": 0, "est. achieved occupancy %": 12.5}},
        {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 6,
         "args": {"Bytes": 4096, "Device Type": 0}},
        {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 7,
         "args": {"Bytes": 512, "Device Type": 1, "Device Id": 0}},
        {"ph": "s", "id": 9, "pid": 1, "tid": 1, "ts": 5.25, "cat": "ac2g", "name": "ac2g"},
        {"ph": "f", "id": 9, "pid": 0, "tid": 7, "ts": 8, "cat": "ac2g", "name": "ac2g", "bp": "e"},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}},
        _op("aten::mm", "@ts", 0.4445, tid=2),  # epoch µs with a fraction: exact ns
        {"ph": "X", "cat": "Trace", "name": "session", "pid": 1, "tid": 0, "ts": 0, "dur": 200},
    ]
    path = _write(tmp_path, events, traceName="x")
    _assert_same(path)
    cols = read_columns(path)
    assert 1695835542481129123 in cols.start_ns.tolist()  # hand-computed: 1695835542481129.123 µs
    assert 444 in cols.dur_ns.tolist()  # 0.4445 µs rounds half to even


def test_a_gzip_trace_with_fields_after_the_events(tmp_path):
    doc = json.loads(gzip.open(REAL["triton"](), "rt").read())
    events = doc.pop("traceEvents")
    p = tmp_path / "after.pt.trace.json.gz"
    with gzip.open(p, "wt") as fh:
        fh.write(json.dumps({"traceEvents": events, **doc, "late": [{"a": [1]}, {"b": "}]"}]}))
    _assert_same(p)
    assert read_columns(p).top["late"] == [{"a": [1]}, {"b": "}]"}]


def test_traces_the_fast_path_does_not_read_go_through_the_full_reader(tmp_path):
    events = [{"ph": "B", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 1},
              {"ph": "E", "pid": 1, "tid": 1, "ts": 5},
              _op("aten::mul", 10, 2)]
    _assert_same(_write(tmp_path, events), fast=False)


def test_errors_are_the_full_readers(tmp_path):
    bad = tmp_path / "bad.pt.trace.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "ts": 1,')
    with pytest.raises(TraceReadError) as ours:
        read_columns(bad)
    with pytest.raises(TraceReadError) as full:
        KinetoReader().read(bad)
    assert str(ours.value) == str(full.value)
    with pytest.raises(TraceReadError):
        read_columns(tmp_path / "missing.json")


def test_columns_are_numpy_arrays():
    cols = read_columns(REAL["alexnet"]())
    assert cols.start_ns.dtype == np.int64 and cols.name_id.dtype == np.int32
    assert cols.category_mask("kernel").sum() == sum(1 for c in cols.category_id if cols.categories[c] == "kernel")
