"""Stand-ins for NVML and CUPTI on machines without an NVIDIA GPU.

They have the methods of the real adapters (:class:`~omniprof.backends.cupti.nvml.PynvmlAdapter`,
:class:`~omniprof.backends.cupti.cupti_adapter.CuptiPythonAdapter`,
:class:`~omniprof.backends.cupti.cupti_adapter.CuptiPmSampler`) and replay recorded values, so the
``cupti`` backend's logic runs unchanged above them. :func:`records_from_kineto` turns a real
GPU's Kineto trace into CUPTI activity records to replay.

The fakes reach the backend the way any plugin does, through a registry, never by replacing
something process-wide: :func:`fake_cupti_backend` makes a ``cupti`` backend class whose
:class:`~omniprof.backends.cupti.backend.GpuAdapters` are the fakes, and :func:`fake_gpu_registry`
a registry holding it in place of the real one::

    from omniprof.testing.gpu_fakes import FakeCupti, FakeNvml, fake_gpu_registry

    reg = fake_gpu_registry(nvml=FakeNvml(), cupti=FakeCupti(records))
    with omniprof.Profiler(backend="cupti", registry=reg) as prof:
        ...

For the CLI or a child process, name a module-level subclass in a ``plugins.toml``
(``[backend.cupti]``, ``target = "mymod:FakeGpu"``, ``override = true``) and pass it with
``--plugins`` or ``OMNIPROF_PLUGINS``.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omniprof.backends.cupti.cupti_adapter import CuptiCallError, CuptiLoadError
from omniprof.backends.cupti.nvml import (
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_NOT_SUPPORTED,
    NvmlCallError,
    NvmlDevice,
)

__all__ = ["FakeNvml", "FakeCupti", "FakePmSampler", "fake_adapters", "fake_cupti_backend", "fake_gpu_registry",
           "records_from_kineto", "A100_READINGS", "A100_DEVICE", "H100_DEVICE"]

#: One A100 as NVML describes it.
A100_DEVICE = {"name": "NVIDIA A100-SXM4-40GB", "uuid": "GPU-00000000-fake-0000-0000-000000000000",
               "memory_total_bytes": 42_949_672_960, "pci_bus_id": "00000000:07:00.0", "compute_capability": "8.0"}
#: One H100 (compute capability 9.0: PM sampling's time trigger, which the A100 lacks).
H100_DEVICE = {"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-00000000-fake-0000-0000-000000000001",
               "memory_total_bytes": 85_520_809_984, "pci_bus_id": "00000000:19:00.0", "compute_capability": "9.0"}

#: NVML readings of a GPU going from idle into a compute-bound loop and back, in NVML's units
#: after the adapter's conversions (percent, bytes, W, MHz, C, bytes/s).
A100_READINGS: tuple[dict[str, float], ...] = tuple(
    {"gpu_utilization": u, "memory_utilization": mu, "memory_used": mem, "memory_total": 42_949_672_960.0,
     "power": p, "sm_clock": sm, "memory_clock": 1215.0, "temperature": t, "pcie_tx": tx, "pcie_rx": rx}
    for u, mu, mem, p, sm, t, tx, rx in [
        (0.0, 0.0, 3.2e8, 52.1, 210.0, 31.0, 1.0e6, 2.0e6),
        (35.0, 8.0, 1.9e9, 118.4, 1410.0, 33.0, 4.1e8, 9.8e8),
        (100.0, 41.0, 1.9e9, 301.7, 1410.0, 41.0, 2.0e7, 3.1e7),
        (100.0, 43.0, 1.9e9, 327.9, 1395.0, 47.0, 1.8e7, 2.9e7),
        (97.0, 40.0, 1.9e9, 318.2, 1395.0, 51.0, 2.2e7, 3.0e7),
        (12.0, 2.0, 1.9e9, 96.5, 1410.0, 50.0, 6.0e8, 1.2e8),
        (0.0, 0.0, 1.9e9, 61.0, 210.0, 48.0, 1.0e6, 2.0e6),
    ])


class FakeNvml:
    """NVML with recorded readings.

    Args:
        devices: one mapping per GPU (name, uuid, memory_total_bytes, ...); default one A100.
        readings: per device index, the readings to replay in order (the last one repeats);
            default :data:`A100_READINGS` for every device.
        init_error: an NVML return code :meth:`init` fails with (12: library not found, 9: driver
            not loaded, 4: no permission).
        unsupported: per device, metrics that fail with NVML_ERROR_NOT_SUPPORTED.
        lost_after: per device, the number of readings after which it fails with GPU_IS_LOST.
        driver: the driver version reported.

    ``calls`` lists every method called, for tests.
    """

    def __init__(self, devices: Sequence[Mapping[str, Any]] | None = None,
                 readings: Mapping[int, Sequence[Mapping[str, float]]] | None = None, *, init_error: int | None = None,
                 unsupported: Mapping[int, Sequence[str]] | None = None, lost_after: Mapping[int, int] | None = None,
                 driver: str = "580.65.06") -> None:
        self.devices = [dict(d) for d in (devices if devices is not None else [A100_DEVICE])]
        self.readings = readings
        self.init_error = init_error
        self.unsupported = {k: set(v) for k, v in (unsupported or {}).items()}
        self.lost_after = dict(lost_after or {})
        self.driver = driver
        self.calls: list[str] = []
        self.reads: dict[int, int] = {}
        self.initialized = False

    def init(self) -> None:
        self.calls.append("init")
        if self.init_error is not None:
            raise NvmlCallError(self.init_error, "nvmlInit", "fake NVML failure")
        self.initialized = True

    def shutdown(self) -> None:
        self.calls.append("shutdown")
        self.initialized = False

    def versions(self) -> dict[str, str]:
        return {"driver": self.driver, "cuda_driver": "13.0"}

    def device_count(self) -> int:
        return len(self.devices)

    def device(self, index: int) -> NvmlDevice:
        return NvmlDevice(index=index, **self.devices[index])

    def read(self, index: int, metrics: Sequence[str], *, slow: bool) -> dict[str, Any]:
        n = self.reads.get(index, 0)
        self.reads[index] = n + 1
        if index in self.lost_after and n >= self.lost_after[index]:
            raise NvmlCallError(NVML_ERROR_GPU_IS_LOST, "nvmlDeviceGetUtilizationRates", "GPU is lost")
        series = (self.readings or {}).get(index, A100_READINGS)
        row = series[min(n, len(series) - 1)]
        out: dict[str, Any] = {}
        for m in metrics:
            if m in self.unsupported.get(index, ()):
                out[m] = NvmlCallError(NVML_ERROR_NOT_SUPPORTED, "nvml", "Not Supported")
            elif m in row:
                out[m] = float(row[m])
        return out


class FakeCupti:
    """CUPTI replaying recorded activity records.

    Args:
        records: plain records (the shapes of :mod:`omniprof.backends.cupti.cupti_adapter`) with
            times relative to the moment tracing starts (the first ``enable``).
        clock: the clock the session uses (its ``now_ns()`` drives :meth:`timestamp_ns`).
        load_error: a :class:`CuptiLoadError` :meth:`load` raises.
        subscribe_status: a CUptiResult code :meth:`subscribe` fails with (39: another subscriber).
        enable_status: per record kind, a CUptiResult code :meth:`enable` fails with.
        dropped: records CUPTI reports dropped (returned by the first :meth:`dropped_records`).
        buffer_records: records per delivered buffer.

    Only records of enabled kinds are delivered, as CUPTI does; ``device`` records are delivered
    when ``device`` is enabled.
    """

    EPOCH_SHIFT_NS = 7_000_000_000_000  # CUPTI's clock is not the reference clock

    def __init__(self, records: Sequence[Mapping[str, Any]] = (), *, clock: Any = None,
                 load_error: CuptiLoadError | None = None, subscribe_status: int | None = None,
                 enable_status: Mapping[str, int] | None = None, dropped: int = 0, buffer_records: int = 64) -> None:
        from omniprof.core.clock import DEFAULT_CLOCK

        self.records = [dict(r) for r in records]
        self.clock = clock or DEFAULT_CLOCK
        self.load_error = load_error
        self.subscribe_status = subscribe_status
        self.enable_status = dict(enable_status or {})
        self.dropped = dropped
        self.buffer_records = buffer_records
        self.calls: list[str] = []
        self.enabled: set[str] = set()
        self.ever_enabled: set[str] = set()
        self.subscribed = False
        self._on_records: Any = None
        self._base: int | None = None
        self._delivered = False
        self.callback_errors: list[str] = []

    def load(self) -> None:
        self.calls.append("load")
        if self.load_error is not None:
            raise self.load_error

    def versions(self) -> dict[str, str]:
        return {"cupti-python": "fake"}

    def timestamp_ns(self) -> int:
        return int(self.clock.now_ns()) + self.EPOCH_SHIFT_NS

    def subscribe(self) -> None:
        self.calls.append("subscribe")
        if self.subscribe_status is not None:
            raise CuptiCallError(self.subscribe_status, "subscribe")
        if self.subscribed:
            raise CuptiCallError(39, "subscribe")
        self.subscribed = True

    def unsubscribe(self) -> None:
        self.calls.append("unsubscribe")
        self.subscribed = False

    def register(self, on_records: Any, buffer_bytes: int) -> None:
        self.calls.append(f"register:{buffer_bytes}")
        self._on_records = on_records

    def set_device_buffer_bytes(self, nbytes: int) -> None:
        self.calls.append(f"device_buffer:{nbytes}")

    def use_system_thread_ids(self) -> None:
        self.calls.append("system_thread_ids")

    def flush_period(self, ms: int) -> None:
        self.calls.append(f"flush_period:{ms}")

    def enable(self, kind: str) -> None:
        self.calls.append(f"enable:{kind}")
        if kind in self.enable_status:
            raise CuptiCallError(self.enable_status[kind], "activity_enable")
        if self._base is None:
            self._base = self.timestamp_ns()
        self.enabled.add(kind)
        self.ever_enabled.add(kind)

    def disable(self, kind: str) -> None:
        self.calls.append(f"disable:{kind}")
        self.enabled.discard(kind)

    def enable_device_graph(self, on: bool) -> None:
        self.calls.append(f"device_graph:{on}")

    def flush(self) -> None:
        self.calls.append("flush")
        if self._delivered or self._on_records is None:
            return
        self._delivered = True
        base = self._base or 0
        out = []
        for r in self.records:
            if r["kind"] not in self.ever_enabled:
                continue
            r = dict(r)
            for key in ("start", "end", "timestamp"):
                if key in r:
                    r[key] = int(r[key]) + base
            out.append(r)
        for i in range(0, len(out), self.buffer_records):
            self._on_records(out[i:i + self.buffer_records])

    def dropped_records(self) -> int:
        n, self.dropped = self.dropped, 0
        return n


class FakePmSampler:
    """PM sampling replaying recorded samples: ``samples`` are (start, end, values) relative to start.

    ``start_error`` / ``decode_error``: what :meth:`start` / :meth:`decode` raise instead (the
    adapter's errors, as :class:`~omniprof.backends.cupti.cupti_adapter.CuptiPmSampler` raises them).
    """

    def __init__(self, device: int, metrics: list[str], interval_ns: int, buffer_bytes: int, *,
                 samples: Sequence[tuple[int, int, Sequence[float]]] = (), overflow: bool = False,
                 clock: Any = None, start_error: BaseException | None = None,
                 decode_error: BaseException | None = None) -> None:
        from omniprof.core.clock import DEFAULT_CLOCK

        self.device = device
        self.metrics = metrics
        self.interval_ns = interval_ns
        self.buffer_bytes = buffer_bytes
        self.samples = list(samples)
        self.overflow = overflow
        self.clock = clock or DEFAULT_CLOCK
        self.start_error = start_error
        self.decode_error = decode_error
        self.decodes = 0
        self.state = "new"
        self._base = 0

    def start(self) -> None:
        if self.start_error is not None:
            raise self.start_error
        self.state = "started"
        self._base = int(self.clock.now_ns()) + FakeCupti.EPOCH_SHIFT_NS

    def decode(self) -> tuple[list[tuple[int, int, list[float]]], bool]:
        self.decodes += 1
        if self.decode_error is not None:
            raise self.decode_error
        out = [(a + self._base, b + self._base, list(v)) for a, b, v in self.samples]
        self.samples = []
        overflow, self.overflow = self.overflow, False
        return out, overflow

    def stop(self) -> None:
        self.state = "stopped"

    def close(self) -> None:
        self.state = "closed"


def fake_adapters(nvml: FakeNvml | None = None, cupti: FakeCupti | None = None, pm: Any = None) -> Any:
    """:class:`~omniprof.backends.cupti.backend.GpuAdapters` that hand out these fakes.

    ``nvml`` and ``cupti`` are instances used by every session (and probe) of a backend with these
    adapters (a default :class:`FakeNvml` / :class:`FakeCupti`, an A100 with no records, when
    None); ``pm`` a factory ``(device, metrics, interval_ns, buffer_bytes) -> sampler`` (default
    :class:`FakePmSampler`).
    """
    from omniprof.backends.cupti.backend import GpuAdapters

    nv = nvml if nvml is not None else FakeNvml()
    cu = cupti if cupti is not None else FakeCupti()
    return GpuAdapters(nvml=lambda: nv, cupti=lambda: cu, pm=pm or FakePmSampler)


def fake_cupti_backend(nvml: FakeNvml | None = None, cupti: FakeCupti | None = None, pm: Any = None) -> type:
    """A subclass of the ``cupti`` backend (same name, same logic) whose adapters are these fakes
    (see :func:`fake_adapters`); its ``capabilities()``, ``checks()`` and ``probe()`` read them too."""
    from omniprof.backends.cupti.backend import CuptiBackend

    return type("FakeGpuCuptiBackend", (CuptiBackend,), {"adapters": fake_adapters(nvml, cupti, pm),
                                                         "__module__": __name__})


def fake_gpu_registry(nvml: FakeNvml | None = None, cupti: FakeCupti | None = None, pm: Any = None,
                      **registry_args: Any) -> Any:
    """A :class:`~omniprof.core.registry.Registry` (built with ``registry_args``) whose ``cupti``
    backend is :func:`fake_cupti_backend` of these fakes; every other plugin as installed. Give it
    to ``Profiler(registry=...)``, ``run_doctor(...)`` or ``runner.run(..., registry=...)``."""
    from omniprof.core.registry import Registry

    reg = Registry(**registry_args)
    reg.add("backend", fake_cupti_backend(nvml, cupti, pm), source="omniprof.testing.gpu_fakes")
    return reg


def records_from_kineto(path: str | Path, *, max_blocks_per_multiprocessor: int = 32) -> list[dict[str, Any]]:
    """CUPTI activity records rebuilt from a Kineto (torch.profiler) trace recorded on a GPU.

    Kernels, memcpy, memset, CUDA runtime calls and synchronisation become records with the
    trace's values; ``deviceProperties`` become ``device`` records. Times are relative to the
    earliest GPU or runtime event. ``max_blocks_per_multiprocessor`` is not in Kineto's device
    properties (32 on sm_80 and later).
    """
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    data = json.loads(raw)
    events = [e for e in data.get("traceEvents", []) if e.get("ph") == "X" and e.get("cat") in (
        "kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_sync")]
    if not events:
        return []
    t0 = min(float(e["ts"]) for e in events)
    out: list[dict[str, Any]] = []
    for p in data.get("deviceProperties", []):
        warp = int(p.get("warpSize", 32))
        out.append({"kind": "device", "id": int(p["id"]), "name": p.get("name", ""),
                    "num_multiprocessors": int(p["numSms"]), "num_threads_per_warp": warp,
                    "max_warps_per_multiprocessor": int(p["maxThreadsPerMultiprocessor"]) // warp,
                    "max_blocks_per_multiprocessor": max_blocks_per_multiprocessor,
                    "max_registers_per_multiprocessor": int(p["regsPerMultiprocessor"]),
                    "max_shared_memory_per_multiprocessor": int(p["sharedMemPerMultiprocessor"]),
                    "compute_capability": f"{p.get('computeMajor')}.{p.get('computeMinor')}"})
    kinds = {"HtoD": 1, "DtoH": 2, "DtoD": 8, "HtoH": 9, "PtoP": 10}
    for e in events:
        a = e.get("args", {})
        start = int(round((float(e["ts"]) - t0) * 1000))
        end = start + int(round(float(e.get("dur", 0)) * 1000))
        cid = int(a.get("correlation", 0))
        cat = e["cat"]
        if cat == "kernel":
            out.append({"kind": "kernel", "name": e["name"], "start": start, "end": end,
                        "device_id": int(a.get("device", 0)), "context_id": int(a.get("context", 0)),
                        "stream_id": int(a.get("stream", 0)), "correlation_id": cid,
                        "grid": list(a.get("grid", [1, 1, 1])), "block": list(a.get("block", [1, 1, 1])),
                        "registers_per_thread": int(a.get("registers per thread", 0)),
                        "static_shared_memory": int(a.get("shared memory", 0)), "dynamic_shared_memory": 0,
                        "graph_id": 0, "graph_node_id": 0})
        elif cat == "gpu_memcpy":
            word = e["name"].split()[1] if len(e["name"].split()) > 1 else ""
            out.append({"kind": "memcpy", "copy_kind": kinds.get(word, 0), "bytes": int(a.get("bytes", 0)),
                        "start": start, "end": end, "device_id": int(a.get("device", 0)),
                        "stream_id": int(a.get("stream", 0)), "correlation_id": cid, "graph_node_id": 0})
        elif cat == "gpu_memset":
            out.append({"kind": "memset", "bytes": int(a.get("bytes", 0)), "value": 0, "start": start, "end": end,
                        "device_id": int(a.get("device", 0)), "stream_id": int(a.get("stream", 0)),
                        "correlation_id": cid, "graph_node_id": 0})
        elif cat == "cuda_runtime":
            out.append({"kind": "runtime", "name": e["name"], "cbid": int(a.get("cbid", 0)), "start": start,
                        "end": end, "process_id": int(e.get("pid", 0)), "thread_id": int(e.get("tid", 0)),
                        "correlation_id": cid})
        elif cat == "cuda_sync":
            stream = a.get("stream")
            out.append({"kind": "sync", "type": _SYNC_NAMES.get(e["name"], 0), "start": start, "end": end,
                        "context_id": int(a.get("context", 0)),
                        "stream_id": None if stream in (None, -1) else int(stream), "correlation_id": cid})
    return out


_SYNC_NAMES = {"Event Sync": 1, "Stream Wait Event": 2, "Stream Sync": 3, "Context Sync": 4}
