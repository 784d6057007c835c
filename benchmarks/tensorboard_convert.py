"""How fast the tensorboard reporter converts a large result, beside the json reporter on the same one.

    python benchmarks/tensorboard_convert.py [--spans 200000] [--samples 100000] [--repeat 3]

Prints the median time and output size of: timeline build (plain data), XSpace build + serialise,
the whole write_logdir, and result.to_json() for comparison, with ratios. No assertions: figures only.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time

from omniprof.core.results import (
    BackendResult,
    CounterSeries,
    Flow,
    Frame,
    ProfileResult,
    RunMetadata,
    Span,
    StackSample,
    ThreadInfo,
    Track,
)
from omniprof.reporters.tensorboard import build_timeline, to_xspace, write_logdir


def big_result(n_spans: int, n_samples: int, seed: int = 0) -> ProfileResult:
    rng = random.Random(seed)
    threads = 8
    tracks = [Track(f"thread:{t}", f"worker-{t}", "thread", tid=1000 + t) for t in range(threads)]
    tracks += [Track(f"device:0:stream:{s}", f"stream {s}", "stream", device=0) for s in (7, 13)]
    spans = []
    t = [0] * threads
    for i in range(n_spans):
        th = i % threads
        dur = rng.randint(1_000, 50_000)
        flow = (i,) if i % 10 == 0 else ()
        spans.append(Span(f"op_{i % 300}", f"thread:{th}", t[th], dur, "cpu_op", {"seq": i}, flow))
        if flow:
            spans.append(Span(f"kernel_{i % 50}", f"device:0:stream:{7 if i % 20 else 13}", t[th] + dur, dur // 2,
                              "kernel", {"grid": [64, 1, 1], "block": [128, 1, 1]}, flow))
        t[th] += dur + rng.randint(0, 2_000)
    frames = [Frame(f"fn_{i}", "mod.py", i) for i in range(200)]
    # 500 stacks of depth 20 grown as a tree (shared prefixes, like real call stacks); each thread
    # keeps its stack for the next sample 80% of the time (a hot loop), else jumps to another.
    stacks = [tuple(range(10)) + tuple(rng.sample(range(10, 200), 10)) for _ in range(500)]
    samples, current = [], [0] * threads
    for i in range(n_samples):
        th = i % threads
        if rng.random() > 0.8:
            current[th] = rng.randrange(500)
        samples.append(StackSample(1_000_000 * (i // threads + 1), th, current[th], 1_000_000))
    counters = [CounterSeries(f"c{k}", "W", "device:0:stream:7", range(0, 10_000_000_000, 1_000_000),
                              [float(x % 300) for x in range(10_000)]) for k in range(4)]
    part = BackendResult("bench", tracks=tracks, spans=spans, frames=frames, stacks=stacks,
                         threads=[ThreadInfo(t, f"worker-{t}") for t in range(threads)], samples=samples,
                         counters=counters, flows=[Flow(i) for i in range(0, n_spans, 10)],
                         end_ns=max(t) if t else 0)
    return ProfileResult(metadata=RunMetadata(host="bench", start_unix_ns=1_700_000_000_000_000_000), parts=(part,))


def timed(fn, repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spans", type=int, default=200_000)
    ap.add_argument("--samples", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    result = big_result(args.spans, args.samples)
    n_events = sum(len(p.spans) for p in result.parts)
    print(f"result: {n_events} spans, {args.samples} samples (depth 20, shared prefixes), 4 counters x 10000 values")
    t_tl, tl = timed(lambda: build_timeline(result), args.repeat)
    t_pb, data = timed(lambda: to_xspace(tl).SerializeToString(), args.repeat)
    with tempfile.TemporaryDirectory() as d:
        t_all, _ = timed(lambda: write_logdir(result, d), args.repeat)
    t_json, text = timed(result.to_json, args.repeat)
    rows = [("timeline (plain data)", t_tl, None), ("XSpace build + serialise", t_pb, len(data)),
            ("write_logdir (all)", t_all, len(data)), ("json reporter (to_json)", t_json, len(text.encode()))]
    for name, secs, size in rows:
        extra = f"{size / 1e6:8.1f} MB" if size else " " * 11
        print(f"{name:28s} {secs:7.2f} s {extra}   {secs / t_json:5.2f}x json")
    print(f"xplane / json size: {len(data) / len(text.encode()):.2f}; "
          f"write_logdir throughput: {n_events / t_all / 1e3:.0f}k spans/s")


if __name__ == "__main__":
    main()
