"""Overhead of the ``cupti`` backend, measured side by side in one run.

On a machine with an NVIDIA GPU and a CUDA build of torch, times one GPU-bound loop (matmuls)
    * unprofiled,
    * with NVML sampling only at 10 ms (``device_tracer_level=0``) -- target: <= 1% slower,
    * with NVML + CUPTI activity (kernels, memcpy, runtime calls),
    * under ``torch.profiler`` with CPU and CUDA activities (Kineto, also CUPTI),
and prints each median time and its ratio to unprofiled. Without a GPU it says
"no GPU: skipped" with the probe's reason.

Everywhere, it also measures the offline half of the backend: turning CUPTI records into the
result (event caps, timeline, kernel statistics), replaying the real A100 AlexNet trace through
the fakes, in ns per record.

Usage: python benchmarks/gpu_overhead.py [--repeats 7] [--iters 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path


def offline(repeats: int) -> None:
    from omniprof.backends.cupti.activity import ActivityCollector, build_timeline
    from omniprof.formats.kernels import kernel_stats
    from omniprof.testing.gpu_fakes import records_from_kineto

    root = Path(__file__).resolve().parents[1]
    trace = next((p for p in (root / ".." / "shared" / "data" / "kineto" / "alexnet_cuda_trace.json.gz",
                              root / ".." / ".." / "shared" / "data" / "kineto" / "alexnet_cuda_trace.json.gz")
                  if p.exists()), None)
    if trace is None:
        print("offline: AlexNet trace not found: skipped")
        return
    base = records_from_kineto(trace)
    records = [dict(r, correlation_id=r.get("correlation_id", 0) + 1_000_000 * k) if r["kind"] != "device" else r
               for k in range(40) for r in base]
    n = len(records)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        c = ActivityCollector(max_activity_events=1 << 30, max_api_events=1 << 30, max_annotation_strings=1 << 20)
        for i in range(0, n, 512):
            c.add(records[i:i + 512])
        _, spans, *_ = build_timeline(c, lambda t: t, end_ns=0)
        kernel_stats(spans)
        times.append(time.perf_counter_ns() - t0)
    med = statistics.median(times)
    print(f"offline: {n} CUPTI records -> result + kernel stats: median {med / 1e6:.1f} ms "
          f"= {med / n:.0f} ns/record ({repeats} repeats)")


def gpu(repeats: int, iters: int) -> None:
    import omniprof
    from omniprof import BackendUnavailableError, ProfileOptions
    from omniprof.backends.cupti import CuptiBackend

    try:
        CuptiBackend.probe()
    except BackendUnavailableError as e:
        print(f"no GPU: skipped ({e.reason})")
        return
    try:
        import torch
    except ImportError:
        print("no GPU workload: skipped (torch is not installed)")
        return
    if not torch.cuda.is_available():
        print("no GPU workload: skipped (this torch is not a CUDA build)")
        return

    a = torch.randn(4096, 4096, device="cuda")

    def loop() -> None:
        x = a
        for _ in range(iters):
            x = (x @ a).clamp_(-1, 1)
        torch.cuda.synchronize()

    def plain() -> None:
        loop()

    def nvml_only() -> None:
        with omniprof.Profiler(backend="cupti", options=ProfileOptions(device_tracer_level=0),
                               backend_options={"cupti": {"nvml_interval_s": 0.01}}):
            loop()

    def cupti_full() -> None:
        with omniprof.Profiler(backend="cupti", backend_options={"cupti": {"nvml_interval_s": 0.01}}):
            loop()

    def torch_profiler() -> None:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
            loop()

    loop()  # warm up kernels and allocator
    cases = {"unprofiled": plain, "cupti NVML only @10ms": nvml_only, "cupti NVML+CUPTI": cupti_full,
             "torch.profiler CPU+CUDA": torch_profiler}
    times: dict[str, list[float]] = {k: [] for k in cases}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(repeats):  # interleaved, so drift hits every case alike
            for name, fn in cases.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    base = statistics.median(times["unprofiled"])
    print(f"GPU: {torch.cuda.get_device_name(0)}, {iters} matmuls 4096^2 per run, {repeats} runs each, medians:")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:28s} {med * 1e3:9.2f} ms   x{med / base:.4f}   ({(med / base - 1) * 100:+.2f}%)")
    nv = statistics.median(times["cupti NVML only @10ms"]) / base - 1
    print(f"NVML @10ms overhead: {nv * 100:+.2f}% (target <= 1%: {'met' if nv <= 0.01 else 'NOT met'})")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--iters", type=int, default=200)
    ns = p.parse_args(argv)
    offline(ns.repeats)
    gpu(ns.repeats, ns.iters)
    return 0


if __name__ == "__main__":
    sys.exit(main())
