"""Signals that end a run (issue 31, F14): a closed SSH session (SIGHUP) keeps the profile as
SIGTERM does, and Ctrl-C pressed twice leaves the program's own traceback and exit 130, whichever
engine records. Each case is a real ``omniprof run`` child process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import omniprof
from omniprof.core.profiler import RESULT_FILENAME

ROOT = Path(__file__).resolve().parents[2]

SELF_SIGNAL = """
import os, signal, sys, threading, time
import omniprof
sig = getattr(signal, sys.argv[1])
delay_s = float(sys.argv[2])
def send():
    time.sleep(0.4)
    os.kill(os.getpid(), sig)
    if delay_s >= 0:
        time.sleep(delay_s)
        os.kill(os.getpid(), sig)
threading.Thread(target=send, daemon=True).start()
def busy_loop():
    end = time.perf_counter() + 30
    while time.perf_counter() < end:
        with omniprof.annotate("chunk"):
            sum(i * i for i in range(2000))
busy_loop()
"""


def _run(tmp_path: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "prog.py").write_text(SELF_SIGNAL)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "omniprof", "run", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def test_sighup_saves_like_sigterm(tmp_path, tally):
    """SIGHUP (the terminal or SSH session went away) stops the program, saves the result (partial,
    with the samples so far) and omniprof then dies of SIGHUP, as python would."""
    p = _run(tmp_path, ["--logdir", "L", "prog.py", "SIGHUP", "-1"])
    tally.fault("SIGHUP")
    assert p.returncode == -signal.SIGHUP, (p.returncode, p.stderr[-2000:])
    saved = list((tmp_path / "L").glob(f"plugins/profile/*/{RESULT_FILENAME}"))
    assert len(saved) == 1, p.stderr
    r = omniprof.load(saved[0])
    assert r.partial and r.part("cpu").samples
    assert any(e.type == "Terminated" and "SIGHUP" in e.message for e in r.errors), r.errors


@pytest.mark.parametrize("engine,delay_ms", [("native", 0), ("native", 10), ("thread", 0), ("thread", 10),
                                             ("signal", 10)])
def test_double_ctrl_c_keeps_the_programs_traceback(tmp_path, engine, delay_ms, tally):
    """The second Ctrl-C lands while the program unwinds from the first or while omniprof stops:
    exit 130, the result on disk, and the traceback printed is the program's (it ends in
    ``busy_loop``), never one into omniprof's stop or ``contextlib.py``."""
    p = _run(tmp_path, ["-O", f"cpu.engine={engine}", "--logdir", "L", "prog.py", "SIGINT", str(delay_ms / 1000)])
    tally.fault("double SIGINT")
    assert p.returncode == 130, (p.returncode, p.stderr[-2000:])
    tb = p.stderr[p.stderr.index("Traceback"):]
    frames = [line.strip() for line in tb.splitlines() if line.strip().startswith("File ")]
    assert frames and "prog.py" in frames[-1], tb
    assert not any("contextlib.py" in f or f"{os.sep}omniprof{os.sep}" in f for f in frames), tb
    saved = list((tmp_path / "L").glob(f"plugins/profile/*/{RESULT_FILENAME}"))
    assert len(saved) == 1, p.stderr
    assert omniprof.load(saved[0]).part("cpu").samples
