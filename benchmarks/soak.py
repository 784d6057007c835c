"""Soak: a long profiled run with bounded memory.

Runs a mixed workload (allocation churn, recursion, 4 worker threads, annotations) under the cpu
sampler for ``--duration-s`` seconds (default 600), with a logdir so checkpoints are written, and
prints RSS over time. Two phases share the run: the default buffer (memory grows by a fixed cost
per sample until the buffer is full) and, with ``--max-samples``, a small buffer (memory flat once
full). The figures to quote: peak RSS, RSS growth per 1,000 samples, growth after the buffer is
full, checkpoints written and their longest time.

    python benchmarks/soak.py                      # 10 minutes, default buffer
    python benchmarks/soak.py --duration-s 60 --max-samples 20000
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import tempfile
import threading
import time
import warnings


_NULL = contextlib.nullcontext()


def rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def recurse(n: int) -> int:
    return sum(range(300)) if n == 0 else recurse(n - 1) + 1


def worker(stop: threading.Event) -> None:
    while not stop.is_set():
        junk = [bytes(200) for _ in range(100)]
        recurse(len(junk) % 30)
        time.sleep(0.001)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration-s", type=float, default=600.0)
    ap.add_argument("--max-samples", type=int, default=None, help="cpu sample buffer (default: the backend's)")
    ap.add_argument("--every-s", type=float, default=30.0, help="print RSS this often")
    ap.add_argument("--annotate-every", type=int, default=100,
                    help="wrap one iteration in N in omniprof.annotate (1: every iteration, ~10^4/s)")
    args = ap.parse_args()

    import omniprof

    warnings.simplefilter("ignore", omniprof.errors.DataLossWarning)  # the loss is read from the result
    backend_options = {"cpu": {"max_samples": args.max_samples}} if args.max_samples else {}
    logdir = tempfile.mkdtemp(prefix="omniprof-soak-")
    gc.collect()
    rss0 = rss_mib()
    stop = threading.Event()
    threads = [threading.Thread(target=worker, args=(stop,), name=f"soak-{i}") for i in range(4)]
    print(f"soak: {args.duration_s:.0f} s, buffer {args.max_samples or 'default'}, logdir {logdir}")
    print(f"{'t_s':>6} {'rss_mib':>8} {'samples':>9}")
    print(f"{0:6.0f} {rss0:8.1f} {0:9d}")
    rows = []
    prof = omniprof.Profiler(backend="cpu", backend_options=backend_options, logdir=logdir)
    t_start = time.perf_counter()
    with prof:
        for t in threads:
            t.start()
        next_mark = t_start + args.every_s
        i = 0
        while time.perf_counter() - t_start < args.duration_s:
            with omniprof.annotate("churn") if i % args.annotate_every == 0 else _NULL:
                junk = [bytearray(500) for _ in range(200)]
                del junk
                recurse(i % 40)
            i += 1
            now = time.perf_counter()
            if now >= next_mark:
                backend = prof._backends.get("cpu")
                n = len(backend.sampler) if backend is not None and backend.sampler is not None else -1
                rss = rss_mib()
                rows.append((now - t_start, rss, n))
                print(f"{now - t_start:6.0f} {rss:8.1f} {n:9d}", flush=True)
                next_mark += args.every_s
        stop.set()
        for t in threads:
            t.join()
    result = prof.result
    part = result.part("cpu")
    lost = sum(x.count for x in result.losses)
    peak = max([r[1] for r in rows] + [rss_mib()])
    samples = len(part.samples)
    print(f"samples kept {samples}, not taken {lost}, peak RSS {peak:.1f} MiB (start {rss0:.1f} MiB)")
    if samples:
        grow = (rows[-1][1] - rss0) / max(rows[-1][2], 1) * 1000 if rows else float("nan")
        print(f"RSS growth per 1,000 samples while recording: {grow * 1024:.1f} KiB")
    full = [r for r in rows if args.max_samples and r[2] >= args.max_samples]
    if len(full) >= 2:
        print(f"RSS growth after the buffer was full ({full[0][0]:.0f} s .. {full[-1][0]:.0f} s): "
              f"{full[-1][1] - full[0][1]:+.2f} MiB")
    print(f"annotation spans {sum(1 for s in part.spans if s.category == 'annotation')}")
    print(f"checkpoints {prof.checkpoints}, longest {prof.checkpoint_max_ns / 1e6:.1f} ms")


if __name__ == "__main__":
    main()
