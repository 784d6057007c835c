"""Time the process is stopped (SIGSTOP, Ctrl-Z, a debugger, a frozen container) is a counted gap,
never the running function's time (issue 31, F14). A real program with a Profiler is stopped by a
helper process for a measured while as it runs ``during()``; the stop's length is measured by the
helper, ``during()``'s wall time by the program itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = """
import json, os, signal, subprocess, sys, time
import omniprof

engine, mode = sys.argv[1], sys.argv[2]
STOPPER = '''
import os, signal, sys, time
pid = int(sys.argv[1])
sys.stdin.readline()
time.sleep(0.2)
t0 = time.perf_counter()
os.kill(pid, signal.SIGSTOP)
time.sleep(2.0)
os.kill(pid, signal.SIGCONT)
print(time.perf_counter() - t0, flush=True)
'''
helper = subprocess.Popen([sys.executable, "-c", STOPPER, str(os.getpid())], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True)

def during():
    t0 = time.perf_counter()
    helper.stdin.write("go\\n")
    helper.stdin.flush()
    while time.perf_counter() - t0 < 3.0:
        sum(i * i for i in range(1000))
    return time.perf_counter() - t0

with omniprof.Profiler(backend="cpu", backend_options={"cpu": {"engine": engine, "mode": mode}}) as prof:
    wall_s = during()
stop_s = float(helper.stdout.readline())
helper.wait()
part = prof.result.part("cpu")
names = [f.name for f in part.frames]
ns = sum(s.weight_ns for s in part.samples if any(names[i] == "during" for i in part.stacks[s.stack_id]))
stopped = [l.count for l in part.losses if l.kind == "process_stopped"]
print(json.dumps({"wall_s": wall_s, "stop_s": stop_s, "during_s": ns / 1e9, "stopped_s": sum(stopped) / 1e9}))
"""


@pytest.mark.parametrize("engine,mode", [("native", "wall"), ("native", "cpu"), ("thread", "wall"),
                                         ("signal", "wall")])
def test_stopped_time_is_a_gap_not_the_functions_time(tmp_path, engine, mode, tally):
    (tmp_path / "prog.py").write_text(PROGRAM)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run([sys.executable, "prog.py", engine, mode], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    tally.fault("SIGSTOP")
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    # during() ran wall_s, of which stop_s stopped: at most wall_s - stop_s is its own (a busy machine
    # only makes it less in cpu mode); the stop itself is counted as a loss, about as long as measured.
    assert got["during_s"] < got["wall_s"] - 0.5 * got["stop_s"], got
    assert 0.5 * got["stop_s"] < got["stopped_s"] < 1.5 * got["stop_s"], got
