"""The Kineto trace reader: real GPU traces, synthetic edge cases, bad input. Never imports torch."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import omniprof
from omniprof.formats import kineto_json
from omniprof.formats.kineto import FWDBWD_FLOW_BASE, us_text_to_ns
from omniprof.readers import KinetoReader

read_trace = KinetoReader().read  # what `omniprof report` reads: the events, then the op and kernel tables
from omniprof.cli import main
from omniprof.core.readers import detect_format, read_any
from omniprof.errors import DataLossWarning, TraceReadError
from tests.tools import shared_data

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "traces" / "mlp_cpu.pt.trace.json.gz"


def alexnet() -> Path:
    """The real AlexNet GPU trace of the shared data folder."""
    return shared_data("kineto", "alexnet_cuda_trace.json.gz")


def triton() -> Path:
    """The real Triton GPU trace of the shared data folder."""
    return shared_data("kineto", "triton_cuda_trace.json.gz")


def _write(tmp_path: Path, events: list, name: str = "t.pt.trace.json", **top) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"schemaVersion": 1, **top, "traceEvents": events}), encoding="utf-8")
    return path


def _x(name, cat, ts, dur, pid=1, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def test_alexnet_categories_and_counts():
    """Every kernel, memcpy, memset, CPU op and runtime call of the AlexNet trace becomes a span."""
    part = read_trace(alexnet()).parts[0]
    cats: dict[str, int] = {}
    for s in part.spans:
        cats[s.category] = cats.get(s.category, 0) + 1
    assert cats == {"kernel": 79, "memcpy": 16, "memset": 3, "cpu_op": 359, "runtime": 361, "sync": 41,
                    "annotation": 8}
    assert part.losses == ()


def test_alexnet_kernel_args_follow_conventions():
    """Kernel spans carry grid, block, registers, shared memory, occupancy, device, stream, correlation."""
    part = read_trace(alexnet()).parts[0]
    k = next(s for s in part.spans if s.category == "kernel" and s.args.get("correlation_id") == 218)
    assert k.args["grid"] == [864, 1, 1] and k.args["block"] == [256, 1, 1]
    assert k.args["registers_per_thread"] == 47 and k.args["static_shared_memory_bytes"] == 0
    assert k.args["occupancy_pct"] == 63 and k.args["device"] == 0 and k.args["stream"] == 7
    assert k.track == "device:0:stream:7"
    track = next(t for t in part.tracks if t.id == k.track)
    assert (track.kind, track.device, track.stream) == ("stream", 0, 7)
    assert k.start_ns == 1695835573023613 * 1000 and k.dur_ns == 71_000
    copy = next(s for s in part.spans if s.category == "memcpy")
    assert copy.args["kind"] == "HtoD" and copy.args["bytes"] == 92928
    assert copy.args["bandwidth_bytes_per_s"] == pytest.approx(7.744e9)


def test_alexnet_launch_flows_link_runtime_to_device():
    """Each launch flow id is carried by one host runtime span and the GPU work it started."""
    part = read_trace(alexnet()).parts[0]
    assert len(part.flows) == 139
    by_id: dict[int, set[str]] = {}
    for s in part.spans:
        for f in s.flow_ids:
            by_id.setdefault(f, set()).add(s.category)
    for flow in part.flows:
        assert flow.name == "launch" and flow.category == "cuda"
        cats = by_id[flow.flow_id]
        assert "runtime" in cats and cats & {"kernel", "memcpy", "memset", "sync"}


def test_alexnet_kernel_and_op_tables():
    """kernel_stats counts all 79 kernels; op_stats charges device time to the launching op."""
    part = read_trace(alexnet()).parts[0]
    ks = part.table("kernel_stats")
    assert sum(ks.column("occurrences")) == 79
    ops = {r["name"]: r for r in part.table("op_stats").records()}
    assert ops["aten::addmm"]["calls"] == 6
    assert ops["aten::addmm"]["device_self_ns"] > 0
    assert ops["aten::linear"]["device_total_ns"] == ops["aten::addmm"]["device_total_ns"]
    assert ops["aten::linear"]["device_self_ns"] == 0
    kernel_ns = sum(s.dur_ns for s in part.spans if s.category in ("kernel", "memcpy", "memset"))
    assert ops["[param|cuda]"]["device_total_ns"] <= kernel_ns


def test_triton_trace_metadata_and_base_time():
    """Top-level fields (devices, CUDA versions, base time) land in the part's metadata."""
    r = read_trace(triton())
    part = r.parts[0]
    assert part.metadata["kineto_base_time_ns"] == 1727743122000000000
    assert part.metadata["devices"][0]["name"].startswith("NVIDIA A100")
    assert part.metadata["cuda_runtime_version"] == 12000
    k = next(s for s in part.spans if s.category == "kernel")
    assert k.name == "triton_poi_fused_add_cos_sin_0" and k.start_ns == 2413669097444592
    assert part.clock.offset_ns == 0 and "offline" in part.metadata["clock_note"]
    assert any(s.category == "step" and s.args == {"step_num": 1} for s in part.spans)
    assert r.metadata.devices and r.metadata.backends == ("torch",)


def test_result_round_trips_through_json(tmp_path):
    """A result read from a trace saves and loads back equal."""
    r = read_trace(alexnet())
    assert omniprof.load(r.save(tmp_path / "r.json")) == r


@pytest.mark.parametrize("fraction", [0.0001, 0.3, 0.5, 0.97, 0.9999])
def test_truncated_real_trace_names_file_and_position(tmp_path, fraction):
    """A truncated copy of a real trace raises TraceReadError with the file and line/column/char."""
    raw = gzip.decompress(alexnet().read_bytes())
    cut = tmp_path / "cut.pt.trace.json"
    cut.write_bytes(raw[: int(len(raw) * fraction)])
    with pytest.raises(TraceReadError) as info:
        read_trace(cut)
    msg = str(info.value)
    assert str(cut) in msg and "line " in msg and "column " in msg and "(char " in msg
    assert "truncated" in msg or "ends" in msg


def test_truncated_gzip_is_a_clear_error(tmp_path):
    """A gzip file cut short raises TraceReadError saying it is truncated."""
    data = alexnet().read_bytes()
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceReadError, match="truncated"):
        read_trace(cut)


def test_malformed_json_reports_line_and_column(tmp_path):
    """Invalid JSON in the middle of the event array names the exact line and column."""
    good = json.dumps(_x("a", "cpu_op", 1, 1))
    text = '{"traceEvents": [\n' + good + ',\n' + good + ',\n  {"ph": "X", "ts": 5 "dur": 1},\n' + good + "\n]}"
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(json.JSONDecodeError) as ref:
        json.loads(text)
    where = f"line {ref.value.lineno} column {ref.value.colno} (char {ref.value.pos})"
    assert where == "line 4 column 23 (char 228)"
    with pytest.raises(TraceReadError, match=rf"bad\.json: invalid JSON: Expecting ',' delimiter at {re.escape(where)}"):
        read_trace(path)


def test_not_a_kineto_trace(tmp_path):
    """A JSON object without traceEvents is rejected with the keys it does have."""
    path = tmp_path / "x.json"
    path.write_text('{"a": 1, "b": [1, 2]}')
    with pytest.raises(TraceReadError, match="no 'traceEvents' array.*keys: a, b"):
        read_trace(path)


def test_extra_data_after_trace(tmp_path):
    """Garbage after the closing brace is an error, not ignored."""
    path = _write(tmp_path, [_x("a", "cpu_op", 1, 1)])
    path.write_text(path.read_text() + " xyz")
    with pytest.raises(TraceReadError, match="extra data"):
        read_trace(path)


@pytest.mark.parametrize("text,ns", [("4385052688052.478", 4385052688052478), ("1.0005", 1000), ("1.0015", 1002),
                                     ("1695835542514261.123", 1695835542514261123), ("-2.5", -2500),
                                     ("1e3", 1_000_000), ("0.0004999", 0)])
def test_microseconds_convert_exactly(text, ns):
    """Kineto's decimal microseconds become exact integer ns (half-even), with no float drift."""
    assert us_text_to_ns(kineto_json._Num(text)) == ns


def test_large_timestamps_keep_nanoseconds(tmp_path):
    """A 16-digit timestamp with ns decimals keeps every nanosecond (a float would not)."""
    path = tmp_path / "t.json"
    path.write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, '
                    '"ts": 1695835542514261.123, "dur": 0.001}]}')
    s = read_trace(path).parts[0].spans[0]
    assert (s.start_ns, s.dur_ns) == (1695835542514261123, 1)


def test_op_stats_self_total_device_and_memory(tmp_path):
    """Self time excludes children; device time and memory go to the innermost enclosing op."""
    events = [
        _x("parent", "cpu_op", 0, 100),
        _x("child", "cpu_op", 10, 30, **{"Input Dims": [[2, 3]], "Input type": ["float"]}),
        _x("cudaLaunchKernel", "cuda_runtime", 15, 5, correlation=7, cbid=211),
        _x("child", "cpu_op", 50, 10),
        _x("gemm", "kernel", 60, 40, pid=0, tid=7, device=0, stream=7, correlation=7, grid=[1, 1, 1],
           block=[32, 1, 1]),
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 20, "s": "t",
         "args": {"Bytes": 4096, "Total Allocated": 4096, "Total Reserved": 0, "Device Type": 0, "Device Id": -1}},
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 70, "s": "t",
         "args": {"Bytes": 1024, "Total Allocated": 5120, "Total Reserved": 0, "Device Type": 0, "Device Id": -1}},
    ]
    part = read_trace(_write(tmp_path, events)).parts[0]
    ops = {r["name"]: r for r in part.table("op_stats").records()}
    assert ops["parent"]["total_ns"] == 100_000 and ops["parent"]["self_ns"] == 60_000
    assert ops["child"]["calls"] == 2 and ops["child"]["total_ns"] == 40_000
    assert ops["child"]["device_self_ns"] == 40_000 and ops["parent"]["device_self_ns"] == 0
    assert ops["parent"]["device_total_ns"] == 40_000
    assert ops["child"]["cpu_memory_self_bytes"] == 4096
    assert ops["parent"]["cpu_memory_self_bytes"] == 1024 and ops["parent"]["cpu_memory_total_bytes"] == 5120
    mem = next(c for c in part.counters if c.name == "memory_allocated (cpu)")
    assert mem.unit == "bytes" and mem.values == (4096.0, 5120.0) and mem.t_ns == (20_000, 70_000)
    assert part.summaries["memory"]["peak_memory_allocated_cpu_bytes"] == 5120
    child = next(s for s in part.spans if s.name == "child" and s.args)
    assert child.args == {"input_shapes": [[2, 3]], "input_dtypes": ["float"]}
    assert [f.flow_id for f in part.flows] == [7]


def test_forward_backward_flows_bind_to_ops(tmp_path):
    """fwdbwd flow events link the forward and backward ops, with ids kept apart from CUDA ones."""
    events = [_x("aten::mm", "cpu_op", 10, 5), _x("MmBackward0", "cpu_op", 50, 5),
              {"ph": "s", "id": 3, "pid": 1, "tid": 1, "ts": 10, "cat": "fwdbwd", "name": "fwdbwd"},
              {"ph": "f", "id": 3, "pid": 1, "tid": 1, "ts": 50, "cat": "fwdbwd", "name": "fwdbwd", "bp": "e"}]
    part = read_trace(_write(tmp_path, events)).parts[0]
    assert [f.flow_id for f in part.flows] == [FWDBWD_FLOW_BASE + 3]
    assert all(s.flow_ids == (FWDBWD_FLOW_BASE + 3,) for s in part.spans)


def test_begin_end_pairs_and_bare_array(tmp_path):
    """A bare event array with B/E pairs reads; an unclosed B is counted as truncated."""
    events = [{"ph": "B", "name": "outer", "cat": "user_annotation", "pid": 1, "tid": 1, "ts": 1},
              {"ph": "E", "pid": 1, "tid": 1, "ts": 9},
              {"ph": "B", "name": "open", "cat": "user_annotation", "pid": 1, "tid": 1, "ts": 10}]
    path = tmp_path / "a.json"
    path.write_text(json.dumps(events))
    with pytest.warns(DataLossWarning, match="never closed"):
        r = read_trace(path)
    part = r.parts[0]
    assert [(s.name, s.start_ns, s.dur_ns, s.category) for s in part.spans] == [("outer", 1000, 8000, "annotation")]
    assert part.losses[0].kind == "truncated" and part.losses[0].count == 1 and r.partial


def test_bad_events_are_counted_not_silent(tmp_path):
    """Events lacking a timestamp, and unknown phases, are counted as losses with a warning."""
    events = [_x("ok", "cpu_op", 1, 1), {"ph": "X", "name": "no_ts", "pid": 1, "tid": 1}, 42,
              {"ph": "b", "name": "async", "id": 1, "ts": 3, "pid": 1, "tid": 1}]
    with pytest.warns(DataLossWarning):
        part = read_trace(_write(tmp_path, events)).parts[0]
    kinds = {loss.kind: loss for loss in part.losses}
    assert kinds["malformed_events"].count == 2 and "line 1" in kinds["malformed_events"].detail
    assert kinds["unsupported_events"].count == 1 and "'b'" in kinds["unsupported_events"].detail
    assert [s.name for s in part.spans] == ["ok"]


def test_instants_are_kept_profiler_markers_are_bounds(tmp_path):
    """Instant events become Instants (string pids too); Kineto's global markers only set bounds."""
    events = [_x("a", "cpu_op", 10, 1),
              {"ph": "i", "s": "t", "name": "mark", "cat": "x", "pid": "Main", "tid": "t1", "ts": 12, "args": {"k": 1}},
              {"ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "", "ts": 30}]
    part = read_trace(_write(tmp_path, events)).parts[0]
    assert [(i.name, i.t_ns, i.args) for i in part.instants] == [("mark", 12_000, {"k": 1})]
    assert part.end_ns == 30_000


def test_unknown_categories_are_kept(tmp_path):
    """A category the reader does not know stays a span under its own name, args kept."""
    with pytest.warns(omniprof.errors.OmniprofWarning, match="no event category is one omniprof analyses"):
        part = read_trace(_write(tmp_path, [_x("thing", "new_cat", 1, 2, foo="bar", **{"Ev Idx": 3})])).parts[0]
    assert part.spans[0].category == "new_cat" and part.spans[0].args == {"foo": "bar"}


def test_tiny_chunks_parse_the_same(tmp_path, monkeypatch):
    """Values split across read chunks parse exactly as with large chunks."""
    events = [_x(f"op{i}", "cpu_op", 1000 + i * 10.125, 3.5, **{"Input Dims": [[i, 2]]}) for i in range(40)]
    path = _write(tmp_path, events, traceName="x")
    whole = read_trace(path)
    monkeypatch.setattr(kineto_json, "CHUNK_CHARS", 7)
    assert read_trace(path) == whole


def test_detect_and_read_any(tmp_path):
    """read_any routes a Kineto file (plain or gzipped) to this reader."""
    path = _write(tmp_path, [_x("a", "cpu_op", 1, 1)])
    gz = tmp_path / "t.pt.trace.json.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert detect_format(gz) == "kineto"
    assert read_any(gz).parts[0].spans == read_any(path).parts[0].spans


def test_reader_does_not_import_torch():
    """Reading a Kineto trace never imports torch (GPU traces read on laptops)."""
    code = ("import sys, omniprof, omniprof.backends.torch as t, omniprof.formats.kineto as k;"
            f"k.read_trace({str(EXAMPLE)!r}); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_bundled_example_trace_reads():
    """The example CPU trace shipped in examples/ reads, with shapes and FLOPs-bearing ops."""
    r = read_trace(EXAMPLE)
    part = r.parts[0]
    assert any(s.category == "cpu_op" and s.args.get("input_shapes") for s in part.spans)
    assert part.table("op_stats") is not None


def test_cli_report_prints_kernel_and_op_tables(capsys):
    """`omniprof report TRACE -r table` prints the op and kernel tables."""
    assert main(["report", str(alexnet()), "-r", "table"]) == 0
    out = capsys.readouterr().out
    assert "Kernel statistics" in out and "Op statistics" in out and "aten::addmm" in out


def test_cli_report_truncated_is_one_line_error(tmp_path, capsys):
    """A truncated trace gives exit code 1 and a one-line error naming the file, no traceback."""
    cut = tmp_path / "cut.pt.trace.json"
    cut.write_bytes(gzip.decompress(alexnet().read_bytes())[:50_000])
    assert main(["report", str(cut)]) == 2  # an unreadable input is a user mistake: exit 2
    err = capsys.readouterr().err
    assert err.startswith("omniprof: error: ") and str(cut) in err and "Traceback" not in err


def test_missing_file_is_a_clear_error(tmp_path):
    """A missing trace file raises TraceReadError naming it."""
    with pytest.raises(TraceReadError, match="no such file or directory: .*nope.json"):
        read_trace(tmp_path / "nope.json")


def test_not_utf8_is_a_clear_error(tmp_path):
    """Bytes that are not UTF-8 raise TraceReadError with the position."""
    path = tmp_path / "bin.json"
    path.write_bytes(b'{"traceEvents": [\xff\xfe]}')
    with pytest.raises(TraceReadError, match="bin.json: not UTF-8 text .* at line 1"):
        read_trace(path)


def test_ids_beyond_64_bits_stay_in_track_names_only(tmp_path):
    """A pid, device or stream no result can hold (10**20: a damaged trace) is kept in the track's id
    and name but not as a Track number, so the result still saves and loads (a fuzz find)."""
    events = [_x("op", "cpu_op", 0, 10, pid=10**20, tid=1),
              _x("k", "kernel", 2, 3, pid=0, tid=7, device=10**20, stream=-(10**20))]
    result = read_trace(_write(tmp_path, events))
    tracks = {t.kind: t for t in result.parts[0].tracks}
    assert (tracks["thread"].pid, tracks["thread"].tid) == (None, 1)
    assert (tracks["stream"].device, tracks["stream"].stream) == (None, None)
    assert str(10**20) in tracks["stream"].id
    assert omniprof.load(result.save(tmp_path / "r.json")) == result


@pytest.mark.parametrize("chunk_chars", [None, 7])
def test_raw_control_characters_in_strings_are_read_and_counted(tmp_path, monkeypatch, chunk_chars):
    """torch 2.13's Python tracer now and then writes a raw control character into a string (seen in a
    real with_stack trace: ``"Call stack": "torch/profiler/_cupti_monitor.py(0): \\x07;..."``), which
    strict JSON forbids: json.load rejects the file, and the whole torch result was lost. Such values
    are read as written and counted; the rest of the trace reads as without them."""
    data = json.loads(gzip.decompress(alexnet().read_bytes()))
    events = data["traceEvents"][:60] if chunk_chars else data["traceEvents"]
    op = next(e for e in events if e.get("cat") == "cpu_op")
    op["name"] += "\x07"
    text = json.dumps({**data, "traceEvents": events}, ensure_ascii=False)
    text = text.replace("\\u0007", "\x07")  # raw, as torch wrote it
    assert "\x07" in text
    with pytest.raises(json.JSONDecodeError, match="Invalid control character"):
        json.loads(text)
    reference = json.loads(text, strict=False)["traceEvents"]
    path = tmp_path / "ctl.pt.trace.json"
    path.write_text(text, encoding="utf-8")
    if chunk_chars:
        monkeypatch.setattr(kineto_json, "CHUNK_CHARS", chunk_chars)
    part = read_trace(path).parts[0]
    assert part.metadata["values_with_control_characters"] == 1
    assert [s.name for s in part.spans if "\x07" in s.name] == [op["name"]]
    ops = [e for e in reference if e.get("cat") == "cpu_op"]
    assert len([s for s in part.spans if s.category == "cpu_op"]) == len(ops)
    assert op["name"] in part.table("op_stats").column("name")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 2**70])
def test_hostile_correlation_and_sync_args_round_trip(tmp_path, value):
    """A runtime call's ``correlation`` and a sync event's ``device`` that are NaN, infinite or
    past 64 bits: the span's args are JSON-safe like every other span's (NaN became a float the
    saved result could not reproduce: the result read back differed), and the result round-trips."""
    events = [_x("cudaLaunchKernel", "cuda_runtime", 10, 5, correlation=value, cbid=211),
              _x("cudaDeviceSynchronize", "cuda_sync", 20, 5, device=value, cuda_sync_kind="Device")]
    result = read_trace(_write(tmp_path, events))
    spans = result.parts[0].spans
    args = [s.args for s in spans]
    assert args == [json.loads(json.dumps(a)) for a in args]  # plain JSON values, NaN/inf as text
    assert omniprof.load(result.save(tmp_path / "r.json")) == result


@pytest.mark.parametrize(("ts", "dur"), [(-(10**20), 5), (10**17, 0), (9_223_372_036_854_775, 10)])
def test_times_beyond_64_bits_are_malformed_events(tmp_path, ts, dur):
    """An event whose start or end (us -> ns) does not fit 64 bits (a fuzz find: ts = -10**20 gave a
    result that could not be saved) is counted as malformed; the other events read, and the result
    saves and loads."""
    events = [_x("bad", "cpu_op", ts, dur), _x("good", "cpu_op", 10, 5)]
    with pytest.warns(DataLossWarning):
        result = read_trace(_write(tmp_path, events))
    assert [s.name for s in result.parts[0].spans] == ["good"]
    assert omniprof.load(result.save(tmp_path / "r.json")) == result
