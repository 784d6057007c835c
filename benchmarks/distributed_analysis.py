"""Cross-rank analysis at scale: 64 synthetic ranks x 10^6 events, 1 worker vs N, and on Dask.

Issue 17's target: the cross-rank analysis of 64 ranks x 10^6 Kineto events, with its wall time,
its peak memory (at most 2x the largest single rank's in-memory size), its speedup with 2 workers
against 1, and the same analysis through the Dask executor on a local cluster.

1. **Generate** ``--ranks`` GPU-training-like Kineto traces of ``--events`` events each into a temp
   dir (fixed seed, so every run reads the same bytes; written as a stream, ranks in parallel; the
   time is printed apart). Per step: 8 (``aten::addmm`` op, ``cudaLaunchKernel``, GEMM kernel,
   launch flow pair), a memcpy, an NCCL all-reduce kernel and the ``ProfilerStep#N`` annotation;
   rank ``--slow-rank`` computes 30 % longer, so the others wait for it in every all-reduce.
2. **One rank in memory**: ``read_trace`` of the largest rank, in a fresh process: its RSS growth
   with the trace read is the rank's *in-memory size*, the unit of the memory target.
3. **One rank streamed**: ``crossrank.reduce_file`` of the same rank (what each worker does).
4. **analyze workers=1** and **workers=N** (``crossrank.analyze_dir``), each in a fresh process.
5. **Dask**: a ``distributed.LocalCluster`` of N single-threaded worker processes on 127.0.0.1,
   ``analyze_dir(executor=address)``; its start time is printed apart.

Memory is measured honestly: a sampler thread sums the RSS of the analysing process and all its
descendants every 20 ms, and the peak of that sum less the tree's RSS before reading is the
analysis's peak. For the pool that counts the worker processes it spawns (about 27 MiB each for
the interpreter and imports alone); for Dask, the client, the scheduler (in the client's process
with a LocalCluster) and every nanny and worker process, less their RSS once started and warm.
RSS counts pages shared between processes once per process, so the sum is an upper bound. Every
run's report must equal the serial one exactly (a SHA-256 over each rank's figures, the waits, the
notes and the stragglers), and the straggler found must be the slowed rank. The size of one
rank's summary is also measured apart (tracemalloc of it unpickled: what the combining process
keeps per rank), the independent figure the per-rank growth should match.

``--scaling 4,8,16,32`` measures the peak of every mode at each rank count instead (the first N
ranks of one set of traces) and prints the growth per rank added (least squares) and the peak it
predicts at ``--predict`` ranks (64).

Run: ``python benchmarks/distributed_analysis.py`` (the full size; ``--ranks 8 --events 100000``
for a short run; ``--keep DIR`` to keep the traces and ``--traces DIR`` to reuse them; ``--no-dask``).
The per-rank growth in minutes: ``python benchmarks/distributed_analysis.py --scaling 4,8,16,32
--events 250000``.

Cost at the full size: the traces are 64 x 132 MiB = 8.3 GiB of JSON in the temp dir. Reading
is the slow part, not generating: a 10^6-event rank takes about 10 s of CPU to read and reduce,
generating it 0.9 s of CPU (plus the disk write). The runs read 64 ranks three times (workers=1,
workers=N, Dask) plus the largest twice, so on a quiet 2-core machine expect about 2 min to
generate and 10.5 + 5.5 + 5.5 min to analyse: some 25 min in all.

Measured (2 cores shared with other work, load average 3.5-7.4), ``--scaling 4,8,16,32 --events
250000``: one rank in memory 75 MiB (the unit); one rank streamed 17 MiB (0.22x); one rank's
summary 584 KiB (5,813 steps); peaks at 4 / 8 / 16 / 32 ranks: workers=1 22 / 26 / 29 / 41 MiB,
workers=2 92 / 98 / 101 / 108 MiB, Dask 40 / 40 / 50 / 62 MiB; growth per rank added 0.65 / 0.50 /
0.84 MiB (the summary's 0.57 MiB); predicted at 64 ranks 0.82x / 1.66x / 1.19x the unit (workers=2
carries its two interpreters, 0.7x of this small unit); reports equal in every mode. At the full
size (one run, load 3.5-6.8): unit 300 MiB; one rank streamed 62 MiB (0.21x); one summary
2.3 MiB; workers=1 220 MiB (0.73x) in 1,346 s, workers=2 315 MiB (1.05x) in 901 s, Dask 300 MiB
(1.00x) in 521 s; reports equal; straggler found. Those wall times do not compare (workers=1 ran
at nice 10 throughout, workers=2 for its first 6.5 min, Dask not at all).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PER_STEP = 8 * 5 + 3  # events per step, see generate()
SEED = 17


def generate(path: Path, rank: int, world: int, n_events: int, slow: bool, seed: int = SEED) -> int:
    """Write one rank's trace as a stream (never the whole event list in memory); its event count."""
    rng = random.Random(seed * 100_003 + rank)
    ts = 1_700_000_000_000_000  # µs
    corr = 0
    n_steps = max(1, n_events // PER_STEP)
    n = 0
    with open(path, "w") as fh:
        fh.write('{"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": %d, "world_size": %d}, '
                 '"deviceProperties": [{"id": 0, "name": "Synthetic GPU"}], "traceEvents": [\n' % (rank, world))
        first = True
        for step in range(n_steps):
            start = ts
            t = ts
            lines = []
            for _ in range(8):
                corr += 1
                d = round(rng.uniform(900, 1100) * (1.3 if slow else 1.0), 3)
                lines.append('{"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 1, "tid": 1, '
                             f'"ts": {t:.3f}, "dur": {d:.3f}}}')
                lines.append('{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, '
                             f'"ts": {t + 1:.3f}, "dur": 5, "args": {{"correlation": {corr}}}}}')
                lines.append('{"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_tn", "pid": 0, "tid": 7, '
                             f'"ts": {t + 8:.3f}, "dur": {d:.3f}, "args": {{"correlation": {corr}, "device": 0, '
                             '"stream": 7}}')
                lines.append(f'{{"ph": "s", "id": {corr}, "pid": 1, "tid": 1, "ts": {t + 1:.3f}, "cat": "ac2g", '
                             '"name": "ac2g"}')
                lines.append(f'{{"ph": "f", "id": {corr}, "pid": 0, "tid": 7, "ts": {t + 8:.3f}, "cat": "ac2g", '
                             '"name": "ac2g", "bp": "e"}')
                t += d + 10
            lines.append('{"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, '
                         f'"tid": 7, "ts": {t:.3f}, "dur": 20, "args": {{"device": 0, "stream": 7, "bytes": 1048576}}}}')
            # Every rank leaves the all-reduce together, when the slowest rank's compute is done.
            slowest_end = start + 8 * (1100 * 1.3 + 10) + 40
            ar = max(30.0, slowest_end - (t + 20)) + 30
            lines.append('{"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": 0, '
                         f'"tid": 8, "ts": {t + 20:.3f}, "dur": {ar:.3f}, "args": {{"device": 0, "stream": 8}}}}')
            end = max(slowest_end + 30, t + 100)
            lines.append(f'{{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{step}", "pid": 1, "tid": 1, '
                         f'"ts": {start:.3f}, "dur": {end - start:.3f}}}')
            fh.write(("" if first else ",\n") + ",\n".join(lines))
            first = False
            n += len(lines)
            ts = int(end) + 10
        fh.write("\n]}\n")
    return n


def _gen(args: tuple[str, int, int, int, bool]) -> tuple[int, int]:
    path, rank, world, n_events, slow = args
    n = generate(Path(path), rank, world, n_events, slow)
    return n, os.path.getsize(path)


# Runs in a fresh interpreter: one measurement, printed as one JSON line.
_CHILD = r"""
import json, os, sys, threading, time, warnings
sys.path.insert(0, sys.argv[1])
import psutil
warnings.simplefilter("ignore")
from omniprof.analysis import crossrank
mode, path, n = sys.argv[2], sys.argv[3], int(sys.argv[4])
me = psutil.Process()

def tree_rss():
    total = 0
    for p in [me, *me.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total

peak = [0]
stop = threading.Event()
def sample():
    while not stop.is_set():
        peak[0] = max(peak[0], tree_rss())
        stop.wait(0.02)

extra = {}
cluster = client = None
if mode == "dask":
    from distributed import Client, LocalCluster
    t0 = time.perf_counter()
    cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, host="127.0.0.1",
                           dashboard_address=None)
    client = Client(cluster)
    client.run(lambda: __import__("omniprof.analysis.crossrank"))  # imports done before timing, as a warm pool
    extra["start_s"] = time.perf_counter() - t0
before = tree_rss()
peak[0] = before
th = threading.Thread(target=sample, daemon=True)
th.start()
t0 = time.perf_counter()
if mode == "memory":
    from omniprof.formats.kineto import read_trace
    res = read_trace(path)
    wall = time.perf_counter() - t0
    extra["resident_bytes"] = me.memory_info().rss - before
    extra["spans"] = sum(len(p.spans) for p in res.parts)
    out = None
elif mode == "stream":
    s = crossrank.reduce_file(path, "kineto", None)
    wall = time.perf_counter() - t0
    out = None
    import pickle, tracemalloc
    blob = pickle.dumps(s)
    tracemalloc.start()
    s2 = pickle.loads(blob)  # what one rank's summary holds in the combining process
    extra["summary_bytes"] = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    extra["summary_pickled_bytes"] = len(blob)
    extra["steps"], extra["collectives"] = len(s.steps), len(s.collectives)
elif mode == "dask":
    rep = crossrank.analyze(path, executor=cluster.scheduler_address)
    wall = time.perf_counter() - t0
    out = rep
else:
    rep = crossrank.analyze(path, workers=n)
    wall = time.perf_counter() - t0
    out = rep
stop.set(); th.join()
if out is not None:
    import array, hashlib, attrs
    def plain(o):
        return list(o) if isinstance(o, array.array) else str(o)
    h = hashlib.sha256()  # every figure of every rank, the waits and the notes, one rank at a time
    for r in out.ranks:
        h.update(json.dumps(attrs.asdict(r), sort_keys=True, default=plain).encode())
    h.update(json.dumps(sorted(map(list, out.wait_ns.items()))).encode())
    h.update(json.dumps([list(out.notes), [attrs.asdict(s) for s in out.stragglers]], sort_keys=True,
                        default=plain).encode())
    extra["report"] = h.hexdigest()
    extra["stragglers"] = [s.rank for s in out.stragglers]
    extra["breakdown"] = out.breakdown_rows()[:2]
if client is not None:
    client.close(); cluster.close()
print(json.dumps({"wall_s": wall, "peak_bytes": peak[0] - before, **extra}))
"""


def _measure(mode: str, path: Path, n: int = 1) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, str(ROOT), mode, str(path), str(n)], capture_output=True,
                         text=True)
    if out.returncode:
        raise SystemExit(f"{mode} run failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _load() -> str:
    a, b, c = os.getloadavg()
    return f"load {a:.2f} {b:.2f} {c:.2f}"


def _slope(xs: list[int], ys: list[float]) -> tuple[float, float]:
    """Least-squares line ``y = a + b x``: ``(a, b)``."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - b * mx, b


def _subset(d: Path, files: list[Path], n: int, into: Path) -> Path:
    """A directory holding the first ``n`` ranks' traces (symlinks)."""
    sub = into / f"ranks{n}"
    sub.mkdir(exist_ok=True)
    for f in files[:n]:
        link = sub / f.name
        if not link.exists():
            link.symlink_to(f.resolve())
    return sub


def scaling(ns: argparse.Namespace, d: Path, files: list[Path], unit: int, counts: list[int | None]) -> bool:
    """Peak memory at several rank counts, per mode; the per-rank slope and what it predicts."""
    sizes = sorted({min(int(x), len(files)) for x in ns.scaling.split(",")})
    modes = [("workers=1", "workers", 1), (f"workers={ns.workers}", "workers", ns.workers)]
    if not ns.no_dask:
        modes.append((f"Dask {ns.workers} workers", "dask", ns.workers))
    work = Path(tempfile.mkdtemp(prefix="omniprof-xrank-sub-"))
    peaks: dict[str, list[float]] = {m[0]: [] for m in modes}
    same = True
    try:
        print(f"{'ranks':>5} " + " ".join(f"{m[0] + ' MiB':>18} {'x unit':>6}" for m in modes) + "  wall s (per mode)  load")
        for n in sizes:
            sub = _subset(d, files, n, work)
            got = [_measure(kind, sub, w) for _, kind, w in modes]
            same &= all(g["report"] == got[0]["report"] for g in got)
            for (name, _, _), g in zip(modes, got):
                peaks[name].append(g["peak_bytes"] / 2**20)
            print(f"{n:>5} " + " ".join(f"{g['peak_bytes'] / 2**20:>18.0f} {g['peak_bytes'] / unit:>6.2f}" for g in got)
                  + "  " + " / ".join(f"{g['wall_s']:.1f}" for g in got) + f"  {_load()}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"per rank added (least squares over {sizes}), and the peak it predicts at {ns.predict} ranks of this size:")
    for name, ys in peaks.items():
        a, b = _slope(sizes, ys)
        pred = a + b * ns.predict
        print(f"  {name:<18} {b:+7.2f} MiB/rank; at {ns.predict} ranks {pred:7.0f} MiB = {pred * 2**20 / unit:.2f}x unit")
    print(f"reports equal across modes at every size: {same}")
    return same


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--events", type=int, default=1_000_000, help="events per rank (default 10^6)")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1), help="workers to compare with 1")
    ap.add_argument("--slow-rank", type=int, default=3)
    ap.add_argument("--traces", type=Path, help="reuse traces generated before (with --keep) instead of generating")
    ap.add_argument("--keep", type=Path, help="generate into this directory and keep it")
    ap.add_argument("--no-dask", action="store_true", help="skip the Dask executor run")
    ap.add_argument("--scaling", help="comma-separated rank counts (e.g. 4,8,16,32): peak memory at each, per mode, "
                                      "and the growth per rank added, instead of the one full comparison")
    ap.add_argument("--predict", type=int, default=64, help="with --scaling: the rank count to predict the peak at")
    ns = ap.parse_args(argv)
    if ns.scaling:
        ns.ranks = max(int(x) for x in ns.scaling.split(","))
    ns.slow_rank = min(ns.slow_rank, ns.ranks - 1)
    print(f"{_load()} before; {os.cpu_count()} cores")
    tmp = None
    if ns.traces:
        d = ns.traces
        files = sorted(d.glob("rank*.pt.trace.json"), key=lambda p: int(p.name[4:].split(".")[0]))
        sizes = [f.stat().st_size for f in files]
        counts: list[int | None] = [None] * len(files)
        print(f"reusing {len(files)} traces in {d}")
    else:
        d = ns.keep or Path(tempfile.mkdtemp(prefix="omniprof-xrank-"))
        tmp = None if ns.keep else d
        d.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        jobs = [(str(d / f"rank{r}.pt.trace.json"), r, ns.ranks, ns.events, r == ns.slow_rank) for r in range(ns.ranks)]
        with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as ex:
            got = list(ex.map(_gen, jobs))
        counts, sizes = [g[0] for g in got], [g[1] for g in got]
        files = [Path(j[0]) for j in jobs]
        print(f"generated {ns.ranks} ranks x {counts[0]:,} events ({sum(sizes) / 2**30:.2f} GiB JSON, "
              f"{max(sizes) / 2**20:.0f} MiB per rank) in {time.perf_counter() - t0:.1f} s ({os.cpu_count()} processes)")
    try:
        largest = files[max(range(len(files)), key=lambda i: sizes[i])]
        mem = _measure("memory", largest)
        unit = mem["resident_bytes"]
        stream = _measure("stream", largest)
        print(f"largest rank in memory (read_trace, {mem['spans']:,} spans): {unit / 2**20:.0f} MiB resident "
              f"(the unit of the target); reduced and streamed: peak {stream['peak_bytes'] / 2**20:.0f} MiB "
              f"({stream['peak_bytes'] / unit:.2f}x)")
        print(f"one rank's summary ({stream['steps']:,} steps, {stream['collectives']:,} collectives): "
              f"{stream['summary_bytes'] / 2**10:,.0f} KiB in memory (tracemalloc of the unpickled summary), "
              f"{stream['summary_pickled_bytes'] / 2**10:,.0f} KiB pickled; x {ns.predict} ranks = "
              f"{ns.predict * stream['summary_bytes'] / 2**20:.0f} MiB")
        if ns.scaling:
            ok = scaling(ns, d, files, unit, counts)
            print(f"{_load()} after")
            return 0 if ok else 1
        rows = [("one rank: read_trace (in memory)", mem), ("one rank: reduce_file (streamed)", stream)]
        serial = _measure("workers", d, 1)
        rows.append(("analyze workers=1", serial))
        par = _measure("workers", d, ns.workers)
        rows.append((f"analyze workers={ns.workers}", par))
        dk = None
        if not ns.no_dask:
            dk = _measure("dask", d, ns.workers)
            rows.append((f"analyze Dask LocalCluster {ns.workers} workers", dk))
        print(f"{'run':<42} {'wall s':>8} {'peak MiB':>9} {'x unit':>7}")
        for name, x in rows:
            print(f"{name:<42} {x['wall_s']:>8.2f} {x['peak_bytes'] / 2**20:>9.0f} {x['peak_bytes'] / unit:>7.2f}")
        if dk is not None:
            print(f"(Dask cluster start, not in its wall: {dk['start_s']:.1f} s; its peak sums the client, the "
                  f"in-process scheduler, every nanny and worker process, less their RSS before reading)")
        print(f"speedup {ns.workers} workers vs 1: {serial['wall_s'] / par['wall_s']:.2f}x; "
              f"{ns.ranks * (counts[0] or 0) / par['wall_s'] / 1e6:.2f} M events/s with {ns.workers}")
        same = [par["report"] == serial["report"]] + ([dk["report"] == serial["report"]] if dk else [])
        print(f"reports equal to workers=1 exactly: workers={ns.workers} {same[0]}"
              + (f", Dask {same[1]}" if dk else ""))
        target = 2 * unit
        worst = max(x["peak_bytes"] for name, x in rows[2:])
        print(f"peak memory target <= 2x unit ({target / 2**20:.0f} MiB): worst analysis peak {worst / 2**20:.0f} MiB "
              f"-> {'met' if worst <= target else 'NOT met'}")
        print(f"stragglers found: {serial['stragglers']} (slowed: [{ns.slow_rank}])")
        b = serial["breakdown"][0]
        print(f"rank 0: compute {b['compute_pct']:.2f}% comm {b['exposed_communication_pct']:.2f}% "
              f"mem {b['exposed_memory_pct']:.2f}% idle {b['idle_pct']:.2f}%")
        print(f"{_load()} after")
        # With 2 ranks the median is their midpoint, so the slowed rank exceeds it by half the gap only.
        ok = all(same) and (serial["stragglers"] == [ns.slow_rank] if ns.ranks > 2 else True)
        return 0 if ok else 1
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
