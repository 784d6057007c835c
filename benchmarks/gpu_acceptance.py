"""GPU acceptance: every GPU path of omniprof checked against an independent reference in one run.

One prepared run for a machine with one NVIDIA GPU (an H100 or H200 lent through the device tool;
docs/gpu.md says how), at most about 8 minutes. Each group of checks runs in its own child process,
so a crash, a hang or a CUPTI subscriber left behind by one group cannot stop or spoil the others.
The references, each measured in the same run:

    cupti         the cupti backend's kernels (names, counts, total time within 2%), memcpy/memset
                  (counts, bytes, against torch.profiler and against the copies the workload makes)
                  and launch->kernel flows, against torch.profiler (Kineto) on the same workload
    nvml          NVML counter tracks against `nvidia-smi --query-gpu` sampled in the same window
    torch         the torch backend's op table against key_averages() of the same torch profile
                  (self CUDA time and CUDA runtime rows included), kernel statistics, memory
                  timeline by category (torch's export_memory_timeline and the tensors' own bytes)
    xla           the xla backend's kernel statistics against xprof's kernel_stats tool run on the
                  same xplane, op statistics against framework_op_stats, omniprof.jax.profile tables
    options       GPU advanced options honoured (activity and API caps counted as losses,
                  gpu_enable_nvtx_tracking, record_* switches, CUDA graph ids)
    doctor        `omniprof doctor` truthful (driver and GPU as nvidia-smi says, libcupti found,
                  CUPTI privileges as the driver's RmProfilingAdminOnly says)
    overhead_*    each GPU backend against the raw profiler it wraps, on the same loop

Each check records ``{"name", "ok", "figures": {...}}`` (and ``"error"``, a traceback summary, when
it raised); a failing check never stops the others. The record,
``<results-dir>/<date>-<device>.json`` = ``{"device", "driver", "torch", "jax", ..., "checks": [...]}``,
is written atomically.

Usage: python benchmarks/gpu_acceptance.py [--results-dir DIR] [--log FILE] [--only GROUP,...]
                                           [--budget-s 400] [--plan]

Exit status: 0 every check passed; 1 some check failed (the record says which); 3 no GPU here:
one line ``no GPU: <reason> ...`` on stdout, nothing measured, nothing written (the run stops
before its first CUDA call); 2 bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import importlib.metadata as md
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Callable

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NO_GPU = 0, 1, 2, 3
ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RESULTS = ROOT / "benchmarks" / "results" / "gpu"
MIB = 1 << 20

#: group -> (the checks it records, its time limit in seconds)
GROUPS: dict[str, tuple[tuple[str, ...], int]] = {
    "cupti": (("cupti.session", "cupti.reference", "cupti.kernel_names", "cupti.kernel_time", "cupti.memcpy_memset",
               "cupti.flows"), 120),
    "nvml": (("nvml.counters_vs_nvidia_smi",), 60),
    "torch": (("torch.op_table", "torch.kernel_stats", "torch.memory_by_category"), 120),
    "xla": (("xla.kernel_stats", "xla.op_stats", "xla.jax_profile"), 150),
    "options": (("options.activity_cap", "options.api_cap", "options.nvtx", "options.record_switches",
                 "options.graph_node_mapping"), 120),
    "doctor": (("doctor.truthful",), 90),
    "overhead_torch": (("overhead.cupti_vs_kineto", "overhead.torch_vs_torch_profiler"), 120),
    "overhead_xla": (("overhead.xla_vs_jax_profiler",), 120),
}


# -- the harness: one record per check, a failure never stops the next ----------------------------
def tb_summary(exc: BaseException, limit: int = 6) -> str:
    """The exception and the last frames of its traceback, a few lines."""
    frames = traceback.extract_tb(exc.__traceback__)[-limit:]
    where = "; ".join(f"{Path(f.filename).name}:{f.lineno} in {f.name}" for f in frames)
    return f"{type(exc).__name__}: {str(exc)[:600]} [{where}]"


#: in a group's child process: where its records are rewritten after every check, so that a crash
#: (a segfault in a native library, say) loses only the check it happened in
RECORDS_OUT: Path | None = None


def run_check(records: list[dict[str, Any]], name: str, fn: Callable[[], tuple[bool, dict[str, Any]]]
              ) -> dict[str, Any]:
    """Run one check, append its record; an exception is a failed record with its traceback summary."""
    t0 = time.perf_counter()
    try:
        ok, figures = fn()
        rec: dict[str, Any] = {"name": name, "ok": bool(ok), "figures": _plain(figures)}
    except Exception as e:  # noqa: BLE001 - every failure is recorded, the next check runs
        rec = {"name": name, "ok": False, "figures": {}, "error": tb_summary(e)}
    rec["wall_s"] = round(time.perf_counter() - t0, 3)
    records.append(rec)
    if RECORDS_OUT is not None:
        write_atomically(RECORDS_OUT, records)
    return rec


def _plain(x: Any) -> Any:
    """JSON-ready: tuples to lists, other objects to their text."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, float):
        return round(x, 6)
    if x is None or isinstance(x, (bool, int, str)):
        return x
    return str(x)


class Needs:
    """Results a later check of the same group needs; asking for a missing one raises, naming it."""

    def __init__(self) -> None:
        self._d: dict[str, Any] = {}

    def __setitem__(self, k: str, v: Any) -> None:
        self._d[k] = v

    def __getitem__(self, k: str) -> Any:
        if k not in self._d:
            raise RuntimeError(f"needs {k!r} from an earlier check of this group, which failed")
        return self._d[k]


def pct(a: float, b: float) -> float:
    return 100.0 * (a - b) / b if b else (0.0 if a == b else float("inf"))


@contextlib.contextmanager
def quiet_warnings() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


# -- workloads -------------------------------------------------------------------------------------
def memset_async(torch: Any, tensor: Any) -> str:
    """cudaMemsetAsync on the tensor's bytes (torch issues none itself); returns what issued it."""
    nbytes = tensor.numel() * tensor.element_size()
    stream = torch.cuda.current_stream().cuda_stream
    try:
        from cuda.bindings import runtime as rt
    except ImportError:
        from cuda import cudart as rt  # older cuda-python
    err, = rt.cudaMemsetAsync(tensor.data_ptr(), 0, nbytes, stream)
    if int(err) != 0:
        raise RuntimeError(f"cudaMemsetAsync failed: {err}")
    return "cuda.bindings.runtime.cudaMemsetAsync"


class TorchWork:
    """Per iteration: a matmul and a relu (kernels), 1 MiB HtoD from pinned and from pageable memory,
    1 MiB DtoH, 1 MiB DtoD, one 1 MiB memset. Every copy is counted by hand in ``expected``."""

    def __init__(self, torch: Any, n: int = 1024) -> None:
        self.torch = torch
        torch.manual_seed(0)
        self.a = torch.randn(n, n, device="cuda")
        self.b = torch.randn(n, n, device="cuda")
        self.host = torch.randn(MIB // 4)
        self.pinned = self.host.pin_memory()
        self.dev = torch.empty(MIB // 4, device="cuda")
        self.dst = torch.empty(MIB // 4, device="cuda")
        #: how the memset is issued, or why it cannot be (then the workload has none and expects none)
        try:
            self.memset_by: str | None = memset_async(torch, self.dst)
            torch.cuda.synchronize()
            self.memset_error = ""
        except Exception as e:  # noqa: BLE001 - a figure, not a reason to lose the other copies
            self.memset_by, self.memset_error = None, tb_summary(e)

    def run(self, iters: int) -> None:
        t = self.torch
        for _ in range(iters):
            c = t.relu(self.a @ self.b)
            self.dev.copy_(self.pinned, non_blocking=True)   # HtoD, pinned
            self.dev.copy_(self.host)                        # HtoD, pageable
            self.dst.copy_(self.dev)                         # DtoD
            self.host.copy_(self.dst)                        # DtoH
            if self.memset_by:
                memset_async(t, self.dst)                    # memset
            del c
        t.cuda.synchronize()

    def expected(self, iters: int) -> dict[str, int]:
        return {"HtoD": 2 * iters, "DtoH": iters, "DtoD": iters, "memset": iters if self.memset_by else 0}


def matmul_loop(torch: Any, iters: int, n: int = 2048) -> Callable[[], None]:
    torch.manual_seed(0)
    a = torch.randn(n, n, device="cuda")

    def loop() -> None:
        x = a
        for _ in range(iters):
            x = (x @ a).clamp_(-1, 1)
        torch.cuda.synchronize()

    return loop


def kineto_events(prof: Any, tmp: Path, name: str) -> list[dict[str, Any]]:
    """torch's own Chrome trace of a torch.profiler profile, read with json (no omniprof code)."""
    path = tmp / f"{name}.pt.trace.json"
    prof.export_chrome_trace(str(path))
    with open(path, encoding="utf-8") as fh:
        return list(json.load(fh).get("traceEvents", []))


def demangle(names: list[str]) -> dict[str, str]:
    """c++filt's reading of each name (the name itself where c++filt is missing)."""
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, timeout=30,
                             check=True).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return {n: n for n in names}
    return dict(zip(names, out)) if len(out) == len(names) else {n: n for n in names}


# -- the cupti backend's part against torch.profiler's Chrome trace events (pure functions) ---------
def _x(kev: list[dict[str, Any]], *cats: str) -> list[dict[str, Any]]:
    return [e for e in kev if e.get("ph") == "X" and e.get("cat") in cats]


def compare_kernels(part: Any, kev: list[dict[str, Any]]) -> tuple[bool, dict[str, Any]]:
    """Kernel names and counts of our part equal torch.profiler's."""
    ours = Counter(s.name for s in part.spans if s.category == "kernel")
    theirs = Counter(e["name"] for e in _x(kev, "kernel"))
    readable = demangle(sorted(ours))
    ours_demangled: Counter[str] = Counter()
    for n, k in ours.items():
        ours_demangled[readable[n]] += k
    return ours == theirs, {
        "kernels_ours": sum(ours.values()), "kernels_torch_profiler": sum(theirs.values()),
        "distinct_ours": len(ours), "distinct_torch_profiler": len(theirs), "names_and_counts_equal": ours == theirs,
        "equal_after_demangling_ours": ours_demangled == theirs,
        "only_ours": sorted(set(ours) - set(theirs))[:5], "only_torch_profiler": sorted(set(theirs) - set(ours))[:5],
        "count_mismatches": {n: [ours[n], theirs[n]] for n in sorted(set(ours) & set(theirs)) if ours[n] != theirs[n]}}


def compare_kernel_time(part: Any, kev: list[dict[str, Any]], tolerance_pct: float = 2.0) -> tuple[bool, dict[str, Any]]:
    """Total kernel time of our part within ``tolerance_pct`` of torch.profiler's."""
    ours = sum(s.dur_ns for s in part.spans if s.category == "kernel")
    theirs = sum(round(float(e.get("dur", 0)) * 1000) for e in _x(kev, "kernel"))
    diff = pct(ours, theirs)
    return abs(diff) <= tolerance_pct, {"total_kernel_ms_ours": ours / 1e6, "total_kernel_ms_torch_profiler": theirs / 1e6,
                                        "diff_pct": diff, "tolerance_pct": tolerance_pct}


def compare_copies(part: Any, kev: list[dict[str, Any]], expected: dict[str, int] | None = None,
                   nbytes: int = MIB) -> tuple[bool, dict[str, Any]]:
    """memcpy (by direction) and memset counts and bytes equal torch.profiler's, and the copies of
    ``nbytes`` number what the workload made (``expected``: direction or "memset" -> count)."""
    ours: Counter[tuple[str, int]] = Counter()
    for s in part.spans:
        if s.category == "memcpy":
            ours[(str(s.args.get("kind")), int(s.args.get("bytes", 0)))] += 1
        elif s.category == "memset":
            ours[("memset", int(s.args.get("bytes", 0)))] += 1
    theirs: Counter[tuple[str, int]] = Counter()
    for e in _x(kev, "gpu_memcpy"):  # "Memcpy HtoD (Pageable -> Device)"
        theirs[(e["name"].split()[1], int(e.get("args", {}).get("bytes", 0)))] += 1
    for e in _x(kev, "gpu_memset"):
        theirs[("memset", int(e.get("args", {}).get("bytes", 0)))] += 1
    by_hand = {k: ours[(k, nbytes)] for k in expected} if expected else {}
    ok = bool(ours) and ours == theirs and by_hand == (expected or {})
    return ok, {"ours": {f"{k} {b}B": n for (k, b), n in sorted(ours.items())},
                "torch_profiler": {f"{k} {b}B": n for (k, b), n in sorted(theirs.items())},
                f"expected_{nbytes}B_by_hand": expected, f"ours_{nbytes}B": by_hand,
                "bytes_ours": sum(b * n for (_, b), n in ours.items()),
                "bytes_torch_profiler": sum(b * n for (_, b), n in theirs.items())}


def compare_flows(part: Any, kev: list[dict[str, Any]]) -> tuple[bool, dict[str, Any]]:
    """Every flow of our part ends at a CUDA call we recorded, and we link at least the GPU work
    torch.profiler links (its ``ac2g`` flows carry the correlation id)."""
    device = [s for s in part.spans if s.category in ("kernel", "memcpy", "memset")]
    host: dict[int, list[str]] = {}
    for s in part.spans:
        if s.category == "runtime":
            host.setdefault(int(s.args.get("correlation_id", 0)), []).append(s.name)
    linked = [s for s in device if s.flow_ids]
    bad_ends = [s.name for s in device for f in s.flow_ids if f not in host]
    launchers = Counter(n for s in linked for f in s.flow_ids for n in host.get(f, ()))
    flow_ids = {e.get("id") for e in kev if e.get("cat") == "ac2g" and e.get("ph") in ("s", "f")}
    kdevice = _x(kev, "kernel", "gpu_memcpy", "gpu_memset")
    klinked = sum(1 for e in kdevice if e.get("args", {}).get("correlation") in flow_ids)
    ok = bool(device) and not bad_ends and len(linked) >= klinked
    return ok, {"device_spans": len(device), "linked": len(linked),
                "unlinked_names": sorted({s.name for s in device if not s.flow_ids})[:5],
                "device_events_torch_profiler": len(kdevice), "linked_torch_profiler": klinked,
                "flow_ids_without_host_call": len(bad_ends), "flows_ours": len(part.flows),
                "host_ends": dict(launchers.most_common(8))}


# -- group: cupti ----------------------------------------------------------------------------------
def group_cupti(records: list[dict[str, Any]], tmp: Path) -> None:
    import torch

    import omniprof
    from omniprof import ProfileOptions

    iters = 20
    work = TorchWork(torch)
    work.run(3)  # cuBLAS handle, allocator, module loading outside both sessions
    got = Needs()

    def session() -> tuple[bool, dict[str, Any]]:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            with omniprof.Profiler(backend="cupti", options=ProfileOptions(host_tracer_level=3)) as prof:
                work.run(iters)
        part = prof.result.part("cupti")
        got["part"] = part
        cats = Counter(s.category for s in part.spans)
        return bool(cats.get("kernel")), {
            "spans_by_category": dict(cats), "flows": len(part.flows), "losses": [vars_loss(x) for x in part.losses],
            "warnings": [str(w.message)[:200] for w in said][:5], "versions": part.metadata.get("versions", {}),
            "notes": part.metadata.get("notes", []), "errors": part.metadata.get("errors", [])}

    def reference() -> tuple[bool, dict[str, Any]]:
        # torch.profiler (Kineto, CUPTI underneath) on the same workload, after ours has let CUPTI go
        # (one subscriber per process); its failure is the reference's, not ours.
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as tp:
            work.run(iters)
        got["kineto"] = kineto_events(tp, tmp, "cupti_reference")
        cats = Counter(e.get("cat") for e in got["kineto"] if e.get("ph") == "X")
        return bool(cats.get("kernel")), {"events_by_category": dict(cats)}

    def kernel_names() -> tuple[bool, dict[str, Any]]:
        return compare_kernels(got["part"], got["kineto"])

    def kernel_time() -> tuple[bool, dict[str, Any]]:
        ok, figures = compare_kernel_time(got["part"], got["kineto"])
        return ok, {**figures, "note": "two runs of the same workload (one CUPTI subscriber per process)"}

    def copies() -> tuple[bool, dict[str, Any]]:
        ok, figures = compare_copies(got["part"], got["kineto"], work.expected(iters))
        return ok, {"memset_issued_by": work.memset_by or f"none: {work.memset_error}", **figures}

    def flows() -> tuple[bool, dict[str, Any]]:
        return compare_flows(got["part"], got["kineto"])

    run_check(records, "cupti.session", session)
    run_check(records, "cupti.reference", reference)
    run_check(records, "cupti.kernel_names", kernel_names)
    run_check(records, "cupti.kernel_time", kernel_time)
    run_check(records, "cupti.memcpy_memset", copies)
    run_check(records, "cupti.flows", flows)


def vars_loss(loss: Any) -> dict[str, Any]:
    return {"source": loss.source, "kind": loss.kind, "count": loss.count, "detail": loss.detail[:160]}


# -- group: nvml -----------------------------------------------------------------------------------
SMI_FIELDS = {  # nvidia-smi field -> (our metric, factor from nvidia-smi's unit to ours, tolerance (abs, rel))
    "utilization.gpu": ("gpu_utilization", 1.0, (10.0, 0.0)),
    "memory.used": ("memory_used", float(MIB), (0.0, 0.02)),  # MiB -> bytes; 2% of the total
    "power.draw": ("power", 1.0, (0.0, 0.15)),
    "clocks.sm": ("sm_clock", 1.0, (0.0, 0.05)),
    "clocks.mem": ("memory_clock", 1.0, (0.0, 0.02)),
    "temperature.gpu": ("temperature", 1.0, (3.0, 0.0)),
}


def group_nvml(records: list[dict[str, Any]], tmp: Path) -> None:
    import torch

    import omniprof
    from omniprof import ProfileOptions

    def check() -> tuple[bool, dict[str, Any]]:
        loop = matmul_loop(torch, 40, 4096)
        loop()
        hold = torch.empty(4 * 1024 * MIB // 4, device="cuda").fill_(1.0)  # 4 GiB held through the window
        prof = omniprof.Profiler(backend="cupti", options=ProfileOptions(device_tracer_level=0),
                                 backend_options={"cupti": {"nvml_interval_s": 0.05}})
        clock = prof.clock
        smi: list[tuple[int, list[float | None]]] = []
        proc = subprocess.Popen(["nvidia-smi", "-i", "0", f"--query-gpu={','.join(SMI_FIELDS)}",
                                 "--format=csv,noheader,nounits", "-lms", "100"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

        def read() -> None:
            for line in proc.stdout:  # type: ignore[union-attr]
                vals: list[float | None] = []
                for cell in line.strip().split(","):
                    try:
                        vals.append(float(cell))
                    except ValueError:  # "[N/A]"
                        vals.append(None)
                smi.append((clock.now_ns(), vals))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            with prof:
                t0 = clock.now_ns()
                while clock.now_ns() - t0 < 3.0e9:
                    loop()
                t1 = clock.now_ns()
        finally:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)
            reader.join(5)
        del hold
        part = prof.result.part("cupti")
        lo, hi = t0 + int(0.5e9), t1 - int(0.1e9)  # the steady part of the window
        series = {c.name: c for c in part.counters}
        counter_tracks = {t.id for t in part.tracks if t.kind == "counter"}
        total = next((c.values[0] for n, c in series.items() if n.endswith(".memory_total") and c.values), 0.0)
        figures: dict[str, Any] = {"window_s": (hi - lo) / 1e9, "smi_samples": 0, "series": sorted(series)}
        ok = True
        for i, (field, (metric, factor, (tol_abs, tol_rel))) in enumerate(SMI_FIELDS.items()):
            s = series.get(f"gpu0.{metric}")
            theirs = [v[i] * factor for t, v in smi if lo <= t <= hi and len(v) > i and v[i] is not None]
            figures["smi_samples"] = max(figures["smi_samples"], len(theirs))
            if s is None or not theirs:
                figures[metric] = {"ours": None if s is None else "no samples in window", "nvidia_smi": len(theirs)}
                ok = False
                continue
            mine = [v for t, v in zip(s.t_ns, s.values) if lo <= t <= hi]
            if not mine:
                figures[metric] = {"ours": "no samples in window"}
                ok = False
                continue
            a, b = statistics.median(mine), statistics.median(theirs)
            tol = tol_abs + tol_rel * (total if metric == "memory_used" else abs(b))
            good = abs(a - b) <= tol and s.track in counter_tracks
            ok &= good
            figures[metric] = {"ours_median": a, "nvidia_smi_median": b, "tolerance": tol, "ok": good,
                               "samples_ours": len(mine), "on_counter_track": s.track in counter_tracks}
        return ok, figures

    run_check(records, "nvml.counters_vs_nvidia_smi", check)


# -- group: torch ----------------------------------------------------------------------------------
def kept_torch_registry() -> tuple[Any, list[Any]]:
    """A registry whose ``torch`` backend is the real one, keeping torch's profile object, so that
    key_averages() of the very run omniprof read can be asked for (Registry.add, as plugins do)."""
    from omniprof.backends.torch import TorchBackend
    from omniprof.core.registry import Registry

    kept: list[Any] = []

    class KeptTorchBackend(TorchBackend):
        def _build(self, state: dict[str, Any]) -> Any:
            kept.append(state.get("prof"))
            return super()._build(state)

    reg = Registry()
    reg.add("backend", KeptTorchBackend, source="benchmarks/gpu_acceptance.py")
    return reg, kept


def _us(e: Any, *names: str) -> float:
    for n in names:
        v = getattr(e, n, None)
        if v is not None:
            return float(v)
    return 0.0


def compare_op_table(part: Any, host_events: list[Any], require_runtime: bool = True) -> tuple[bool, dict[str, Any]]:
    """Our op table against torch's ``key_averages()`` rows of host events (ops, annotations and CUDA
    runtime calls): every row there, with its calls, total and self CPU time, total and self CUDA
    time (torch keeps microseconds: 2 us + 0.001 us per call allowed). ``require_runtime``: torch's
    rows must include CUDA runtime calls (a CUDA run)."""
    table = part.table("op_stats")
    ours = {r["name"]: r for r in (table.records() if table is not None else [])}
    missing, bad = [], {}
    runtime = [e.key for e in host_events if e.key.startswith("cuda")]
    worst = {"total_us": 0.0, "self_us": 0.0, "device_total_us": 0.0, "self_device_us": 0.0}
    for e in host_events:
        r = ours.get(e.key)
        if r is None:
            missing.append(e.key)
            continue
        tol = 2.0 + 0.001 * e.count
        pairs = {"total_us": (r["total_ns"] / 1e3, e.cpu_time_total),
                 "self_us": (r["self_ns"] / 1e3, e.self_cpu_time_total),
                 "device_total_us": ((r["device_total_ns"] or 0) / 1e3, _us(e, "device_time_total", "cuda_time_total")),
                 "self_device_us": ((r["device_self_ns"] or 0) / 1e3,
                                    _us(e, "self_device_time_total", "self_cuda_time_total"))}
        if r["calls"] != e.count:
            bad[e.key] = {"calls": [r["calls"], e.count]}
        for k, (a, b) in pairs.items():
            worst[k] = max(worst[k], abs(a - b))
            if abs(a - b) > tol:
                bad.setdefault(e.key, {})[k] = [round(a, 3), round(b, 3)]
    ok = bool(host_events) and not missing and not bad and (bool(runtime) or not require_runtime)
    return ok, {"rows_torch": len(host_events), "rows_ours": len(ours), "runtime_rows_torch": runtime[:10],
                "runtime_rows_missing_in_ours": [k for k in runtime if k in missing],
                "missing_in_ours": missing[:10], "mismatches": dict(list(bad.items())[:10]),
                "worst_abs_diff_us": worst, "tolerance_us": "2 + 0.001 * calls"}


def group_torch(records: list[dict[str, Any]], tmp: Path) -> None:
    import torch
    from torch.autograd import DeviceType

    import omniprof
    from omniprof import ProfileOptions

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).cuda()
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(256, 512, device="cuda")

    def step() -> None:
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()

    step()
    torch.cuda.synchronize()
    got = Needs()

    def op_table() -> tuple[bool, dict[str, Any]]:
        reg, kept = kept_torch_registry()
        with quiet_warnings():
            with omniprof.Profiler(backend="torch", registry=reg) as prof:
                for _ in range(3):
                    step()
                torch.cuda.synchronize()
        part = prof.result.part("torch")
        got["part"] = part
        ka = kept[-1].key_averages()
        got["ka"] = ka
        return compare_op_table(part, [e for e in ka if e.device_type == DeviceType.CPU])

    def kernel_stats() -> tuple[bool, dict[str, Any]]:
        part, ka = got["part"], got["ka"]
        ours: dict[str, list[int]] = {}
        table = part.table("kernel_stats")  # None when the part has no kernels
        for r in (table.records() if table is not None else []):
            acc = ours.setdefault(r["kernel_name"], [0, 0])
            acc[0] += r["occurrences"]
            acc[1] += r["total_ns"]
        theirs = {e.key: e for e in ka if e.device_type == DeviceType.CUDA
                  and not e.key.startswith(("Memcpy", "Memset"))}
        bad = {}
        for k, e in theirs.items():
            a = ours.get(k)
            b_us = _us(e, "self_device_time_total", "self_cuda_time_total")
            if a is None or a[0] != e.count or abs(a[1] / 1e3 - b_us) > 2.0 + 0.001 * e.count:
                bad[k[:80]] = [None if a is None else [a[0], a[1] / 1e3], [e.count, b_us]]
        extra = sorted(set(ours) - set(theirs))
        return not bad and not extra and bool(theirs), {
            "kernels_torch": len(theirs), "kernels_ours": len(ours), "mismatches": dict(list(bad.items())[:8]),
            "only_ours": extra[:5], "occurrences_ours": sum(v[0] for v in ours.values()),
            "occurrences_torch": sum(e.count for e in theirs.values())}

    def memory() -> tuple[bool, dict[str, Any]]:
        # A fresh model and optimizer: Adam's state is created inside the recording, as torch's
        # memory profiler needs to see it allocated to call it optimizer state.
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).cuda()
        adam = torch.optim.Adam(net.parameters())
        reg, kept = kept_torch_registry()
        opts = ProfileOptions(host_tracer_level=3, python_tracer_level=1)
        with quiet_warnings():
            with omniprof.Profiler(backend="torch", options=opts, registry=reg) as prof:
                for _ in range(2):
                    net(x).sum().backward()
                    adam.step()
                    adam.zero_grad()
                torch.cuda.synchronize()
        part = prof.result.part("torch")
        path = tmp / "memory_timeline.json"
        kept[-1].export_memory_timeline(str(path), device="cuda:0")  # torch's own export of the same run
        from torch.profiler import _memory_profiler as mp

        names = ["unknown" if c is None else c.name.lower() for c in mp._CATEGORY_TO_INDEX]
        times, sizes = json.loads(path.read_text())
        theirs = {n: max((row[i + 1] for row in sizes), default=0) for i, n in enumerate(names)}
        ours = {}
        for c in part.counters:
            m = re.fullmatch(r"memory (\w+) \((.+)\)", c.name)
            if m and m.group(2) == "cuda:0":
                ours[m.group(1)] = max(c.values, default=0)
        # by hand: the tensors' own bytes, and the same rounded up to the CUDA caching allocator's 512-byte blocks
        params = list(net.parameters())
        state = [t for s in adam.state.values() for t in s.values() if isinstance(t, torch.Tensor) and t.is_cuda]
        by_hand = {"gradient": [sum(p.numel() * p.element_size() for p in params),
                                sum(-(-p.numel() * p.element_size() // 512) * 512 for p in params)],
                   "optimizer_state": [sum(t.numel() * t.element_size() for t in state),
                                       sum(-(-t.numel() * t.element_size() // 512) * 512 for t in state)]}
        hand_ok = {k: ours.get(k) in v for k, v in by_hand.items()}
        same = {k: ours.get(k, 0) == v for k, v in theirs.items() if v}
        return all(same.values()) and all(hand_ok.values()), {
            "peaks_ours_bytes": ours, "peaks_torch_export_bytes": {k: v for k, v in theirs.items() if v},
            "equal_to_torch_export": same, "by_hand_bytes_exact_and_rounded_to_512": by_hand,
            "equal_by_hand": hand_ok, "timeline_points_torch": len(times)}

    run_check(records, "torch.op_table", op_table)
    run_check(records, "torch.kernel_stats", kernel_stats)
    run_check(records, "torch.memory_by_category", memory)


# -- group: xla ------------------------------------------------------------------------------------
def gviz_records(data: Any) -> list[dict[str, Any]]:
    """Rows of xprof's gviz DataTable JSON (one table or a list of them) as dicts by column id."""
    if isinstance(data, bytes):
        data = data.decode("utf-8", "replace")
    if isinstance(data, str):
        data = json.loads(data) if data.strip() else []
    tables = data if isinstance(data, list) else [data]
    out = []
    for t in tables:
        if not isinstance(t, dict):
            continue
        ids = [c.get("id") or c.get("label") for c in t.get("cols", [])]
        for r in t.get("rows", []):
            out.append({k: (cell.get("v") if isinstance(cell, dict) else cell) for k, cell in zip(ids, r.get("c", []))})
    return out


def xprof_tool(xplane: Path, tool: str) -> list[dict[str, Any]]:
    """xprof's own tool on the xplane file, called directly (not through omniprof)."""
    from xprof.convert import raw_to_tool_data

    data, _ = raw_to_tool_data.xspace_to_tool_data([str(xplane)], tool, {"use_saved_result": False})
    return gviz_records(data)


def group_xla(records: list[dict[str, Any]], tmp: Path) -> None:
    import jax
    import jax.numpy as jnp

    import omniprof

    x = jax.random.normal(jax.random.key(0), (2048, 2048), dtype=jnp.float32)
    f = jax.jit(lambda a: jnp.tanh(a @ a) * 0.5 + jnp.sum(a, axis=0))
    f(x).block_until_ready()
    reps = 10
    got = Needs()

    def session() -> None:
        if "part" in got._d:
            return
        with quiet_warnings():
            with omniprof.Profiler(backend="xla", logdir=tmp / "xla") as prof:
                for _ in range(reps):
                    f(x).block_until_ready()
        got["part"] = prof.result.part("xla")
        got["xplane"] = next((tmp / "xla").rglob("*.xplane.pb"))

    def kernels() -> tuple[bool, dict[str, Any]]:
        session()
        part = got["part"]
        tool_occ: Counter[str] = Counter()   # xprof has a row per kernel, op and launch shape: summed per kernel
        tool_us: Counter[str] = Counter()
        for r in xprof_tool(got["xplane"], "kernel_stats"):
            if r.get("kernel_name"):
                tool_occ[r["kernel_name"]] += int(float(r.get("occurrences") or 0))
                tool_us[r["kernel_name"]] += float(r.get("total_duration_us") or 0)
        tool = dict(tool_occ)
        table: dict[str, list[float]] = {}
        for r in (part.table("kernel_stats").records() if part.table("kernel_stats") else []):
            acc = table.setdefault(r["kernel_name"], [0, 0])
            acc[0] += r["occurrences"]
            acc[1] += r["total_ns"]
        spans = Counter(s.name for s in part.spans if s.category == "kernel")
        span_ns = Counter()
        for s in part.spans:
            if s.category == "kernel":
                span_ns[s.name] += s.dur_ns
        table_ok = {k: v[0] for k, v in table.items()} == tool and all(
            abs(table[k][1] / 1e3 - tool_us[k]) <= 1.0 + 0.001 * tool_occ[k] for k in tool)
        spans_ok = dict(spans) == tool and all(
            abs(span_ns[k] / 1e3 - tool_us[k]) <= max(1.0, 0.01 * tool_us[k]) for k in tool)
        return bool(tool) and table_ok and spans_ok, {
            "kernels_xprof": len(tool), "occurrences_xprof": sum(tool_occ.values()),
            "occurrences_table": sum(v[0] for v in table.values()), "kernel_spans_ours": sum(spans.values()),
            "table_equals_xprof": table_ok, "spans_equal_xprof": spans_ok,
            "total_us_xprof": sum(tool_us.values()), "total_us_spans": sum(span_ns.values()) / 1e3,
            "only_xprof": sorted(set(tool) - set(spans))[:5], "only_spans": sorted(set(spans) - set(tool))[:5]}

    def ops() -> tuple[bool, dict[str, Any]]:
        session()
        part = got["part"]
        tool = [r for r in xprof_tool(got["xplane"], "framework_op_stats")
                if r.get("operation") and r.get("type") != "IDLE" and r.get("operation") != "IDLE"]
        theirs = Counter()
        their_self = Counter()
        for r in tool:
            theirs[r["operation"]] += int(float(r.get("occurrences") or 0))
            their_self[r["operation"]] += float(r.get("total_self_time") or 0)
        table = part.table("op_stats")
        ours = Counter()
        our_self = Counter()
        for r in (table.records() if table else []):
            ours[r["name"]] += r["calls"]
            our_self[r["name"]] += r["self_ns"] / 1e3
        ok = bool(tool) and ours == theirs and all(abs(our_self[k] - their_self[k]) <= 1.0 + 0.001 * theirs[k]
                                                    for k in theirs)
        return ok, {"ops_xprof": len(theirs), "ops_ours": len(ours), "calls_equal": ours == theirs,
                    "self_us_xprof": sum(their_self.values()), "self_us_ours": sum(our_self.values()),
                    "only_xprof": sorted(set(theirs) - set(ours))[:5], "only_ours": sorted(set(ours) - set(theirs))[:5],
                    "table_title": table.title if table else None}

    def jax_profile() -> tuple[bool, dict[str, Any]]:
        session()
        with quiet_warnings():
            run = omniprof.jax.profile(f, x, quiet=True)
        from omniprof.backends.xla.timing import render_profile

        text = render_profile(run)
        per_call = Counter()
        for r in run.kernel_rows:
            per_call[r["kernel_name"]] += r["occurrences"]
        in_session = Counter(s.name for s in got["part"].spans if s.category == "kernel")
        expected = {k: v // reps for k, v in in_session.items()}
        ok = bool(run.kernel_rows) and bool(run.op_rows) and dict(per_call) == expected and all(
            k[:40] in text for k in list(per_call)[:3])
        return ok, {"kernel_rows": len(run.kernel_rows), "op_rows": len(run.op_rows),
                    "kernels_per_call": sum(per_call.values()), "kernels_per_call_from_session": sum(expected.values()),
                    "equal_to_session_per_call": dict(per_call) == expected, "text_lines": text.count("\n"),
                    "device": run.summary.device}

    run_check(records, "xla.kernel_stats", kernels)
    run_check(records, "xla.op_stats", ops)
    run_check(records, "xla.jax_profile", jax_profile)


# -- group: options ------------------------------------------------------------------------------
def group_options(records: list[dict[str, Any]], tmp: Path) -> None:
    import torch

    import omniprof
    from omniprof import ProfileOptions

    work = TorchWork(torch)
    work.run(3)
    iters = 10
    device_kinds = ("kernel", "memcpy", "memset", "sync")

    def session(options: ProfileOptions | None = None, backend_options: dict[str, Any] | None = None,
                fn: Callable[[], None] | None = None) -> Any:
        with quiet_warnings():
            with omniprof.Profiler(backend="cupti", options=options,
                                   backend_options={"cupti": backend_options} if backend_options else None) as p:
                (fn or (lambda: work.run(iters)))()
        return p.result.part("cupti")

    got = Needs()

    def base() -> Any:
        if "base" not in got._d:
            got["base"] = session()
        return got["base"]

    def activity_cap() -> tuple[bool, dict[str, Any]]:
        full = sum(1 for s in base().spans if s.category in device_kinds)
        part = session(ProfileOptions(advanced_configuration={"gpu_max_activity_api_events": 5}))
        kept = sum(1 for s in part.spans if s.category in device_kinds)
        lost = sum(x.count for x in part.losses if x.kind == "events_dropped" and "activity" in x.detail)
        return kept == 5 and lost > 0 and kept + lost == full, {
            "device_records_uncapped": full, "kept": kept, "counted_lost": lost, "cap": 5}

    def api_cap() -> tuple[bool, dict[str, Any]]:
        full = sum(1 for s in base().spans if s.category == "runtime")
        part = session(ProfileOptions(advanced_configuration={"gpu_max_callback_api_events": 5}))
        kept = sum(1 for s in part.spans if s.category == "runtime")
        lost = sum(x.count for x in part.losses if x.kind == "events_dropped" and "callback" in x.detail)
        return kept == 5 and lost > 0 and kept + lost == full, {
            "api_records_uncapped": full, "kept": kept, "counted_lost": lost, "cap": 5}

    def nvtx() -> tuple[bool, dict[str, Any]]:
        n = 7

        def ranges() -> None:
            for i in range(n):
                torch.cuda.nvtx.range_push("omniprof-acceptance")
                work.run(1)
                torch.cuda.nvtx.range_pop()

        part = session(ProfileOptions(advanced_configuration={"gpu_enable_nvtx_tracking": True}), fn=ranges)
        got_ranges = [s for s in part.spans if s.category == "nvtx" and s.name == "omniprof-acceptance"]
        return len(got_ranges) == n, {"ranges_pushed": n, "ranges_recorded": len(got_ranges),
                                      "NVTX_INJECTION64_PATH": os.environ.get("NVTX_INJECTION64_PATH"),
                                      "record_kinds": part.metadata.get("record_kinds")}

    def switches() -> tuple[bool, dict[str, Any]]:
        figures: dict[str, Any] = {}
        p = session(backend_options={"record_memcpy": False, "record_memset": False})
        c = Counter(s.category for s in p.spans)
        figures["record_memcpy_memset_false"] = dict(c)
        ok = c.get("kernel", 0) > 0 and not c.get("memcpy") and not c.get("memset")
        p = session(ProfileOptions(device_tracer_level=0))
        c = Counter(s.category for s in p.spans)
        figures["device_tracer_level_0"] = {"spans": dict(c), "counters": len(p.counters)}
        ok &= not c.get("kernel") and len(p.counters) > 0
        p = session(ProfileOptions(host_tracer_level=1))
        c = Counter(s.category for s in p.spans)
        figures["host_tracer_level_1"] = dict(c)
        ok &= not c.get("runtime") and c.get("kernel", 0) > 0
        p = session(ProfileOptions(host_tracer_level=3))
        apis = Counter(s.args.get("api") for s in p.spans if s.category == "runtime")
        figures["host_tracer_level_3_api_kinds"] = dict(apis)
        ok &= apis.get("driver", 0) > 0 and apis.get("runtime", 0) > 0
        return ok, figures

    def graphs() -> tuple[bool, dict[str, Any]]:
        a = torch.randn(512, 512, device="cuda")

        def fn() -> Any:
            return torch.relu(a @ a) + 1

        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        eager = session(fn=lambda: (fn(), torch.cuda.synchronize()))
        eager_kernels = sum(1 for sp in eager.spans if sp.category == "kernel")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        replays = 3

        def replay() -> None:
            for _ in range(replays):
                g.replay()
            torch.cuda.synchronize()

        part = session(ProfileOptions(advanced_configuration={"gpu_dump_graph_node_mapping": True}), fn=replay)
        ks = [sp for sp in part.spans if sp.category == "kernel"]
        with_ids = [sp for sp in ks if sp.args.get("graph_id")]
        ok = len(ks) == replays * eager_kernels and len(with_ids) == len(ks) and eager_kernels > 0
        return ok, {"eager_kernels": eager_kernels, "replays": replays, "graph_kernels": len(ks),
                    "with_graph_id": len(with_ids), "with_node_id": sum(1 for sp in ks if sp.args.get("graph_node_id"))}

    run_check(records, "options.activity_cap", activity_cap)
    run_check(records, "options.api_cap", api_cap)
    run_check(records, "options.nvtx", nvtx)
    run_check(records, "options.record_switches", switches)
    run_check(records, "options.graph_node_mapping", graphs)


# -- group: doctor ---------------------------------------------------------------------------------
def group_doctor(records: list[dict[str, Any]], tmp: Path) -> None:
    def check() -> tuple[bool, dict[str, Any]]:
        from omniprof.backends.cupti.diagnostics import cupti_library_path
        from omniprof.core.doctor import run_doctor

        smi = nvidia_smi()
        with quiet_warnings():
            rep = run_doctor(frameworks=True)
        gpu = {c.name: (bool(c.ok), str(c.detail)) for c in rep.gpu}
        env = dict(rep.environment)
        admin_only = None
        with contextlib.suppress(OSError):
            m = re.search(r"RmProfilingAdminOnly:\s*(\d)", Path("/proc/driver/nvidia/params").read_text())
            admin_only = int(m.group(1)) if m else None
        may_profile = admin_only in (0, None) or os.geteuid() == 0
        lib = cupti_library_path()
        truths = {
            "driver_as_nvidia_smi": gpu.get("nvml", (False, ""))[0] and smi["driver"] in gpu["nvml"][1],
            "gpu_as_nvidia_smi": gpu.get("gpus", (False, ""))[0] and smi["name"] in gpu["gpus"][1],
            "libcupti_found": gpu.get("cupti", (False, ""))[0] and lib is not None and Path(lib).is_file(),
            "privileges_as_driver_says": gpu.get("cupti_subscriber", (False, ""))[0] == may_profile,
            "torch_sees_cuda": "cuda available: True" in env.get("torch", ""),
            "jax_sees_gpu": any(w in env.get("jax devices", "") for w in ("gpu:", "cuda:")),
        }
        caps = {name: [(c.feature, bool(c.available)) for c in cs] for name, cs in rep.capabilities
                if name in ("cupti", "torch", "xla")}
        return all(truths.values()), {"truths": truths, "gpu_checks": gpu, "libcupti": lib,
                                      "RmProfilingAdminOnly": admin_only, "euid": os.geteuid(), "capabilities": caps}

    run_check(records, "doctor.truthful", check)


# -- groups: overhead ------------------------------------------------------------------------------
def medians(cases: dict[str, Callable[[list[float]], None]], repeats: int) -> dict[str, dict[str, float]]:
    """Each case run ``repeats`` times, interleaved; median loop time (inside the session) and whole time."""
    loop: dict[str, list[float]] = {k: [] for k in cases}
    whole: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            inner: list[float] = []
            t0 = time.perf_counter()
            fn(inner)
            whole[name].append(time.perf_counter() - t0)
            loop[name].append(inner[0] if inner else whole[name][-1])
    return {k: {"loop_ms": statistics.median(loop[k]) * 1e3, "session_ms": statistics.median(whole[k]) * 1e3}
            for k in cases}


def _timed_loop(loop: Callable[[], None], inner: list[float]) -> None:
    t0 = time.perf_counter()
    loop()
    inner.append(time.perf_counter() - t0)


def overhead_verdict(ours: dict[str, float], raw: dict[str, float]) -> bool:
    """Ours is acceptable when its loop runs within 10% (+1 ms) of the raw profiler's."""
    return ours["loop_ms"] <= 1.10 * raw["loop_ms"] + 1.0


def group_overhead_torch(records: list[dict[str, Any]], tmp: Path) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    import omniprof

    loop = matmul_loop(torch, 200)
    loop()
    repeats = 5

    def plain(inner: list[float]) -> None:
        _timed_loop(loop, inner)

    def kineto(acts: list[Any]) -> Callable[[list[float]], None]:
        def run(inner: list[float]) -> None:
            with profile(activities=acts):
                _timed_loop(loop, inner)
        return run

    def ours(backend: str) -> Callable[[list[float]], None]:
        def run(inner: list[float]) -> None:
            with quiet_warnings(), omniprof.Profiler(backend=backend):
                _timed_loop(loop, inner)
        return run

    def cupti() -> tuple[bool, dict[str, Any]]:
        # ours first, then Kineto: a Kineto session may leave CUPTI set up its way for the process
        a = medians({"unprofiled": plain, "omniprof cupti": ours("cupti")}, repeats)
        b = medians({"unprofiled": plain, "torch.profiler CUDA": kineto([ProfilerActivity.CUDA])}, repeats)
        after: Any = "ok"
        try:
            ours("cupti")([])
        except Exception as e:  # noqa: BLE001 - a figure: can users run both in one process?
            after = tb_summary(e)
        return overhead_verdict(a["omniprof cupti"], b["torch.profiler CUDA"]), {
            **{f"{k} (phase 1)": v for k, v in a.items()}, **{f"{k} (phase 2)": v for k, v in b.items()},
            "cupti_after_torch_profiler_in_same_process": after, "repeats": repeats,
            "loop": "200 x (2048^2 fp32 matmul + clamp)", "target": "loop within 10% + 1 ms of the raw profiler's"}

    def torch_backend() -> tuple[bool, dict[str, Any]]:
        m = medians({"unprofiled": plain, "torch.profiler CPU+CUDA": kineto([ProfilerActivity.CPU, ProfilerActivity.CUDA]),
                     "omniprof torch": ours("torch")}, repeats)
        return overhead_verdict(m["omniprof torch"], m["torch.profiler CPU+CUDA"]), {
            **m, "repeats": repeats, "target": "loop within 10% + 1 ms of the raw profiler's"}

    run_check(records, "overhead.cupti_vs_kineto", cupti)
    run_check(records, "overhead.torch_vs_torch_profiler", torch_backend)


def group_overhead_xla(records: list[dict[str, Any]], tmp: Path) -> None:
    import jax
    import jax.numpy as jnp

    import omniprof

    x = jax.random.normal(jax.random.key(0), (2048, 2048), dtype=jnp.float32)
    f = jax.jit(lambda a: jnp.clip(a @ a, -1, 1))
    f(x).block_until_ready()
    repeats = 5

    def loop() -> None:
        y = x
        for _ in range(200):
            y = f(y)
        y.block_until_ready()

    def plain(inner: list[float]) -> None:
        _timed_loop(loop, inner)

    def raw(inner: list[float]) -> None:
        with tempfile.TemporaryDirectory(dir=tmp) as d, jax.profiler.trace(d):
            _timed_loop(loop, inner)

    def ours(inner: list[float]) -> None:
        with quiet_warnings(), omniprof.Profiler(backend="xla"):
            _timed_loop(loop, inner)

    def check() -> tuple[bool, dict[str, Any]]:
        m = medians({"unprofiled": plain, "jax.profiler.trace": raw, "omniprof xla": ours}, repeats)
        return overhead_verdict(m["omniprof xla"], m["jax.profiler.trace"]), {
            **m, "repeats": repeats, "loop": "200 x jit(clip(a @ a)) 2048^2 fp32",
            "target": "loop within 10% + 1 ms of the raw profiler's; session_ms includes xprof's tools at stop"}

    run_check(records, "overhead.xla_vs_jax_profiler", check)


GROUP_FUNCS: dict[str, Callable[[list[dict[str, Any]], Path], None]] = {
    "cupti": group_cupti, "nvml": group_nvml, "torch": group_torch, "xla": group_xla, "options": group_options,
    "doctor": group_doctor, "overhead_torch": group_overhead_torch, "overhead_xla": group_overhead_xla,
}


# -- the parent: environment, "no GPU", children, the record -------------------------------------
def nvidia_smi() -> dict[str, str]:
    """Name, driver and memory of GPU 0 as nvidia-smi says; raises OSError/CalledProcessError without one."""
    out = subprocess.run(["nvidia-smi", "-i", "0", "--query-gpu=name,driver_version,memory.total",
                          "--format=csv,noheader"], capture_output=True, text=True, timeout=30, check=True).stdout
    name, driver, mem = [c.strip() for c in out.strip().splitlines()[0].split(",")]
    return {"name": name, "driver": driver, "memory_total": mem}


def dist_version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    """Versions, without importing torch or jax (no CUDA call)."""
    import platform

    import omniprof

    native = {}
    for mod in ("omniprof.backends.cpu._nativesampler", "omniprof.backends.cpu._fastwalk",
                "omniprof.backends.memory._allocsampler"):
        try:
            __import__(mod)
            native[mod.rsplit(".", 1)[1]] = True
        except ImportError:
            native[mod.rsplit(".", 1)[1]] = False
    return {"python": platform.python_version(), "omniprof": omniprof.__version__,
            "omniprof_from": str(Path(omniprof.__file__).parent), "torch": dist_version("torch"),
            "jax": dist_version("jax"), "jaxlib": dist_version("jaxlib"), "xprof": dist_version("xprof"),
            "cupti-python": dist_version("cupti-python"), "nvidia-ml-py": dist_version("nvidia-ml-py"),
            "nvidia-cuda-cupti": dist_version("nvidia-cuda-cupti") or dist_version("nvidia-cuda-cupti-cu13"),
            "omniprof_c_extensions": native}


def no_gpu_reason() -> str | None:
    """Why there is no GPU to test here, or None. The first CUDA call of the run is the last one here."""
    try:
        nvidia_smi()
    except FileNotFoundError:
        return "nvidia-smi not found"
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as e:
        return f"nvidia-smi found no GPU ({type(e).__name__}: {str(e).strip()[:120]})"
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device"
    return None


def group_env(group: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", XLA_PYTHON_CLIENT_PREALLOCATE="false",
               TF_CPP_MIN_LOG_LEVEL="3")
    if group == "options":  # NVTX hands its ranges to CUPTI only when injected before the process starts
        from omniprof.backends.cupti.diagnostics import cupti_library_path

        lib = cupti_library_path()
        if lib:
            env["NVTX_INJECTION64_PATH"] = lib
    return env


def run_group(group: str, limit_s: float, log: Any) -> list[dict[str, Any]]:
    """One group in a child process; a crash or timeout becomes a failed record for each of its checks."""
    names = GROUPS[group][0]
    with tempfile.TemporaryDirectory(prefix=f"omniprof-gpu-{group}-") as d:
        out = Path(d) / "records.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--group", group, "--group-out", str(out)]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit_s, env=group_env(group))
            rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as e:
            rc = None
            stdout = (e.stdout or b"").decode("utf-8", "replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            stderr = (e.stderr or b"").decode("utf-8", "replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        wall = time.perf_counter() - t0
        if log is not None:
            log.write(f"===== group {group}: rc={rc} wall={wall:.1f}s\n{stdout}\n--- stderr ---\n{stderr}\n")
            log.flush()
        got: list[dict[str, Any]] = []
        if out.exists():
            with contextlib.suppress(ValueError):
                got = json.loads(out.read_text())
    done = {r["name"] for r in got}
    why = (f"group {group!r} timed out after {limit_s:.0f} s" if rc is None else
           f"group {group!r} exited with status {rc}") + f"; stderr: ...{stderr.strip()[-600:]}"
    for name in names:
        if name not in done:
            got.append({"name": name, "ok": False, "figures": {}, "error": f"not recorded: {why}"})
    return got


def write_atomically(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1, sort_keys=False)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def record_path(results_dir: Path, device: str, when: _dt.datetime) -> Path:
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", device).strip("-") or "gpu"
    return results_dir / f"{when:%Y-%m-%d}-{slug}.json"


def child_main(group: str, out: Path) -> int:
    global RECORDS_OUT
    RECORDS_OUT = out
    records: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix=f"omniprof-gpu-{group}-work-") as d:
            GROUP_FUNCS[group](records, Path(d))
    except Exception as e:  # noqa: BLE001 - the group's setup failed: say so for each check not recorded
        done = {r["name"] for r in records}
        records += [{"name": n, "ok": False, "figures": {}, "error": f"group setup: {tb_summary(e)}"}
                    for n in GROUPS[group][0] if n not in done]
    write_atomically(out, records)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS, help="where the record is written")
    p.add_argument("--log", type=Path, help="write every group's own output to this file")
    p.add_argument("--only", help="comma-separated groups (default: all): " + ", ".join(GROUPS))
    p.add_argument("--budget-s", type=float, default=400.0, help="wall-clock budget for all groups (default 400)")
    p.add_argument("--plan", action="store_true", help="print the groups, their checks and limits; run nothing")
    p.add_argument("--group", help=argparse.SUPPRESS)
    p.add_argument("--group-out", type=Path, help=argparse.SUPPRESS)
    ns = p.parse_args(argv)
    if ns.group:
        if ns.group not in GROUPS or ns.group_out is None:
            p.error(f"--group must be one of {', '.join(GROUPS)}, with --group-out")
        return child_main(ns.group, ns.group_out)
    groups = list(GROUPS) if not ns.only else [g.strip() for g in ns.only.split(",") if g.strip()]
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        p.error(f"--only: unknown group(s) {unknown}; groups: {', '.join(GROUPS)}")
    if ns.plan:
        for g in groups:
            checks, limit = GROUPS[g]
            print(f"{g:15s} limit {limit:4d} s  {', '.join(checks)}")
        print(f"budget {ns.budget_s:.0f} s for all groups; record: {ns.results_dir}/<date>-<device>.json")
        return EXIT_OK
    env = environment()
    why = no_gpu_reason()
    if why is not None:
        print(f"no GPU: {why} (omniprof {env['omniprof']}, torch {env['torch']}, jax {env['jax']}); "
              f"nothing measured, nothing written")
        return EXIT_NO_GPU
    smi = nvidia_smi()
    import torch

    started = _dt.datetime.now(_dt.timezone.utc)
    t0 = time.perf_counter()
    checks: list[dict[str, Any]] = [{"name": "environment", "ok": all(env[k] for k in (
        "torch", "jax", "xprof", "cupti-python", "nvidia-ml-py")), "figures": env}]
    log = open(ns.log, "a", encoding="utf-8") if ns.log else None
    try:
        for g in groups:
            left = ns.budget_s - (time.perf_counter() - t0)
            if left < 20:
                checks += [{"name": n, "ok": False, "figures": {}, "error": f"not run: {ns.budget_s:.0f} s budget spent"}
                           for n in GROUPS[g][0]]
                continue
            got = run_group(g, min(GROUPS[g][1], left), log)
            for r in got:
                print(f"[{'ok' if r['ok'] else 'FAIL'}] {r['name']}" + (f": {r['error'][:300]}" if r.get("error") else ""),
                      flush=True)
            checks += got
    finally:
        if log is not None:
            log.close()
    record = {"device": smi["name"], "driver": smi["driver"], "torch": torch.__version__, "jax": env["jax"],
              "cuda": torch.version.cuda, "omniprof": env["omniprof"], "python": env["python"],
              "date": started.isoformat(timespec="seconds"), "wall_s": round(time.perf_counter() - t0, 1),
              "checks": checks}
    path = record_path(ns.results_dir, smi["name"], started)
    write_atomically(path, record)
    failed = [c["name"] for c in checks if not c["ok"]]
    print(f"{len(checks) - len(failed)}/{len(checks)} checks passed on {smi['name']} (driver {smi['driver']}) in "
          f"{record['wall_s']} s; record: {path}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return EXIT_FAILED if failed else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
