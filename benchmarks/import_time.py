"""What `import omniprof` and `omniprof plugins` cost, measured in fresh processes.

    python benchmarks/import_time.py [--runs 15] [--tree] [--root CHECKOUT]

Prints medians (and min) over ``--runs`` fresh interpreters, each figure beside its baseline:

* ``-X importtime`` cumulative microseconds of the ``omniprof`` line (the issue's figure: <= 70 ms),
  and of ``site`` (what the interpreter itself imports before any user code);
* wall time of ``python -c "import omniprof"`` and of ``python -c pass``;
* the same after touching the kernel's classes (``omniprof.Profiler``: what a program that profiles
  pays, since ``import omniprof`` loads its names on first use);
* wall time of ``omniprof plugins`` (<= 0.3 s).

``--tree`` also prints the modules of one ``import omniprof`` by self time, to see where it goes.
Bytecode is cached as for any user: a warm-up run writes it under a temporary
``PYTHONPYCACHEPREFIX`` (no file is written beside the sources; ``PYTHONDONTWRITEBYTECODE`` is
dropped for these processes). Compare before and after a change with ``git stash`` (run, stash, run again), or against another
checkout with ``--root /path/to/checkout`` (its omniprof is put first on ``PYTHONPATH``). The load
average is printed beside the figures, since a busy machine inflates them all.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Every process runs in an empty directory: ``python -c`` puts the working directory first on
#: sys.path, and ``omniprof plugins`` reads a plugins.toml found there.
CWD = tempfile.mkdtemp(prefix="omniprof-import-time-")
#: Bytecode goes here (PYTHONPYCACHEPREFIX), not beside any source file.
PYCACHE = os.path.join(CWD, "pycache")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    # What users run: bytecode cached (a warm-up run writes it, under PYCACHE). With
    # PYTHONDONTWRITEBYTECODE every run would compile every module from source again.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = PYCACHE
    env["PYTHONPATH"] = str(ROOT)
    return env


def importtime(code: str) -> dict[str, tuple[int, int]]:
    """``{module: (self_us, cumulative_us)}`` of one fresh ``python -X importtime -c code``, in
    import order; ``"<after site>"`` sums the top-level imports that follow ``site``."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True,
                          env=_env(), cwd=CWD, check=True)
    out: dict[str, tuple[int, int]] = {}
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, cum_us, name = line[len("import time:"):].split("|")
        if name.strip() == "site":
            after = 0
        elif not name.startswith("  ") and "site" in out:
            after += int(cum_us)
        out.setdefault(name.strip(), (int(self_us), int(cum_us)))
    out["<after site>"] = (0, after if "site" in out else 0)
    return out


def wall(cmd: list[str]) -> float:
    return timed(cmd)[0]


def timed(cmd: list[str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system) of one run of ``cmd``. On a busy machine the
    CPU time is the steadier figure: waiting for a core counts in wall time only."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, capture_output=True, env=_env(), cwd=CWD, check=True)
    t1 = time.perf_counter()
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return t1 - t0, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def _fmt(values: list[float], unit: str, scale: float) -> str:
    return f"median {statistics.median(values) * scale:7.1f} {unit}   min {min(values) * scale:7.1f} {unit}"


def main() -> None:
    global ROOT
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--tree", action="store_true", help="print the modules of one import by self time")
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout whose omniprof is measured")
    args = ap.parse_args()
    ROOT = args.root.resolve()
    for code in ("import omniprof; omniprof.Profiler", "import omniprof; omniprof.get_registry().infos()"):
        subprocess.run([sys.executable, "-c", code], capture_output=True, env=_env(), cwd=CWD, check=True)  # warm-up
    omni: list[float] = []
    site: list[float] = []
    kernel: list[float] = []
    for _ in range(args.runs):
        t = importtime("import omniprof")
        omni.append(t["omniprof"][1])
        site.append(t["site"][1])
        kernel.append(importtime("import omniprof; omniprof.Profiler")["<after site>"][1])
    imp = [timed([sys.executable, "-c", "import omniprof"]) for _ in range(args.runs)]
    bare = [timed([sys.executable, "-c", "pass"]) for _ in range(args.runs)]
    cli = [timed([sys.executable, "-m", "omniprof", "plugins"]) for _ in range(args.runs)]
    print(f"{ROOT}: load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs); "
          f"{args.runs} fresh processes each; Python {sys.version.split()[0]}")
    print(f"-X importtime omniprof (cumulative)  {_fmt(omni, 'ms', 1e-3)}   target <= 70 ms")
    print(f"  ... and omniprof.Profiler          {_fmt(kernel, 'ms', 1e-3)}")
    print(f"-X importtime site (baseline)        {_fmt(site, 'ms', 1e-3)}")
    for label, runs, unit, scale, target in (
            ("python -c 'import omniprof'", imp, "ms", 1e3, ""), ("python -c pass (baseline)", bare, "ms", 1e3, ""),
            ("python -m omniprof plugins", cli, "ms", 1e3, "   target <= 300 ms")):
        print(f"{label + ' wall':36s} {_fmt([w for w, _ in runs], unit, scale)}{target}")
        print(f"{label + ' CPU':36s} {_fmt([c for _, c in runs], unit, scale)}")
    if args.tree:
        t = importtime("import omniprof")
        start = list(t).index("site") + 1 if "site" in t else 0
        rows = sorted(list(t.items())[start:], key=lambda kv: -kv[1][0])
        print("\nmodules imported by `import omniprof`, by self time (us):")
        for name, (self_us, cum_us) in rows[:30]:
            print(f"  {self_us:8d} self {cum_us:8d} cumulative  {name}")


if __name__ == "__main__":
    try:
        main()
    finally:
        shutil.rmtree(CWD, ignore_errors=True)
