"""Temporal breakdown side by side: Holistic Trace Analysis, omniprof, and a count over the raw events.

HTA (``hta.trace_analysis.TraceAnalysis.get_temporal_breakdown``) runs in its own Python (it pulls
pandas and plotly; give it with ``--hta-python`` or ``OMNIPROF_HTA_PYTHON``, e.g. a venv made by
``python -m venv .venv-hta && .venv-hta/bin/pip install holistictraceanalysis``) on the same
per-rank Kineto traces omniprof reads (``crossrank.analyze``):

* ``real``: the real AlexNet GPU trace in shared/data/kineto (HTA's own test data), as ranks 0 and 1;
* ``synthetic``: ``--ranks`` ranks of ``--events`` events from benchmarks/distributed_analysis.py;
* or ``--traces DIR``: any directory of per-rank traces.

Their definitions differ in the window, and HTA rounds sub-µs times. HTA: from the first to the last GPU event
(``kernel_time``); idle = window - union of GPU events; compute = union of compute kernels;
non-compute = the rest (communication and memory kernels not under compute). omniprof: the rank's
profiled steps (``ProfilerStep#N``) when it has them, else the same first-to-last span; its comm% +
mem% (exposed) is HTA's non-compute. So the table prints omniprof twice: its own (step window) and
over HTA's window (the same traces without their step marks), and a third, independent count:
plain ``json`` over the raw events, integer nanoseconds from the decimal text, a sweep over
interval ends (neither omniprof's reader nor its interval code), once by our definitions and once by
HTA's rules (``cuda_sync`` events as GPU time, the last step's work dropped, sub-µs times rounded
inward to whole µs) to show where HTA's figures come from. Target: within 1 pp of HTA.

Run: ``python benchmarks/hta_compare.py --hta-python .venv-hta/bin/python``
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

_HTA = r"""
import json, sys, warnings, logging
warnings.simplefilter("ignore")
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
import hta
ta = TraceAnalysis(trace_dir=sys.argv[1])
df = ta.get_temporal_breakdown(visualize=False)
rows = {}
for _, r in df.iterrows():
    rows[int(r["rank"])] = {k: float(r[k]) for k in ("idle_time(us)", "compute_time(us)", "non_compute_time(us)",
                                                       "kernel_time(us)")}
print(json.dumps({"version": getattr(hta, "__version__", "?"), "rows": rows}))
"""

_GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}
_COMM = re.compile(r"nccl|rccl", re.IGNORECASE)


def _ns(value: object) -> int:
    return int((Decimal(str(value)) * 1000).to_integral_value())


def raw_count(path: Path, hta_rules: bool = False) -> dict[str, int]:
    """Independent: the breakdown over the raw events, with plain json and a sweep over interval ends.

    GPU events: kernels, memcpys, memsets; communication by name (nccl/rccl), memory the copies,
    compute the other kernels. ``hta_rules`` does what HTA does instead, to show where it differs:
    ``cuda_sync`` events count as GPU events (non-compute), and with two steps
    or more, GPU work launched at or after the last ``ProfilerStep`` started (by its launch's
    correlation; unlinked work by its own start) is dropped; and in a trace with sub-µs times every
    event is rounded inward to whole µs.
    """
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as fh:
        doc = json.load(fh)
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    cats = _GPU_CATS | ({"cuda_sync"} if hta_rules else set())
    evs = [e for e in xs if e.get("cat") in cats]
    steps = [_ns(e["ts"]) for e in xs if str(e.get("name", "")).startswith("ProfilerStep")]
    if hta_rules and len(steps) > 1:
        last = max(steps)
        launch = {e["args"]["correlation"]: _ns(e["ts"]) for e in xs
                  if e.get("cat") in ("cuda_runtime", "cuda_driver", "cpu_op") and "correlation" in (e.get("args") or {})}
        evs = [e for e in evs if (launch.get(e["args"]["correlation"], last) if "correlation" in (e.get("args") or {})
                                  else _ns(e["ts"])) < last]
    # HTA rounds a trace with sub-µs times inward to whole µs (start up, end down): pytorch#122425.
    fractional = hta_rules and any(_ns(e["ts"]) % 1000 for e in xs if "ts" in e)
    iv = []
    for e in evs:
        a = _ns(e["ts"])
        b = a + _ns(e.get("dur", 0))
        if fractional:
            a, b = -(-a // 1000) * 1000, b // 1000 * 1000
        name = str(e.get("name", ""))
        mem = (re.match(r"Memcpy|Memset", name) or e["cat"] == "cuda_sync") if hta_rules else e["cat"] not in ("kernel", "Kernel")
        kind = "comm" if _COMM.search(name) else "mem" if mem else "comp"
        iv.append((a, b, kind))
    lo, hi = min(a for a, _, _ in iv), max(b for _, b, _ in iv)
    points = []
    for a, b, k in iv:
        points.append((a, 1, k))
        points.append((b, -1, k))
    points.sort(key=lambda p: (p[0], p[1]))
    active = {"comp": 0, "comm": 0, "mem": 0}
    out = {"window": hi - lo, "compute": 0, "idle": 0, "other": 0}
    prev = lo
    for t, d, k in points:
        if t > prev:
            seg = t - prev
            if active["comp"]:
                out["compute"] += seg
            elif active["comm"] or active["mem"]:
                out["other"] += seg
            else:
                out["idle"] += seg
            prev = t
        active[k] += d
    return out


def _ours(d: Path) -> dict[int, dict[str, float]]:
    from omniprof.analysis import crossrank

    rep = crossrank.analyze(d, workers=1)
    return {r["rank"]: {"compute": r["compute_pct"], "other": r["exposed_communication_pct"] + r["exposed_memory_pct"],
                        "idle": r["idle_pct"], "window_ns": r["window_ns"]} for r in rep.breakdown_rows()}


def _ours_device_window(files: dict[int, Path]) -> dict[int, dict[str, float]]:
    """omniprof's reduction over HTA's window: the same spans without their step marks."""
    import attrs

    from omniprof.analysis import crossrank
    from omniprof.formats.kineto import read_trace

    out = {}
    for rank, f in files.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = read_trace(f)
        parts = [attrs.evolve(p, spans=[s for s in p.spans if s.category != "step"]) for p in res.parts]
        s = crossrank.reduce_rank(parts, rank=rank)
        out[rank] = {"compute": s.pct(s.compute_ns), "other": s.pct(s.exposed_communication_ns + s.exposed_memory_ns),
                     "idle": s.pct(s.idle_ns), "window_ns": s.window_ns}
    return out


def _rank_files(d: Path) -> dict[int, Path]:
    from omniprof.analysis.crossrank import rank_inputs, reduce_file

    return {reduce_file(f, kind, hint).rank: Path(f) for f, kind, hint in rank_inputs(d)}


def compare(name: str, d: Path, hta_python: str) -> float:
    print(f"\n== {name}: {d}")
    out = subprocess.run([hta_python, "-c", _HTA, str(d)], capture_output=True, text=True)
    if out.returncode:
        print(f"HTA failed:\n{out.stderr[-2000:]}")
        return float("nan")
    hta = json.loads(out.stdout.strip().splitlines()[-1])
    files = _rank_files(d)
    ours, dev = _ours(d), _ours_device_window(files)
    print(f"HTA {hta['version']}; % of each figure's window; other = HTA non-compute = omniprof exposed comm + mem")
    head = f"{'rank':>4} {'who':<28} {'window ms':>10} {'compute%':>9} {'other%':>8} {'idle%':>7}"
    print(head)
    worst = 0.0
    for rank in sorted(files):
        h = hta["rows"][str(rank)]
        k = h["kernel_time(us)"]
        hp = {"compute": 100 * h["compute_time(us)"] / k, "other": 100 * h["non_compute_time(us)"] / k,
              "idle": 100 * h["idle_time(us)"] / k, "window_ns": k * 1000}
        raw = raw_count(files[rank])
        rp = {x: 100 * raw[x] / raw["window"] for x in ("compute", "other", "idle")} | {"window_ns": raw["window"]}
        raw = raw_count(files[rank], hta_rules=True)
        rh = {x: 100 * raw[x] / raw["window"] for x in ("compute", "other", "idle")} | {"window_ns": raw["window"]}
        for who, v in (("HTA", hp), ("omniprof (its step window)", ours[rank]), ("omniprof (HTA's window)", dev[rank]),
                       ("raw events count", rp), ("raw events count, HTA rules", rh)):
            print(f"{rank:>4} {who:<28} {v['window_ns'] / 1e6:>10.3f} {v['compute']:>9.2f} {v['other']:>8.2f} "
                  f"{v['idle']:>7.2f}")
        diff = max(abs(hp[x] - dev[rank][x]) for x in ("compute", "other", "idle"))
        diff_raw = max(abs(rp[x] - dev[rank][x]) for x in ("compute", "other", "idle"))
        diff_hta = max(abs(rh[x] - hp[x]) for x in ("compute", "other", "idle"))
        worst = max(worst, diff)
        print(f"{rank:>4} max |diff|: omniprof (HTA's window) vs HTA {diff:.3f} pp; omniprof vs raw count "
              f"{diff_raw:.4f} pp; HTA vs raw count with HTA's rules {diff_hta:.4f} pp")
    return worst


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hta-python", default=os.environ.get("OMNIPROF_HTA_PYTHON"),
                    help="a Python with holistictraceanalysis installed (or OMNIPROF_HTA_PYTHON)")
    ap.add_argument("--traces", type=Path, help="a directory of per-rank Kineto traces (instead of the two sets)")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--events", type=int, default=20_000)
    ns = ap.parse_args(argv)
    if not ns.hta_python:
        print("give HTA's python: --hta-python PATH or OMNIPROF_HTA_PYTHON (python -m venv .venv-hta && "
              ".venv-hta/bin/pip install holistictraceanalysis)", file=sys.stderr)
        return 2
    load = os.getloadavg()
    print(f"load average: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    worst = []
    if ns.traces:
        worst.append(compare("traces", ns.traces, ns.hta_python))
    else:
        from tests.tools import SHARED_DATA_ENV, find_shared_data, shared_data_dirs

        alexnet = find_shared_data("kineto", "alexnet_cuda_trace.json.gz")
        if alexnet is None:
            print(f"kineto/alexnet_cuda_trace.json.gz not found in the shared data folder (looked in "
                  f"{', '.join(map(str, shared_data_dirs()))}): put shared/ beside the repository or set "
                  f"{SHARED_DATA_ENV}", file=sys.stderr)
            return 2
        with tempfile.TemporaryDirectory() as tmp:
            real = Path(tmp) / "real"
            real.mkdir()
            with gzip.open(alexnet, "rt") as fh:
                doc = json.load(fh)
            for r in range(2):
                doc["distributedInfo"] = {**doc.get("distributedInfo", {}), "rank": r, "world_size": 2}
                with gzip.open(real / f"alexnet_rank{r}.json.gz", "wt") as fh:
                    json.dump(doc, fh)
            worst.append(compare("real (AlexNet, shared/data/kineto, as 2 ranks)", real, ns.hta_python))
            sys.path.insert(0, str(ROOT / "benchmarks"))
            from distributed_analysis import generate

            syn = Path(tmp) / "synthetic"
            syn.mkdir()
            for r in range(ns.ranks):
                generate(syn / f"rank{r}.pt.trace.json", r, ns.ranks, ns.events, r == min(3, ns.ranks - 1))
            worst.append(compare(f"synthetic ({ns.ranks} ranks x {ns.events:,} events)", syn, ns.hta_python))
            shutil.rmtree(tmp, ignore_errors=True)
    w = max(worst)
    print(f"\nworst |omniprof - HTA| over the same window: {w:.3f} pp -> {'within' if w <= 1 else 'NOT within'} 1 pp")
    return 0 if w <= 1 else 1


if __name__ == "__main__":
    sys.exit(main())
