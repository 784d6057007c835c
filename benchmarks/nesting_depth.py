"""Perfetto and Chrome export time against nesting depth, to see how each grows.

    python benchmarks/nesting_depth.py [--depths 5000,10000,20000]

Two shapes of one thread's spans, each ``depth`` spans:
* nested: every span inside the previous one (a recursion ``depth`` calls deep);
* overlapping: every span starts inside the previous one and ends after it (no two nest), so
  each needs its own overflow lane.
Times are wall seconds of ``omniprof.report(result, reporter, BytesIO())``, best of 2; the
ratio column is time(depth) / time(first depth) (linear growth doubles per doubled depth).
"""

from __future__ import annotations

import argparse
import io
import time
import warnings

import omniprof
from omniprof.core.results import BackendResult, ProfileResult, Span, Track


def result(depth: int, shape: str) -> ProfileResult:
    if shape == "nested":
        spans = [Span(f"f{i % 7}", "t", i * 10, (2 * depth - 2 * i) * 10) for i in range(depth)]
    else:
        spans = [Span(f"f{i % 7}", "t", i * 10, depth * 10) for i in range(depth)]
    return ProfileResult(parts=(BackendResult(backend="cpu", tracks=[Track("t", "main")], spans=spans),))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--depths", default="5000,10000,20000")
    args = ap.parse_args()
    depths = [int(x) for x in args.depths.split(",")]
    warnings.simplefilter("ignore")
    print(f"{'shape':<12}{'reporter':<10}" + "".join(f"{d:>12}" for d in depths) + "   ratio")
    for shape in ("nested", "overlapping"):
        for rep in ("perfetto", "chrome"):
            times = []
            for d in depths:
                r = result(d, shape)
                best = float("inf")
                for _ in range(2):
                    t = time.perf_counter()
                    omniprof.report(r, rep, io.BytesIO())
                    best = min(best, time.perf_counter() - t)
                times.append(best)
            print(f"{shape:<12}{rep:<10}" + "".join(f"{t:>11.3f}s" for t in times) + "   "
                  + " : ".join(f"{t / times[0]:.1f}" for t in times))


if __name__ == "__main__":
    main()
