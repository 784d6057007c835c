"""XProf's own converter (the code behind its tools) on the tensorboard reporter's output of a real
torch run: framework op statistics equal torch's figures (omniprof's op_stats, itself checked against
torch's key_averages), and the views it cannot fill are named, with why, in XProf's diagnostics."""

from __future__ import annotations

import json

import pytest

import omniprof
from omniprof.reporters.tensorboard import write_logdir

torch = pytest.importorskip("torch")
raw_to_tool_data = pytest.importorskip("xprof.convert.raw_to_tool_data",
                                       reason="XProf is not installed (pip install 'omniprof[tensorboard]')")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x = torch.randn(8, 16)
    opts = omniprof.ProfileOptions(host_tracer_level=3, device_tracer_level=0)
    with omniprof.Profiler(backend="torch", options=opts) as prof:
        for _ in range(3):
            model(x).sum().backward()
            prof.step()
    path = write_logdir(prof.result, tmp_path_factory.mktemp("logs"))

    def tool(name):
        data, _ = raw_to_tool_data.xspace_to_tool_data([path], name, {})
        return json.loads(data)

    return prof.result, tool


def test_framework_op_stats_equal_torch_op_table(converted):
    """Every aten op: occurrences and total time (us) as in the op table, to the ns; self time too where
    the op's children are all ops (see below). ``aten::sum`` re-dispatches to itself: counted once."""
    result, tool = converted
    tables = [t for t in tool("framework_op_stats") if isinstance(t, dict) and t.get("rows")]
    cols = [c["id"] for c in tables[0]["cols"]]
    rows = [dict(zip(cols, (c.get("v") for c in r["c"]))) for r in tables[0]["rows"]]
    xprof = {f"{r['type']}::{r['operation']}": r for r in rows if r["host_or_device"] == "Host" and r["type"] != "IDLE"}
    ours = {r["name"]: r for r in result.part("torch").table("op_stats").records() if r["name"].startswith("aten::")}
    assert len(ours) >= 10 and set(xprof) == set(ours)
    # XProf's self time subtracts only children it counts as ops (torch's subtracts every op and range
    # nested in it): equal where all children are namespace::op ops, never smaller elsewhere.
    spans = sorted((s for s in result.part("torch").spans if s.category in ("cpu_op", "annotation", "step")),
                   key=lambda s: (s.track, s.start_ns, -s.dur_ns))
    plain_children: set[str] = set()
    stack = []
    for sp in spans:
        while stack and (stack[-1].track != sp.track or stack[-1].end_ns <= sp.start_ns):
            stack.pop()
        if stack and "::" not in sp.name:
            plain_children.add(stack[-1].name)
        stack.append(sp)
    same_self = 0
    for name, r in ours.items():
        x = xprof[name]
        assert x["occurrences"] == r["calls"], name
        assert round(x["total_time"] * 1000) == r["total_ns"], name
        if name in plain_children:
            assert round(x["total_self_time"] * 1000) >= r["self_ns"], name
        else:
            assert round(x["total_self_time"] * 1000) == r["self_ns"], name
            same_self += 1
    assert same_self >= 8


def test_views_not_filled_are_named_with_why(converted):
    """XProf's overview diagnostics list the views a torch run cannot fill and the reason."""
    _, tool = converted
    text = json.dumps(tool("overview_page"))
    assert "omniprof: torch ops fill XProf's framework_op_stats" in text
    assert "op_profile, memory_viewer and graph_viewer (built from XLA HLO" in text
    assert "memory_profile not filled: XProf reads TensorFlow allocator events only" in text
