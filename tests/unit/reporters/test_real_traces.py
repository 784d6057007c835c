"""Span profiles from real GPU traces (shared/data/kineto): real spans overlap without nesting,
and every viewer must still take the files with every span's time accounted for."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

import omniprof
from omniprof.core.results import ProfileResult
from omniprof.reporters.speedscope import speedscope_document
from omniprof.analysis.stackdata import span_lanes, stack_profile
from tests.unit.reporters.test_speedscope import check_importable
from tests.tools import shared_data


def _kineto_spans(name: str) -> ProfileResult:
    """A real Kineto GPU trace, read by omniprof's own Kineto reader."""
    from omniprof.core.readers import read_any

    return read_any(shared_data("kineto", name))


@pytest.mark.parametrize("trace", ["alexnet_cuda_trace.json.gz", "triton_cuda_trace.json.gz"])
def test_speedscope_of_real_gpu_trace(trace, speedscope_schema):
    """Every span of a real trace appears once in a valid, importable speedscope file, with its
    exact start and end."""
    result = _kineto_spans(trace)
    doc = speedscope_document(result)
    jsonschema.validate(doc, speedscope_schema)
    check_importable(doc)
    intervals = sorted((s.start_ns - result.metadata.start_ns, s.end_ns - result.metadata.start_ns)
                       for s in result.parts[0].spans)
    got = []
    for prof in doc["profiles"]:
        stack = []
        for e in prof["events"]:
            if e["type"] == "O":
                stack.append(e["at"])
            else:
                got.append((stack.pop(), e["at"]))
    assert sorted(got) == intervals


def test_real_trace_has_overlaps_that_move_lanes():
    """The AlexNet trace has spans overlapping without nesting; they move to overlap lanes."""
    result = _kineto_spans("alexnet_cuda_trace.json.gz")
    lanes, moved = span_lanes(result.parts[0])
    assert moved > 0 and any("(overlap" in lane.name for lane in lanes)
    assert "spans moved to overlap lanes" in speedscope_document(result)["name"]


def test_pprof_and_flamegraph_of_real_trace(go_pprof, flamegraph_pl, run_tool, tmp_path):
    """Span self times from a real trace total the same in go tool pprof, flamegraph.pl and ours."""
    result = _kineto_spans("alexnet_cuda_trace.json.gz")
    total = stack_profile(result, "spans").totals()[1]
    pb = omniprof.report(result, "pprof", tmp_path / "p.pb.gz")
    top = run_tool(go_pprof, "-top", "-unit=ns", str(pb)).stdout.decode()
    m = re.search(r"of (\d+)ns total", top.replace(",", ""))
    assert m and int(m.group(1)) == total, top[:600]
    folded = omniprof.report(result, "collapsed", tmp_path / "f.collapsed")
    proc = run_tool(flamegraph_pl, str(folded))
    assert "Ignored" not in proc.stderr.decode()
    m = re.search(r"<title>all \(([\d,]+) samples", proc.stdout.decode())
    assert m and int(m.group(1).replace(",", "")) == total


@pytest.mark.slow
def test_speedscope_app_opens_real_gpu_trace(speedscope_app, tmp_path):
    """speedscope itself imports the spans of a real GPU trace, overlap lanes included."""
    result = _kineto_spans("alexnet_cuda_trace.json.gz")
    path = omniprof.report(result, "speedscope", tmp_path / "alexnet.speedscope.json")
    shown = speedscope_app.load(path)
    assert not shown["failed"], shown["console"]
    assert shown["title"] == f"{json.loads(path.read_text())['name']} - speedscope"
