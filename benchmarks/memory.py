"""Memory profiling figures, measured side by side in one run.

1. Allocation sampling overhead on allocation-heavy workloads: wall time under omniprof's
   `memory` backend at sample_rate=0.01, under tracemalloc (full tracing) and under memray (when
   installed), each divided by the unprofiled time (median of repeats).
2. Heap snapshot of ~10^6 live objects: time and peak extra memory, in memory and streaming.

Run: python benchmarks/memory.py [--quick]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def w_strings(n: int) -> int:
    return sum(len(str(i) * 3) for i in range(n))


def w_dicts(n: int) -> int:
    out = [{"a": i, "b": [i, i + 1], "c": (i, str(i))} for i in range(n)]
    return len(out)


def w_objects(n: int) -> int:
    class P:
        __slots__ = ("x", "y")

        def __init__(self, x: int, y: int) -> None:
            self.x, self.y = x, y

    return sum(P(i, i).x for i in range(n))


def w_bytes(n: int) -> int:
    return sum(len(bytearray(i % 4096)) for i in range(n))


WORKLOADS = {"strings": (w_strings, 400_000), "dicts": (w_dicts, 150_000), "objects": (w_objects, 400_000),
             "bytes": (w_bytes, 200_000)}


def timed(fn, n) -> float:
    # Process CPU time: on a shared machine it is far steadier than wall time.
    gc.collect()
    t = time.process_time()
    fn(n)
    return time.process_time() - t


def run_omniprof(fn, n) -> float:
    import omniprof

    with omniprof.Profiler(backend="memory", backend_options={"memory": {"sample_rate": 0.01}}):
        t = timed(fn, n)
    return t


def run_tracemalloc(fn, n) -> float:
    import tracemalloc

    tracemalloc.start(16)
    try:
        return timed(fn, n)
    finally:
        tracemalloc.stop()


def run_memray(fn, n) -> float | None:
    try:
        import memray
    except ImportError:
        return None
    with tempfile.TemporaryDirectory() as d:
        with memray.Tracker(os.path.join(d, "m.bin")):
            return timed(fn, n)


def overhead(repeats: int, scale: float) -> None:
    print(f"== allocation sampling overhead (CPU time, median of {repeats} interleaved runs; ratio = profiled / unprofiled)")
    print(f"{'workload':10} {'base_s':>8} {'omniprof@0.01':>14} {'tracemalloc':>12} {'memray':>8}")
    ratios: dict[str, list[float]] = {"omniprof": [], "tracemalloc": [], "memray": []}
    for name, (fn, n) in WORKLOADS.items():
        n = int(n * scale)
        runs: dict[str, list] = {"base": [], "om": [], "tm": [], "mr": []}
        for _ in range(repeats):  # interleaved, so load changes hit every variant alike
            runs["base"].append(timed(fn, n))
            runs["om"].append(run_omniprof(fn, n))
            runs["tm"].append(run_tracemalloc(fn, n))
            runs["mr"].append(run_memray(fn, n))
        base, om, tm = (statistics.median(runs[k]) for k in ("base", "om", "tm"))
        mr = statistics.median(runs["mr"]) if None not in runs["mr"] else None
        ratios["omniprof"].append(om / base)
        ratios["tracemalloc"].append(tm / base)
        if mr is not None:
            ratios["memray"].append(mr / base)
        print(f"{name:10} {base:8.3f} {om / base:14.3f} {tm / base:12.3f} {(mr / base) if mr else float('nan'):8.3f}")
    print(f"{'median':10} {'':8} {statistics.median(ratios['omniprof']):14.3f} "
          f"{statistics.median(ratios['tracemalloc']):12.3f} "
          f"{statistics.median(ratios['memray']) if ratios['memray'] else float('nan'):8.3f}   (goal: omniprof <= 1.2)")


SNAP_CHILD = """
import sys, time, resource, json
sys.path.insert(0, {root!r})
from omniprof.backends.memory.heapsnapshot import take_heap_snapshot
objs = [{{"i": i, "s": str(i)}} for i in range({n} // 3)]
import gc; gc.collect()
def rss():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
before = rss()
with open("/proc/self/clear_refs", "w") as fh:
    fh.write("5")  # reset the peak RSS mark so VmHWM measures only the snapshot
base = rss()
t = time.perf_counter()
take_heap_snapshot({path!r}, streaming={streaming})
dt = time.perf_counter() - t
print(json.dumps({{"seconds": dt, "peak_extra_bytes": rss() - base}}))
"""


ASSEMBLE_CHILD = """
import sys, time, json
sys.path.insert(0, {root!r})
from omniprof.backends.memory.heapsnapshot import assemble_snapshot
t = time.perf_counter()
counts = assemble_snapshot({path!r}, {path!r} + ".joined")
dt = time.perf_counter() - t
with open("/proc/self/status") as fh:
    peak = next(int(l.split()[1]) * 1024 for l in fh if l.startswith("VmHWM:"))
print(json.dumps({{"seconds": dt, "peak_bytes": peak, **counts}}))
"""


def _child(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def snapshot(n: int) -> None:
    print(f"\n== heap snapshot of ~{n:,} live objects (child process; peak extra = VmHWM growth while snapshotting)")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "h.heapsnapshot")
        fig = _child(SNAP_CHILD.format(root=str(ROOT), n=n, path=path, streaming=False))
        doc_nodes = json.load(open(path))["snapshot"]["node_count"]
        print(f"in-memory  nodes {doc_nodes:>9,}  time {fig['seconds']:7.2f} s  "
              f"peak extra {fig['peak_extra_bytes'] / 2**20:8.1f} MiB  file {os.path.getsize(path) / 2**20:7.1f} MiB")
        spath = os.path.join(d, "s.heapsnapshot")
        fig = _child(SNAP_CHILD.format(root=str(ROOT), n=n, path=spath, streaming=True))
        parts = sum(os.path.getsize(spath + e) for e in (".nodes", ".edges", ".strings"))
        print(f"streaming  parts {parts / 2**20:7.1f} MiB  time {fig['seconds']:7.2f} s  "
              f"peak extra {fig['peak_extra_bytes'] / 2**20:8.1f} MiB   (goal: < 100 MiB)")
        fig = _child(ASSEMBLE_CHILD.format(root=str(ROOT), path=spath))
        print(f"assemble   nodes {fig['nodes']:>9,}  time {fig['seconds']:7.2f} s  "
              f"peak (whole process) {fig['peak_bytes'] / 2**20:8.1f} MiB  (offline, separate process)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    args = ap.parse_args()
    overhead(repeats=3 if args.quick else 5, scale=0.25 if args.quick else 1.0)
    snapshot(200_000 if args.quick else 1_000_000)


if __name__ == "__main__":
    main()
