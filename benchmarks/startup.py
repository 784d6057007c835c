"""Start-up of ``omniprof run empty.py`` beside pyinstrument's and python's, and ``omniprof doctor``'s first line.

    python benchmarks/startup.py [--runs 15] [--root CHECKOUT]

Times, in fresh processes, interleaved (python, pyinstrument, omniprof, python, ...) so that a
change in the machine's load hits all three alike, medians and minima printed side by side with
the load average:

* ``python empty.py`` (the floor), ``pyinstrument empty.py`` (the anchor: the goal is <= 1.5x its
  time), ``omniprof run empty.py`` (the table reporter to a pipe); wall and CPU (user + system)
  time, the CPU time being the steadier figure on a busy machine;
* ``omniprof doctor``: the time to its first line on stdout (goal <= 0.5 s) and to its end.

Bytecode is cached as for any user (a warm-up run writes it under a temporary
``PYTHONPYCACHEPREFIX``). ``--root`` measures another checkout's omniprof (put first on
``PYTHONPATH``), e.g. main's, for a before/after in one run.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _env(root: Path, pycache: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = pycache
    env["PYTHONPATH"] = str(root)
    return env


def timed(cmd: list[str], env: dict[str, str], cwd: str) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one run of ``cmd``."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=cwd, check=True)
    t1 = time.perf_counter()
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return t1 - t0, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def first_line(cmd: list[str], env: dict[str, str], cwd: str) -> tuple[float, float]:
    """Seconds to the first line on stdout, and to the end."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=cwd)
    assert proc.stdout is not None
    proc.stdout.readline()
    t1 = time.perf_counter()
    proc.stdout.read()
    proc.wait()
    return t1 - t0, time.perf_counter() - t0


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _row(label: str, values: list[float], anchor: list[float] | None = None, goal: str = "") -> str:
    med = statistics.median(values)
    text = f"  {label:34s} median {med * 1e3:8.1f} ms  min {min(values) * 1e3:8.1f} ms"
    if anchor:
        text += f"  = {med / statistics.median(anchor):5.2f}x pyinstrument"
    return text + (f"  {goal}" if goal else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--doctor-runs", type=int, default=3)
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout whose omniprof is measured")
    args = ap.parse_args()
    pyinstrument = shutil.which("pyinstrument", path=os.path.dirname(sys.executable)) or shutil.which("pyinstrument")
    if pyinstrument is None:
        sys.exit("pyinstrument is not installed: pip install pyinstrument (it is the anchor)")
    cwd = tempfile.mkdtemp(prefix="omniprof-startup-")
    try:
        empty = os.path.join(cwd, "empty.py")
        Path(empty).write_text("")
        env = _env(args.root.resolve(), os.path.join(cwd, "pycache"))
        cmds = {"python empty.py": [sys.executable, empty],
                "pyinstrument empty.py": [sys.executable, pyinstrument, empty],
                "omniprof run empty.py": [sys.executable, "-m", "omniprof", "run", empty]}
        for cmd in cmds.values():  # warm-up: bytecode written once
            timed(cmd, env, cwd)
        load0 = _load()
        walls: dict[str, list[float]] = {k: [] for k in cmds}
        cpus: dict[str, list[float]] = {k: [] for k in cmds}
        for _ in range(args.runs):
            for label, cmd in cmds.items():
                w, c = timed(cmd, env, cwd)
                walls[label].append(w)
                cpus[label].append(c)
        doctor = [sys.executable, "-m", "omniprof", "doctor"]
        first_line(doctor, env, cwd)
        dr = [first_line(doctor, env, cwd) for _ in range(args.doctor_runs)]
        print(f"{args.root.resolve()}: Python {sys.version.split()[0]}, {os.cpu_count()} CPUs; load average "
              f"{load0} before, {_load()} after; {args.runs} interleaved runs each")
        for what, table in (("wall", walls), ("CPU", cpus)):
            print(f"{what} time:")
            anchor = table["pyinstrument empty.py"]
            for label in cmds:
                goal = "goal <= 1.5x pyinstrument" if label.startswith("omniprof") else ""
                print(_row(label, table[label], anchor if label != "python empty.py" else None, goal))
        print(f"omniprof doctor ({args.doctor_runs} runs, frameworks imported):")
        print(_row("first line on stdout", [a for a, _ in dr], goal="goal <= 500 ms"))
        print(_row("whole report", [b for _, b in dr]))
    finally:
        shutil.rmtree(cwd, ignore_errors=True)


if __name__ == "__main__":
    main()
