"""`omniprof run` on a program that opens a fork-based multiprocessing.Pool ten times, N times over.

    python benchmarks/fork_pool_loop.py [--runs 50] [--timeout-s 60]

The program is tests/reliability/test_processes.py's POOL (five pools mapped then terminated by
``with``, five terminated while their workers are busy). A run passes when it prints "pools done",
exits 0 and writes no traceback; one still running after the timeout is a hang (killed, with its
workers). Before signals were blocked across fork() about 1 run in 5 hung: a worker SIGTERMed
before it had run any Python kept living, and Pool.terminate() waited for it forever.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--timeout-s", type=float, default=60.0)
    args = ap.parse_args()
    source = (ROOT / "tests" / "reliability" / "test_processes.py").read_text(encoding="utf-8")
    program = re.search(r'^POOL = """(.*?)"""', source, re.S | re.M)
    assert program is not None, "POOL not found in tests/reliability/test_processes.py"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    counts = {"ok": 0, "hang": 0, "failed": 0}
    walls = []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "pool.py").write_text(program.group(1), encoding="utf-8")
            t0 = time.perf_counter()
            p = subprocess.Popen([sys.executable, "-m", "omniprof", "run", "--logdir", "L", "-r", "json", "-o", "out",
                                  "pool.py"], cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, start_new_session=True)
            try:
                out, err = p.communicate(timeout=args.timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)  # the run and its pool workers
                p.communicate()
                counts["hang"] += 1
                print(f"run {i + 1}: hung (killed after {args.timeout_s:g} s)", flush=True)
                continue
            walls.append(time.perf_counter() - t0)
            if p.returncode == 0 and out == "pools done\n" and "Traceback" not in err:
                counts["ok"] += 1
            else:
                counts["failed"] += 1
                print(f"run {i + 1}: exit {p.returncode}: {err.strip()[-500:]}", flush=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    wall = f", median {sorted(walls)[len(walls) // 2]:.1f} s a run" if walls else ""
    print(f"fork pool loop: {args.runs} runs: {counts['ok']} ok, {counts['hang']} hung, {counts['failed']} failed"
          f"{wall} (load average {load:.1f})")
    return 0 if counts["ok"] == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
