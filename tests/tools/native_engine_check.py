"""Checks of the native sampling engine alone, runnable by any CPython 3.10-3.13 without omniprof's
dependencies: ``python native_engine_check.py DIR`` where DIR holds ``_nativesampler`` built for
that interpreter (tests/integration/test_cpu_native.py builds it with that interpreter's headers).

Prints one ``OK name detail`` or ``FAIL name detail`` line per check; exit status 1 on any FAIL.
Ground truths are measured independently: each function timed alone, lines taken from the source.
"""

from __future__ import annotations

import struct
import sys
import threading
import time
from collections import Counter

ns = None  # the extension, imported by main() from the directory given
FAILS = []


def check(name, ok, detail=""):
    print(("OK  " if ok else "FAIL") + f" {name} {detail}", flush=True)
    if not ok:
        FAILS.append(name)


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


def hot_loop(n):
    s = 0
    for i in range(n):
        a = i + 1
        x = (a ** 3 ** 2) ** 2 % 1000003  # HOT
        s += a + x
    return s


def deep(n, f):
    return f() if n == 0 else deep(n - 1, f)


def session(fn, interval_ns=1_000_000, mode=0, exclude=()):
    ns.set_native_ids({t.ident: t.native_id for t in threading.enumerate()})
    ns.start(interval_ns, mode, 2048, 1 << 22, list(exclude))
    t0 = time.perf_counter()
    try:
        fn()
    finally:
        ns.stop()
    wall = time.perf_counter() - t0
    data, stacks, codes, stats = ns.drain()
    objs = dict(zip(codes, ns.resolve_codes(codes)))
    st = dict(stacks)
    out = []
    for t, tid, w, sf, gen in struct.iter_unpack("qQqqQ", data):
        raw = st[sf & ((1 << 40) - 1)]
        frames = [(objs.get(raw[i]), raw[i + 1]) for i in range(0, len(raw), 2)]
        out.append((t, tid, w, sf >> 40, frames))
    return out, stats, wall


def line_of(code, off):
    for s, e, ln in code.co_lines():
        if s <= off < e:
            return ln
    return code.co_firstlineno


def main():
    global ns
    sys.path.insert(0, sys.argv[1])
    import _nativesampler

    ns = _nativesampler
    ok, how = ns.available()
    check("available", ok, how)
    if not ok:
        sys.exit(1)

    # 1. heavy vs tiny: truth = each timed alone
    n = 200_000
    t = time.perf_counter()
    for i in range(n):
        heavy(i)
    th = time.perf_counter() - t
    t = time.perf_counter()
    for i in range(n):
        tiny(i)
    tt = time.perf_counter() - t
    truth = th / (th + tt)

    def both():
        end = time.perf_counter() + 1.0
        while time.perf_counter() < end:
            for i in range(500):
                heavy(i)
                tiny(i)

    smp, stats, _ = session(both)
    c = Counter(fr[4][0][0].co_name for fr in smp if fr[4] and fr[4][0][0] is not None)
    share = c["heavy"] / max(c["heavy"] + c["tiny"], 1)
    check("heavy_vs_tiny", abs(share - truth) < 0.15, f"heavy share {share:.3f} truth {truth:.3f} ({c})")
    check("no_torn_majority", stats["torn"] < 0.05 * max(stats["ticks"], 1), str(stats))

    # 2. the hot line of a loop gets most of the function's samples
    hot_line = next(i + 1 for i, ln in enumerate(open(__file__).read().splitlines()) if ln.rstrip().endswith("# HOT"))
    smp, stats, _ = session(lambda: [hot_loop(20_000) for _ in range(15)])
    lines = Counter(line_of(fr[4][0][0], fr[4][0][1]) for fr in smp
                    if fr[4] and fr[4][0][0] is not None and fr[4][0][0].co_name == "hot_loop")
    hot = lines[hot_line] / max(sum(lines.values()), 1)
    check("hot_line", hot >= 0.6, f"hot line share {hot:.3f} ({dict(lines)})")

    # 3. busy threads: each sampled at most ticks, at a good share of the requested rate
    def spin(sec):
        end = time.perf_counter() + sec
        while time.perf_counter() < end:
            pass

    def threads():
        ts = [threading.Thread(target=spin, args=(0.8,), name=f"w{i}") for i in range(3)]
        for x in ts:
            x.start()
        ns.set_native_ids({t.ident: t.native_id for t in threading.enumerate()})
        for x in ts:
            x.join()

    smp, stats, wall = session(threads)
    per = Counter(s[1] for s in smp if any(f[0] is not None and f[0].co_name == "spin" for f in s[4]))
    rates = sorted(v / 0.8 for v in per.values())
    check("busy_threads", len(rates) == 3 and rates[0] >= 400, f"per-thread Hz {[round(r) for r in rates]}")

    # 4. deep recursion: full depth recorded
    smp, stats, _ = session(lambda: deep(400, lambda: spin(0.3)))
    depth = max((len(s[4]) for s in smp), default=0)
    check("deep_recursion", depth >= 400, f"max depth {depth}, torn {stats['torn']}")

    # 5. safety: threads starting and ending constantly while sampled at 5 kHz (freed thread states
    #    and frames read mid-change must never crash the process)
    def churn():
        end = time.perf_counter() + 1.0
        while time.perf_counter() < end:
            ts = [threading.Thread(target=deep, args=(30, lambda: sum(range(200)))) for _ in range(8)]
            for x in ts:
                x.start()
            for x in ts:
                x.join()

    smp, stats, _ = session(churn, interval_ns=200_000)
    check("thread_churn_safe", stats["ticks"] > 100, f"ticks {stats['ticks']} samples {len(smp)} torn {stats['torn']}")

    # 6. modes: cpu leaves a sleeping thread out, gil samples one holder at a time
    def sleeper_and_spinner():
        t = threading.Thread(target=time.sleep, args=(0.5,), name="sleeper")
        t.start()
        ns.set_native_ids({x.ident: x.native_id for x in threading.enumerate()})
        spin(0.5)
        t.join()

    smp, _, _ = session(sleeper_and_spinner)
    idle = Counter((s[1], bool(s[3] & ns.FLAG_IDLE)) for s in smp)
    main_id = threading.main_thread().ident
    sleeper_idle = sum(v for (tid, i), v in idle.items() if tid != main_id and i)
    sleeper_all = sum(v for (tid, i), v in idle.items() if tid != main_id)
    check("wall_marks_idle", sleeper_all > 0 and sleeper_idle >= 0.8 * sleeper_all,
          f"sleeper idle {sleeper_idle}/{sleeper_all}")
    smp, _, _ = session(sleeper_and_spinner, mode=ns.MODE_CPU)
    others = sum(1 for s in smp if s[1] != main_id)
    mains = sum(1 for s in smp if s[1] == main_id)
    check("cpu_mode_skips_sleepers", mains > 100 and others <= 0.1 * mains, f"main {mains} sleeper {others}")
    smp, _, _ = session(threads, mode=ns.MODE_GIL)
    by_t = Counter(s[0] for s in smp)
    check("gil_mode_one_holder", len(smp) > 50 and max(by_t.values()) == 1, f"samples {len(smp)}")

    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
