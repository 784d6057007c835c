"""``Profiler.stop()`` from another thread than the one that started it (issue 31, F3): with the
torch backend it segfaulted the process (3 of 3), losing every backend's data. It is refused there
with a clear error, the session goes on recording, and the starting thread stops it. A real script
in a child process, since the failure was a crash."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = """
import threading
import omniprof
import torch

prof = omniprof.Profiler(backend=["torch", "cpu"]).start()
torch.ones(100).sum()
err = []
def other():
    try:
        prof.stop()
    except Exception as e:
        err.append(e)
t = threading.Thread(target=other)
t.start()
t.join()
print("refused:", type(err[0]).__name__, err[0])
torch.ones(100).sum()
prof.stop()
print("stopped:", [p.backend for p in prof.result.parts])
"""


def test_stop_from_another_thread_is_refused_with_torch(tmp_path):
    (tmp_path / "prog.py").write_text(PROGRAM)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "KINETO_LOG_LEVEL": "4"}
    p = subprocess.run([sys.executable, "prog.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    assert "refused: ProfilerStateError backend 'torch' must be stopped from the thread that started it" in p.stdout
    assert "stopped: ['torch', 'cpu']" in p.stdout, p.stdout
