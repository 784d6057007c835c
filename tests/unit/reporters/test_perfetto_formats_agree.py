"""The Perfetto protobuf and the Chrome JSON of one result, read back by Perfetto's trace processor,
hold the same events: every slice (name, ts, dur, track, args), instant, counter value, flow and
sample, each equal to what the result itself says (computed here from the ProfileResult, not by
the reporter), and equal between the two files event for event, overflow lanes included.

The result is a real cpu-backend session (annotations recorded as they close, sampled stacks of
two threads) beside a GPU part made by hand (no GPU here): a device clock with an offset, a
runtime thread launching kernels on two streams (flows, one chained over three spans), collective
ops that overlap without nesting (overflow lanes), an instant and two counters.
"""

from __future__ import annotations

import re

import pytest

import omniprof
from omniprof.core.results import (
    BackendResult,
    ClockInfo,
    CounterSeries,
    Flow,
    Instant,
    ProfileResult,
    Span,
    Track,
)
from tests.unit.reporters.test_perfetto import cpu_result

pytest.importorskip("perfetto.trace_processor", reason="the perfetto package (pip install perfetto) runs the reader")

_LANE = re.compile(r" \(lane \d+\)$")


def multi_part_result() -> ProfileResult:
    host = cpu_result()  # a real cpu session: annotations of two steps, samples of two threads
    cpu = host.parts[0]
    assert cpu.spans and cpu.samples, "the cpu session recorded no annotations or no samples"
    # The device clock reads ~0 when the run starts: its offset onto the reference clock is large and odd.
    offset = min(s.start_ns for s in cpu.spans) - 1_234_567 + 89
    rt, s7, s8, coll = "cupti:thread:4242", "device:0:stream:7", "device:0:stream:8", "device:0:nccl"
    spans = []
    for i in range(4):
        t = 1_300_000 + i * 2_000_000
        stream = s7 if i % 2 == 0 else s8
        spans.append(Span("cudaLaunchKernel", rt, t, 7_000 + 13 * i, "runtime", {"correlation": 100 + i}, flow_ids=(100 + i,)))
        spans.append(Span(f"gemm_{i}", stream, t + 25_000, 400_000 + 1_000 * i, "kernel",
                          {"grid": "[128,1,1]", "block": "[256,1,1]", "regs": 64}, flow_ids=(100 + i,)))
    # a chain over three spans: a sync on the runtime thread, the kernel it waits for, an event record
    spans.append(Span("cudaStreamSynchronize", rt, 9_500_000, 30_000, "runtime", flow_ids=(7,)))
    spans.append(Span("reduce", s7, 9_510_000, 15_000, "kernel", flow_ids=(7,)))
    spans.append(Span("eventRecord", s8, 9_520_000, 1_000, "kernel", flow_ids=(7,)))
    # collectives overlapping without nesting: lanes 2 and 3 of their track
    spans += [Span("all_reduce", coll, 2_000_000, 3_000_000, "nccl", {"bytes": 1 << 20}),
              Span("all_gather", coll, 3_000_000, 3_000_000, "nccl", {"bytes": 1 << 19}),
              Span("broadcast", coll, 4_000_000, 3_000_000, "nccl", {"root": 0})]
    device = BackendResult(
        backend="cupti", clock=ClockInfo("cupti_gpu_ns", offset), start_ns=1_000_000, end_ns=11_000_000,
        tracks=(Track(rt, "cuda-runtime", "thread", tid=4242), Track(s7, "Stream 7", "stream", device=0, stream=7),
                Track(s8, "Stream 8", "stream", device=0, stream=8), Track(coll, "NCCL", "other", device=0),
                Track("device:0:power", "GPU 0 power", "counter", device=0)),
        spans=tuple(spans),
        instants=(Instant("cudaEventSynchronize", s7, 9_600_000, "sync", {"event": 3}),),
        counters=(CounterSeries("power", "W", "device:0:power", (1_000_000, 5_000_000, 9_000_000), (71.5, 80.0, 75.25)),
                  CounterSeries("memory_used", "bytes", s7, (1_500_000, 6_000_000), (2.0**30, 1.5 * 2**30))),
        flows=(Flow(7, "sync", "cuda_sync"), *(Flow(100 + i, "launch", "cuda_launch") for i in range(4))),
    )
    return host.evolve(parts=(cpu, device))


def _arg_text(value) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def expected(result: ProfileResult) -> dict:
    """What the reader must find, from the result alone. Every time here is >= 0 on the reference
    clock, so the trace keeps the reference clock unshifted: ts = t + clock.offset_ns."""
    slices, counters, flows, samples = [], [], [], []
    for p in result.parts:
        off = p.clock.offset_ns
        names = {t.id: t.name for t in p.tracks}
        for s in p.spans:
            slices.append((s.name, s.start_ns + off, s.dur_ns, names[s.track],
                           tuple(sorted((k, _arg_text(v)) for k, v in s.args.items()))))
        for i in p.instants:
            slices.append((i.name, i.t_ns + off, 0, names[i.track],
                           tuple(sorted((k, _arg_text(v)) for k, v in i.args.items()))))
        for c in p.counters:
            counters += [(c.name, t + off, v) for t, v in zip(c.t_ns, c.values)]
        chains: dict[int, list[tuple[int, str]]] = {}
        for s in p.spans:
            for f in s.flow_ids:
                chains.setdefault(f, []).append((s.start_ns + off, s.name))
        for chain in chains.values():
            chain.sort()
            flows += [((a_name, a_ts), (b_name, b_ts)) for (a_ts, a_name), (b_ts, b_name) in zip(chain, chain[1:])]
        threads = {th.thread_id: th.name for th in p.threads}
        for x in p.samples:
            leaf = p.frames[p.stacks[x.stack_id][-1]].name
            samples.append((x.t_ns + off, threads[x.thread_id], leaf))
    assert min(ts for _, ts, *_ in slices) >= 0
    return {"slices": sorted(slices), "counters": sorted(counters), "flows": sorted(flows), "samples": sorted(samples)}


_SLICES = """
select s.id as id, s.name as name, s.ts as ts, s.dur as dur, s.category as category, s.arg_set_id as arg_set_id,
       coalesce(th.name, t.name) as track
from slice s join track t on t.id = s.track_id
left join thread_track tt on tt.id = s.track_id left join thread th on th.utid = tt.utid
"""
_PROTO_SAMPLES = """
select ps.ts as ts, th.name as thread, f.name as leaf from perf_sample ps join thread th using(utid)
join stack_profile_callsite c on c.id = ps.callsite_id join stack_profile_frame f on f.id = c.frame_id
"""


def read_back(engine, path, fmt: str, ours: set[str]) -> dict:
    """What the trace processor finds in the file: slices with their full track name (lanes kept)
    and args (the reader's ``debug.``/``args.`` prefix dropped), counters, flows, samples."""
    from omniprof.testing.trace_processor import import_problems, open_trace, query_rows

    with open_trace(path, engine) as tp:
        assert import_problems(tp) == []
        rows = query_rows(tp, _SLICES)
        args: dict[int, list[tuple[str, str]]] = {}
        prefix = "debug." if fmt == "proto" else "args."  # where each importer puts an event's own args
        for a in query_rows(tp, f"select arg_set_id, key, display_value from args where key glob '{prefix}*'"):
            args.setdefault(a["arg_set_id"], []).append((a["key"][len(prefix):], a["display_value"]))
        flow_rows = query_rows(tp, "select slice_out, slice_in from flow")
        counter_rows = query_rows(tp, "select t.name as name, c.ts as ts, c.value as value from counter c "
                                      "join counter_track t on c.track_id = t.id")
        proto_samples = query_rows(tp, _PROTO_SAMPLES) if fmt == "proto" else []
    by_id = {r["id"]: r for r in rows}
    slices = sorted((r["name"], r["ts"], r["dur"], r["track"],
                     tuple(sorted(args.get(r["arg_set_id"], []))) if r["arg_set_id"] is not None else ())
                    for r in rows if r["category"] != "sample")
    flows = sorted(((by_id[f["slice_out"]]["name"], by_id[f["slice_out"]]["ts"]),
                    (by_id[f["slice_in"]]["name"], by_id[f["slice_in"]]["ts"])) for f in flow_rows)
    suffix = " value" if fmt == "json" else ""  # the JSON importer names a counter "<name> <arg>"
    counters = sorted((c["name"][: len(c["name"]) - len(suffix)], c["ts"], c["value"]) for c in counter_rows
                      if c["name"][: len(c["name"]) - len(suffix)] in ours)
    if fmt == "proto":  # the frame name carries its line: "work:20"
        samples = sorted((s["ts"], s["thread"], s["leaf"].rsplit(":", 1)[0]) for s in proto_samples)
    else:  # Chrome JSON: an instant of category "sample" named by the leaf frame
        samples = sorted((r["ts"], r["track"], r["name"]) for r in rows if r["category"] == "sample")
    return {"slices": slices, "counters": counters, "flows": flows, "samples": samples}


@pytest.fixture(scope="module")
def both(engine, tmp_path_factory):
    result = multi_part_result()
    ours = {c.name for p in result.parts for c in p.counters}
    out = tmp_path_factory.mktemp("agree")
    got = {}
    for fmt in ("proto", "json"):
        path = omniprof.report(result, "perfetto", out / fmt, options={"format": fmt})
        got[fmt] = read_back(engine, path, fmt, ours)
    return result, got


@pytest.mark.parametrize("fmt", ["proto", "json"])
def test_each_file_holds_exactly_the_results_events(both, fmt):
    """Slices (name, ts, dur, track, args), instants, counters, flows and samples read back from
    each file equal the result's own, times on the reference clock (device part: its offset added)."""
    result, got = both
    want = expected(result)
    g = got[fmt]
    assert [(n, ts, d, _LANE.sub("", track), a) for n, ts, d, track, a in g["slices"]] == want["slices"]
    assert g["counters"] == want["counters"]
    assert g["flows"] == want["flows"]
    assert g["samples"] == want["samples"]


def test_proto_and_json_agree_event_for_event(both):
    """The two files hold the same events with the same tracks, lanes included."""
    _, got = both
    proto, js = got["proto"], got["json"]
    lanes = sorted({track for *_, track, _ in proto["slices"] if _LANE.search(track)})
    assert lanes == ["NCCL (lane 2)", "NCCL (lane 3)"]  # the three collectives overlap without nesting
    for what in ("slices", "counters", "flows", "samples"):
        assert len(proto[what]) == len(js[what]) > 0, what
        for a, b in zip(proto[what], js[what]):
            assert a == b, what
