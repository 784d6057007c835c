"""How the flame-graph and XProf reporters grow with nesting and with threads.

    python benchmarks/reporter_growth.py [--spans 1000,10000,20000] [--threads 1000,5000,10000]
                                         [--repeat 1]

Two shapes, the ones the reliability audit of issue 31 found quadratic:

* nested: ``N`` identical spans on one track (same name, start and length), so each nests in the
  one before: a stack ``N`` deep. Written by pprof, collapsed and speedscope.
* threads: ``N`` threads (tracks) of one span each, written by the tensorboard reporter (one XLine
  per thread).

Each figure is the wall time of ``omniprof.report(result, reporter, path)``, the best of
``--repeat``; the ratio column is each time over the first size's time. Linear growth gives
ratios equal to the size ratios (x10, x20 here); quadratic gives their squares (x100, x400). The
load average is printed beside the figures: on a shared machine, read the ratios more than the
seconds.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings
from pathlib import Path

import omniprof
from omniprof.core.results import BackendResult, ProfileResult, RunMetadata, Span, Track


def nested(n: int) -> ProfileResult:
    spans = [Span("step", "t", 1_000, 1_000_000, category="annotation") for _ in range(n)]
    part = BackendResult(backend="cpu", tracks=[Track("t", "main")], spans=spans, start_ns=0, end_ns=2_000_000)
    return ProfileResult(metadata=RunMetadata(backends=("cpu",), start_ns=0, end_ns=2_000_000), parts=(part,))


def threads(n: int) -> ProfileResult:
    tracks = [Track(f"thread:{i}", f"worker {i}", tid=i) for i in range(n)]
    spans = [Span("work", f"thread:{i}", 1_000 + i, 5_000, category="annotation") for i in range(n)]
    part = BackendResult(backend="cpu", tracks=tracks, spans=spans, start_ns=0, end_ns=2_000_000)
    return ProfileResult(metadata=RunMetadata(backends=("cpu",), start_ns=0, end_ns=2_000_000,
                                              start_unix_ns=1_700_000_000_000_000_000), parts=(part,))


def timed(result: ProfileResult, reporter: str, out: Path, repeat: int) -> float:
    best = float("inf")
    for k in range(repeat):
        t0 = time.perf_counter()
        omniprof.report(result, reporter, out / f"{reporter}-{k}", overwrite=True)
        best = min(best, time.perf_counter() - t0)
    return best


def row(label: str, reporter: str, sizes: list[int], make, out: Path, repeat: int) -> None:
    times = [timed(make(n), reporter, out, repeat) for n in sizes]
    print(f"{label:<9}{reporter:<12}" + "".join(f"{t:>11.3f}s" for t in times) + "   "
          + " : ".join(f"x{t / times[0]:.1f}" for t in times) + f"   (load {os.getloadavg()[0]:.1f})", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spans", default="1000,10000,20000")
    ap.add_argument("--threads", default="1000,5000,10000")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    spans = [int(x) for x in args.spans.split(",")]
    nthreads = [int(x) for x in args.threads.split(",")]
    warnings.simplefilter("ignore")
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        print(f"{'shape':<9}{'reporter':<12}" + "".join(f"{n:>12}" for n in spans) + "   ratio")
        for reporter in ("pprof", "collapsed", "speedscope"):
            row("nested", reporter, spans, nested, out, args.repeat)
        print(f"{'shape':<9}{'reporter':<12}" + "".join(f"{n:>12}" for n in nthreads) + "   ratio")
        row("threads", "tensorboard", nthreads, threads, out, args.repeat)


if __name__ == "__main__":
    main()
