"""Cost of checkpoints (``omniprof.partial.json`` while recording), measured side by side.

The same CPU-bound workload runs for ``--seconds`` under the cpu backend with a logdir, with
checkpoints every ``--every-s`` seconds and with them off (``OMNIPROF_CHECKPOINT_S=0``),
alternating, ``--rounds`` times. Prints work done per second in each mode, their ratio, and the
number and longest time of checkpoints.

    python benchmarks/checkpoint_cost.py --seconds 10 --every-s 1 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time


def work(seconds: float) -> int:
    n = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(i * i for i in range(300))
        n += 1
    return n


def run(seconds: float, every_s: float) -> tuple[float, int, float]:
    import omniprof

    os.environ["OMNIPROF_CHECKPOINT_S"] = str(every_s)
    with omniprof.Profiler(backend="cpu", logdir=tempfile.mkdtemp(prefix="omniprof-ckpt-"),
                           backend_options={"cpu": {"accumulate": False}}) as prof:
        n = work(seconds)
    return n / seconds, prof.checkpoints, prof.checkpoint_max_ns / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--every-s", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    on, off, counts, longest = [], [], [], []
    for _ in range(args.rounds):
        rate, count, worst = run(args.seconds, args.every_s)
        on.append(rate)
        counts.append(count)
        longest.append(worst)
        off.append(run(args.seconds, 0)[0])
    print(f"{args.rounds} rounds of {args.seconds:g} s, checkpoints every {args.every_s:g} s (cpu backend, 1 kHz)")
    print(f"work/s with checkpoints: median {statistics.median(on):,.0f}  {[round(x) for x in on]}")
    print(f"work/s without:          median {statistics.median(off):,.0f}  {[round(x) for x in off]}")
    print(f"ratio with/without: {statistics.median(on) / statistics.median(off):.3f}")
    print(f"checkpoints per run: {counts}; longest checkpoint: {max(longest):.1f} ms")


if __name__ == "__main__":
    main()
