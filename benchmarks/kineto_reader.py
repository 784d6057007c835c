"""Reading a Kineto trace of 10^6 events: time and peak memory, beside plain ``json.load``.

Generates a synthetic GPU-training-like trace (CPU ops with shapes, CUDA launches, kernels with launch
parameters, memcpys, launch flows, memory events, step annotations) of ``--events`` events, then reads it
in fresh subprocesses:

* ``omniprof``: ``omniprof.formats.kineto.read_trace`` (streaming; builds the ProfileResult: spans, flows, counters;
  the op and kernel tables are analysis, built after it);
* ``json.load``: the whole file parsed into Python objects, nothing else done (the floor of a naive
  reader, before it builds anything).

For each: wall time, peak RSS growth over the process's RSS just before reading (``ru_maxrss``), and
the peak of Python allocations (``tracemalloc``, in a separate run because it slows Python down), each
also as a multiple of the uncompressed file size. Target: omniprof's peak below 3x the file size.

Run: ``python benchmarks/kineto_reader.py [--events 1000000] [--keep PATH]``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

KERNELS = [
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3> >"
    "(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)",
    "ampere_sgemm_128x64_tn", "sm80_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x32_stage4_warpsize2x2x1_tensor16x8x16",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float>, unsigned int, "
    "float, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, float>, unsigned int, float, 4>)",
]
OPS = [("aten::addmm", [[1024], [64, 512], [512, 1024], [], []], ["float", "float", "float", "Scalar", "Scalar"]),
       ("aten::add", [[64, 1024], [64, 1024], []], ["float", "float", "Scalar"]),
       ("aten::relu", [[64, 1024]], ["float"]), ("aten::mean", [[64, 1024], [], [], []], ["float", "", "", ""])]


def generate(path: Path, n_events: int, seed: int = 0) -> int:
    """Write a trace of about ``n_events`` events; returns the exact count."""
    rng = random.Random(seed)
    pid, tid = 4242, 4242
    ts = 1_700_000_000_000_000.0  # us, Unix epoch like older Kineto
    corr = 0
    ext = 0
    count = 0
    with open(path, "w", encoding="utf-8") as fh:
        fh.write('{\n  "schemaVersion": 1,\n  "deviceProperties": [{"id": 0, "name": "Synthetic GPU", "numSms": 108}],\n'
                 '  "traceEvents": [\n')
        first = True

        def emit(ev: dict) -> None:
            nonlocal first, count
            fh.write(("" if first else ",\n") + "  " + json.dumps(ev))
            first = False
            count += 1

        for meta in ({"name": "process_name", "ph": "M", "ts": ts, "pid": pid, "tid": 0, "args": {"name": "python3"}},
                     {"name": "thread_name", "ph": "M", "ts": ts, "pid": pid, "tid": tid, "args": {"name": "main"}}):
            emit(meta)
        step = 0
        while count < n_events:
            if count % 10_000 < 8:
                emit({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": pid, "tid": tid,
                      "ts": round(ts, 3), "dur": 5000.5, "args": {"External id": ext, "Ev Idx": count}})
                step += 1
            name, dims, types = OPS[rng.randrange(len(OPS))]
            ext += 1
            corr += 1
            t0 = round(ts, 3)
            emit({"ph": "X", "cat": "cpu_op", "name": name, "pid": pid, "tid": tid, "ts": t0, "dur": 12.345,
                  "args": {"External id": ext, "Sequence number": ext, "Fwd thread id": 0, "Record function id": 0,
                           "Concrete Inputs": ["", "", ""], "Input type": types, "Input Strides": [[1]] * len(dims),
                           "Input Dims": dims, "Ev Idx": count}})
            emit({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": tid,
                  "ts": round(ts + 3.125, 3), "dur": 4.5, "args": {"External id": ext, "cbid": 211, "correlation": corr}})
            emit({"ph": "s", "id": corr, "pid": pid, "tid": tid, "ts": round(ts + 3.125, 3), "cat": "ac2g", "name": "ac2g"})
            if rng.random() < 0.08:
                emit({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": 7,
                      "ts": round(ts + 20.5, 3), "dur": 3.0, "args": {"External id": ext, "device": 0, "context": 1,
                                                                      "stream": 7, "correlation": corr, "bytes": 262144,
                                                                      "memory bandwidth (GB/s)": 8.7}})
            else:
                emit({"ph": "X", "cat": "kernel", "name": KERNELS[rng.randrange(len(KERNELS))], "pid": 0, "tid": 7,
                      "ts": round(ts + 20.5, 3), "dur": 7.25,
                      "args": {"External id": ext, "queued": 0, "device": 0, "context": 1, "stream": 7,
                               "correlation": corr, "registers per thread": 32, "shared memory": 0,
                               "blocks per SM": 2.37, "warps per SM": 18.96, "grid": [256, 1, 1], "block": [256, 1, 1],
                               "est. achieved occupancy %": 29}})
            emit({"ph": "f", "id": corr, "pid": 0, "tid": 7, "ts": round(ts + 20.5, 3), "cat": "ac2g", "name": "ac2g",
                  "bp": "e"})
            if rng.random() < 0.1:
                emit({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": pid, "tid": tid,
                      "ts": round(ts + 1.5, 3), "args": {"Total Reserved": 2 << 20, "Total Allocated": 1 << 20,
                                                         "Bytes": 4096, "Device Id": -1, "Device Type": 0,
                                                         "Addr": 94509577802944, "Ev Idx": count}})
            ts += 15.0
        fh.write('\n  ],\n  "traceName": "synthetic.pt.trace.json", "displayTimeUnit": "ms"\n}\n')
    return count


_CHILD = r"""
import json, resource, sys, time, tracemalloc
mode, how, path = sys.argv[1], sys.argv[2], sys.argv[3]
if mode == "omniprof":
    import warnings
    from omniprof.formats.kineto import read_trace
    def work():
        r = read_trace(path)
        return len(r.parts[0].spans)
else:
    def work():
        with open(path, encoding="utf-8") as fh:
            return len(json.load(fh)["traceEvents"])
def rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
if how == "tracemalloc":
    tracemalloc.start()
    n = work()
    print(json.dumps({"items": n, "tracemalloc_peak_bytes": tracemalloc.get_traced_memory()[1]}))
else:
    with open("/proc/self/statm") as fh:
        base = int(fh.read().split()[1]) * resource.getpagesize()
    t0 = time.perf_counter()
    n = work()
    dt = time.perf_counter() - t0
    print(json.dumps({"items": n, "time_s": dt, "rss_growth_bytes": rss() - base}))
"""


def measure(mode: str, how: str, path: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, mode, how, str(path)], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keep", type=Path, default=None, help="write the synthetic trace here and keep it")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.keep or Path(tmp) / "synthetic.pt.trace.json"
        n = generate(path, args.events)
        size = os.path.getsize(path)
        print(f"trace: {n} events, {size / 2**20:.1f} MiB uncompressed ({path.name})")
        print(f"{'reader':10} {'time_s':>8} {'rss_growth':>12} {'x_file':>7} {'py_peak':>12} {'x_file':>7}  items")
        rows = {}
        for mode in ("omniprof", "json.load"):
            timed = measure(mode, "time", path)
            traced = measure(mode, "tracemalloc", path)
            rows[mode] = (timed, traced)
            print(f"{mode:10} {timed['time_s']:8.2f} {timed['rss_growth_bytes'] / 2**20:9.1f} MiB "
                  f"{timed['rss_growth_bytes'] / size:7.2f} {traced['tracemalloc_peak_bytes'] / 2**20:9.1f} MiB "
                  f"{traced['tracemalloc_peak_bytes'] / size:7.2f}  {timed['items']}")
        ours = rows["omniprof"]
        peak = max(ours[0]["rss_growth_bytes"], ours[1]["tracemalloc_peak_bytes"])
        print(f"omniprof peak / file size = {peak / size:.2f} (target < 3.00): {'OK' if peak < 3 * size else 'MISSED'}")
        print(f"omniprof time / json.load time = {ours[0]['time_s'] / rows['json.load'][0]['time_s']:.2f}")


if __name__ == "__main__":
    main()
