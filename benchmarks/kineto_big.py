"""A big real Kineto trace side by side: omniprof's op and kernel tables vs Holistic Trace Analysis.

The trace is benchmarks/big_kineto.py's: the real AlexNet GPU trace (shared/data/kineto) repeated
``--copies`` times, shifted in time (1,710 copies: about 477 MB, 2.4 M events). Each reader runs in a
fresh process, one after the other, in this one run; for each, the wall time and the peak RSS of
that process (``wait4``'s ``ru_maxrss``), with the load average before and after:

* ``omniprof report -r table``: the CLI, today's full reader (every event a Python object);
* ``omniprof columns``: the columnar reader (:mod:`omniprof.formats.kineto_columns`) and the op and
  kernel tables from its columns (:mod:`omniprof.analysis.torch_columns`), the same figures;
* ``HTA``: ``TraceAnalysis`` on a directory holding the trace, then ``get_gpu_kernel_breakdown``
  (HTA 0.5, in its own Python: ``python -m venv .venv-hta && .venv-hta/bin/pip install
  'holistictraceanalysis==0.5.*'``; give it with ``--hta-python`` or ``OMNIPROF_HTA_PYTHON``).

Then the columnar path's peak RSS at 1/10, 5/10 and 10/10 of the copies (memory against trace size).
Goals (issue 32): time <= 0.2x HTA's, peak memory <= 0.25x HTA's.

Measured 2026-11-27 on the shared 2-core machine, heavily loaded (load 8-19: compare only rows of
one run; the loads are beside each row):

* one run (``kineto_big.py --hta-python .venv-hta/bin/python``): omniprof columns 183.5 s, 445 MiB
  (load 19.0); HTA 0.5.0 564.4 s, 2,614 MiB (load 12.2-19.0): 0.33x HTA's time, 0.17x its memory.
  Columns at 1/10, 5/10, 10/10 of the trace: 92, 260, 488 MiB (load 8-9): it grows with the trace
  (about 0.35 KiB a span: the columns plus the nesting's working lists), not flat.
* another run (load 8.6 -> 4.8): omniprof columns 16.6 s, 496 MiB; ``omniprof report -r table``
  (the full reader) 100.1 s, 1,046 MiB.

Run it with omniprof's own environment (the CLI needs its dependencies), e.g. ``.venv/bin/python``.

Run: ``python benchmarks/kineto_big.py [--copies 1710] [--hta-python .venv-hta/bin/python] [--skip-report]``
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

_COLUMNS = r"""
import sys
from omniprof.formats.kineto_columns import read_columns
from omniprof.analysis.torch_columns import op_stats_from_columns, kernel_stats_from_columns
cols = read_columns(sys.argv[1])
ops = op_stats_from_columns(cols)
kernels = kernel_stats_from_columns(cols)
print(f"{len(cols)} spans, {len(ops.rows)} op rows, {len(kernels.rows)} kernel rows ({cols.parser})")
"""

_HTA = r"""
import sys, warnings, logging
warnings.simplefilter("ignore")
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
ta = TraceAnalysis(trace_dir=sys.argv[1])
kernel_type_df, kernel_df = ta.get_gpu_kernel_breakdown(visualize=False)
print(f"{len(kernel_df)} kernel rows")
"""


def run(cmd: list[str]) -> dict[str, object]:
    """Run ``cmd``; its wall time, peak RSS (MiB) and last output line."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    lines = out.decode(errors="replace").strip().splitlines()
    if proc.returncode:
        return {"wall_s": wall, "rss_mib": float("nan"), "note": "FAILED: " + err.decode(errors="replace")[-300:]}
    peak = float(lines[-1].split()[-1])
    return {"wall_s": wall, "rss_mib": peak, "note": lines[-2] if len(lines) > 1 else ""}


_WRAP = r"""
import os, resource, subprocess, sys
p = subprocess.Popen(sys.argv[1:])
_, status, ru = os.wait4(p.pid, 0)
code = os.waitstatus_to_exitcode(status)
if code:
    sys.exit(code)
print(f"peak_rss_mib {ru.ru_maxrss / 1024:.1f}")
"""


def measured(cmd: list[str]) -> dict[str, object]:
    """``cmd`` through a wrapper that reports that one process's peak RSS (``wait4``)."""
    return run([sys.executable, "-c", _WRAP, *cmd])


def _load() -> str:
    a = os.getloadavg()
    return f"{a[0]:.2f} {a[1]:.2f} {a[2]:.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=1710)
    ap.add_argument("--hta-python", default=os.environ.get("OMNIPROF_HTA_PYTHON"))
    ap.add_argument("--skip-report", action="store_true", help="leave out today's `omniprof report -r table`")
    ap.add_argument("--skip-scaling", action="store_true", help="leave out the 1/10, 5/10, 10/10 memory runs")
    ns = ap.parse_args(argv)
    from big_kineto import DATA, generate

    def trace(copies: int) -> Path:
        p = DATA / f"alexnet_x{copies}.pt.trace.json"
        if not p.exists():
            generate(p, copies)
        return p

    big = trace(ns.copies)
    size = big.stat().st_size
    print(f"trace: {big.name}, {size / 1e6:.1f} MB ({ns.copies} copies of the real AlexNet trace)")
    print(f"load average before: {_load()}   ({os.cpu_count()} CPUs)")
    rows: dict[str, dict[str, object]] = {}
    print(f"\n{'reader':44} {'wall s':>8} {'peak RSS MiB':>13}  output (load average after)", flush=True)

    def one(name: str, cmd: list[str]) -> None:
        r = rows[name] = measured(cmd)
        print(f"{name:44} {r['wall_s']:8.1f} {r['rss_mib']:13.0f}  {r['note']} ({_load()})", flush=True)

    one("omniprof columns", [sys.executable, "-c", _COLUMNS, str(big)])
    if ns.hta_python:
        hdir = DATA / f"hta_x{ns.copies}"
        hdir.mkdir(exist_ok=True)
        link = hdir / big.name
        if not link.exists():
            link.symlink_to(big)
        one("HTA 0.5 (TraceAnalysis + kernel breakdown)", [ns.hta_python, "-c", _HTA, str(hdir)])
    else:
        print("HTA left out: give --hta-python or OMNIPROF_HTA_PYTHON")
    if not ns.skip_report:
        one("omniprof report -r table (the full reader)", [sys.executable, "-m", "omniprof", "report", str(big), "-r", "table"])
    hta = rows.get("HTA 0.5 (TraceAnalysis + kernel breakdown)")
    cols = rows["omniprof columns"]
    if hta and hta["rss_mib"] == hta["rss_mib"]:
        t, m = cols["wall_s"] / hta["wall_s"], cols["rss_mib"] / hta["rss_mib"]  # type: ignore[operator]
        print(f"\nomniprof columns / HTA: time {t:.2f}x (goal <= 0.20), memory {m:.2f}x (goal <= 0.25)", flush=True)
    if not ns.skip_scaling:
        print(f"\nmemory against trace size (omniprof columns); load average {_load()}")
        print(f"{'copies':>7} {'MB':>8} {'wall s':>8} {'peak RSS MiB':>13}")
        for frac in (1, 5, 10):
            c = max(1, ns.copies * frac // 10)
            p = trace(c)
            r = measured([sys.executable, "-c", _COLUMNS, str(p)])
            print(f"{c:>7} {p.stat().st_size / 1e6:8.1f} {r['wall_s']:8.1f} {r['rss_mib']:13.0f}  ({_load()})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
