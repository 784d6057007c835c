"""Accuracy of the cpu sampler's engines beside py-spy and pyinstrument, on workloads whose truth is
measured independently (each piece timed alone). Printed side by side in one run.

    python benchmarks/cpu_accuracy.py            # ~2-3 minutes
    python benchmarks/cpu_accuracy.py --seconds 1 --only generators,deep

The workloads and their truths live in ``tests/tools/cpu_workloads.py`` (shared with the tests):
  heavy/tiny   heavy() (20 statements) and tiny() (return x + 1) called alternately; truth: each
               timed alone; figure: heavy's share of their self time.
  hot line     a loop whose one line computes a chain of ``**``; figure: that line's share of the
               function's samples (truth: nearly all its time; target >= 80%).
  C calls      sorted() of 600k floats + sha256 of 40 MB + a Python loop; truth: each timed alone;
               figure: each line's share by count and by time.
  threads      3 busy threads for the run while main joins; figure: samples per second per thread.
  late thread  a thread started 40% into the run, alive 20% of it; truth: its life as it measured it;
               figure: the time the profiler gives that thread.
  asyncio      two tasks on one loop doing n and 3n work per step; truth: each task's work timed alone;
               figure: the big task's share of the tasks' time.
  generators   a generator doing heavy() per item feeding a loop doing tiny() per item, and sum() over a
               generator expression; truth: heavy and tiny timed alone; figures: the generator's share,
               and samples that show a generator frame without its callers (must be 0).
  deep         a 120-deep recursion with work per level and at the leaf; truth: the leaf timed alone
               over the whole recursion timed alone; figures: the leaf's share, and the share of leaf
               samples carrying all 121 levels.
in-thread is the reference for where the interpreter really is (tests/tools/_inthread_ref.c): a
SIGPROF handler reads the busy thread's own stack while that thread is stopped in it (the kernel's
timer rate, often 250 Hz; the main thread only). Shares by function and by line are held to it; the
"truth" figures time each piece alone, which also counts the calls' own overhead.
py-spy runs outside (``py-spy record --rate 1000 --format raw --threads --nonblocking``, needs ptrace);
pyinstrument in process at 1 ms (it follows only the thread that started it). Others share this
machine: read the figures with the load average printed first.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter

HERE = os.path.abspath(__file__)
ROOT = os.path.dirname(os.path.dirname(HERE))
_spec = importlib.util.spec_from_file_location("cpu_workloads", os.path.join(ROOT, "tests", "tools", "cpu_workloads.py"))
wl = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(wl)
WL_FILE = wl.HERE

WORKLOADS = {"heavy/tiny": wl.w_heavy_tiny, "hot line": wl.w_hot, "C calls": wl.w_c, "threads": wl.w_threads,
             "late thread": wl.w_late_thread, "asyncio": wl.w_asyncio, "generators": wl.w_generators,
             "deep": wl.w_deep}
GEN_NAMES = ("produce", "<genexpr>")


def truths():
    return {"heavy/tiny": wl.truth_heavy_tiny(), "C calls": wl.truth_c(), "asyncio": wl.truth_asyncio(),
            "generators": wl.truth_generators(), "deep": wl.truth_deep()}


def _short(name):
    return name.rsplit(".", 1)[-1]


# -- child: run one workload under one profiler; print rows (stack names root first, leaf line, thread,
#    weight_s) and the truths only the run itself can measure (the late thread's life) as JSON
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
            st = [part.frames[i] for i in part.stacks[s.stack_id]]
            rows.append(([_short(f.name) for f in st], st[-1].line if st else 0, names.get(s.thread_id, "?"),
                         s.weight_ns / 1e9))
    elif profiler == "pyinstrument":
        from pyinstrument import Profiler

        p = Profiler(interval=0.001)
        p.start()
        fn(sec)
        session = p.stop()
        for frames, dur in _pyinst_samples(session):
            # "function\x00file\x00first line[\x01l<current line>]": the current line when recorded. A
            # builtin leaf (sorted, sha256) is charged to its caller's line, as the other profilers do.
            mine = [f for f in frames if f.split("\x00")[1:2] == [WL_FILE]]
            leaf = (mine or frames)[-1].split("\x00") if frames else ["?"]
            line = 0
            if len(leaf) > 2:
                first, _, cur = leaf[2].partition("\x01l")
                line = int(cur) if cur.isdigit() else 0
            thread = frames[0].split("\x00")[0] if frames else "?"
            stack = [_short(f.split("\x00")[0]) for f in frames]
            if mine and frames and frames[-1] is not mine[-1]:  # a builtin leaf: its caller's line
                stack = stack[:len(stack) - (len(frames) - 1 - frames.index(mine[-1]))]
            rows.append((stack, line, thread, dur))
    elif profiler == "in-thread":
        import threading

        sys.path.insert(0, os.environ["OMNIPROF_REF_DIR"])
        import _inthread_ref as ref

        codes = _all_codes()
        ref.start(1000, threading.get_ident())
        try:
            fn(sec)
        finally:
            pairs, _ = ref.stop()
        for (leaf, off), st in zip(pairs, ref.stacks()):
            names = [codes[c].co_name if c in codes else "?" for c in reversed(st)]
            rows.append((names, _line_of(codes.get(leaf), off), "MainThread", 1.0))
    else:
        fn(sec)
    print("ROWS" + json.dumps({"rows": rows, "late_lived_s": wl.LATE.get("lived_s"),
                               "main_thread_only": profiler == "in-thread"}))


def _all_codes():
    """id -> code object of every function in the workloads and here (the in-thread reference
    records code addresses; these objects live as long as their functions)."""
    return wl.codes_by_id(*[v for v in vars(sys.modules[__name__]).values() if hasattr(v, "__code__")])


def _line_of(code, off):
    if code is None:
        return 0
    for start, end, line in code.co_lines():
        if start <= off < end:
            return line or 0
    return 0


def _pyinst_samples(session):
    # frame identifiers are "function\x00file\x00line"; pyinstrument's own attribute markers dropped
    for stack, dur, *_ in session.frame_records:
        yield [f for f in stack if not f.startswith("[") and "\x00<thread>\x00" not in f or f is stack[0]], dur


def run(workload, profiler, sec):
    cmd = [sys.executable, HERE, "--child", workload, profiler, str(sec)]
    env = {**os.environ, "PYTHONPATH": ROOT}
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
                    rows += [([_short(f.name) for f in frames], frames[-1].line, name or str(tid), 0.001)] * count
            extra = json.loads(r.stdout.split("ROWS", 1)[1].splitlines()[0]) if "ROWS" in r.stdout else {}
            return {"rows": rows, "late_lived_s": extra.get("late_lived_s")}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        print(r.stderr[-500:])
        return None
    return json.loads(r.stdout.split("ROWS", 1)[1].splitlines()[0])


def figures(workload, res, sec, truth):
    if res is None:
        return "n/a"
    rows = [(st, line, th, wt) for st, line, th, wt in res["rows"]]
    if workload == "heavy/tiny":
        w = Counter()
        for st, line, th, wt in rows:
            if st:
                w[st[-1]] += wt
        share = w["heavy"] / max(w["heavy"] + w["tiny"], 1e-12)
        return f"heavy {100 * share:.1f}% (truth {100 * truth['heavy/tiny']:.1f}%)"
    if workload == "hot line":
        hot = wl.tagged_lines("HOT")[0]
        lines = Counter(line for st, line, th, wt in rows if st and st[-1] == "hot_loop")
        return f"hot line {100 * lines[hot] / max(sum(lines.values()), 1):.1f}% of hot_loop's samples"
    if workload == "C calls":
        c, w = Counter(), Counter()
        for st, line, th, wt in rows:
            kind = wl.c_line_kind(line) if st and st[-1] == "c_heavy" else None
            if kind:
                c[kind] += 1
                w[kind] += wt
        tc, tw = max(sum(c.values()), 1), max(sum(w.values()), 1e-12)
        t = truth["C calls"]
        return " ".join(f"{k} {100 * c[k] / tc:.0f}/{100 * w[k] / tw:.0f}% (truth {100 * t[k]:.0f})"
                        for k in ("sort", "sha", "loop")) + "  [count/time]"
    if res.get("main_thread_only") and workload in ("threads", "late thread"):
        return "n/a (samples the main thread only)"
    if workload == "threads":
        per = Counter(th for st, line, th, wt in rows if st and st[-1] == "spin")
        if len(per) < 3:
            return f"worker threads seen: {len(per)} of 3 (profiles only the thread that started it?)"
        rates = sorted(v / sec for v in per.values())
        return "per-thread Hz " + ", ".join(f"{r:.0f}" for r in rates) + " (requested 1000)"
    if workload == "late thread":
        lived = res.get("late_lived_s")
        got = sum(wt for st, line, th, wt in rows if th == "late" or (th != "late" and "late_worker" in st))
        if not got:
            return f"the late thread is not in the profile (it lived {lived:.3f} s)" if lived else "n/a"
        return f"late thread {got:.3f} s (truth: it lived {lived:.3f} s)"
    if workload == "asyncio":
        w = Counter()
        for st, line, th, wt in rows:
            for k in ("small_task_work", "big_task_work"):
                if k in st:
                    w[k] += wt
        share = w["big_task_work"] / max(sum(w.values()), 1e-12)
        return f"big task {100 * share:.1f}% (truth {100 * truth['asyncio']:.1f}%)"
    if workload == "generators":
        w = Counter()
        rooted = in_gen = 0
        for st, line, th, wt in rows:
            if "consume" in st and st[-1] in ("heavy", "tiny"):
                w[st[-1]] += wt
            if any(n in GEN_NAMES for n in st):
                in_gen += 1
                rooted += st[0] in GEN_NAMES
        share = w["heavy"] / max(w["heavy"] + w["tiny"], 1e-12)
        leaf = Counter()
        for st, line, th, wt in rows:
            if st and th == "MainThread":
                leaf[st[-1]] += wt
        tot = max(sum(leaf.values()), 1e-12)
        return (f"generator {100 * share:.1f}% (truth {100 * truth['generators']:.1f}%); of all: heavy "
                f"{100 * leaf['heavy'] / tot:.1f}% produce {100 * leaf['produce'] / tot:.1f}% consume "
                f"{100 * leaf['consume'] / tot:.1f}%; {rooted} of {in_gen} generator samples without callers")
    # deep
    leaf = total = full = n_leaf = 0
    for st, line, th, wt in rows:
        if "recurse" not in st:
            continue
        total += wt
        if st[-1] == "recursion_leaf":
            leaf += wt
            n_leaf += 1
            full += st.count("recurse") == wl.DEPTH + 1
    return (f"leaf {100 * leaf / max(total, 1e-12):.1f}% (truth {100 * truth['deep']:.1f}%); "
            f"{100 * full / max(n_leaf, 1):.1f}% of leaf samples with all {wl.DEPTH + 1} levels")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--only", default="", help="comma-separated workload names (default: all)")
    ap.add_argument("--profilers", default="in-thread,omniprof-native,omniprof-signal,py-spy,pyinstrument")
    ap.add_argument("--child", nargs=3)
    a = ap.parse_args()
    if a.child:
        child(a.child[0], a.child[1], float(a.child[2]))
        return
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} "
          f"(other processes share these CPUs)\n")
    truth = truths()
    only = [x.strip() for x in a.only.split(",") if x.strip()]
    if "in-thread" in a.profilers:
        sys.path.insert(0, ROOT)
        from pathlib import Path

        from tests.tools import build_extension

        ref_dir = tempfile.mkdtemp(prefix="omniprof-ref-")
        build_extension(sys.executable, Path(ROOT) / "tests" / "tools" / "_inthread_ref.c", Path(ref_dir))
        os.environ["OMNIPROF_REF_DIR"] = ref_dir
    for wl_name in WORKLOADS:
        if only and not any(o in wl_name for o in only):
            continue
        print(f"== {wl_name}")
        for p in a.profilers.split(","):
            print(f"  {p:<17} {figures(wl_name, run(wl_name, p, a.seconds), a.seconds, truth)}")
        print()


if __name__ == "__main__":
    main()
