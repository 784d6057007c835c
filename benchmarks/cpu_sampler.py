"""Benchmarks of the ``cpu`` sampler, printed side by side in one run.

    python benchmarks/cpu_sampler.py            # everything (~1-2 minutes)
    python benchmarks/cpu_sampler.py --quick    # fewer repeats

Figures:
  1. Overhead at 1 kHz: profiled / unprofiled wall time on CPU-bound workloads (recursive calls,
     numeric loops, string/dict work, deep stacks, generators), for omniprof (signal engine),
     pyinstrument (interval 1 ms) and cProfile, each the best of N alternating runs, and the median
     ratio per profiler, by wall time, by CPU time of the process and by CPU time of the workload's
     own thread (the native engine's thread is apart: its CPU time is printed separately).
     Target for omniprof-native: <= 1.03.
  2. Accuracy: a workload whose time splits 2:1 between two functions; attributed shares (by
     weighted time and by sample count) vs the truth, and achieved vs requested rate.
  3. Hot path: cost of one sample on shallow and 120-frame stacks.
  4. Report building: 10^6 samples to tree and flat rows; memory per stored sample.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable

sys.setrecursionlimit(10_000)


# -- workloads ----------------------------------------------------------------------------------
def fib(n: int) -> int:
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def w_recursive() -> None:
    fib(33)


def w_numeric() -> None:
    s = 0.0
    for i in range(1, 6_000_000):
        s += (i * 0.5) ** 0.5 / i
    del s


def w_strings_dicts() -> None:
    d: dict[str, int] = {}
    for i in range(2_000_000):
        k = f"key{i % 5000}:{i % 7}"
        d[k] = d.get(k, 0) + len(k.upper())
    sorted(d.items(), key=lambda kv: kv[1])


def _deep(n: int, work: Callable[[], None]) -> None:
    if n == 0:
        work()
    else:
        _deep(n - 1, work)


def _leaf_work() -> None:
    t = 0
    for i in range(4000):
        t += i & 7


def w_deep_stacks() -> None:
    for _ in range(4000):
        _deep(120, _leaf_work)


def w_generators() -> None:
    total = 0
    for _ in range(120):
        total += sum(x * x for x in range(60_000) if x % 3)
    del total


WORKLOADS = {"recursive (fib 33)": w_recursive, "numeric loop": w_numeric, "string/dict": w_strings_dicts,
             "deep stacks (120)": w_deep_stacks, "generators": w_generators}


# -- profilers ----------------------------------------------------------------------------------
# Each runner returns (wall seconds, CPU seconds of this process, CPU seconds of the workload's own
# thread) for one run of f, profiler start and stop included.
def _timed(f: Callable[[], None], start: Callable[[], None], stop: Callable[[], None]) -> tuple[float, float, float]:
    w, c, t = time.perf_counter(), time.process_time(), time.thread_time()
    start()
    f()
    stop()
    return time.perf_counter() - w, time.process_time() - c, time.thread_time() - t


def run_plain(f: Callable[[], None]) -> tuple[float, float]:
    return _timed(f, lambda: None, lambda: None)


def run_noop_signal(f: Callable[[], None]) -> tuple[float, float]:
    """The floor of any in-process signal sampler: SIGALRM at 1 kHz with a handler doing nothing."""
    import signal

    def start() -> None:
        signal.signal(signal.SIGALRM, lambda s, fr: None)
        signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)

    def stop() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)

    return _timed(f, start, stop)


def _run_engine(f: Callable[[], None], engine: str) -> tuple[float, float]:
    import omniprof

    prof = omniprof.Profiler(backend="cpu", backend_options={"cpu": {"engine": engine}})
    out = _timed(f, prof.start, prof.stop)
    over = prof.result.part("cpu").summaries["overhead"]
    ENGINE_CPU_S.setdefault(engine, []).append(over.get("engine_cpu_ns", 0) / 1e9)
    if engine == "native":
        PARTS.setdefault(CURRENT[0], []).append(
            (over.get("ticks", 0), over.get("handler_cpu_ns", 0), over.get("drain_cpu_ns", 0),
             over.get("engine_cpu_ns", 0), out[2]))
    omniprof.cpu.clear()
    return out


#: CPU seconds of the native engine's own thread per run (reported apart: it is not the workload's thread)
ENGINE_CPU_S: dict[str, list[float]] = {}
#: workload -> per native run (ticks, handler CPU ns, drain CPU ns, engine thread CPU ns, workload thread CPU s)
PARTS: dict[str, list[tuple[int, int, int, int, float]]] = {}
CURRENT = [""]


def print_parts() -> None:
    """What each part of the native engine cost, per workload, measured by the engine in each run:
    the program thread's CPU time in the snapshot signal handler (the stack copy, done by the
    running thread itself), the drain thread's CPU time (under the GIL: records to samples, code
    resolution), and the engine thread's own (ticks, reads of the threads that are not running,
    the signal's sending and waiting); medians over the runs, and per tick."""
    if not PARTS:
        return
    print("== 1d. Native engine's cost by part (median per run; what the workload's thread pays is the handler "
          "and the drain)")
    print(f"{'workload':<22}{'ticks':>7}{'handler ms':>12}{'us/tick':>9}{'drain ms':>10}{'us/tick':>9}"
          f"{'engine ms':>11}{'us/tick':>9}{'(handler+drain)/thread CPU':>28}")
    for wname, runs in PARTS.items():
        med = [statistics.median(r[i] for r in runs) for i in range(5)]
        ticks = max(med[0], 1)
        share = (med[1] + med[2]) / 1e9 / med[4] if med[4] else 0.0
        print(f"{wname:<22}{med[0]:>7.0f}{med[1] / 1e6:>12.2f}{med[1] / ticks / 1e3:>9.2f}{med[2] / 1e6:>10.2f}"
              f"{med[2] / ticks / 1e3:>9.2f}{med[3] / 1e6:>11.2f}{med[3] / ticks / 1e3:>9.2f}{100 * share:>27.2f}%")
    print()


def run_omniprof(f: Callable[[], None]) -> tuple[float, float]:
    return _run_engine(f, "signal")


def run_omniprof_native(f: Callable[[], None]) -> tuple[float, float]:
    return _run_engine(f, "native")


def run_pyinstrument(f: Callable[[], None]) -> tuple[float, float]:
    from pyinstrument import Profiler

    p = Profiler(interval=0.001)
    return _timed(f, p.start, p.stop)


def run_cprofile(f: Callable[[], None]) -> tuple[float, float]:
    p = cProfile.Profile()
    return _timed(f, p.enable, p.disable)


PROFILERS = {"none": run_plain, "noop-signal": run_noop_signal, "omniprof-native": run_omniprof_native,
             "omniprof-signal": run_omniprof,
             "pyinstrument": run_pyinstrument, "cProfile": run_cprofile}


def overhead(repeats: int, only: list[str] | None = None) -> None:
    import omniprof

    with omniprof.Profiler(backend="cpu"):  # first-session imports are not part of the overhead
        pass
    omniprof.cpu.clear()
    names = ["none", *[n for n in PROFILERS if n != "none" and (not only or n in only)]]
    best: dict[str, dict[str, list[float]]] = {}
    for wname, f in WORKLOADS.items():
        CURRENT[0] = wname
        f()  # warm up
        b = {n: [float("inf")] * 3 for n in names}
        for _ in range(repeats):
            for n in names:
                gc.collect()
                for k, v in enumerate(PROFILERS[n](f)):
                    b[n][k] = min(b[n][k], v)
        best[wname] = b
    for kind, idx in (("wall time", 0), ("CPU time of the process", 1), ("CPU time of the workload's thread", 2)):
        print(f"== 1{'abc'[idx]}. Overhead at 1 kHz by {kind} (best of {repeats} alternating runs; "
              f"ratio = profiled / unprofiled; load average now {' '.join(f'{x:.2f}' for x in os.getloadavg())})")
        print(f"{'workload':<22}" + "".join(f"{n:>14}" for n in names[1:]) + f"{'base s':>10}")
        ratios: dict[str, list[float]] = {n: [] for n in names[1:]}
        for wname, b in best.items():
            row = f"{wname:<22}"
            for n in names[1:]:
                r = b[n][idx] / b["none"][idx]
                ratios[n].append(r)
                row += f"{r:>14.3f}"
            print(row + f"{b['none'][idx]:>10.3f}")
        print(f"{'median':<22}" + "".join(f"{statistics.median(ratios[n]):>14.3f}" for n in names[1:]))
        print()
    print_parts()
    eng = ENGINE_CPU_S.get("native", [])
    if eng:
        print(f"native engine's own thread: {statistics.median(eng) * 1e3:.1f} ms CPU per run (median), included in "
              f"the process CPU ratios above, not in the wall ratios' workload thread")
    print("target: omniprof-native median <= 1.03 by wall time of the workload. Scalene paper (OSDI'23, Table 3): py-spy 1.02, pyinstrument 1.69, "
          "cProfile 1.73, yappi 3.17. 'noop-signal' is the floor any in-process signal sampler pays.")
    print()


# -- accuracy -----------------------------------------------------------------------------------
def _work(n: int) -> int:
    t = 0
    for i in range(n):
        t += i
    return t


def heavy() -> None:
    _work(30_000)


def light() -> None:
    _work(15_000)


def accuracy(duration_s: float) -> None:
    import omniprof

    print("== 2. Accuracy: heavy() does twice light()'s work; truth = their wall time measured around each call")
    pc = time.perf_counter
    for interval in (0.001, 0.0005):
        truth = {"heavy": 0.0, "light": 0.0}
        with omniprof.Profiler(backend="cpu", backend_options={"cpu": {"interval_s": interval}}) as prof:
            end = pc() + duration_s
            while pc() < end:
                a = pc()
                heavy()
                b = pc()
                light()
                c = pc()
                truth["heavy"] += b - a
                truth["light"] += c - b
        part = prof.result.part("cpu")
        w = {"heavy": 0, "light": 0}
        cnt = {"heavy": 0, "light": 0}
        for s in part.samples:
            for i in reversed(part.stacks[s.stack_id]):
                n = part.frames[i].name
                if n in w:
                    w[n] += s.weight_ns
                    cnt[n] += 1
                    break
        over = part.summaries["overhead"]
        true_share = 100 * truth["heavy"] / (truth["heavy"] + truth["light"])
        share_w = 100 * w["heavy"] / max(w["heavy"] + w["light"], 1)
        share_c = 100 * cnt["heavy"] / max(cnt["heavy"] + cnt["light"], 1)
        print(f"interval {interval * 1e3:.1f} ms: truth {true_share:.1f}%; heavy share by time {share_w:.1f}% "
              f"(error {share_w - true_share:+.1f} pts), by count {share_c:.1f}% (error {share_c - true_share:+.1f} pts); "
              f"achieved {over['achieved_rate_hz']:.0f} Hz of {over['requested_rate_hz']:.0f} Hz "
              f"({100 * over['achieved_rate_hz'] / over['requested_rate_hz']:.1f}%); "
              f"sampler self-time {over['sampler_overhead_pct']:.2f}%; {len(part.samples)} samples")
        omniprof.cpu.clear()
    print("targets: shares within 2 points; achieved rate within 10% of requested "
          "(a loaded machine delays timer signals: check the load average printed above)")
    print()


# -- hot path -----------------------------------------------------------------------------------
def hot_path(n: int) -> None:
    from omniprof.backends.cpu.sampler import Sampler
    from omniprof.backends.cpu.stacks import python_stacks
    from omniprof.core.clock import DEFAULT_CLOCK

    print(f"== 3. Hot path: one sample of the main thread (signal-engine source), best of 10 rounds of {n // 10}")
    box = [None]
    sampler = Sampler(python_stacks(main_frame=lambda: box[0]), DEFAULT_CLOCK, 10 * n)

    def measure() -> float:
        # Best of 10 rounds of n // 10 samples: other processes sharing the CPUs only add time.
        box[0] = sys._getframe(1)
        sampler.begin()
        best = float("inf")
        for _ in range(10):
            t = time.perf_counter_ns()
            for _ in range(n // 10):
                sampler.sample()
            best = min(best, (time.perf_counter_ns() - t) / (n // 10) / 1e3)
        return best

    def at_depth(d: int) -> float:
        return measure() if d == 0 else at_depth(d - 1)

    base = len(_stack_depth())
    for d in (0, 50, 120):
        us = at_depth(d)
        print(f"stack depth {base + d:>4}: {us:6.2f} us per sample (at 1 kHz: {us / 10:.2f}% of a core)")
    print()


def _stack_depth() -> list[object]:
    f, out = sys._getframe(), []
    while f is not None:
        out.append(f)
        f = f.f_back
    return out


# -- report building ----------------------------------------------------------------------------
def report_building(n: int) -> None:
    import random

    from omniprof.backends.cpu.sampler import BYTES_PER_SAMPLE, Sampler
    from omniprof.core.clock import DEFAULT_CLOCK
    from omniprof.core.results import BackendResult, Frame, StackSample, ThreadInfo
    from omniprof.analysis.stackreport import build_report, format_report

    print(f"== 4. Report building: {n:,} samples")
    rng = random.Random(1)
    frames = [Frame(f"func_{i}", f"/src/pkg/mod_{i % 40}.py", 10 + i % 300) for i in range(600)]
    # Realistic: 3000 distinct stacks that are root paths of one 6000-node call tree (shared
    # prefixes, depth up to ~60), as a real program's stacks are.
    parent = [-1]
    depth = [1]
    for _ in range(5999):
        p = max(rng.randrange(len(parent)) for _ in range(3))  # prefer recent (deeper) nodes
        parent.append(p)
        depth.append(depth[p] + 1)
    node_frame = [rng.randrange(600) for _ in parent]

    def path(node: int) -> tuple[int, ...]:
        out = []
        while node >= 0:
            out.append(node_frame[node])
            node = parent[node]
        return tuple(reversed(out))

    stacks = [path(rng.randrange(len(parent))) for _ in range(3000)]
    tracemalloc.start()
    m0 = tracemalloc.get_traced_memory()[0]
    samples = [StackSample(i * 1000, 1 + i % 4, rng.randrange(3000), 1_000_000, None) for i in range(n)]
    m1 = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    part = BackendResult(backend="cpu", frames=frames, stacks=stacks, samples=samples,
                         threads=[ThreadInfo(t, f"t{t}") for t in range(1, 5)])
    print(f"(3000 distinct stacks, depth {min(map(len, stacks))}-{max(map(len, stacks))}, 4 threads)")
    for label, kw in (("tree", {"format": "tree", "sortedby": "count"}), ("flat", {"format": "flat"}),
                      ("tree by thread", {"format": "tree", "groupby": "thread"})):
        t = time.perf_counter()
        groups = build_report(part, **kw)
        t_build = time.perf_counter() - t
        t = time.perf_counter()
        lines = format_report(part, groups=groups, cols=150, **kw)
        t_fmt = time.perf_counter() - t
        print(f"{label:<15} build {t_build:6.3f} s + format {t_fmt:6.3f} s = {t_build + t_fmt:6.3f} s "
              f"({len(lines):,} lines)   target <= 2 s")
    # Raw buffer memory, measured: append n samples to a Sampler.
    s = Sampler(lambda: [(1, ("f", 1))], DEFAULT_CLOCK, n + 1, tasks=None)
    s.begin()
    tracemalloc.start()
    b0 = tracemalloc.get_traced_memory()[0]
    for _ in range(200_000):
        s.sample()
    b1 = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    print(f"memory: sample buffer {BYTES_PER_SAMPLE} B/sample stated, {(b1 - b0) / 200_000:.1f} B/sample measured "
          f"(array growth included); exported StackSample objects {(m1 - m0) / n:.0f} B/sample")
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer repeats")
    ap.add_argument("--only", choices=["overhead", "accuracy", "hotpath", "report"], action="append")
    ap.add_argument("--profilers", help="comma-separated subset of " + ",".join(p for p in PROFILERS if p != "none"))
    a = ap.parse_args()
    only = set(a.only or ["overhead", "accuracy", "hotpath", "report"])
    import os

    print(f"python {sys.version.split()[0]} on {sys.platform}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.2f} (other processes share these CPUs)\n")
    if "overhead" in only:
        overhead(3 if a.quick else 7, a.profilers.split(",") if a.profilers else None)
    if "accuracy" in only:
        accuracy(1.5 if a.quick else 3.0)
    if "hotpath" in only:
        hot_path(2000 if a.quick else 10000)
    if "report" in only:
        report_building(1_000_000)


if __name__ == "__main__":
    main()
