"""The ``torch`` backend vs plain ``torch.profiler.profile`` on the same CPU training loop.

Both record CPU activity at the same detail (omniprof's default host_tracer_level=2 is torch's
default: ops, no shapes). Runs alternate (plain, omniprof, plain, ...) so machine load hits both
alike; the medians are compared.

* ``loop``: CPU time (``time.process_time``) of the profiled loop itself, what the profiler costs
  the workload; CPU time rather than wall time because this machine is shared and wall time
  swings with other processes' load (wall medians are printed too). torch runs on one thread
  (``torch.set_num_threads(1)``) so CPU time is the loop's own work. Target: omniprof / plain <= 1.02.
* ``collect``: stopping and turning the recording into data. Plain: ``stop()`` plus
  ``export_chrome_trace`` to a temporary file; omniprof: ``stop()``, which saves the Kineto JSON and
  builds the ProfileResult with op and kernel tables.
* ``unprofiled``: the loop without any profiler, for scale.

Run: ``python benchmarks/torch_overhead.py [--iters 150] [--repeats 41]``
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time
import warnings

import torch
from torch.profiler import ProfilerActivity, profile

import omniprof


def make():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))

    def loop(iters: int) -> None:
        for _ in range(iters):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()

    return loop


def timed(loop, iters: int) -> tuple[float, float]:
    gc.collect()  # the previous run's garbage must not be collected on this run's time
    w0, c0 = time.perf_counter(), time.process_time()
    loop(iters)
    return time.process_time() - c0, time.perf_counter() - w0


def run_plain(loop, iters: int) -> tuple[float, float, float]:
    prof = profile(activities=[ProfilerActivity.CPU])
    prof.start()
    cpu, wall = timed(loop, iters)
    t1 = time.perf_counter()
    prof.stop()
    fd, path = tempfile.mkstemp(suffix=".pt.trace.json")
    os.close(fd)
    prof.export_chrome_trace(path)
    t2 = time.perf_counter()
    os.unlink(path)
    return cpu, wall, t2 - t1


def run_omniprof(loop, iters: int) -> tuple[float, float, float]:
    prof = omniprof.Profiler(backend="torch", options=omniprof.ProfileOptions(device_tracer_level=0))
    prof.start()
    cpu, wall = timed(loop, iters)
    t1 = time.perf_counter()
    prof.stop()
    t2 = time.perf_counter()
    return cpu, wall, t2 - t1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=150)
    ap.add_argument("--repeats", type=int, default=41)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    loop = make()
    loop(20)  # warm up allocator and kernels
    bare, plain, ours = [], [], []
    for i in range(args.repeats):
        order = (("plain", run_plain), ("omniprof", run_omniprof))
        for name, fn in order if i % 2 == 0 else order[::-1]:
            (plain if name == "plain" else ours).append(fn(loop, args.iters))
        bare.append(timed(loop, args.iters))
    med = statistics.median
    bc, bw = med(b[0] for b in bare), med(b[1] for b in bare)
    pl, pw, pc = (med(p[i] for p in plain) for i in range(3))
    ol, ow, oc = (med(o[i] for o in ours) for i in range(3))
    print(f"torch {torch.__version__}, 1 thread, {args.iters} iterations x {args.repeats} alternating repeats (medians)")
    print(f"{'':12} {'loop_cpu_s':>10} {'loop_wall_s':>11} {'collect_s':>10} {'cpu/unprofiled':>15}")
    print(f"{'unprofiled':12} {bc:10.3f} {bw:11.3f} {'-':>10} {1.0:15.2f}")
    print(f"{'plain torch':12} {pl:10.3f} {pw:11.3f} {pc:10.3f} {pl / bc:15.2f}")
    print(f"{'omniprof':12} {ol:10.3f} {ow:11.3f} {oc:10.3f} {ol / bc:15.2f}")
    # Paired: each repeat ran both back to back, so its ratio sees the same machine load.
    ratio = med(o[0] / p[0] for o, p in zip(ours, plain))
    print(f"loop CPU-time ratio omniprof / plain torch.profiler (median of paired ratios) = {ratio:.3f} "
          f"(target <= 1.02): {'OK' if ratio <= 1.02 else 'MISSED'}; ratio of medians {ol / pl:.3f}; "
          f"wall-time ratio {med(o[1] / p[1] for o, p in zip(ours, plain)):.3f}")
    print(f"collect ratio omniprof / plain (stop+export) = {oc / pc:.2f}")


if __name__ == "__main__":
    main()
