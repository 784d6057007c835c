"""Cross-rank analysis of synthetic per-rank Kineto traces: wall time and peak memory, 1 worker vs N.

Generates ``--ranks`` GPU-training-like Kineto traces of about ``--events`` events each (steps, CPU
ops and CUDA launches linked by flows to compute kernels, memcpys, an NCCL all-reduce kernel per
step; rank ``--slow-rank`` takes 30 % longer before each all-reduce, so the others wait for it),
with ``distributedInfo.rank`` set, then in fresh subprocesses:

* ``one rank``: ``read_trace`` + ``reduce_rank`` of the largest rank alone: the single-rank cost;
* ``analyze workers=1``: ``crossrank.analyze_dir`` reading ranks one after another in-process;
* ``analyze workers=N``: the same with N worker processes.

For each: wall time; peak RSS growth of the analysing process over its RSS before reading; and for
worker runs the largest worker's peak RSS (``RUSAGE_CHILDREN``). The target of issue 17 is a peak
of at most 2x the largest single rank's in-memory size, and a speedup with more cores. It checks
that the straggler found is the slowed rank.

Run: ``python benchmarks/distributed_analysis.py [--ranks 4] [--events 20000] [--workers 2]``
(the issue's full size is ``--ranks 64 --events 1000000``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path


def generate(path: Path, rank: int, world: int, n_events: int, slow: bool, seed: int = 0) -> int:
    """One rank's trace; returns its event count. Per step: 8 (op, launch, kernel) triples, a memcpy,
    an NCCL all-reduce kernel whose start waits for the slowest rank."""
    rng = random.Random(seed * 1000 + rank)
    events = []
    ts = 1_700_000_000_000_000.0
    corr = 0
    step = 0
    per_step = 8 * 3 + 2 + 1
    n_steps = max(1, n_events // per_step)
    compute_us = 1000.0
    for step in range(n_steps):
        start = ts
        t = ts
        for _ in range(8):
            corr += 1
            d = rng.uniform(900, 1100) * (1.3 if slow else 1.0)
            events.append({"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 1, "tid": 1, "ts": t, "dur": d})
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                           "ts": t + 1, "dur": 5, "args": {"correlation": corr}})
            events.append({"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_tn", "pid": 0, "tid": 7,
                           "ts": t + 8, "dur": d, "args": {"correlation": corr, "device": 0, "stream": 7}})
            events.append({"ph": "s", "id": corr, "pid": 1, "tid": 1, "ts": t + 1, "cat": "ac2g", "name": "ac2g"})
            events.append({"ph": "f", "id": corr, "pid": 0, "tid": 7, "ts": t + 8, "cat": "ac2g", "name": "ac2g",
                           "bp": "e"})
            t += d + 10
        events.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": 7,
                       "ts": t, "dur": 20, "args": {"device": 0, "stream": 7, "bytes": 1 << 20}})
        # All ranks leave the all-reduce together, when the slowest rank's compute is done.
        slowest_end = start + 8 * (1100 * 1.3 + 10) + 40
        events.append({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": 0,
                       "tid": 8, "ts": t + 20, "dur": max(30.0, slowest_end - (t + 20)) + 30,
                       "args": {"device": 0, "stream": 8}})
        end = max(slowest_end + 30, t + 100)
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1,
                       "ts": start, "dur": end - start})
        ts = end + compute_us * 0.01
    doc = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
           "deviceProperties": [{"id": 0, "name": "Synthetic GPU"}], "traceEvents": events}
    path.write_text(json.dumps(doc))
    return len(events)


_CHILD = r"""
import json, os, resource, sys, time
sys.path.insert(0, sys.argv[1])
from omniprof.analysis import crossrank
from omniprof.formats.kineto import read_trace
import warnings
warnings.simplefilter("ignore")
mode, path = sys.argv[2], sys.argv[3]
def rss():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
before = rss()
t0 = time.perf_counter()
if mode == "one":
    res = read_trace(path)
    s = crossrank.reduce_rank(res.parts, rank=0)
    out = {}
else:
    rep = crossrank.analyze(path, workers=int(mode))
    out = {"stragglers": [s.rank for s in rep.stragglers]}
wall = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
print(json.dumps({"wall_s": wall, "peak_growth_bytes": peak - before, "worker_peak_bytes": child, **out}))
"""


def _run(mode: str, path: Path) -> dict:
    root = str(Path(__file__).resolve().parents[1])
    out = subprocess.run([sys.executable, "-c", _CHILD, root, mode, str(path)], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--events", type=int, default=20_000, help="events per rank")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--slow-rank", type=int, default=3)
    ns = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        sizes = []
        for r in range(ns.ranks):
            n = generate(d / f"rank{r}.pt.trace.json", r, ns.ranks, ns.events, r == ns.slow_rank)
            sizes.append((d / f"rank{r}.pt.trace.json").stat().st_size)
        print(f"{ns.ranks} ranks x {n:,} events ({max(sizes) / 2**20:.1f} MiB JSON per rank); "
              f"{os.cpu_count()} cores here")
        largest = d / f"rank{ns.slow_rank}.pt.trace.json"
        one = _run("one", largest)
        serial = _run("1", d)
        par = _run(str(ns.workers), d)
        unit = one["peak_growth_bytes"]
        print(f"{'run':<22} {'wall s':>8} {'peak growth MiB':>16} {'x one rank':>10} {'worker peak MiB':>16}")
        print(f"{'one rank (read+reduce)':<22} {one['wall_s']:>8.2f} {unit / 2**20:>16.1f} {1.0:>10.2f} {'-':>16}")
        for name, x in (("analyze workers=1", serial), (f"analyze workers={ns.workers}", par)):
            wp = f"{x['worker_peak_bytes'] / 2**20:.1f}" if name.endswith(f"={ns.workers}") and ns.workers > 1 else "-"
            print(f"{name:<22} {x['wall_s']:>8.2f} {x['peak_growth_bytes'] / 2**20:>16.1f} "
                  f"{x['peak_growth_bytes'] / unit:>10.2f} {wp:>16}")
        print(f"speedup {ns.workers} workers vs 1: {serial['wall_s'] / par['wall_s']:.2f}x")
        print(f"stragglers found: {serial['stragglers']} (slowed: [{ns.slow_rank}]); "
              f"same with workers: {par['stragglers'] == serial['stragglers']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
