"""Perfetto export: throughput, bytes per event and peak memory, protobuf beside Chrome JSON.

Targets (issue 7):
  * Perfetto protobuf export of 10**6 spans at >= 1,000,000 events/s on this machine;
  * peak memory of the export independent of the event count;
  * bytes per event printed beside Chrome JSON's;
  * Chrome JSON and Perfetto outputs of the same result hold the same event count, read back by
    Perfetto's trace processor.

Run: python benchmarks/perfetto_export.py [--spans 1000000] [--readback-spans N] [--repeat 3]

Each file is written through ``omniprof.report`` (atomic temp file + fsync + rename), so the
figures include the real write. Throughput runs without tracemalloc; memory is measured in separate
runs with tracemalloc (peak allocated during the export, above what the result itself holds).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import attrs

import omniprof
from omniprof.core.results import BackendResult, ClockInfo, CounterSeries, ProfileResult, Span, Track
from omniprof.reporters.perfetto import expected_counts


def make(n_spans: int, *, threads: int = 8, names: int = 200) -> ProfileResult:
    """``n_spans`` spans on ``threads`` thread tracks: each thread runs a loop of 'step' spans with
    four nested op spans each (realistic nesting), names from a pool, plus a counter per thread."""
    tracks = tuple(Track(f"thread:{t}", f"worker-{t}", "thread", pid=1000, tid=1000 + t) for t in range(threads))
    spans = []
    per_thread = n_spans // threads
    t0 = 10**12
    for t in range(threads):
        ts = t0
        track = f"thread:{t}"
        made = 0
        while made < per_thread:
            spans.append(Span("step", track, ts, 1000, "step"))
            made += 1
            for k in range(4):
                if made >= per_thread:
                    break
                spans.append(Span(f"op_{(made * 7 + k) % names}", track, ts + 50 + k * 230, 200, "xla_op"))
                made += 1
            ts += 1100
    counters = tuple(CounterSeries(f"queue_depth_{t}", "count", f"thread:{t}", tuple(t0 + i * 10_000 for i in range(100)),
                                   tuple(float(i % 7) for i in range(100))) for t in range(threads))
    part = BackendResult(backend="bench", clock=ClockInfo(), start_ns=t0, end_ns=t0 + per_thread * 300,
                         tracks=tracks, spans=tuple(spans), counters=counters)
    return ProfileResult(metadata=omniprof.core.results.RunMetadata(host="bench", pid=1000), parts=(part,))


def with_args(result: ProfileResult) -> ProfileResult:
    """The same spans, each with four args (as XLA ops carry hlo_op, hlo_module, flops, program_id)."""
    part = result.parts[0]
    spans = tuple(Span(s.name, s.track, s.start_ns, s.dur_ns, s.category,
                       {"hlo_op": s.name, "hlo_module": "jit_train_step", "flops": i % 4096, "program_id": 7})
                  for i, s in enumerate(part.spans))
    return result.evolve(parts=(attrs.evolve(part, spans=spans),))


def events(result: ProfileResult) -> int:
    c = expected_counts(result)
    return c["slices"] + c["counter_values"] + c["flows"] + c["samples"]


def timed_export(result: ProfileResult, options: dict, outdir: Path, repeat: int) -> tuple[float, float, int]:
    """Median wall seconds and median CPU seconds over ``repeat`` runs, and the file size.

    CPU time is printed beside wall time because this machine is shared: on a loaded machine the
    wall time includes waiting for a core.
    """
    walls, cpus = [], []
    size = 0
    for i in range(repeat):
        path = outdir / f"t{i}"
        t, c = time.perf_counter(), time.process_time()
        omniprof.report(result, "perfetto", path, options=options)
        walls.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
        size = path.stat().st_size
        path.unlink()
    return statistics.median(walls), statistics.median(cpus), size


def peak_export_bytes(result: ProfileResult, fmt: str, outdir: Path) -> int:
    path = outdir / f"mem.{fmt}"
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    omniprof.report(result, "perfetto", path, options={"format": fmt})
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    path.unlink()
    return peak


def readback(result: ProfileResult, outdir: Path) -> dict[str, int] | str:
    from omniprof.testing.trace_processor import TraceProcessorUnavailable, import_problems, open_trace, query_rows

    out: dict[str, int] = {}
    try:
        for fmt in ("proto", "json"):
            path = omniprof.report(result, "perfetto", outdir / f"rb.{fmt}", options={"format": fmt})
            with open_trace(path) as tp:
                problems = import_problems(tp)
                if problems:
                    return f"{fmt}: import problems {problems}"
                slices = query_rows(tp, "select count(*) as n from slice")[0]["n"]
                counters = query_rows(tp, "select count(*) as n from counter")[0]["n"]
                flows = query_rows(tp, "select count(*) as n from flow")[0]["n"]
                out[fmt] = slices + counters + flows
    except TraceProcessorUnavailable as e:
        return f"skipped: {e}"
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spans", type=int, default=1_000_000)
    ap.add_argument("--readback-spans", type=int, default=None,
                    help="spans in the result read back by the trace processor (default: the exported result "
                         "itself; 0: skip)")
    ap.add_argument("--repeat", type=int, default=3)
    ns = ap.parse_args()

    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, load average {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        outdir = Path(tmp)
        t = time.perf_counter()
        big = make(ns.spans)
        n = events(big)
        print(f"result: {ns.spans:,} spans, {n:,} events (built in {time.perf_counter() - t:.1f} s)\n")

        rows = []
        for label, opts, rep in (("Perfetto protobuf", {"format": "proto"}, ns.repeat),
                                 ("Chrome JSON", {"format": "json", "compress": False}, 1),
                                 ("Chrome JSON .json.gz", {"format": "json"}, 1)):
            rows.append((label, *timed_export(big, opts, outdir, rep)))
        print(f"{'format':<22}{'wall s':>8}{'cpu s':>8}{'events/s wall':>15}{'events/s cpu':>14}"
              f"{'bytes/event':>13}{'file MB':>9}")
        for label, wall, cpu, size in rows:
            print(f"{label:<22}{wall:>8.2f}{cpu:>8.2f}{n / wall:>15,.0f}{n / cpu:>14,.0f}{size / n:>13.1f}{size / 1e6:>9.1f}")
        (_, pw, pc, ps), (_, jw, _, js), (_, gw, _, gs) = rows
        verdict = "met" if n / pw >= 1e6 else ("met in CPU time (machine loaded)" if n / pc >= 1e6 else "NOT met")
        print(f"\nprotobuf export: {n / pw:,.0f} events/s wall, {n / pc:,.0f} events/s CPU "
              f"(target >= 1,000,000: {verdict})")
        print(f"bytes per event: protobuf {ps / n:.1f}, Chrome JSON {js / n:.1f} ({js / ps:.1f}x the protobuf), "
              f".json.gz {gs / n:.1f}; protobuf export is {jw / pw:.1f}x faster than JSON, {gw / pw:.1f}x than .json.gz")

        args_n = max(ns.spans // 5, 1000)
        argful = with_args(make(args_n))
        wall, cpu, size = timed_export(argful, {"format": "proto"}, outdir, 1)
        jwall, jcpu, jsize = timed_export(argful, {"format": "json", "compress": False}, outdir, 1)
        na = events(argful)
        print(f"with 4 args per span ({args_n:,} spans): protobuf {na / wall:,.0f} events/s wall, {na / cpu:,.0f} CPU, "
              f"{size / na:.1f} B/event; Chrome JSON {na / jwall:,.0f} events/s wall, {na / jcpu:,.0f} CPU, "
              f"{jsize / na:.1f} B/event")
        del argful

        print("\npeak memory of the export (tracemalloc, above the result itself):")
        small = make(max(ns.spans // 10, 1000))
        for fmt in ("proto", "json"):
            a, b = peak_export_bytes(small, fmt, outdir), peak_export_bytes(big, fmt, outdir)
            print(f"  {fmt:<6} {events(small):>10,} events: {a / 1e6:6.2f} MB   {n:>10,} events: {b / 1e6:6.2f} MB"
                  f"   ratio {b / a:.2f} for {n / events(small):.0f}x the events")
        if ns.readback_spans != 0:
            rb = big if ns.readback_spans is None else make(ns.readback_spans)
            del big
            want = events(rb)
            t = time.perf_counter()
            got = readback(rb, outdir)
            print(f"\nread back by Perfetto's trace processor ({sum(len(p.spans) for p in rb.parts):,} spans, {want:,} events, "
                  f"{time.perf_counter() - t:.1f} s):")
            if isinstance(got, str):
                print(f"  {got}")
            else:
                for fmt, count in got.items():
                    print(f"  {fmt:<6} {count:,} events {'== expected' if count == want else f'!= expected {want:,}'}")
                print(f"  same event count in both formats: {got['proto'] == got['json'] == want}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
