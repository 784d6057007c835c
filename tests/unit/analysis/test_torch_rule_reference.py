"""The torch op table against torch's own table-building code on real GPU traces.

Reference: ``torch.autograd.profiler_util.EventList`` - its ``_build_tree()`` (which nests a thread's
CPU events, CUDA runtime/driver calls included, and folds a same-name only child) and
``key_averages()`` - run on ``FunctionEvent`` objects built from the trace's own events the way
``torch.autograd.profiler.profile._parse_kineto_results`` builds them from Kineto's: the CPU-side
categories (ops, user annotations, runtime and driver calls, Python functions) as CPU events,
the GPU-side ones as device events, torch's filtered names left out, ``ProfilerStep#N`` renamed
``ProfilerStep*``, a runtime call moved to the thread of the op it is linked to. The JSON is
parsed here with ``json`` and ``Decimal``, independently of omniprof's reader, and every time is
given to torch as integer nanoseconds so that torch's sums are exact.
"""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from omniprof.analysis.torch_ops import op_table
from omniprof.readers import KinetoReader
from tests.tools import ROOT, shared_data

torch = pytest.importorskip("torch")

_CPU_CATS = {"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "python_function", "xpu_runtime",
             "privateuse1_runtime", "privateuse1_driver", "mtia_runtime", "xpu_driver"}
_DEVICE_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "cuda_sync", "gpu_user_annotation", "cuda_profiler_range"}
_FRONTEND = {"cpu_op", "user_annotation", "python_function"}


def _traces() -> list[Path]:
    return [shared_data("kineto", "alexnet_cuda_trace.json.gz"), shared_data("kineto", "triton_cuda_trace.json.gz"),
            ROOT / "examples" / "traces" / "mlp_cpu.pt.trace.json.gz"]


def _ns(us: Decimal | int) -> int:
    return int(Decimal(us) * 1000)


def torch_rows(path: Path, group_by_input_shapes: bool = False) -> dict[Any, tuple[int, int, int]]:
    """torch's key_averages() CPU rows of the trace: name (with ``group_by_input_shapes``: name and
    input shapes) -> (count, CPU total ns, self CPU ns)."""
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import EventList, FunctionEvent, _filter_name, _rewrite_name

    with (gzip.open if path.suffix == ".gz" else open)(path, "rt", encoding="utf-8") as fh:
        events = json.load(fh, parse_float=Decimal)["traceEvents"]
    fes = []
    frontend: dict[int, FunctionEvent] = {}
    linked: list[tuple[int, FunctionEvent]] = []
    for ev in events:
        cat = ev.get("cat")
        if ev.get("ph") != "X" or (cat not in _CPU_CATS and cat not in _DEVICE_CATS) or _filter_name(ev["name"]):
            continue
        args = ev.get("args") or {}
        start = _ns(ev["ts"])
        on_cpu = cat in _CPU_CATS
        fe = FunctionEvent(
            id=args.get("External id", 0) if cat in _FRONTEND else args.get("correlation", 0),
            name=_rewrite_name(ev["name"], with_wildcard=True), trace_name=_rewrite_name(ev["name"]),
            thread=ev["tid"], start_us=start, end_us=start + _ns(ev.get("dur", 0)),
            input_shapes=args.get("Input Dims", []), stack=[], use_device="cuda",
            device_type=DeviceType.CPU if on_cpu else DeviceType.CUDA, sequence_nr=args.get("Sequence number", -1),
            fwd_thread=args.get("Fwd thread id"), is_user_annotation=cat == "user_annotation",
            is_python_function=cat == "python_function", flops=args.get("flops"))
        fes.append(fe)
        if cat in _FRONTEND:
            frontend.setdefault(fe.id, fe)
        elif isinstance(args.get("External id"), int) and args["External id"] > 0:
            linked.append((args["External id"], fe))
    for ext, fe in linked:  # torch: a runtime call takes the thread of the op it is linked to
        op = frontend.get(ext)
        if op is not None and fe.device_type == DeviceType.CPU:
            fe.thread = op.thread
    fes.sort(key=lambda e: [e.time_range.start, -e.time_range.end])
    lst = EventList(fes, use_device="cuda")
    lst._build_tree()
    return {((e.key, str(e.input_shapes)) if group_by_input_shapes else e.key):
            (e.count, e.cpu_time_total, e.self_cpu_time_total)
            for e in lst.key_averages(group_by_input_shapes) if e.device_type == DeviceType.CPU}


@pytest.mark.parametrize("path", _traces(), ids=lambda p: p.name)
def test_op_rows_equal_torch_key_averages(path):
    """Every op, annotation and runtime row of our op table equals torch's key_averages() row:
    calls, total and self CPU time to the nanosecond; no row more, none less."""
    theirs = torch_rows(path)
    table = KinetoReader().read(path).parts[0].table("op_stats")
    ours = {r["name"]: (r["calls"], r["total_ns"], r["self_ns"]) for r in table.records()}
    assert set(ours) == set(theirs), (sorted(set(ours) - set(theirs)), sorted(set(theirs) - set(ours)))
    diff = {k: (ours[k], theirs[k]) for k in theirs if ours[k] != theirs[k]}
    assert not diff
    assert _columns_rows(path) == theirs  # the same rule on the columnar reader's columns


def _columns_rows(path: Path) -> dict[str, tuple[int, int, int]]:
    from omniprof.analysis.torch_columns import op_stats_from_columns
    from omniprof.formats.kineto_columns import read_columns

    cols = read_columns(path)
    assert cols.parser != "full reader"
    return {r["name"]: (r["calls"], r["total_ns"], r["self_ns"]) for r in op_stats_from_columns(cols).records()}


def test_runtime_calls_are_rows_and_children_of_their_op():
    """The issue's figures on the shared AlexNet trace: aten::empty_strided's self time is 0.739 ms
    by torch's rules (its 30 s cudaMalloc/sync calls are rows of their own), not 29,951.779 ms."""
    path = shared_data("kineto", "alexnet_cuda_trace.json.gz")
    theirs = torch_rows(path)
    rows = {r["name"]: r for r in KinetoReader().read(path).parts[0].table("op_stats").records()}
    assert rows["aten::empty_strided"]["self_ns"] == theirs["aten::empty_strided"][2]
    assert round(rows["aten::empty_strided"]["self_ns"] / 1e6, 3) == 0.739
    for name in ("cudaLaunchKernel", "cudaMemcpyAsync", "cudaStreamSynchronize", "cudaMalloc"):
        assert rows[name]["calls"] == theirs[name][0] > 0


def test_grouping_by_input_shape_keeps_annotation_shapes(tmp_path):
    """c10d's ranges (``nccl:all_reduce``, ``nccl:all_to_all``, user annotations) record their inputs'
    shapes; grouped by input shape they keep them, one row per distinct shape as torch keys them
    (DLRM's worker0 has 7 such shapes), not one row per name with empty shapes."""
    sizes = [1024, 2048, 1024, 4096, 2048, 512, 1024, 16384, 8192]  # 9 calls, 7 (name, shape) pairs
    events, t = [], 0
    for k, n in enumerate(sizes):
        name = "nccl:all_reduce" if k % 3 else "nccl:all_to_all"
        events.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 1, "ts": t, "dur": 50,
                       "args": {"External id": 2 * k + 1, "Input Dims": [[n]], "Input type": ["float"]}})
        events.append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": t + 5,
                       "dur": 20, "args": {"External id": 2 * k + 2, "Input Dims": [[n]]}})
        t += 100
    path = tmp_path / "ranges.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    theirs = torch_rows(path, group_by_input_shapes=True)
    table = op_table(KinetoReader().read(path).parts[0], group_by_input_shape=True)
    ours = {(r["name"], str(json.loads(r["input_shapes"]))): (r["calls"], r["total_ns"], r["self_ns"])
            for r in table.records()}
    assert ours == theirs
    assert len([k for k in ours if k[0].startswith("nccl:")]) == 7


def test_folding_hiding_overlaps_and_threads_equal_torch(tmp_path):
    """The cases torch's tree handles specially, against torch's own code: a same-name only child
    folded into its parent (three deep), a same-name child with a sibling (not folded), torch's
    utility ops left out, a span crossing its parent's end (a sibling, not a child), runtime calls
    inside ops, and the same names on two threads."""
    def x(name, cat, ts, dur, tid=1, ext=0):
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
                "args": {"External id": ext, **({"correlation": ext} if cat == "cuda_runtime" else {})}}

    events = [
        x("aten::sum", "cpu_op", 0, 100, ext=1), x("aten::sum", "cpu_op", 10, 80, ext=2),
        x("aten::sum", "cpu_op", 20, 50, ext=3), x("cudaLaunchKernel", "cuda_runtime", 30, 10, ext=3),
        x("aten::add", "cpu_op", 200, 100, ext=4), x("aten::add", "cpu_op", 210, 30, ext=5),
        x("aten::empty", "cpu_op", 250, 10, ext=6), x("profiler::_record_function_exit", "cpu_op", 270, 20, ext=7),
        x("aten::is_leaf", "cpu_op", 295, 2, ext=8),
        x("A", "user_annotation", 400, 10, ext=9), x("B", "user_annotation", 405, 10, ext=10),
        x("aten::mm", "cpu_op", 406, 2, ext=11), x("cudaMemcpyAsync", "cuda_runtime", 406.5, 1, ext=11),
        x("A", "user_annotation", 400, 7, tid=2, ext=12), x("cudaStreamSynchronize", "cuda_runtime", 401, 2, tid=2,
                                                             ext=12),
    ]
    path = tmp_path / "cases.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    theirs = torch_rows(path)
    assert theirs["aten::sum"][0] == 1 and theirs["aten::add"][0] == 2  # the cases are there
    ours = {r["name"]: (r["calls"], r["total_ns"], r["self_ns"])
            for r in KinetoReader().read(path).parts[0].table("op_stats").records()}
    assert ours == theirs
    assert _columns_rows(path) == theirs
