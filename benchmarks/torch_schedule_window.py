"""A schedule window that ends inside the training loop: omniprof vs plain ``torch.profiler``.

Both profile the same CPU training loop with the same schedule (``wait=5, warmup=2, active=10,
repeat=1`` over 40 iterations), so the recording window closes at iteration 17 and the loop goes
on for 23 more. Plain torch: ``profile(schedule=torch.profiler.schedule(...))`` with ``prof.step()``
and no ``on_trace_ready`` (torch stops its tracer at the window's end and keeps the events).
omniprof: ``Profiler(backend="torch", schedule=omniprof.schedule(...))`` with ``prof.step()``; the
step that ends the window only stops torch's tracer, the result is built at ``stop()``.

* ``loop``: CPU time (``time.process_time``) of the 40 iterations, step calls included: what the
  profiler costs the training loop. Target: omniprof / plain <= 1.05.
* ``window-end step``: wall time of the one ``step()`` call that ends the window.
* ``after``: ``stop()`` and, for plain torch, ``export_chrome_trace`` (for scale: the result
  building omniprof moved out of the loop).

Runs alternate (plain, omniprof, plain, ...; the order flips every repeat) so machine load hits both
alike; the paired ratio's median is reported. Run:
``python benchmarks/torch_schedule_window.py [--repeats 21]``
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
from torch.profiler import schedule as torch_schedule

import omniprof

WAIT, WARMUP, ACTIVE, ITERS = 5, 2, 10, 40


def make():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))

    def one() -> None:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()

    return one


def drive(one, step) -> tuple[float, float]:
    """The loop; returns (loop CPU seconds, wall seconds of the window-ending step)."""
    gc.collect()
    end_step = 0.0
    c0 = time.process_time()
    for i in range(ITERS):
        one()
        t = time.perf_counter()
        step()
        if i == WAIT + WARMUP + ACTIVE - 1:
            end_step = time.perf_counter() - t
    return time.process_time() - c0, end_step


def run_plain(one) -> tuple[float, float, float]:
    prof = profile(activities=[ProfilerActivity.CPU],
                   schedule=torch_schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1))
    prof.start()
    loop, end_step = drive(one, prof.step)
    t0 = time.perf_counter()
    prof.stop()
    fd, path = tempfile.mkstemp(suffix=".pt.trace.json")
    os.close(fd)
    prof.export_chrome_trace(path)
    os.unlink(path)
    return loop, end_step, time.perf_counter() - t0


def run_omniprof(one) -> tuple[float, float, float]:
    prof = omniprof.Profiler(backend="torch", options=omniprof.ProfileOptions(device_tracer_level=0),
                             schedule=omniprof.schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1))
    prof.start()
    loop, end_step = drive(one, prof.step)
    t0 = time.perf_counter()
    result = prof.stop()
    assert result is not None and result.part("torch").table("op_stats") is not None
    return loop, end_step, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=21)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    one = make()
    for _ in range(20):
        one()
    plain, ours = [], []
    load0 = os.getloadavg()[0]
    for i in range(args.repeats):
        order = (("plain", run_plain), ("omniprof", run_omniprof))
        for name, fn in order if i % 2 == 0 else order[::-1]:
            (plain if name == "plain" else ours).append(fn(one))
    load1 = os.getloadavg()[0]
    med = statistics.median
    print(f"torch {torch.__version__}, 1 thread, {ITERS} iterations, schedule wait={WAIT} warmup={WARMUP} "
          f"active={ACTIVE} repeat=1, {args.repeats} alternating repeats (medians); "
          f"load average {load0:.1f} at the start, {load1:.1f} at the end, {os.cpu_count()} CPUs")
    print(f"{'':12} {'loop_cpu_s':>10} {'window-end step_ms':>19} {'after_s':>8}")
    for label, rows in (("plain torch", plain), ("omniprof", ours)):
        print(f"{label:12} {med(r[0] for r in rows):10.4f} {1000 * med(r[1] for r in rows):19.2f} "
              f"{med(r[2] for r in rows):8.3f}")
    ratio = med(o[0] / p[0] for o, p in zip(ours, plain))
    print(f"loop CPU-time ratio omniprof / plain torch.profiler (median of paired ratios) = {ratio:.3f} "
          f"(target <= 1.05): {'OK' if ratio <= 1.05 else 'MISSED'}")


if __name__ == "__main__":
    main()
