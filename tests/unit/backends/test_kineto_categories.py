"""Kineto category coverage on the real AlexNet GPU trace: GPU-side user annotations, PyTorch 1.8-1.9
category names and ``async`` launch flows, and traces whose categories nothing recognises.

No GPU is needed: the real trace (``../shared/data/kineto/SOURCE.md``) is rewritten into the event
shapes that Kineto itself writes for the feature under test. Where the shapes come from:

* ``gpu_user_annotation`` (PyTorch 1.10+, e.g. DDP's ``DistributedDataParallel.forward``): an ``X``
  event on the GPU's pid and the stream's tid, spanning the GPU work launched inside the host
  annotation, with ``args: {"External id": N}`` equal to the host annotation's (libkineto's
  ``GpuUserAnnotation`` activity as its ChromeTraceLogger writes it).
* PyTorch 1.8-1.9 (libkineto's ``output_json.cpp`` of 2021): ``"cat": "Operator"`` for CPU ops and
  record_function ranges (args ``Device``, ``External id``, ``Trace name``, ``Trace iteration``),
  ``"Runtime"`` (args ``cbid``, ``correlation``, ``external id``, ``external ts``), ``"Kernel"``,
  ``"Memcpy"``, ``"Memset"`` on ``"tid": "stream N"``, ``"User"`` for the GPU-side annotation on
  ``"tid": "stream N user"``; host tids written as strings (``"24472"``); launches linked by
  ``{"ph": "s", "cat": "async", "name": "launch", "id": <correlation>, "tid": <int>}`` at the
  runtime call and ``{"ph": "f", ..., "tid": "stream N", "bp": "e"}`` at the GPU activity; no
  ``cuda_sync`` category yet.

The expected values are the modern trace's own events, counted straight from its JSON here, or
the modern trace as read (whose tables other tests check against torch and HTA).
"""

from __future__ import annotations

import gzip
import json
import warnings
from collections import Counter
from pathlib import Path

import pytest

from omniprof.readers import KinetoReader

read_trace = KinetoReader().read  # what `omniprof report` reads: the events, then the op and kernel tables
from omniprof.errors import DataLossWarning, OmniprofWarning
from tests.tools import shared_data


def _events() -> dict:
    with gzip.open(shared_data("kineto", "alexnet_cuda_trace.json.gz"), "rt", encoding="utf-8") as fh:
        return json.load(fh)


def _write(tmp_path: Path, trace: dict, name: str) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(trace), encoding="utf-8")
    return path


def _with_gpu_annotations(trace: dict) -> tuple[dict, int]:
    """The trace plus, for each host user annotation that launched GPU work, its GPU-side projection."""
    events = trace["traceEvents"]
    runtime_by_corr = {e["args"]["correlation"]: e for e in events if e.get("cat") == "cuda_runtime"}
    device = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    added = []
    for a in (e for e in events if e.get("cat") == "user_annotation"):
        t0, t1 = a["ts"], a["ts"] + a["dur"]
        work = [d for d in device if (r := runtime_by_corr.get(d["args"]["correlation"])) is not None
                and r["tid"] == a["tid"] and t0 <= r["ts"] < t1]
        if not work:
            continue
        start = min(d["ts"] for d in work)
        end = max(d["ts"] + d["dur"] for d in work)
        added.append({"ph": "X", "cat": "gpu_user_annotation", "name": a["name"], "pid": 0, "tid": 7,
                      "ts": start, "dur": end - start, "args": {"External id": a["args"]["External id"]}})
    return {**trace, "traceEvents": events + added}, len(added)


def test_gpu_user_annotations_are_device_time_not_cpu_calls(tmp_path):
    """Each host annotation is one call with its host time; its GPU-side projection is not a second call."""
    trace = _events()
    host = [e for e in trace["traceEvents"] if e.get("cat") == "user_annotation"]
    expected = {}
    for e in host:
        calls, total = expected.get(e["name"], (0, 0))
        expected[e["name"]] = (calls + 1, total + e["dur"] * 1000)  # integer microseconds in this trace
    doubled, n_added = _with_gpu_annotations(trace)
    assert n_added >= 5  # the warmup/measure forward passes launched work
    part = read_trace(_write(tmp_path, doubled, "ddp_like.pt.trace.json")).parts[0]
    ops = part.table("op_stats")
    got = {r[0]: (r[1], r[2]) for r in ops.rows if r[0] in expected}
    assert got == expected
    gpu = [s for s in part.spans if s.category == "gpu_annotation"]
    assert len(gpu) == n_added
    assert {s.track for s in gpu} == {"device:0:stream:7"}
    assert all(s.args.get("external_id") for s in gpu)


def _legacy(trace: dict) -> dict:
    """The trace as PyTorch 1.8-1.9's Kineto wrote it (see the module docs for the shapes)."""
    out = []
    launched = {e["args"]["correlation"] for e in trace["traceEvents"]
                if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")}
    for e in trace["traceEvents"]:
        cat, ph, a = e.get("cat"), e.get("ph"), e.get("args") or {}
        if ph == "X" and cat in ("cpu_op", "user_annotation"):
            args = {"Device": e["pid"], "External id": a["External id"], "Trace name": "PyTorch Profiler",
                    "Trace iteration": 0}
            if "Input Dims" in a:
                args["Input dims"] = a["Input Dims"]
            out.append({**e, "cat": "Operator", "tid": str(e["tid"]), "args": args})
        elif ph == "X" and cat == "cuda_runtime":
            out.append({**e, "cat": "Runtime", "tid": str(e["tid"]),
                        "args": {"cbid": a["cbid"], "correlation": a["correlation"], "external id": 0,
                                 "external ts": e["ts"]}})
        elif ph == "X" and cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            legacy_cat = {"kernel": "Kernel", "gpu_memcpy": "Memcpy", "gpu_memset": "Memset"}[cat]
            args = {k: v for k, v in a.items() if k != "External id"}
            args["external id"] = 0
            out.append({**e, "cat": legacy_cat, "tid": f"stream {a['stream']}", "args": args})
            out.append({"ph": "f", "id": a["correlation"], "pid": a["device"], "tid": f"stream {a['stream']}",
                        "ts": e["ts"], "cat": "async", "name": "launch", "bp": "e"})
        elif ph == "X" and cat == "cuda_sync":
            continue  # no such category before PyTorch 1.10
        elif ph in ("s", "f") and cat == "ac2g":
            if ph == "s" and e["id"] in launched:  # 1.9 linked launches, memcpy and memset calls only
                out.append({"ph": "s", "id": e["id"], "pid": e["pid"], "tid": e["tid"], "ts": e["ts"],
                            "cat": "async", "name": "launch"})
        elif ph == "M" and e.get("name") == "thread_name":
            out.append({**e, "tid": str(e["tid"])})
        else:
            out.append(e)
    return {**trace, "traceEvents": out}


def test_pytorch_1_9_trace_is_analysed_like_its_modern_form(tmp_path):
    """Op table, kernel table, launch flows and categories of the legacy form equal the modern one's."""
    modern = _events()
    modern = {**modern, "traceEvents": [e for e in modern["traceEvents"] if e.get("cat") != "cuda_sync"]}
    legacy = _legacy(modern)
    assert {e.get("cat") for e in legacy["traceEvents"] if e.get("ph") == "X"} == {
        "Operator", "Runtime", "Kernel", "Memcpy", "Memset", "Trace"}
    new = read_trace(_write(tmp_path, modern, "modern.pt.trace.json")).parts[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataLossWarning)
        old = read_trace(_write(tmp_path, legacy, "legacy.pt.trace.json")).parts[0]
    kernels = sum(1 for e in modern["traceEvents"] if e.get("cat") == "kernel")
    assert kernels == 79
    assert old.table("kernel_stats").rows == new.table("kernel_stats").rows
    assert sum(r[1] for r in old.table("kernel_stats").rows) == kernels
    assert old.table("op_stats").rows == new.table("op_stats").rows
    # Launch flows: one per runtime call whose correlation id reaches the GPU, as in the modern trace.
    assert len(old.flows) == len(new.flows) > 90
    # record_function ranges were "Operator" events then: the op table treats both alike.
    modern_cats = Counter("cpu_op" if s.category == "annotation" else s.category for s in new.spans)
    assert Counter(s.category for s in old.spans) == modern_cats
    assert "unbound_flow_events" not in old.metadata
    by_track = Counter(s.track for s in old.spans if s.category == "kernel")
    assert by_track == Counter(s.track for s in new.spans if s.category == "kernel")
    # The host ops sit on one thread track whatever way the tid was written.
    assert len({s.track for s in old.spans if s.category == "cpu_op"}) == 1


def test_pytorch_1_9_gpu_side_user_ranges_are_device_time(tmp_path):
    """``"cat": "User"`` on ``"stream 7 user"`` is the GPU side of an annotation: never an op-table call."""
    modern, n_added = _with_gpu_annotations(_events())
    legacy = _legacy(modern)
    for e in legacy["traceEvents"]:
        if e.get("cat") == "gpu_user_annotation":
            e["cat"], e["tid"] = "User", "stream 7 user"
    part = read_trace(_write(tmp_path, legacy, "legacy.pt.trace.json")).parts[0]
    host = Counter(e["name"] for e in _events()["traceEvents"] if e.get("cat") == "user_annotation")
    got = {r[0]: r[1] for r in part.table("op_stats").rows if r[0] in host}
    assert got == dict(host)
    assert sum(1 for s in part.spans if s.category == "gpu_annotation") == n_added


def test_unrecognised_categories_warn_instead_of_an_empty_analysis(tmp_path):
    """A trace whose categories are all unknown still reads, and says why there are no tables."""
    trace = _events()
    renamed = [{**e, "cat": "op_" + e["cat"]} if e.get("ph") == "X" and e.get("cat") != "Trace" else e
               for e in trace["traceEvents"]]
    with pytest.warns(OmniprofWarning, match=r"no event category is one omniprof analyses \(found 'op_cuda_runtime' x361"):
        part = read_trace(_write(tmp_path, {**trace, "traceEvents": renamed}, "odd.json")).parts[0]
    assert part.table("op_stats") is None and part.table("kernel_stats") is None
    assert "no op table" in part.metadata["analysis_note"]  # a saved result says why, too
    assert len(part.spans) == sum(1 for e in renamed if e.get("ph") == "X" and e.get("cat") != "Trace")  # kept
