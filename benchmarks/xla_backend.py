"""Benchmarks of the ``xla`` backend, measured side by side in one run (numbers, not assertions).

1. Tracing overhead: the same jitted workload under plain ``jax.profiler.start_trace`` and under
   ``omniprof.Profiler(backend="xla")``, interleaved; the time of the workload *while tracing* is
   compared (target ratio <= 1.02), post-processing (stop: export, reading, xprof tools) reported apart.
2. ``omniprof.jax.timed`` runtime vs an independent ``timeit`` of the compiled function (target within 5%).
3. Cost of ``omniprof.annotate`` when no profiler runs, and of an annotation while tracing.

Run: ``python benchmarks/xla_backend.py [--rounds 7] [--iters 200]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import omniprof  # noqa: E402


def make_workload(n: int):
    f = jax.jit(lambda x, y: jnp.tanh(x @ y) + 0.5 * x)
    x = jnp.ones((n, n), jnp.float32)
    f(x, x).block_until_ready()
    return f, x


_CPU: list[float] = []  # process CPU seconds of the most recent run_loop (all threads)


def run_loop(f, x, iters: int) -> float:
    c0 = time.process_time()
    t0 = time.perf_counter()
    for _ in range(iters):
        f(x, x).block_until_ready()
    wall = time.perf_counter() - t0
    _CPU.append(time.process_time() - c0)
    return wall


def plain_jax(f, x, iters: int, same_options: bool) -> tuple[float, float]:
    opts = None
    if same_options:
        opts = jax.profiler.ProfileOptions()
        opts.host_tracer_level = 2
        opts.python_tracer_level = 0
    with tempfile.TemporaryDirectory() as d:
        jax.profiler.start_trace(d, profiler_options=opts)
        loop = run_loop(f, x, iters)
        t0 = time.perf_counter()
        jax.profiler.stop_trace()
        return loop, time.perf_counter() - t0


def ours(f, x, iters: int, tools: bool) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as d:
        prof = omniprof.Profiler(backend="xla", logdir=d, backend_options={"xla": {"record_tool_data": tools}})
        prof.start()
        loop = run_loop(f, x, iters)
        t0 = time.perf_counter()
        prof.stop()
        return loop, time.perf_counter() - t0


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [xs[0]] * 3
    return q[0], statistics.median(xs), q[2]


def overhead(rounds: int, iters: int, n: int) -> None:
    f, x = make_workload(n)
    run_loop(f, x, iters)
    names = ["untraced", "jax (its defaults)", "jax (same options)", "omniprof xla", "omniprof xla, no tools"]
    runners = {
        "untraced": lambda: (run_loop(f, x, iters), 0.0),
        "jax (its defaults)": lambda: plain_jax(f, x, iters, same_options=False),
        "jax (same options)": lambda: plain_jax(f, x, iters, same_options=True),
        "omniprof xla": lambda: ours(f, x, iters, tools=True),
        "omniprof xla, no tools": lambda: ours(f, x, iters, tools=False),
    }
    cols: dict[str, list[tuple[float, float]]] = {k: [] for k in names}
    paired: list[float] = []
    paired_cpu: list[float] = []
    for i in range(rounds):  # interleaved, order rotated, so drift on a shared machine hits every column alike
        order = names[i % len(names):] + names[: i % len(names)]
        got = {}
        cpu = {}
        for k in order:
            got[k] = runners[k]()
            cpu[k] = _CPU[-1]
            cols[k].append(got[k])
        paired.append(got["omniprof xla"][0] / got["jax (same options)"][0])
        paired_cpu.append(cpu["omniprof xla"] / cpu["jax (same options)"])
    med = {k: (statistics.median(a for a, _ in v), statistics.median(b for _, b in v)) for k, v in cols.items()}
    print(f"\n1. Tracing overhead: {iters} calls of a jitted {n}x{n} matmul+tanh, median of {rounds} interleaved rounds")
    print(f"   {'':26s} {'workload while tracing':>24s} {'per call':>10s} {'post-processing (stop)':>24s}")
    for k, (loop, post) in med.items():
        print(f"   {k:26s} {loop * 1e3:21.1f} ms {loop / iters * 1e6:7.1f} us {post * 1e3:21.1f} ms")
    q1, q2, q3 = _quartiles(paired)
    print(f"   ratio omniprof / jax (same options) while tracing, paired per round: median {q2:.3f} "
          f"(quartiles {q1:.3f} .. {q3:.3f}; target <= 1.02)")
    q1, q2, q3 = _quartiles(paired_cpu)
    print(f"   same ratio in process CPU time (less sensitive to other processes on the machine): median {q2:.3f} "
          f"(quartiles {q1:.3f} .. {q3:.3f})")
    print(f"   ratio of medians omniprof / jax (jax defaults: python tracer on): "
          f"{med['omniprof xla'][0] / med['jax (its defaults)'][0]:.3f}")
    print(f"   post-processing omniprof {med['omniprof xla'][1] * 1e3:.0f} ms (export + read + xprof tools), "
          f"without tools {med['omniprof xla, no tools'][1] * 1e3:.0f} ms, jax's export {med['jax (same options)'][1] * 1e3:.0f} ms")


def timed_vs_timeit(n: int, nrepeat: int, rounds: int) -> None:
    f = jax.jit(lambda x: jnp.tanh(x @ x))
    x = jnp.ones((n, n), jnp.float32)
    compiled = f.lower(x).compile()
    compiled(x).block_until_ready()
    ours_s, ref_s = [], []

    def one_ours() -> None:
        ours_s.append(omniprof.jax.timed(f, x, nrepeat=nrepeat).runtime_s)

    def one_ref() -> None:
        ref_s.append(timeit.timeit(lambda: compiled(x).block_until_ready(), number=nrepeat) / nrepeat)

    for i in range(rounds):  # alternate which goes first: a loaded machine drifts within a round
        for fn in ((one_ours, one_ref) if i % 2 == 0 else (one_ref, one_ours)):
            fn()
    print(f"\n2. omniprof.jax.timed vs timeit of the compiled function ({n}x{n} matmul+tanh, nrepeat={nrepeat}, "
          f"{rounds} alternating rounds)")
    pairs = [a / b for a, b in zip(ours_s, ref_s)]
    q1, q2, q3 = _quartiles(pairs)
    print(f"   paired per round: timed / timeit median {q2:.3f} (quartiles {q1:.3f} .. {q3:.3f}; target 0.95 .. 1.05)")
    for label, pick in (("median", statistics.median), ("best", min)):
        a, b = pick(ours_s), pick(ref_s)
        print(f"   {label:6s}: timed runtime {a * 1e6:8.1f} us   timeit {b * 1e6:8.1f} us   "
              f"difference {100 * (a - b) / b:+6.2f}% (target within 5%)")


def annotation_cost(number: int) -> None:
    import contextlib

    from jax.profiler import TraceAnnotation

    def empty():
        with contextlib.nullcontext():
            pass

    def ours_ann():
        with omniprof.annotate("step"):
            pass

    def jax_ann():
        with TraceAnnotation("step"):
            pass

    def best(fn) -> float:
        return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e9

    print(f"\n3. Annotation cost (best of 5 x {number})")
    print(f"   nullcontext (floor)                    {best(empty):7.0f} ns")
    print(f"   omniprof.annotate, no profiler running {best(ours_ann):7.0f} ns")
    print(f"   jax.profiler.TraceAnnotation, no trace  {best(jax_ann):7.0f} ns")
    with omniprof.Profiler(backend="xla", backend_options={"xla": {"record_tool_data": False}}):
        active = best(ours_ann)
    print(f"   omniprof.annotate while tracing (xla)  {active:7.0f} ns")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--n", type=int, default=128)
    a = ap.parse_args()
    print(f"jax {jax.__version__}, device {jax.devices()[0].device_kind}, python {sys.version.split()[0]}")
    overhead(a.rounds, a.iters, a.n)
    timed_vs_timeit(a.n, 100, 4 * a.rounds)
    annotation_cost(20_000)


if __name__ == "__main__":
    main()
