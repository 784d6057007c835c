"""Reporter speed and size on a large synthetic result, side by side in one run.

    python benchmarks/reporters.py [--samples 200000] [--spans 50000]

Prints, for each reporter, the time to write the file and its size, and the ratio of its time to
the json reporter's (the baseline: a plain dump of the same data).
"""

from __future__ import annotations

import argparse
import io
import os
import random
import time

from omniprof.core.reporting import make_reporter
from omniprof.core.results import (
    Allocation,
    BackendResult,
    Frame,
    ProfileResult,
    RunMetadata,
    Span,
    StackSample,
    ThreadInfo,
    Track,
)


def make(samples: int, spans: int, seed: int = 1) -> ProfileResult:
    rnd = random.Random(seed)
    frames = tuple(Frame(f"func_{i}", f"/src/mod_{i % 40}.py", 10 + i) for i in range(400))
    stacks = tuple(tuple(rnd.randrange(400) for _ in range(rnd.randint(5, 60))) for _ in range(3000))
    ss = tuple(StackSample(i * 1_000_000, 1 + i % 4, rnd.randrange(3000), 1_000_000) for i in range(samples))
    sp = []
    t = 0
    for i in range(spans):  # nested pairs plus some imperfect overlaps
        sp.append(Span(f"op_{i % 300}", f"track:{i % 8}", t, 5000))
        sp.append(Span(f"inner_{i % 50}", f"track:{i % 8}", t + 1000, 2000 if i % 97 else 6000))
        t += 6000
    allocs = tuple(Allocation(i, 64 + i % 4096, rnd.randrange(3000), 1 + i % 4, alive_at_end=i % 3 == 0)
                   for i in range(samples // 4))
    part = BackendResult(backend="synthetic", frames=frames, stacks=stacks, samples=ss, spans=tuple(sp),
                         allocations=allocs, threads=tuple(ThreadInfo(i, f"T{i}") for i in range(1, 5)),
                         tracks=tuple(Track(f"track:{i}", f"stream {i}") for i in range(8)))
    md = RunMetadata(backends=("synthetic",), start_ns=0, end_ns=samples * 1_000_000)
    return ProfileResult(metadata=md, parts=(part,))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=200_000)
    ap.add_argument("--spans", type=int, default=50_000)
    ns = ap.parse_args()
    result = make(ns.samples, ns.spans)
    print(f"load average {os.getloadavg()[0]:.2f}; result: {ns.samples} samples (3000 stacks, depth 5-60), {2 * ns.spans} spans, "
          f"{ns.samples // 4} allocations")
    cases = [("json", {}), ("pprof", {"source": "samples"}), ("pprof", {"source": "spans"}),
             ("pprof", {"source": "allocations"}), ("speedscope", {}), ("collapsed", {"source": "samples"}),
             ("table", {"color": "never"}), ("perfetto", {}), ("chrome", {"compress": False})]
    base = None
    print(f"{'reporter':<28} {'seconds':>8} {'MB':>8} {'x json':>7}")
    for name, opts in cases:
        rep = make_reporter(name, opts)
        buf = io.StringIO() if rep.output == "stream" else io.BytesIO()
        t0 = time.perf_counter()
        rep.report(result, buf)
        dt = time.perf_counter() - t0
        size = len(buf.getvalue()) / 1e6
        base = base or dt
        label = name + (f" {opts.get('source', '')}" if "source" in opts else "")
        print(f"{label:<28} {dt:8.2f} {size:8.2f} {dt / base:7.2f}")


if __name__ == "__main__":
    main()
