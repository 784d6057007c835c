"""The native cpu engine: accuracy against independently measured truths, every CPython here, safety.

Tolerances are wide for a loaded 2-core machine; benchmarks/cpu_accuracy.py prints the tight figures.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import omniprof
from omniprof.backends.cpu import api
from omniprof.backends.cpu.native import native_available
from tests.tools import build_extension, cpython_interpreters

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timing


@pytest.fixture(autouse=True)
def fresh_buffer():
    api.clear()
    yield
    api.clear()


def leaf_name(part, s):
    return part.frames[part.stacks[s.stack_id][-1]].name.rsplit(".", 1)[-1]


def names(part, s):
    return [part.frames[i].name.rsplit(".", 1)[-1] for i in part.stacks[s.stack_id]]


def native_profiler(**opts):
    return omniprof.Profiler(backend="cpu", backend_options={"cpu": {"engine": "native", **opts}})


def test_native_is_the_default_here():
    """engine='auto' picks the native engine on this machine (Linux, CPython 3.10-3.13, built)."""
    assert native_available()[0], native_available()[1]
    with omniprof.Profiler(backend="cpu") as prof:
        sum(range(100_000))
    assert prof.result.part("cpu").summaries["overhead"]["engine"] == "native"


# -- every CPython here --------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("version,exe", cpython_interpreters(), ids=[v for v, _ in cpython_interpreters()])
def test_engine_on_every_cpython(version, exe, tmp_path):
    """Builds the engine with that interpreter's own headers and runs tests/tools/native_engine_check.py
    under it: heavy vs tiny against each timed alone, the hot line, 3 busy threads at >= 40% of the
    rate, 400-deep recursion, 5 kHz sampling through constant thread churn without a crash, and the
    wall / cpu / gil modes."""
    build_extension(exe, ROOT / "omniprof/backends/cpu/_nativesampler.c", tmp_path)
    run = subprocess.run([exe, str(ROOT / "tests/tools/native_engine_check.py"), str(tmp_path)],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, f"{version}:\n{run.stdout}\n{run.stderr[-3000:]}"
    assert run.stdout.count("OK ") == 10, run.stdout
    assert "OK   available process_vm_readv" in run.stdout


def test_pipe_fallback_reads(tmp_path):
    """Where process_vm_readv is refused (seccomp), reads go through a pipe: same checks pass."""
    env = {**os.environ, "OMNIPROF_NATIVE_READS": "pipe"}
    from omniprof.backends.cpu import _nativesampler

    run = subprocess.run([sys.executable, str(ROOT / "tests/tools/native_engine_check.py"),
                          os.path.dirname(_nativesampler.__file__)], capture_output=True, text=True, timeout=180,
                         env=env)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert "OK   available pipe copies" in run.stdout


# -- accuracy (this interpreter, through the backend) --------------------------------------------
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


def _time_alone(f, n=100_000):
    t = time.perf_counter()
    for i in range(n):
        f(i)
    return time.perf_counter() - t


def test_heavy_vs_tiny_self_time():
    """heavy() and tiny() called alternately: heavy's share of their self samples is the share of
    their times measured alone (the signal engine gave tiny 85%)."""
    th, tt = _time_alone(heavy), _time_alone(tiny)
    truth = th / (th + tt)
    with native_profiler() as prof:
        end = time.perf_counter() + 0.8
        while time.perf_counter() < end:
            for i in range(500):
                heavy(i)
                tiny(i)
    part = prof.result.part("cpu")
    w = {"heavy": 0, "tiny": 0}
    for s in part.samples:
        n = leaf_name(part, s)
        if n in w:
            w[n] += s.weight_ns
    share = w["heavy"] / (w["heavy"] + w["tiny"])
    assert abs(share - truth) < 0.15, (share, truth)


def c_heavy(data, blob):
    a = sorted(data)
    b = hashlib.sha256(blob).digest()
    s = 0
    for i in range(400_000):
        s += i
    return a, b, s


def test_c_calls_by_count_and_by_time():
    """sorted() on 600k floats, sha256 of 40 MB and a Python loop: each line's share of the samples
    (by count and by time) is its time measured alone (the signal engine gave the loop 91%)."""
    rng = random.Random(1)
    data = [rng.random() for _ in range(600_000)]
    blob = os.urandom(40 * 2**20)
    truth = {"sort": float("inf"), "sha": float("inf"), "loop": float("inf")}
    for _ in range(3):  # best of 3: other processes on this machine only add time
        t0 = time.perf_counter()
        sorted(data)
        t1 = time.perf_counter()
        hashlib.sha256(blob).digest()
        t2 = time.perf_counter()
        s = 0
        for i in range(400_000):
            s += i
        t3 = time.perf_counter()
        for k, v in (("sort", t1 - t0), ("sha", t2 - t1), ("loop", t3 - t2)):
            truth[k] = min(truth[k], v)
    total = sum(truth.values())
    lines = c_heavy.__code__.co_firstlineno
    which = {lines + 1: "sort", lines + 2: "sha", lines + 4: "loop", lines + 5: "loop"}
    with native_profiler() as prof:
        for _ in range(3):
            c_heavy(data, blob)
    part = prof.result.part("cpu")
    cnt = dict.fromkeys(truth, 0)
    tm = dict.fromkeys(truth, 0)
    for smp in part.samples:
        fr = part.frames[part.stacks[smp.stack_id][-1]]
        if fr.name.endswith("c_heavy") and fr.line in which:
            cnt[which[fr.line]] += 1
            tm[which[fr.line]] += smp.weight_ns
    for k in truth:
        share_t, share_c = truth[k] / total, cnt[k] / sum(cnt.values())
        assert abs(share_c - share_t) < 0.15, (k, cnt, truth)
        assert abs(tm[k] / sum(tm.values()) - share_t) < 0.15, (k, tm, truth)


def spin(sec):
    end = time.perf_counter() + sec
    while time.perf_counter() < end:
        pass


def test_busy_threads_each_sampled_near_the_rate():
    """Three CPU-bound threads for 1 s while main joins: each sampled at >= 40% of the requested
    rate in wall mode (the signal engine: 3-22 samples/s in all)."""
    ts = [threading.Thread(target=spin, args=(1.0,), name=f"busy{i}") for i in range(3)]
    with native_profiler() as prof:
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    part = prof.result.part("cpu")
    names_ = {t.thread_id: t.name for t in part.threads}
    per = {}
    for s in part.samples:
        if "spin" in names(part, s):
            per[names_[s.thread_id]] = per.get(names_[s.thread_id], 0) + 1
    assert set(per) == {"busy0", "busy1", "busy2"}, per
    assert min(per.values()) >= 0.4 * 1000 * 1.0, per


def test_late_thread_weighted_from_its_own_start():
    """A thread that lives 0.2 s, started 0.4 s into the session, is reported with ~0.2 s (the
    signal engine: 0.8 s), and its name survives its end before stop()."""
    with native_profiler() as prof:
        spin(0.4)
        t = threading.Thread(target=spin, args=(0.2,), name="late")
        t0 = time.perf_counter()
        t.start()
        t.join()
        lived = time.perf_counter() - t0
        spin(0.2)
    part = prof.result.part("cpu")
    late = [th.thread_id for th in part.threads if th.name == "late"]
    assert late, [th.name for th in part.threads]
    total = sum(s.weight_ns for s in part.samples if s.thread_id == late[0]) / 1e9
    assert 0.5 * lived < total < 1.5 * lived, (total, lived)


def test_asyncio_task_shares():
    """Two tasks doing 1x and 3x work: samples carry their task, time shares follow the work
    timed alone."""

    async def crunch(n):
        for _ in range(4):
            spin(n)
            await asyncio.sleep(0)

    async def main():
        await asyncio.gather(asyncio.create_task(crunch(0.05), name="small"),
                             asyncio.create_task(crunch(0.15), name="big"))

    with native_profiler() as prof:
        asyncio.run(main())
    part = prof.result.part("cpu")
    tn = {t.task_id: t.name for t in part.tasks}
    w = {"small": 0, "big": 0}
    for s in part.samples:
        if s.task_id is not None and tn.get(s.task_id) in w and "spin" in names(part, s):
            w[tn[s.task_id]] += s.weight_ns
    assert w["small"] > 0 and w["big"] > 0, w
    assert 0.6 < w["big"] / (w["big"] + w["small"]) < 0.9, w


def _deep(n):
    return spin(0.3) if n == 0 else _deep(n - 1)


def test_deep_recursion_full_depth():
    """A 300-deep recursion is recorded whole (no truncation, no torn majority)."""
    with native_profiler() as prof:
        _deep(300)
    part = prof.result.part("cpu")
    depth = max(sum(1 for i in part.stacks[s.stack_id] if part.frames[i].name.endswith("_deep")) for s in part.samples)
    assert depth == 301
    assert part.summaries["overhead"]["torn_samples"] < 0.05 * len(part.samples) + 2


def test_idle_threads_marked_and_own_frames_absent():
    """wall mode marks a sleeping thread idle; cpu mode leaves it out; no omniprof frame appears."""
    with native_profiler() as prof:
        t = threading.Thread(target=time.sleep, args=(0.3,), name="napper")
        t.start()
        spin(0.3)
        t.join()
    part = prof.result.part("cpu")
    nap = [th.thread_id for th in part.threads if th.name == "napper"][0]
    nap_s = [s for s in part.samples if s.thread_id == nap]
    assert nap_s and sum(s.idle for s in nap_s) >= 0.8 * len(nap_s)
    assert not any(f.file and "/omniprof/" in f.file and "/tests/" not in f.file for f in part.frames), \
        [f for f in part.frames if "/omniprof/" in (f.file or "")]
    assert part.summaries["overhead"]["engine_cpu_ns"] > 0
    with native_profiler(mode="cpu") as prof2:
        t = threading.Thread(target=time.sleep, args=(0.3,), name="napper")
        t.start()
        spin(0.3)
        t.join()
    p2 = prof2.result.part("cpu")
    nap2 = {th.thread_id for th in p2.threads if th.name == "napper"}
    assert sum(1 for s in p2.samples if s.thread_id in nap2) <= 0.1 * len(p2.samples)


def test_mode_needs_native_engine():
    with pytest.raises(omniprof.BackendError, match="needs the native engine"):
        with omniprof.Profiler(backend="cpu", backend_options={"cpu": {"engine": "signal", "mode": "cpu"}}):
            pass


def test_fallback_warns_naming_the_bias():
    """Without the extension, auto falls back to the signal engine and the warning names the bias."""
    code = ("import warnings, omniprof\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    with omniprof.Profiler(backend='cpu') as p:\n"
            "        sum(range(10**5))\n"
            "print(p.result.part('cpu').summaries['overhead']['engine'])\n"
            "print([str(x.message) for x in w])\n")
    env = {**os.environ, "OMNIPROF_NO_NATIVE": "1", "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "signal"
    assert "native engine cannot run here" in r.stdout and "next bytecode boundary" in r.stdout


def test_peek_during_a_long_c_call_is_full_rate():
    """SIGUSR1 while the main thread is inside one long C call (sorted of 4M floats, GIL held):
    the peek samples at the requested rate during the call (the signal engine: 1-2 samples after it)."""
    code = textwrap.dedent("""
        import os, random, signal, sys, threading, time, omniprof
        omniprof.enable_peek()
        omniprof.set_peek_duration(0.3)
        data = [random.random() for _ in range(4_000_000)]
        def long_c_call():
            return sorted(data)
        print("READY", flush=True)
        time.sleep(0.2)
        t = time.perf_counter()
        long_c_call()
        print("CALL", time.perf_counter() - t, flush=True)
        time.sleep(0.5)
        omniprof.disable_peek()
    """)
    import signal

    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert proc.stdout.readline().strip() == "READY"
        time.sleep(0.3)  # from outside: inside the process no Python code runs during the C call
        proc.send_signal(signal.SIGUSR1)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    r = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    assert r.returncode == 0, r.stderr
    call_s = float(r.stdout.split("CALL", 1)[1].split()[0])
    assert call_s > 0.4, "the C call must outlast the peek for this test to mean anything"
    head = r.stderr.split("omniprof peek: profile of", 1)
    assert "long_c_call" in head[0], r.stderr
    first = head[1].splitlines()[1]
    n = int(first.split(" samples")[0])
    assert n >= 0.4 * 300, r.stderr  # 0.3 s at 1 kHz, loaded machine
    assert "long_c_call" in head[1]
