"""Forks and signals: omniprof's handlers, timers and sessions belong to the process that set them up.

A forked child (``os.fork()``, ``multiprocessing`` with the fork start method) gets the handlers
it would have under plain python and writes nothing of the parent's session; a second Ctrl-C while
the profiler stops keeps the result. Every case runs a real ``omniprof run`` child process (or the
Profiler in this process, checked against the kernel's own timer state) and compares with the same
program under plain python.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import omniprof
from omniprof.core.profiler import PARTIAL_FILENAME, RESULT_FILENAME, Profiler

ROOT = Path(__file__).resolve().parents[2]


def _run(args: list[str], cwd: Path, *, timeout: float = 90, omniprof_run: bool = True
         ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "omniprof", "run", *args] if omniprof_run else [sys.executable, *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


TERMINATE = """
import multiprocessing as mp, time
def sleeper():
    time.sleep(30)
if __name__ == "__main__":
    mp.set_start_method("fork")
    p = mp.Process(target=sleeper)
    p.start()
    time.sleep(0.3)
    p.terminate()
    p.join()
    print("exitcode", p.exitcode)
"""


def test_process_terminate_gives_minus_15_as_under_python(tmp_path, tally):
    """``Process.terminate()`` on a forked child: -15 under python, and the same under omniprof
    (the child got SIGTERM's default action back, not omniprof's unwinding handler)."""
    (tmp_path / "term.py").write_text(TERMINATE)
    plain = _run(["term.py"], tmp_path, omniprof_run=False)
    prof = _run(["-r", "json", "-o", "out", "term.py"], tmp_path)
    tally.fault("Process.terminate() on a forked child")
    assert plain.stdout.strip() == "exitcode -15"
    assert prof.stdout.strip() == "exitcode -15", prof.stderr
    assert "Terminated" not in prof.stderr and "Traceback" not in prof.stderr


POOL = """
import multiprocessing as mp, time
def square(x):
    return x * x
def slow(x):
    time.sleep(5)
if __name__ == "__main__":
    mp.set_start_method("fork")
    for i in range(5):
        with mp.Pool(3) as p:              # __exit__ calls terminate(): SIGTERM to every worker
            assert sum(p.map(square, range(200))) == sum(x * x for x in range(200))
        with mp.Pool(3) as p:              # terminated while the workers are busy
            p.map_async(slow, range(3))
            time.sleep(0.05)
    print("pools done", flush=True)
"""


def test_fork_pool_terminate_never_hangs(tmp_path, tally):
    """``with multiprocessing.Pool() as p`` (fork) ten times, half of them terminated mid-task: the
    run ends (plain python's output and status) and the workers leave no traceback."""
    (tmp_path / "pool.py").write_text(POOL)
    plain = _run(["pool.py"], tmp_path, omniprof_run=False)
    prof = _run(["--logdir", "L", "-r", "json", "-o", "out", "pool.py"], tmp_path, timeout=120)
    tally.fault("Pool.terminate() (fork), 10 pools")
    assert (plain.returncode, plain.stdout) == (0, "pools done\n")
    assert (prof.returncode, prof.stdout) == (0, "pools done\n"), prof.stderr
    assert "Traceback" not in prof.stderr and "Terminated" not in prof.stderr
    assert len(list((tmp_path / "L").glob(f"plugins/profile/*/{RESULT_FILENAME}"))) == 1


FORK = """
import os, time
def spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
def parent_work():
    spin(0.6)
def child_work():
    spin(0.2)
parent_work()
pid = os.fork()
if pid == 0:
    child_work()
    print("child", os.getpid(), flush=True)
else:
    _, status = os.waitpid(pid, 0)
    parent_work()
    print("parent", os.getpid(), "child status", status, flush=True)
"""


def test_fork_in_workload_child_writes_nothing(tmp_path, tally):
    """``os.fork()`` in the program: the child prints what the program prints and nothing of
    omniprof's, saves and reports nothing; the result on disk is the parent's (its pid, its
    1.2 s of work), and there is one result and one report."""
    (tmp_path / "forky.py").write_text(FORK)
    p = _run(["--logdir", "L", "-r", "json,table", "-o", "out", "forky.py"], tmp_path)
    tally.fault("os.fork() in the workload")
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    child = [x for x in lines if x.startswith("child ")]
    parent = [x for x in lines if x.startswith("parent ")]
    assert len(child) == 1 and len(parent) == 1 and parent[0].endswith("child status 0")
    parent_pid = int(parent[0].split()[1])
    assert p.stdout.count("== omniprof cpu") == 1  # one table, the parent's
    assert p.stderr.count("report written") == 1 and p.stderr.count("session saved") == 1, p.stderr
    results = list((tmp_path / "L").glob("plugins/profile/*/*.json"))
    assert [x.name for x in results] == [RESULT_FILENAME]
    assert sorted(x.name for x in (tmp_path / "out").iterdir()) == [RESULT_FILENAME]
    r = omniprof.load(results[0])
    assert r.metadata.pid == parent_pid
    cpu = r.part("cpu")
    by_func = {}
    for s in cpu.samples:
        for f in {cpu.frames[i].name for i in cpu.stacks[s.stack_id]}:
            by_func[f] = by_func.get(f, 0) + s.weight_ns
    # The parent's own work (2 x 0.6 s measured by the program's clock) is there, the child's is not.
    assert by_func.get("parent_work", 0) >= 1.0e9
    assert "child_work" not in by_func


def test_second_sigint_while_stopping_keeps_result_and_disarms_timer(registry_with, tmp_path, tally):
    """A Ctrl-C that arrives while the profiler stops (here: sent by a backend's stop()) waits
    until the result is saved, then raises KeyboardInterrupt; the cpu sampler's timer is disarmed
    and its SIGALRM handler given back (read from the kernel and the signal module)."""
    registry_with(("backend", "sigint", "tests.reliability.fault_plugins:SigintAtStopBackend"))
    old_alrm = signal.getsignal(signal.SIGALRM)
    prof = Profiler(backend=["sigint", "cpu"], logdir=tmp_path, backend_options={"cpu": {"engine": "signal"}})
    prof.start()
    sum(range(200_000))
    try:
        with pytest.raises(KeyboardInterrupt):
            prof.stop()
        tally.fault("SIGINT while stopping")
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
        assert signal.getsignal(signal.SIGALRM) is old_alrm
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert [p.backend for p in prof.result.parts] == ["sigint", "cpu"]
        saved = list(tmp_path.glob(f"plugins/profile/*/{RESULT_FILENAME}"))
        assert len(saved) == 1 and omniprof.load(saved[0]) == prof.result
        assert not list(tmp_path.glob(f"plugins/profile/*/{PARTIAL_FILENAME}"))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_alrm)


DOUBLE_SIGINT = """
import os, signal, sys, threading, time
import omniprof
delay_s = float(sys.argv[1])
def ctrl_c_twice():
    time.sleep(0.4)
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(delay_s)
    os.kill(os.getpid(), signal.SIGINT)
threading.Thread(target=ctrl_c_twice, daemon=True).start()
end = time.perf_counter() + 30
while time.perf_counter() < end:
    with omniprof.annotate("chunk"):
        sum(i * i for i in range(2000))
"""


@pytest.mark.parametrize("engine,delay_ms", [("native", 0), ("native", 1), ("native", 3), ("native", 10),
                                             ("native", 30), ("signal", 0), ("signal", 1), ("signal", 3),
                                             ("signal", 10), ("signal", 30)])
def test_double_ctrl_c_exits_130_and_keeps_result(tmp_path, engine, delay_ms, tally):
    """Two SIGINTs ``delay_ms`` apart (the second lands while omniprof stops): exit 130 as python's
    Ctrl-C, never death by SIGALRM (-14), and the result saved and reported. The signal engine is
    the one whose timer (SIGALRM) a half-done stop left armed; the native default has none."""
    (tmp_path / "cc.py").write_text(DOUBLE_SIGINT)
    p = _run(["-O", f"cpu.engine={engine}", "--logdir", "L", "-r", "json", "-o", "out", "cc.py",
              str(delay_ms / 1000)], tmp_path)
    tally.fault("double SIGINT")
    assert p.returncode == 130, (p.returncode, p.stderr[-2000:])
    saved = list((tmp_path / "L").glob(f"plugins/profile/*/{RESULT_FILENAME}"))
    assert len(saved) == 1, p.stderr
    r = omniprof.load(saved[0])
    assert r.partial and r.part("cpu").samples
    assert (tmp_path / "out" / RESULT_FILENAME).is_file()


def test_fork_resets_handlers_in_child(tmp_path, tally):
    """In-process: a child forked while the cpu signal engine, peek and the CLI's SIGTERM handler
    are installed has python's defaults back (checked in the child, reported by its exit status)."""
    code = textwrap.dedent("""
        import os, signal, sys
        import omniprof
        from omniprof.backends.cpu import api
        from omniprof.runner import sigterm_unwinds as _sigterm_unwinds
        api.enable_peek()
        with _sigterm_unwinds(), omniprof.Profiler(backend="cpu", backend_options={"cpu": {"engine": "signal"}}):
            sum(range(100000))
            pid = os.fork()
            if pid == 0:
                ok = (signal.getsignal(signal.SIGALRM) == signal.SIG_DFL
                      and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
                      and signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL
                      and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0))
                os._exit(0 if ok else 3)
            _, status = os.waitpid(pid, 0)
            print(os.waitstatus_to_exitcode(status))
            assert signal.getsignal(signal.SIGALRM) not in (signal.SIG_DFL, None)  # the parent keeps sampling
        api.disable_peek()
    """)
    (tmp_path / "c.py").write_text(code)
    p = _run(["c.py"], tmp_path, omniprof_run=False)
    tally.fault("fork with handlers installed")
    assert (p.returncode, p.stdout.strip()) == (0, "0"), p.stderr


# A child killed before it has run a line of python: its parent sends SIGTERM right after fork()
# returns (Linux runs the parent first), which is what Pool.terminate() does to a worker it forked
# a moment ago. ``mode`` picks what is installed in the parent: nothing (plain python), the CLI's
# SIGTERM handler, or that handler while the profiler stops (deferred_signals) -- and ``thread``
# forks from a thread other than the main one (multiprocessing's pool handler thread does).
KILL_AT_BIRTH = """
import os, signal, sys, threading, time, contextlib
from omniprof.core.forks import deferred_signals
from omniprof.runner import sigterm_unwinds
mode, where, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
results = []
def forks():
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            time.sleep(0.3)
            os._exit(7)
        os.kill(pid, signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
        results.append(os.waitstatus_to_exitcode(status))
    # and one more that reports the handler it got (after the after-fork callbacks ran)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(w, b"default" if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL else b"python")
        os._exit(0)
    os.waitpid(pid, 0)
    results.append(os.read(r, 100).decode())
outer = sigterm_unwinds() if mode != "plain" else contextlib.nullcontext()
inner = deferred_signals() if mode == "deferred" else contextlib.nullcontext()
with outer, inner:
    if where == "thread":
        t = threading.Thread(target=forks)
        t.start()
        t.join()
    else:
        forks()
print(sorted(set(map(str, results))))
"""


@pytest.mark.parametrize(("mode", "where"), [("plain", "main"), ("owned", "main"), ("owned", "thread"),
                                             ("deferred", "thread")])
def test_child_killed_at_birth_dies_of_sigterm(tmp_path, mode, where, tally):
    """SIGTERM sent to a child before it has run any python (a Pool terminated just after it
    forked a worker): plain python's child dies with -15, and so does the child of a process
    holding omniprof's SIGTERM handler -- forked from the main thread, from another thread, or
    while the profiler stops. The kernel hands the parent's handler to the child, so without
    blocking the signal across the fork the child noted it in Python's C handler and the
    interpreter's after-fork cleanup dropped it: 49 of 50 such children lived on (the Pool hang),
    and a child forked while the profiler stopped kept its SIGTERM handler."""
    (tmp_path / "k.py").write_text(KILL_AT_BIRTH)
    p = _run(["k.py", mode, where, "30"], tmp_path, omniprof_run=False)
    tally.fault("SIGTERM to a child before it runs")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "['-15', 'default']", p.stderr[-2000:]
    assert "Traceback" not in p.stderr and "Terminated" not in p.stderr


# A child forked while a session records starts a session of its own: it must find the engine free
# (the native engine's thread, the allocation hooks are the parent's) and record its own work only.
OWN_SESSION = """
import os, sys, time, json
import omniprof
backend, engine = sys.argv[1], sys.argv[2]
opts = {backend: {"engine": engine, **({"sample_rate": 0.02} if backend == "memory" else {})}}
keep = []  # alive at the end: the tracemalloc engine reports live blocks
def work(s):
    end = time.perf_counter() + s
    while time.perf_counter() < end:
        keep.append(bytearray(2000))
        sum(range(500))
def parent_work(): return work(0.4)
def child_work(): return work(0.4)
# tracemalloc names a frame file:line; the one-line functions are told apart by their line
label = {f: f for f in ("parent_work", "child_work")}
label.update({f"own.py:{fn.__code__.co_firstlineno}": fn.__name__ for fn in (parent_work, child_work)})
def names(res):
    part = res.parts[0]
    items = part.samples if backend == "cpu" else part.allocations
    seen = {part.frames[i].name for it in items for i in part.stacks[it.stack_id]}
    seen = {n.rsplit("/", 1)[-1] for n in seen}
    return sorted({label[n] for n in seen if n in label})
with omniprof.Profiler(backend=backend, backend_options=opts) as prof:
    parent_work()
    pid = os.fork()
    if pid == 0:
        try:
            with omniprof.Profiler(backend=backend, backend_options=opts) as cp:
                child_work()
            print("child", json.dumps(names(cp.result)), flush=True)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    parent_work()
print("parent", json.dumps(names(prof.result)), flush=True)
"""


@pytest.mark.parametrize(("backend", "engine"), [("cpu", "native"), ("cpu", "signal"), ("cpu", "thread"),
                                                 ("memory", "native"), ("memory", "tracemalloc")])
def test_forked_child_profiles_itself(tmp_path, backend, engine, tally):
    """A child forked while the parent records starts its own Profiler with the same engine: it
    starts (the native engine's thread and the allocation hooks are not the child's), its result
    holds its own function only, and the parent's holds the parent's only. The native engine said
    "already running" and the memory sampler "already running" in the child before."""
    (tmp_path / "own.py").write_text(OWN_SESSION)
    p = _run(["own.py", backend, engine], tmp_path, omniprof_run=False, timeout=60)
    tally.fault(f"forked child profiles itself ({backend} {engine})")
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.splitlines() == ['child ["child_work"]', 'parent ["parent_work"]'], p.stderr[-2000:]


CHDIR = """
import os, tempfile
sum(range(300000))
os.chdir(tempfile.mkdtemp())
sum(range(300000))
"""


@pytest.mark.parametrize("config", [False, True])
def test_relative_outdir_and_logdir_survive_a_chdir(tmp_path, config, tally):
    """A program that changes directory: relative ``-o`` and ``--logdir`` still mean the directory
    omniprof was started in (plain and config-driven runs)."""
    (tmp_path / "cd.py").write_text(CHDIR)
    if config:
        (tmp_path / "omniprof.toml").write_text('script = "cd.py"\n')
        p = _run(["--logdir", "L", "-r", "json", "-o", "out"], tmp_path)
    else:
        p = _run(["--logdir", "L", "-r", "json", "-o", "out", "cd.py"], tmp_path)
    tally.check("program chdirs", "outputs in place" if p.returncode == 0 else "lost")
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "out" / RESULT_FILENAME).is_file(), p.stderr
    assert len(list((tmp_path / "L").glob(f"plugins/profile/*/{RESULT_FILENAME}"))) == 1, p.stderr


@pytest.mark.parametrize("value", ["1e-300", "1e-7", "5e-6"])
def test_cpu_interval_below_the_sampler_resolution_refused_before_running(tmp_path, value, tally):
    """``-O cpu.interval_s`` below 10 us: refused with one line before the program runs (before:
    1e-300 silently sampled once a second, 1e-7 died of RecursionError)."""
    (tmp_path / "w.py").write_text("open('RAN', 'w').close()\n")
    p = _run(["-O", f"cpu.interval_s={value}", "w.py"], tmp_path)
    tally.check("cpu.interval_s too small", "refused")
    assert p.returncode == 2 and not (tmp_path / "RAN").exists()
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("omniprof: error: ")
    assert lines[0].endswith(f"backend 'cpu': 'interval_s' must be >= 1e-05 (100 kHz, the fastest the sampler runs; "
                             f"got {float(value)!r})")
