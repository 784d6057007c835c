"""Accuracy of the cpu sampler's engines beside py-spy and pyinstrument, on workloads whose truth is
measured independently (each piece timed alone). Printed side by side in one run.

    python benchmarks/cpu_accuracy.py            # ~1-2 minutes
    python benchmarks/cpu_accuracy.py --seconds 1

Workloads (run in a child process per profiler, so each starts clean):
  heavy/tiny   heavy() (20 statements) and tiny() (return x + 1) called alternately; truth: each
               timed alone; figure: heavy's share of their self time.
  hot line     a loop whose one line computes a chain of ``**``; figure: that line's share of the
               function's samples (truth: nearly all its time; target >= 80%).
  C calls      sorted() of 600k floats + sha256 of 40 MB + a Python loop; truth: each timed alone;
               figure: each line's share by count and by time.
  threads      3 busy threads for 1.5 s while main joins; figure: samples per second per thread.
py-spy runs outside (``py-spy record --rate 1000 --format raw``, needs ptrace); pyinstrument in
process at 1 ms. Others share this machine: read the figures with the load average printed first.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter

HERE = os.path.abspath(__file__)


def heavy(x):
    a = x * 3 + 1
    b = a * a - x
    c = b // 7 + a
    d = c * c % 1000003
    e = d + b - a
    f = e * 2
    g = f ^ 12345
    h = g + d
    i = h * 3
    j = i - 99
    k = j * j % 77
    m = k + 1
    n = m * 5
    o = n - j
    p = o * o % 997
    q = p + a
    r = q * 2
    s = r ^ 99
    t = s + 1
    return t


def tiny(x):
    return x + 1


def w_heavy_tiny(sec):
    end = time.perf_counter() + sec
    while time.perf_counter() < end:
        for i in range(500):
            heavy(i)
            tiny(i)


def hot_loop(n):
    s = 0
    for i in range(n):
        a = i + 1
        x = (a ** 3 ** 2) ** 2 % 1000003  # HOT
        s += a
    return s + x


def w_hot(sec):
    end = time.perf_counter() + sec
    while time.perf_counter() < end:
        hot_loop(20_000)


DATA = BLOB = None


def c_heavy():
    a = sorted(DATA)  # SORT
    b = hashlib.sha256(BLOB).digest()  # SHA
    s = 0
    for i in range(400_000):  # LOOP
        s += i  # LOOP
    return a, b, s


def w_c(sec):
    global DATA, BLOB
    rng = random.Random(1)
    DATA = [rng.random() for _ in range(600_000)]
    BLOB = os.urandom(40 * 2**20)
    end = time.perf_counter() + sec
    while time.perf_counter() < end:
        c_heavy()


def spin(sec):
    end = time.perf_counter() + sec
    while time.perf_counter() < end:
        pass


def w_threads(sec):
    ts = [threading.Thread(target=spin, args=(sec,), name=f"busy{i}") for i in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


WORKLOADS = {"heavy/tiny": w_heavy_tiny, "hot line": w_hot, "C calls": w_c, "threads": w_threads}


def _line(tag):
    return next(i + 1 for i, ln in enumerate(open(HERE).read().splitlines()) if ln.rstrip().endswith(f"# {tag}"))


def truths():
    out = {}
    n = 100_000
    t = time.perf_counter()
    for i in range(n):
        heavy(i)
    th = time.perf_counter() - t
    t = time.perf_counter()
    for i in range(n):
        tiny(i)
    tt = time.perf_counter() - t
    out["heavy/tiny"] = th / (th + tt)
    global DATA, BLOB
    rng = random.Random(1)
    DATA = [rng.random() for _ in range(600_000)]
    BLOB = os.urandom(40 * 2**20)
    t0 = time.perf_counter()
    sorted(DATA)
    t1 = time.perf_counter()
    hashlib.sha256(BLOB).digest()
    t2 = time.perf_counter()
    s = 0
    for i in range(400_000):
        s += i
    t3 = time.perf_counter()
    tot = t3 - t0
    out["C calls"] = {"sort": (t1 - t0) / tot, "sha": (t2 - t1) / tot, "loop": (t3 - t2) / tot}
    return out


# -- child: run one workload under one profiler, print (name, file, line, thread, weight_s) rows as JSON
def child(workload, profiler, sec):
    fn = WORKLOADS[workload]
    rows = []
    if profiler.startswith("omniprof"):
        import omniprof

        engine = profiler.split("-", 1)[1]
        with omniprof.Profiler(backend="cpu", backend_options={"cpu": {"engine": engine}}) as p:
            fn(sec)
        part = p.result.part("cpu")
        names = {t.thread_id: t.name for t in part.threads}
        for s in part.samples:
            fr = part.frames[part.stacks[s.stack_id][-1]]
            rows.append((fr.name.rsplit(".", 1)[-1], fr.line, names.get(s.thread_id, "?"), s.weight_ns / 1e9))
    elif profiler == "pyinstrument":
        from pyinstrument import Profiler

        p = Profiler(interval=0.001)
        p.start()
        fn(sec)
        session = p.stop()
        for frames, dur in _pyinst_samples(session):
            # "function\x00file\x00first line[\x01l<current line>]": the current line when recorded. A
            # builtin leaf (sorted, sha256) is charged to its caller's line, as the other profilers do.
            mine = [f for f in frames if f.split("\x00")[1:2] == [HERE]]
            leaf = (mine or frames)[-1].split("\x00")
            line = 0
            if len(leaf) > 2:
                first, _, cur = leaf[2].partition("\x01l")
                line = int(cur) if cur.isdigit() else 0
            thread = frames[0].split("\x00")[0] if frames else "?"
            rows.append((leaf[0], line, thread, dur))
    else:
        fn(sec)
    print("ROWS" + json.dumps(rows))


def _pyinst_samples(session):
    # frame identifiers are "function\x00file\x00line"; pyinstrument's own attribute markers dropped
    for stack, dur, *_ in session.frame_records:
        yield [f for f in stack if not f.startswith("[") and "\x00<thread>\x00" not in f or f is stack[0]], dur


def run(workload, profiler, sec):
    cmd = [sys.executable, HERE, "--child", workload, profiler, str(sec)]
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(HERE))}
    if profiler == "py-spy":
        from omniprof.backends.cpu.pyspy import parse_raw, which_pyspy

        exe = which_pyspy()
        if exe is None:
            return None
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "raw.txt")
            r = subprocess.run([exe, "record", "--rate", "1000", "--format", "raw", "--threads", "--nonblocking",
                                "-o", out, "--", *cmd], capture_output=True, text=True, env=env)
            if r.returncode != 0 or not os.path.exists(out):
                return None
            rows = []
            for tid, name, frames, count in parse_raw(open(out).read()):
                if frames:
                    rows += [(frames[-1].name, frames[-1].line, name or str(tid), 0.001)] * count
            return rows
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        print(r.stderr[-500:])
        return None
    return [tuple(x) for x in json.loads(r.stdout.split("ROWS", 1)[1])]


def figures(workload, rows, sec, truth):
    if rows is None:
        return "n/a"
    if workload == "heavy/tiny":
        c, w = Counter(), Counter()
        for name, line, th, wt in rows:
            c[name] += 1
            w[name] += wt
        share = w["heavy"] / max(w["heavy"] + w["tiny"], 1e-12)
        return f"heavy {100 * share:.1f}% (truth {100 * truth['heavy/tiny']:.1f}%)"
    if workload == "hot line":
        hot = _line("HOT")
        lines = Counter(line for name, line, th, wt in rows if name == "hot_loop")
        return f"hot line {100 * lines[hot] / max(sum(lines.values()), 1):.1f}% of hot_loop's samples"
    if workload == "C calls":
        which = {_line("SORT"): "sort", _line("SHA"): "sha"}
        for i, ln in enumerate(open(HERE).read().splitlines()):
            if ln.rstrip().endswith("# LOOP"):
                which[i + 1] = "loop"
        c, w = Counter(), Counter()
        for name, line, th, wt in rows:
            if name == "c_heavy" and line in which:
                c[which[line]] += 1
                w[which[line]] += wt
        tc, tw = max(sum(c.values()), 1), max(sum(w.values()), 1e-12)
        t = truth["C calls"]
        return " ".join(f"{k} {100 * c[k] / tc:.0f}/{100 * w[k] / tw:.0f}% (truth {100 * t[k]:.0f})"
                        for k in ("sort", "sha", "loop")) + "  [count/time]"
    per = Counter(th for name, line, th, wt in rows if name == "spin")
    if not per:
        return "no samples of the worker threads (profiles only the thread that started it)"
    rates = sorted(v / sec for v in per.values())
    return "per-thread Hz " + ", ".join(f"{r:.0f}" for r in rates) + " (requested 1000)"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--child", nargs=3)
    a = ap.parse_args()
    if a.child:
        child(a.child[0], a.child[1], float(a.child[2]))
        return
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} "
          f"(other processes share these CPUs)\n")
    truth = truths()
    profs = ["omniprof-native", "omniprof-signal", "py-spy", "pyinstrument"]
    for wl in WORKLOADS:
        print(f"== {wl}")
        for p in profs:
            print(f"  {p:<17} {figures(wl, run(wl, p, a.seconds), a.seconds, truth)}")
        print()


if __name__ == "__main__":
    main()
