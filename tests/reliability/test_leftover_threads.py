"""The program's leftover daemon threads at the end of a session (issue 31, F1): recording stops
for every backend before any backend builds its part, so nothing those threads do while omniprof
stops is recorded. A real program with a Profiler over cpu and memory, 4 daemon threads allocating
without end; the reference is the cpu part's own end (taken in its stop(), after its sampler
stopped and before it builds): before, the memory backend, stopped after cpu, kept recording the
threads' allocations all through the cpu part's build."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = """
import json, threading, time
import omniprof

def churn():
    kept = []
    while True:
        kept.append(bytearray(512))
        if len(kept) > 1000:
            kept.clear()

with omniprof.Profiler(backend=["cpu", "memory"], backend_options={"memory": {"sample_rate": 0.5}}) as prof:
    for _ in range(4):
        threading.Thread(target=churn, daemon=True).start()
    time.sleep(0.3)
cpu, mem = prof.result.part("cpu"), prof.result.part("memory")
print(json.dumps({"cpu_end_ns": cpu.end_ns, "mem_end_ns": mem.end_ns, "allocations": len(mem.allocations),
                  "after": sum(1 for a in mem.allocations if a.t_ns > cpu.end_ns)}))
"""


def test_no_allocation_of_leftover_threads_is_recorded_after_the_end(tmp_path):
    (tmp_path / "prog.py").write_text(PROGRAM)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run([sys.executable, "prog.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["allocations"] > 0, got  # the threads' allocations while the program ran are there
    assert got["mem_end_ns"] <= got["cpu_end_ns"], got  # memory stopped before cpu built anything
    assert got["after"] == 0, got
