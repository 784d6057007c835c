"""Out-of-process engine: py-spy samples this process from outside, with native (C) frames.

An in-process Python sampler cannot see inside C extensions and builtins: its signal handler
runs only between bytecodes, after the C call returned. py-spy reads the process's memory from a
child process (ptrace) and unwinds native stacks too (``--native``), so it shows which C function
of numpy, math or the interpreter the time went to. It is started at ``start()`` and stopped with
SIGINT at ``stop()``, when it writes its samples (``--format raw``: collapsed stacks with counts).

Limits, all recorded in the result: py-spy's raw output has counts but no per-sample times, so
every sample of a session carries the session's end time and the interval py-spy achieved (the
window since it attached over its ticks, not the one requested); C frames py-spy cannot name
(a stripped library) are folded into one ``[library]`` frame per run of them; thread
ids are mapped back to Python thread idents through ``Thread.native_id``; file names are as
py-spy prints them (relative to ``sys.path`` entries); py-spy needs up to about a second to
attach (``ATTACH_WAIT_S``), and work done before it attached is not seen.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from omniprof.core.clock import monotonic
from typing import Any

from omniprof.backends.cpu.sampler import Sampler
from omniprof.core.results import Frame, ThreadInfo
from omniprof.errors import BackendUnavailableError

__all__ = ["PySpyEngine", "add_samples", "find_pyspy", "parse_raw"]

#: Longest wait for py-spy to report that it samples (work before that may be missed).
ATTACH_WAIT_S = 1.0

_THREAD = re.compile(r"^thread \((?P<tid>0x[0-9a-fA-F]+|\d+)\)(?::\s*(?P<name>.*))?$")
_FRAME = re.compile(r"^(?P<name>.*) \((?P<where>[^()]*)\)$")
_ADDRESS = re.compile(r"^0x[0-9a-fA-F]+$")


def which_pyspy() -> str | None:
    """py-spy on PATH, or beside the running interpreter (a venv's ``bin`` used without activating it)."""
    exe = shutil.which("py-spy")
    if exe is None:
        for d in (os.path.dirname(sys.executable), os.path.dirname(os.path.realpath(sys.executable))):
            cand = shutil.which("py-spy", path=d)
            if cand is not None:
                return cand
    return exe


def find_pyspy() -> str:
    """Path of the py-spy executable, or raise BackendUnavailableError saying how to get it."""
    exe = which_pyspy()
    if exe is None:
        raise BackendUnavailableError("py-spy is not installed (engine 'py-spy' needs it for native frames)",
                                      "pip install py-spy, or use engine='signal'/'thread' without native frames",
                                      plugin="cpu")
    return exe


PR_SET_PTRACER = 0x59616D61  # prctl option of the Yama LSM


def set_ptracer(pid: int) -> bool:
    """Let process ``pid`` ptrace this one under Yama's ptrace_scope=1 (0: no one again).

    True when the kernel took it; False where there is no Yama (nothing to allow: the default
    ptrace rules apply) or no prctl (not Linux).
    """
    if not sys.platform.startswith("linux"):
        return False
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_PTRACER, ctypes.c_ulong(pid), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def ptrace_allowed(scope_file: str = "/proc/sys/kernel/yama/ptrace_scope",
                   euid: int | None = None) -> tuple[bool, str]:
    """Whether py-spy (a child process) may ptrace this process, and why."""
    if euid is None:
        euid = os.geteuid() if hasattr(os, "geteuid") else -1
    if euid == 0:
        return True, "running as root"
    try:
        with open(scope_file) as f:
            scope = int(f.read().strip() or 0)
    except (OSError, ValueError):
        return True, "no Yama ptrace restriction"
    if scope == 0:
        return True, "kernel.yama.ptrace_scope=0"
    if scope == 1:
        return True, "kernel.yama.ptrace_scope=1: omniprof names py-spy its tracer (PR_SET_PTRACER)"
    if scope == 2:
        return False, ("kernel.yama.ptrace_scope=2 lets only admins (CAP_SYS_PTRACE) attach: run as root, give "
                       "py-spy CAP_SYS_PTRACE, or use engine='signal' (no native frames)")
    return False, (f"kernel.yama.ptrace_scope={scope} forbids ptrace until reboot: use engine='signal' "
                   f"(no native frames)")


def _frame(text: str) -> Frame:
    m = _FRAME.match(text)
    if m is None:
        return Frame(name=text, kind="native")
    name, where = m.group("name"), m.group("where")
    file, _, line = where.rpartition(":")
    if file and line.isdigit():
        kind = "py" if file.endswith((".py", ".pyw")) or "<frozen" in file else "native"
        return Frame(name=name, file=file, line=int(line), module=None if kind == "py" else os.path.basename(file),
                     kind=kind)
    if _ADDRESS.match(name):  # "0x7f.. (libcrypto.so.3)": no symbol; the library is what is known
        return Frame(name=where if where.startswith("[") else f"[{where}]", module=where, kind="native")
    return Frame(name=name, module=where, kind="native")


def _fold_libraries(frames: list[Frame]) -> list[Frame]:
    """One ``[library]`` frame for each run of unnamed frames of one library (ten addresses inside
    libcrypto are one libcrypto, not ten rows)."""
    out: list[Frame] = []
    for fr in frames:
        if out and fr.kind == "native" and fr.name.startswith("[") and fr == out[-1]:
            continue
        out.append(fr)
    return out


def parse_raw(text: str) -> list[tuple[int | None, str, list[Frame], int]]:
    """Parse py-spy ``--format raw --threads`` output: ``[(native_tid, thread_name, frames root-first, count)]``."""
    out = []
    for line in text.splitlines():
        line = line.rstrip()
        if not line:
            continue
        stack_text, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        parts = stack_text.split(";")
        tid: int | None = None
        name = ""
        m = _THREAD.match(parts[0]) if parts else None
        if m:
            raw_tid = m.group("tid")
            tid = int(raw_tid, 16) if raw_tid.startswith("0x") else int(raw_tid)
            name = m.group("name") or ""
            parts = parts[1:]
        out.append((tid, name, _fold_libraries([_frame(p) for p in parts]), int(count)))
    return out


class PySpyEngine:
    """Runs ``py-spy record`` against ``pid`` until :meth:`stop`."""

    def __init__(self, pid: int, rate_hz: int, native: bool, include_idle: bool = True) -> None:
        self.pid = pid
        self.rate_hz = max(1, rate_hz)
        self.native = native
        self.include_idle = include_idle
        self.proc: subprocess.Popen[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self.out_path: Path | None = None
        self.stderr = b""
        self.ptracer_set = False

    def start(self) -> None:
        exe = find_pyspy()
        self._dir = tempfile.TemporaryDirectory(prefix="omniprof-pyspy-")
        self.out_path = Path(self._dir.name) / "raw.txt"
        cmd = [exe, "record", "--pid", str(self.pid), "--rate", str(self.rate_hz), "--format", "raw", "--threads",
               "--output", str(self.out_path)]
        if self.native:
            cmd.append("--native")
        if self.include_idle:
            cmd.append("--idle")
        # py-spy, our child, must ptrace us, its parent. Under Yama's ptrace_scope=1 (Ubuntu's default)
        # only a process we name may: start it held at a gate (a shell waiting for a line on stdin),
        # name its pid our tracer (the pid survives the exec), then open the gate.
        gated = ["/bin/sh", "-c", 'read _ && exec "$@" </dev/null', "omniprof-pyspy", *cmd]
        self.proc = subprocess.Popen(gated, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     start_new_session=True)
        self.ptracer_set = set_ptracer(self.proc.pid)
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(b"go\n")
            self.proc.stdin.close()
        except OSError:  # the shell died already: reported below, with its stderr
            pass
        self._stderr_thread = threading.Thread(target=self._drain, name="omniprof-pyspy-stderr", daemon=True)
        self._stderr_thread.start()
        # py-spy prints "Sampling process ..." once it runs (with --native, seconds later, after
        # reading symbols, though it samples before): wait for it, at most ATTACH_WAIT_S. Samples
        # of this wait are dropped by the backend (their stacks are in this function).
        deadline = monotonic() + ATTACH_WAIT_S
        while monotonic() < deadline and self.proc.poll() is None and b"Sampling" not in self.stderr:
            time.sleep(0.005)
        if self.proc.poll() is not None:
            self._stderr_thread.join(1.0)
            self.cleanup()
            raise BackendUnavailableError(
                f"py-spy could not attach to pid {self.pid}: {self.stderr.decode(errors='replace').strip()[:300]}",
                "py-spy needs ptrace permission (CAP_SYS_PTRACE or kernel.yama.ptrace_scope=0); "
                "use engine='signal' to sample without native frames", plugin="cpu")

    def _drain(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for chunk in iter(lambda: self.proc.stderr.read1(4096), b""):  # type: ignore[union-attr]
            self.stderr += chunk

    def stop(self) -> list[tuple[int | None, str, list[Frame], int]]:
        """Stop py-spy (SIGINT: it writes its output) and parse what it recorded."""
        if self.proc is None:
            return []
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._stderr_thread.join(2.0)
        text = self.out_path.read_text(encoding="utf-8", errors="replace") if self.out_path and self.out_path.exists() else ""
        self.cleanup()
        return parse_raw(text)

    def cleanup(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.ptracer_set:
            set_ptracer(0)  # py-spy is gone: no process may trace us any more
            self.ptracer_set = False
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None


def add_samples(s: Sampler, lines: list[tuple[int | None, str, list[Frame], int]], end_ns: int, since_ns: int,
                waiter: int, requested_interval_ns: int) -> int:
    """Store py-spy's aggregated stacks in ``s`` as samples (time = session end) and return the ticks.

    py-spy's raw output has counts, no times. With ``--idle`` every tick samples every thread, so
    the thread that waited for py-spy to attach (native id ``waiter``, from ``since_ns`` on) counts
    the ticks: its samples outside omniprof's own py-spy code are the ticks between the attach and
    the session's end, and each sample weighs that window over those ticks, the interval py-spy
    achieved (often far below the one requested: with ``--native`` it unwinds every thread at each
    tick). Without such ticks a sample weighs ``requested_interval_ns``."""
    by_native = {t.native_id: t for t in threading.enumerate() if getattr(t, "native_id", None)}
    me = os.path.join("omniprof", "backends", "cpu", "pyspy.py")
    kept: list[tuple[int, tuple[Any, ...], int]] = []
    waiter_ticks = 0
    per_thread: dict[int, int] = {}
    for native_tid, name, frames, count in lines:
        t = by_native.get(native_tid)
        if (t.name if t is not None else name).startswith("omniprof-"):
            continue  # omniprof's own helper threads
        if any(fr.kind == "py" and fr.file.endswith(me) for fr in frames):
            continue  # the thread waiting for py-spy to attach, or to stop: not the program's work
        if native_tid == waiter:
            waiter_ticks += count
        tid = t.ident if t is not None and t.ident is not None else (native_tid or 0)
        if tid not in s.threads:
            s.threads[tid] = ThreadInfo(tid, t.name if t is not None else (name or f"thread {native_tid}"),
                                        native_tid)
        per_thread[tid] = per_thread.get(tid, 0) + count
        kept.append((tid, tuple(x for fr in reversed(frames) for x in (fr, fr.line)), count))
    ticks = waiter_ticks or max(per_thread.values(), default=0)
    interval_ns = max((end_ns - since_ns) // ticks, 1) if ticks else requested_interval_ns
    for tid, raw, count in kept:
        for _ in range(count):
            s.add(end_ns, tid, raw, interval_ns)
    return ticks
