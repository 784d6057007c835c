"""Chrome/Perfetto output of a real torch run keeps torch's per-allocation memory events and per-op
details (input strides, external ids), read back with Perfetto's own trace processor. The reference
is the Kineto JSON torch itself wrote for the run (kept in the session directory)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import omniprof

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A real torch run with shapes and memory recorded, and torch's own JSON for it."""
    logdir = tmp_path_factory.mktemp("logdir")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x = torch.randn(8, 16)
    opts = omniprof.ProfileOptions(host_tracer_level=3, device_tracer_level=0)
    with omniprof.Profiler(backend="torch", options=opts, logdir=logdir) as prof:
        model(x).sum().backward()
    result = prof.result
    trace = next(Path(a.path) for a in result.parts[0].artifacts if a.kind == "kineto")
    events = json.loads(trace.read_text(encoding="utf-8"))["traceEvents"]
    return result, events


def _tp_args(engine, path, name):
    from omniprof.testing.trace_processor import import_problems, open_trace, query_rows

    with open_trace(path, engine) as tp:
        assert import_problems(tp) == []
        rows = query_rows(tp, "select s.id as id, a.key as key, a.int_value as i, a.string_value as s "
                              f"from slice s left join args a on a.arg_set_id = s.arg_set_id where s.name = '{name}'")
    by_slice: dict[int, dict[str, object]] = {}
    for r in rows:
        d = by_slice.setdefault(r["id"], {})
        if r["key"] is not None:
            # "debug.bytes" (protobuf debug annotations) or "args.bytes" (JSON args): our arg name
            d[r["key"].split(".", 1)[1]] = r["i"] if r["i"] is not None else r["s"]
    return list(by_slice.values())


@pytest.mark.parametrize("fmt", ["proto", "json"])
def test_every_allocation_event_is_kept(engine, run, fmt, tmp_path):
    """Each '[memory]' event torch wrote is one instant in Perfetto, with its bytes and address."""
    result, events = run
    mem = [e for e in events if e.get("name") == "[memory]"]
    assert len(mem) > 10
    path = tmp_path / ("t.perfetto-trace" if fmt == "proto" else "t.json.gz")
    omniprof.report(result, "perfetto", path, options={"format": fmt})
    got = _tp_args(engine, path, "[memory]")
    assert len(got) == len(mem)
    assert sorted((g["bytes"], g["addr"]) for g in got) == sorted((e["args"]["Bytes"], e["args"]["Addr"]) for e in mem)
    assert sorted(g["total_allocated_bytes"] for g in got) == sorted(e["args"]["Total Allocated"] for e in mem)


@pytest.mark.parametrize("fmt", ["proto", "json"])
def test_op_details_strides_and_external_ids_are_kept(engine, run, fmt, tmp_path):
    """aten::addmm slices carry torch's External id, sequence number and input strides."""
    result, events = run
    ops = [e for e in events if e.get("name") == "aten::addmm" and e.get("cat") == "cpu_op"]
    assert len(ops) == 2
    path = tmp_path / ("t.perfetto-trace" if fmt == "proto" else "t.json.gz")
    omniprof.report(result, "perfetto", path, options={"format": fmt})
    got = _tp_args(engine, path, "aten::addmm")
    assert sorted(g["external_id"] for g in got) == sorted(e["args"]["External id"] for e in ops)
    assert sorted(g["sequence_number"] for g in got) == sorted(e["args"]["Sequence number"] for e in ops)
    # strides are nested lists: flattened by the trace processor into input_strides[i][j] keys
    for g in got:
        op = next(e for e in ops if e["args"]["External id"] == g["external_id"])
        strides = {k: v for k, v in g.items() if k.startswith("input_strides")}
        want = {f"input_strides[{i}][{j}]": s for i, st in enumerate(op["args"]["Input Strides"])
                for j, s in enumerate(st)}
        assert {k: v for k, v in strides.items() if k in want} == want
