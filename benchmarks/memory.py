"""Memory profiling figures, measured side by side in one run.

1. Allocation sampling overhead on allocation-heavy workloads: CPU time under omniprof's
   `memory` backend at sample_rate=0.01 and 0.1 (Julia's default), under tracemalloc (full tracing)
   and under memray (when installed), each divided by the unprofiled time (median of repeats);
   then the same churn after the session built a heap it keeps (its sampled blocks stay alive and
   every free meets them).
2. Accuracy: the estimated live bytes at rate 0.01, for 10 seeds, against tracemalloc's exact
   figure for the same workload (>= 100k allocations, all kept alive); and the estimated
   allocated bytes against the sampler's own exact count, with the reported standard error.
3. Heap snapshot of ~10^6 live objects: time and peak extra memory, in memory and streaming.

Run: python benchmarks/memory.py [--quick] [--only overhead|kept|accuracy|snapshot] [--against REV]

``--against REV`` (with the overhead and kept sections) builds the sampler's C source as it was at git
revision REV and as it is in the working tree, both with the same compiler flags, and times them
side by side, interleaved, at rate 0.01: the before/after of a change to the allocation hook.
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
from typing import Any

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


def run_omniprof(fn, n, rate: float = 0.01) -> float:
    import omniprof

    with omniprof.Profiler(backend="memory", backend_options={"memory": {"sample_rate": rate}}):
        t = timed(fn, n)
    return t


def run_tracemalloc(fn, n) -> float:
    import tracemalloc

    tracemalloc.start(16)
    try:
        return timed(fn, n)
    finally:
        tracemalloc.stop()


def _import_memray():
    """memray, from the ``bench`` extra (``pip install 'omniprof[bench]'``), or None."""
    try:
        import memray
    except ImportError:
        return None
    return memray


def run_memray(fn, n) -> float | None:
    memray = _import_memray()
    if memray is None:
        return None
    with tempfile.TemporaryDirectory() as d:
        with memray.Tracker(os.path.join(d, "m.bin")):
            return timed(fn, n)


def build_sampler(rev: str | None, into: str) -> object:
    """The sampler's C source at git revision ``rev`` (None: the working tree), compiled with this
    interpreter's flags under a module name of its own, and imported."""
    import importlib.util
    import sysconfig

    tag = "wt" if rev is None else "rev"
    src = os.path.join(into, f"_allocsampler_{tag}.c")
    rel = "omniprof/backends/memory/_allocsampler.c"
    if rev is None:
        text = (ROOT / rel).read_text()
    else:
        text = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{rel}"], capture_output=True, text=True,
                              check=True).stdout
    Path(src).write_text(text)
    out = os.path.join(into, f"_allocsampler_{tag}{sysconfig.get_config_var('EXT_SUFFIX')}")
    cc = (sysconfig.get_config_var("CC") or "cc").split()
    flags = (sysconfig.get_config_var("CFLAGS") or "").split() + (sysconfig.get_config_var("CCSHARED") or "").split()
    subprocess.run([*cc, *flags, "-O2", "-shared", f"-I{sysconfig.get_paths()['include']}",
                    f"-DPyInit__allocsampler=PyInit__allocsampler_{tag}", src, "-o", out], check=True)
    spec = importlib.util.spec_from_file_location(f"_allocsampler_{tag}", out)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_sampler(mod, fn, n, rate: float = 0.01) -> float:
    """The sampler module alone, started as the memory backend starts it (seed from the OS)."""
    mod.start(rate, 1_000_000, 128, int.from_bytes(os.urandom(8), "little") >> 1, False, 65_536)
    try:
        return timed(fn, n)
    finally:
        mod.stop()
        mod.take(None)


def _cell(ratio: float, width: int) -> str:
    return f"{'n/a':>{width}}" if ratio != ratio else f"{ratio:{width}.3f}"


def overhead(repeats: int, scale: float, against: str | None = None) -> None:
    print(f"== allocation sampling overhead (CPU time, median of {repeats} interleaved runs; ratio = profiled / unprofiled)")
    variants = {"om": ("omniprof@0.01", lambda fn, n: run_omniprof(fn, n, 0.01)),
                "om1": ("omniprof@0.1", lambda fn, n: run_omniprof(fn, n, 0.1)),
                "tm": ("tracemalloc", run_tracemalloc), "mr": ("memray", run_memray)}
    tmp = None
    if against:
        tmp = tempfile.TemporaryDirectory()
        before, after = build_sampler(against, tmp.name), build_sampler(None, tmp.name)
        variants["ab0"] = (f"{against[:10]}@0.01", lambda fn, n: run_sampler(before, fn, n))
        variants["ab1"] = ("worktree@0.01", lambda fn, n: run_sampler(after, fn, n))
        print(f"(last two columns: the sampler's C source at {against} and in the working tree, each built "
              f"alike and run alone)")
    if _import_memray() is None:
        print("(memray: not installed here -- pip install 'omniprof[bench]'; its column reads n/a)")
    widths = {k: max(len(label), 8) for k, (label, _) in variants.items()}
    print(f"{'workload':10} {'base_s':>8} " + " ".join(f"{label:>{widths[k]}}" for k, (label, _) in variants.items()))
    ratios: dict[str, list[float]] = {k: [] for k in variants}
    for name, (fn, n) in WORKLOADS.items():
        n = int(n * scale)
        runs: dict[str, list] = {"base": [], **{k: [] for k in variants}}
        for _ in range(repeats):  # interleaved, so load changes hit every variant alike
            runs["base"].append(timed(fn, n))
            for k, (_, run) in variants.items():
                runs[k].append(run(fn, n))
        base = statistics.median(runs["base"])
        row = {}
        for k in variants:
            if None in runs[k]:
                row[k] = float("nan")
                continue
            row[k] = statistics.median(runs[k]) / base
            ratios[k].append(row[k])
        print(f"{name:10} {base:8.3f} " + " ".join(_cell(row[k], widths[k]) for k in variants))
    med = {k: statistics.median(v) if v else float("nan") for k, v in ratios.items()}
    print(f"{'median':10} {'':8} " + " ".join(_cell(med[k], widths[k]) for k in variants)
          + "   (goal: omniprof@0.01 <= 1.15)")
    if tmp is not None:
        tmp.cleanup()


def w_keep_then_churn(k: int) -> int:
    """A program that loads its data, then works: ``k`` strings built and kept, then the strings
    workload's churn beside them (every free meets the sampled blocks the kept heap left alive)."""
    kept = [str(i) for i in range(k)]
    return len(kept) + w_strings(WORKLOADS["strings"][1])


def kept_heap(repeats: int, keep: int, against: str | None = None) -> None:
    """CPU time of w_keep_then_churn, unprofiled, under the memory backend at 0.01, and (--against)
    under each sampler build alone, each seeded alike run by run (which blocks a seed samples decides
    which frees meet a live sampled block's slot)."""
    import omniprof

    print(f"\n== keep {keep:,} strings, then churn (CPU time, median of {repeats} interleaved runs, "
          f"seeds 1..{repeats})")

    def backend(k: int, seed: int) -> float:
        with omniprof.Profiler(backend="memory", backend_options={"memory": {"sample_rate": 0.01, "seed": seed}}):
            return timed(w_keep_then_churn, k)

    variants: dict[str, Any] = {"omniprof@0.01": backend}
    tmp = None
    if against:
        tmp = tempfile.TemporaryDirectory()
        for label, rev in ((f"{against[:10]}@0.01", against), ("worktree@0.01", None)):
            mod = build_sampler(rev, tmp.name)

            def alone(k: int, seed: int, mod: Any = mod) -> float:
                mod.start(0.01, 1_000_000, 128, seed, False, 65_536)
                try:
                    return timed(w_keep_then_churn, k)
                finally:
                    mod.stop()
                    mod.take(None)

            variants[label] = alone

    print(f"{'kept':>10} {'base_s':>8} " + " ".join(f"{label:>14}" for label in variants))
    for k in (0, keep):
        runs: dict[str, list[float]] = {"base": [], **{label: [] for label in variants}}
        for seed in range(1, repeats + 1):
            runs["base"].append(timed(w_keep_then_churn, k))
            for label, run in variants.items():
                runs[label].append(run(k, seed))
        base = statistics.median(runs["base"])
        print(f"{k:>10,} {base:8.3f} "
              + " ".join(f"{statistics.median(runs[label]) / base:14.3f}" for label in variants))
    if tmp is not None:
        tmp.cleanup()


def w_kept(n: int) -> list:
    """>= n allocations, all kept alive: dicts holding a string and a tuple."""
    return [{"i": i, "s": str(i) * 3, "t": (i, str(i))} for i in range(n)]


def accuracy(n: int, seeds: int) -> None:
    import tracemalloc

    import omniprof

    print(f"\n== accuracy at sample_rate 0.01, {seeds} seeds, workload of {n:,} dicts kept alive")
    gc.collect()
    tracemalloc.start(1)
    before = tracemalloc.get_traced_memory()[0]
    kept = w_kept(n)
    exact_live = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del kept
    print(f"tracemalloc (exact, every allocation traced): live bytes {exact_live:,}")
    print(f"{'seed':>5} {'allocations':>12} {'est_live':>12} {'/exact':>7} {'est_alloc':>12} {'exact_alloc':>12} "
          f"{'/exact':>7} {'stderr':>7}")
    live_ratios, alloc_ratios = [], []
    for seed in range(1, seeds + 1):
        gc.collect()
        with omniprof.memory.profile(sample_rate=0.01, seed=seed) as prof:
            kept = w_kept(n)
        s = prof.result.part("memory").summaries["memory"]
        del kept
        lr = s["est_live_at_end_bytes"] / exact_live
        ar = s["est_allocated_bytes"] / s["allocated_bytes"]
        live_ratios.append(lr)
        alloc_ratios.append(ar)
        print(f"{seed:5} {s['allocations']:12,} {s['est_live_at_end_bytes']:12,} {lr:7.3f} {s['est_allocated_bytes']:12,} "
              f"{s['allocated_bytes']:12,} {ar:7.3f} {s['est_allocated_bytes_stderr'] / s['allocated_bytes']:7.3f}")
    for what, r in (("live vs tracemalloc", live_ratios), ("allocated vs exact count", alloc_ratios)):
        print(f"spread {what:26}: min {min(r):.3f}  max {max(r):.3f}  mean {statistics.mean(r):.3f}  "
              f"stdev {statistics.stdev(r):.3f}   (goal: every seed within 0.90-1.10)")


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
    ap.add_argument("--only", choices=["overhead", "kept", "accuracy", "snapshot"], help="one section only")
    ap.add_argument("--against", metavar="REV", help="overhead: also time the sampler as built from git REV and "
                                                     "from the working tree, side by side")
    args = ap.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start (shared with other work)")
    if args.only in (None, "overhead"):
        overhead(repeats=3 if args.quick else 5, scale=0.25 if args.quick else 1.0, against=args.against)
    if args.only in (None, "kept"):
        kept_heap(repeats=3 if args.quick else 5, keep=1_000_000 if args.quick else 3_000_000, against=args.against)
    if args.only in (None, "accuracy"):
        accuracy(100_000, 10)
    if args.only in (None, "snapshot"):
        snapshot(200_000 if args.quick else 1_000_000)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
