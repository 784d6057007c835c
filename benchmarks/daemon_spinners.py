"""A program that ends with daemon threads still spinning: plain python against `omniprof run`.

    python benchmarks/daemon_spinners.py [--threads 20] [--timeout-s 600]

The program starts N daemon threads that allocate without end, works 0.5 s and returns. Python
kills the threads at exit; omniprof must stop, save and report meanwhile. Prints each wall time
beside plain python's (the anchor) and the load average. Issue 31 F1's target: <= 3x plain python.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROGRAM = """
import sys, threading, time
def spin():
    kept = []
    while True:
        kept.append(object())
        if len(kept) > 1000:
            kept.clear()
for _ in range(int(sys.argv[1])):
    threading.Thread(target=spin, daemon=True).start()
t0 = time.perf_counter()
while time.perf_counter() - t0 < 0.5:
    sum(range(1000))
"""


def _timed(cmd: list[str], cwd: str, timeout_s: float) -> tuple[float, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)
        status = f"exit {p.returncode}"
    except subprocess.TimeoutExpired:
        status = "timed out"
    return time.perf_counter() - t0, status


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=20)
    ap.add_argument("--timeout-s", type=float, default=600.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        Path(d, "spin.py").write_text(PROGRAM)
        n = str(args.threads)
        plain, _ = _timed([sys.executable, "spin.py", n], d, args.timeout_s)
        print(f"load average {os.getloadavg()[0]:.1f}; {args.threads} daemon threads")
        print(f"{'plain python':24s} {plain:7.1f} s   1.0x")
        for backend in ("cpu", "memory"):
            wall, status = _timed([sys.executable, "-m", "omniprof", "run", "-b", backend, "-r", "json", "-o", "out",
                                   "spin.py", n], d, args.timeout_s)
            print(f"{'omniprof run -b ' + backend:24s} {wall:7.1f} s {wall / plain:5.1f}x  ({status})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
