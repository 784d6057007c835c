"""Rank exits after a distributed Profiler stops, N times over: how many end in SIGABRT.

    python benchmarks/distributed_exit_loop.py [--runs 30] [--mode profiler|torch|docs]

``profiler`` and ``torch`` run tests/integration/exit_job.py under torchrun (2 ranks, gloo on
127.0.0.1), which makes the exit race certain on rank 1 (gloo's worker threads SCHED_IDLE on the
main thread's CPU, the GIL held by the last atexit callback): ``profiler`` ends the ranks' work
with a ``Profiler(distributed=True)`` session, ``torch`` with ``torch.distributed.all_gather_object``
(the control: it aborts every time). ``docs`` runs docs/distributed.md's torchrun example as it
stands, nothing forced: there the race is left to the machine's load (2 runs in 19 failed under
pytest on a loaded machine before the fix, none in about 130 on a quieter one).

A run fails when torchrun exits non-zero or a rank printed "terminate called". Before the
Profiler's collectives held their tensors until gloo's worker let go, ``profiler`` failed 29 runs
in 30 (load 4-6); after, none in 30.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _docs_train() -> str:
    text = (ROOT / "docs" / "distributed.md").read_text(encoding="utf-8")
    block = re.search(r"```python\n(.*?)```", text, re.S)
    assert block is not None and "TRAIN = '''" in block.group(1)
    return block.group(1).split("TRAIN = '''")[1].split("'''")[0]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--mode", choices=("profiler", "torch", "docs"), default="profiler")
    args = ap.parse_args()
    env = {**os.environ, "KINETO_LOG_LEVEL": "4",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    failed = 0
    for i in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="omniprof-exit-") as d:
            if args.mode == "docs":
                Path(d, "train.py").write_text(_docs_train())
                job = ["train.py"]
            else:
                job = [str(ROOT / "tests" / "integration" / "exit_job.py"), d, args.mode]
            proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                                   "--master-addr", "127.0.0.1", "--master-port", str(_port()), *job],
                                  cwd=d, env=env, capture_output=True, text=True, timeout=300)
        bad = proc.returncode != 0 or "terminate called" in proc.stderr
        failed += bad
        print(f"run {i + 1}: {'FAILED (rc %d)' % proc.returncode if bad else 'ok'}", flush=True)
    print(f"{args.mode}: {failed}/{args.runs} runs failed (load average {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
