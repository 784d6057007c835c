"""``omniprof attach`` (from outside) beside the in-process native engine and py-spy, in one run.

Accuracy: the workloads of benchmarks/cpu_accuracy.py (tests/tools/cpu_workloads.py: heavy vs tiny
straight-line functions, a loop's hot line, C calls, busy threads, ...) run in a child; the native
engine samples it from inside, ``omniprof.live.attach`` from outside while it runs, py-spy from
outside (``record --nonblocking``). The figures are cpu_accuracy's, against the same truths.

Slowdown: one CPU-bound loop of fixed work, timed by the target itself, alone and while sampled
from outside by attach and by py-spy (blocking: it stops the target at each sample; and
--nonblocking), each repeated and interleaved; the median of each beside the unsampled median.

    python benchmarks/live/attach_bench.py                  # both, ~3 minutes
    python benchmarks/live/attach_bench.py --only heavy,hot --skip-slowdown
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
_spec = importlib.util.spec_from_file_location("cpu_accuracy", os.path.join(ROOT, "benchmarks", "cpu_accuracy.py"))
acc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(acc)

CHILD = r"""
import json, sys, time, importlib.util
spec = importlib.util.spec_from_file_location("cpu_accuracy", sys.argv[1])
acc = importlib.util.module_from_spec(spec); spec.loader.exec_module(acc)
print("READY", flush=True)
sys.stdin.readline()   # the sampler is attached
acc.WORKLOADS[sys.argv[2]](float(sys.argv[3]))
print("ROWS" + json.dumps({"late_lived_s": acc.wl.LATE.get("lived_s")}), flush=True)
time.sleep(0.2)
"""

SPIN = r"""
import sys, time
def heavy(x):
    a = x * 3
    b = a + x
    for i in range(20):
        a = (a * 7 + b) % 1000003
    return a
print("READY", flush=True)
sys.stdin.readline()
t = time.perf_counter()
s = 0
for i in range(int(sys.argv[1])):
    s += heavy(i)
print("TIME", time.perf_counter() - t, flush=True)
"""


def _start(code: str, *args: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, env={**os.environ, "PYTHONPATH": ROOT})
    assert p.stdout.readline().strip() == "READY"
    return p


def attach_rows(workload: str, sec: float, rate_hz: float) -> dict:
    """Run one workload in a child and sample it from outside while it runs; cpu_accuracy's rows."""
    from omniprof.live.attach import AttachOptions, attach

    p = _start(CHILD, os.path.join(ROOT, "benchmarks", "cpu_accuracy.py"), workload, str(sec))
    stop = threading.Event()
    box: dict = {}
    t = threading.Thread(target=lambda: box.update(r=attach(p.pid, AttachOptions(interval_s=1 / rate_hz), stop)))
    t.start()
    time.sleep(0.05)
    p.stdin.write("go\n")
    p.stdin.flush()
    out = p.stdout.read()
    stop.set()
    t.join()
    p.wait()
    part = box["r"].parts[0]
    names = {th.thread_id: th.name for th in part.threads}
    rows = []
    for s in part.samples:
        st = [part.frames[i] for i in part.stacks[s.stack_id]]
        if any(f.file == acc.WL_FILE for f in st):  # the workload's samples (not the child's start or end)
            rows.append(([acc._short(f.name) for f in st], st[-1].line if st else 0, names.get(s.thread_id, "?"),
                         s.weight_ns / 1e9))
    extra = json.loads(out.split("ROWS", 1)[1].splitlines()[0]) if "ROWS" in out else {}
    over = part.summaries["overhead"]
    return {"rows": rows, "late_lived_s": extra.get("late_lived_s"),
            "note": f"{over['achieved_rate_hz']:.0f} Hz achieved, {over['torn']} torn"}


def slowdown(n: int, reps: int) -> None:
    from omniprof.backends.cpu.pyspy import which_pyspy
    from omniprof.live.attach import AttachOptions, attach

    pyspy = which_pyspy()

    def once(how: str) -> float:
        p = _start(SPIN, str(n))
        stop = threading.Event()
        sampler = None
        if how == "attach":
            sampler = threading.Thread(target=attach, args=(p.pid, AttachOptions(interval_s=0.001), stop))
            sampler.start()
        elif how.startswith("py-spy"):
            extra = ["--nonblocking"] if how.endswith("nonblocking") else []
            sampler = subprocess.Popen([pyspy, "record", "--rate", "1000", "--pid", str(p.pid), "-o", os.devnull,
                                        "--format", "raw", *extra], stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
            time.sleep(0.5)  # py-spy attaches
        p.stdin.write("go\n")
        p.stdin.flush()
        out = p.stdout.read()
        p.wait()
        stop.set()
        if isinstance(sampler, threading.Thread):
            sampler.join()
        elif sampler is not None:
            sampler.wait()
        return float(out.split("TIME", 1)[1].split()[0])

    kinds = ["none", "attach"] + (["py-spy", "py-spy-nonblocking"] if pyspy else [])
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(reps):
        for k in kinds:
            times[k].append(once(k))
    base = statistics.median(times["none"])
    print(f"== target slowdown (fixed work, timed by the target; median of {reps}; 1000 Hz requested)")
    for k in kinds:
        med = statistics.median(times[k])
        print(f"  {k:<20} {med:.3f} s  {med / base:.2f}x")
    if not pyspy:
        print("  py-spy: not installed (pip install py-spy)")
    print(f"  load average now {os.getloadavg()[0]:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--rate-hz", type=float, default=1000.0, help="attach's requested rate")
    ap.add_argument("--only", default="heavy,hot,C calls,threads", help="workloads (substring match)")
    ap.add_argument("--skip-slowdown", action="store_true")
    ap.add_argument("--spin-n", type=int, default=300_000)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} "
          f"(other processes share these CPUs)\n")
    truth = acc.truths()
    only = [x.strip() for x in a.only.split(",") if x.strip()]
    for name in acc.WORKLOADS:
        if only and not any(o in name for o in only):
            continue
        print(f"== {name}")
        for prof in ("omniprof-native", "attach", "py-spy"):
            if prof == "attach":
                res = attach_rows(name, a.seconds, a.rate_hz)
                print(f"  {'omniprof attach':<17} {acc.figures(name, res, a.seconds, truth)}  [{res['note']}]")
            else:
                print(f"  {prof:<17} {acc.figures(name, acc.run(name, prof, a.seconds), a.seconds, truth)}")
        print()
    if not a.skip_slowdown:
        slowdown(a.spin_n, a.reps)


if __name__ == "__main__":
    main()
