"""A thin adapter over cupti-python's ``cupti.cupti`` (the 1:1 CUPTI bindings) and ``cupti.pm_sampling``.

This is the only module that calls CUPTI. It turns CUPTI activity objects into plain dicts
inside the buffer-completed callback (the objects point into a buffer CUPTI reuses once the
callback returns) and CUPTI errors into :class:`CuptiCallError` / :class:`CuptiLoadError`, so the
logic in :mod:`omniprof.backends.cupti.activity` never imports ``cupti``. Tests put
:class:`omniprof.testing.gpu_fakes.FakeCupti` in its place.

Plain record shapes (``"kind"`` first; times are CUPTI timestamps in ns):

* ``kernel``: name, start, end, device_id, context_id, stream_id, correlation_id, grid [x,y,z],
  block [x,y,z], registers_per_thread, static_shared_memory, dynamic_shared_memory, graph_id,
  graph_node_id
* ``memcpy``: copy_kind (CUpti_ActivityMemcpyKind), bytes, start, end, device_id, stream_id,
  correlation_id, graph_node_id
* ``memset``: bytes, value, start, end, device_id, stream_id, correlation_id, graph_node_id
* ``sync``: type (CUpti_ActivitySynchronizationType), start, end, context_id, stream_id (or
  None), correlation_id
* ``runtime`` / ``driver``: name, cbid, start, end, process_id, thread_id (OS thread id),
  correlation_id
* ``marker``: id, name, domain, flags, timestamp, thread_id (OS thread id; NVTX ranges and marks)
* ``graph``: graph_id, start, end, device_id, stream_id, correlation_id
* ``device``: id, name, num_multiprocessors, num_threads_per_warp, max_warps_per_multiprocessor,
  max_blocks_per_multiprocessor, max_registers_per_multiprocessor,
  max_shared_memory_per_multiprocessor, compute_capability
* ``overhead``: overhead_kind, start, end
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable
from typing import Any

from omniprof.core.clock import monotonic_ns

__all__ = ["CuptiCallError", "CuptiLoadError", "CuptiPythonAdapter", "CuptiPmSampler", "KINDS", "RESULT_NAMES"]

#: our record kind -> cupti.cupti.ActivityKind member name.
KINDS = {
    "kernel": "CONCURRENT_KERNEL", "memcpy": "MEMCPY", "memset": "MEMSET", "sync": "SYNCHRONIZATION",
    "runtime": "RUNTIME", "driver": "DRIVER", "marker": "MARKER", "graph": "GRAPH_TRACE", "device": "DEVICE",
    "overhead": "OVERHEAD",
}

#: CUptiResult code -> name (cupti_result.h; checked against cupti-python's ``cupti.Result`` by the tests).
RESULT_NAMES = {
    1: "CUPTI_ERROR_INVALID_PARAMETER", 2: "CUPTI_ERROR_INVALID_DEVICE", 3: "CUPTI_ERROR_INVALID_CONTEXT",
    4: "CUPTI_ERROR_INVALID_EVENT_DOMAIN_ID", 5: "CUPTI_ERROR_INVALID_EVENT_ID", 6: "CUPTI_ERROR_INVALID_EVENT_NAME",
    7: "CUPTI_ERROR_INVALID_OPERATION", 8: "CUPTI_ERROR_OUT_OF_MEMORY", 9: "CUPTI_ERROR_HARDWARE",
    10: "CUPTI_ERROR_PARAMETER_SIZE_NOT_SUFFICIENT", 11: "CUPTI_ERROR_API_NOT_IMPLEMENTED",
    12: "CUPTI_ERROR_MAX_LIMIT_REACHED", 13: "CUPTI_ERROR_NOT_READY", 14: "CUPTI_ERROR_NOT_COMPATIBLE",
    15: "CUPTI_ERROR_NOT_INITIALIZED", 16: "CUPTI_ERROR_INVALID_METRIC_ID", 17: "CUPTI_ERROR_INVALID_METRIC_NAME",
    18: "CUPTI_ERROR_QUEUE_EMPTY", 19: "CUPTI_ERROR_INVALID_HANDLE", 20: "CUPTI_ERROR_INVALID_STREAM",
    21: "CUPTI_ERROR_INVALID_KIND", 22: "CUPTI_ERROR_INVALID_EVENT_VALUE", 23: "CUPTI_ERROR_DISABLED",
    24: "CUPTI_ERROR_INVALID_MODULE", 25: "CUPTI_ERROR_INVALID_METRIC_VALUE", 26: "CUPTI_ERROR_HARDWARE_BUSY",
    27: "CUPTI_ERROR_NOT_SUPPORTED", 28: "CUPTI_ERROR_UM_PROFILING_NOT_SUPPORTED",
    29: "CUPTI_ERROR_UM_PROFILING_NOT_SUPPORTED_ON_DEVICE",
    30: "CUPTI_ERROR_UM_PROFILING_NOT_SUPPORTED_ON_NON_P2P_DEVICES",
    31: "CUPTI_ERROR_UM_PROFILING_NOT_SUPPORTED_WITH_MPS", 32: "CUPTI_ERROR_CDP_TRACING_NOT_SUPPORTED",
    33: "CUPTI_ERROR_VIRTUALIZED_DEVICE_NOT_SUPPORTED", 34: "CUPTI_ERROR_CUDA_COMPILER_NOT_COMPATIBLE",
    35: "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES", 36: "CUPTI_ERROR_OLD_PROFILER_API_INITIALIZED",
    37: "CUPTI_ERROR_OPENACC_UNDEFINED_ROUTINE", 38: "CUPTI_ERROR_LEGACY_PROFILER_NOT_SUPPORTED",
    39: "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED",
    40: "CUPTI_ERROR_VIRTUALIZED_DEVICE_INSUFFICIENT_PRIVILEGES",
    41: "CUPTI_ERROR_CONFIDENTIAL_COMPUTING_NOT_SUPPORTED", 42: "CUPTI_ERROR_CMP_DEVICE_NOT_SUPPORTED",
    43: "CUPTI_ERROR_MIG_DEVICE_NOT_SUPPORTED", 44: "CUPTI_ERROR_SLI_DEVICE_NOT_SUPPORTED",
    45: "CUPTI_ERROR_WSL_DEVICE_NOT_SUPPORTED", 46: "CUPTI_ERROR_INVALID_CHIP_NAME",
    47: "CUPTI_ERROR_HES_TRACE_NOT_SUPPORTED_ON_MPS", 999: "CUPTI_ERROR_UNKNOWN",
}
ERROR_INVALID_OPERATION = 7
ERROR_NOT_COMPATIBLE = 14
ERROR_NOT_SUPPORTED = 27
ERROR_INSUFFICIENT_PRIVILEGES = 35
ERROR_MULTIPLE_SUBSCRIBERS = 39
ERROR_VIRTUALIZED_INSUFFICIENT_PRIVILEGES = 40


class CuptiCallError(Exception):
    """A CUPTI call returned an error. ``status`` is the CUptiResult code, ``call`` the function."""

    def __init__(self, status: int, call: str, text: str = "") -> None:
        name = RESULT_NAMES.get(status, text or f"CUptiResult {status}")
        if status < 0:  # no CUptiResult: a failure cupti-python reports in words only
            super().__init__(f"{call} failed: {text}")
        else:
            super().__init__(f"{call} failed with {name} ({status})" + (f": {text}" if text and text != name else ""))
        self.status = status
        self.call = call
        self.name = name


class CuptiLoadError(Exception):
    """CUPTI (or the CUDA driver it needs) could not be loaded. ``missing``: ``"driver"``,
    ``"cupti"``, ``"nvperf"`` (the libnvperf_host/libnvperf_target PM sampling needs) or ``"module"``
    (cupti-python not installed)."""

    def __init__(self, missing: str, detail: str) -> None:
        super().__init__(detail)
        self.missing = missing
        self.detail = detail


def _is_load_failure(e: BaseException) -> bool:
    """cupti-python's words for "the CUDA driver or libcupti is missing" (RuntimeError subclasses)."""
    return type(e).__name__ in ("NotSupportedError", "FunctionNotFoundError")


def _classify_load(e: BaseException) -> CuptiLoadError:
    text = str(e)
    low = text.lower()
    if "libcuda" in low or "driver" in low:
        return CuptiLoadError("driver", text)
    return CuptiLoadError("cupti", text)


class CuptiPythonAdapter:
    """The real CUPTI, through cupti-python (``cupti.cupti``), imported by :meth:`load`."""

    def __init__(self) -> None:
        self._c: Any = None
        self._subscriber: int | None = None
        self._names: dict[tuple[int, int], str] = {}
        self._on_records: Callable[[list[dict[str, Any]]], None] | None = None
        self._buffer_bytes = 8 * 1024 * 1024
        self.callback_errors: list[str] = []

    def _call(self, name: str, *args: Any) -> Any:
        c = self._c
        try:
            return getattr(c, name)(*args)
        except c.cuptiError as e:
            raise CuptiCallError(int(e.status), name) from e
        except RuntimeError as e:  # cupti._internal.utils.NotSupportedError: driver or libcupti missing
            if _is_load_failure(e):
                raise _classify_load(e) from e
            raise

    def load(self) -> None:
        try:
            from cupti import cupti as c
        except ImportError as e:
            raise CuptiLoadError("module", f"cupti-python is not importable: {e}") from e
        self._c = c
        self._call("get_timestamp")  # loads libcuda and libcupti: fails here when either is missing

    def versions(self) -> dict[str, str]:
        from importlib import metadata

        out = {}
        try:
            out["cupti-python"] = metadata.version("cupti-python")
        except metadata.PackageNotFoundError:
            pass
        return out

    def timestamp_ns(self) -> int:
        return int(self._call("get_timestamp"))

    def subscribe(self) -> None:
        """Become CUPTI's subscriber; fails with MULTIPLE_SUBSCRIBERS when another tool holds it."""
        self._subscriber = self._call("subscribe", _ignore_callback, None)

    def unsubscribe(self) -> None:
        if self._subscriber is not None:
            sub, self._subscriber = self._subscriber, None
            self._call("unsubscribe", sub)

    def register(self, on_records: Callable[[list[dict[str, Any]]], None], buffer_bytes: int) -> None:
        self._on_records = on_records
        self._buffer_bytes = int(buffer_bytes)
        self._call("activity_register_callbacks", self._buffer_requested, self._buffer_completed)

    def _buffer_requested(self) -> tuple[int, int]:
        return self._buffer_bytes, 0  # 0: no cap on records per buffer

    def _buffer_completed(self, activities: list[Any]) -> None:
        # Runs on a CUPTI thread. Copy out now; never let an exception cross into CUPTI.
        try:
            records = [r for r in (self._to_dict(a) for a in activities) if r is not None]
            if self._on_records is not None:
                self._on_records(records)
        except Exception as e:  # pragma: no cover - needs a GPU
            self.callback_errors.append(f"{type(e).__name__}: {e}")

    def set_device_buffer_bytes(self, nbytes: int) -> None:
        # cuptiActivitySetAttribute(attr, size_t *valueSize, void *value): both are pointers
        value = ctypes.c_size_t(int(nbytes))
        size = ctypes.c_size_t(ctypes.sizeof(value))
        self._call("activity_set_attribute", int(self._c.ActivityAttribute.ATTR_DEVICE_BUFFER_SIZE),
                   ctypes.addressof(size), ctypes.addressof(value))

    def enable(self, kind: str) -> None:
        self._call("activity_enable", int(getattr(self._c.ActivityKind, KINDS[kind])))

    def disable(self, kind: str) -> None:
        self._call("activity_disable", int(getattr(self._c.ActivityKind, KINDS[kind])))

    def enable_device_graph(self, on: bool) -> None:
        self._call("activity_enable_device_graph", 1 if on else 0)

    def flush(self) -> None:
        self._call("activity_flush_all", int(self._c.ActivityFlag.FLUSH_FORCED))

    def use_system_thread_ids(self) -> None:
        """Report OS thread ids (gettid, Python's ``threading.get_native_id()``) in records.

        CUPTI's default is ``pthread_self()`` cut to 32 bits, which matches nothing else.
        """
        self._call("set_thread_id_type", int(self._c.ActivityThreadIdType.SYSTEM))

    def flush_period(self, ms: int) -> None:
        self._call("activity_flush_period", int(ms))

    def dropped_records(self) -> int:
        """Records CUPTI dropped (buffer space) since the last call, from the global queue."""
        dropped = ctypes.c_size_t(0)
        self._call("activity_get_num_dropped_records", 0, 0, ctypes.addressof(dropped))
        return int(dropped.value)

    # -- record conversion --------------------------------------------------------------------
    def _api_name(self, domain: Any, cbid: int) -> str:
        key = (int(domain), int(cbid))
        name = self._names.get(key)
        if name is None:
            try:
                name = str(self._c.get_callback_name(domain, cbid))
            except Exception:  # pragma: no cover - needs a GPU
                name = f"cbid {cbid}"
            self._names[key] = name
        return name

    def _to_dict(self, a: Any) -> dict[str, Any] | None:
        K = self._c.ActivityKind
        k = int(a.kind)
        if k in (int(K.CONCURRENT_KERNEL), int(K.KERNEL)):
            return {"kind": "kernel", "name": a.name, "start": a.start, "end": a.end, "device_id": a.device_id,
                    "context_id": a.context_id, "stream_id": a.stream_id, "correlation_id": a.correlation_id,
                    "grid": [a.grid_x, a.grid_y, a.grid_z], "block": [a.block_x, a.block_y, a.block_z],
                    "registers_per_thread": a.registers_per_thread, "static_shared_memory": a.static_shared_memory,
                    "dynamic_shared_memory": a.dynamic_shared_memory, "graph_id": a.graph_id,
                    "graph_node_id": a.graph_node_id}
        if k == int(K.MEMCPY):
            return {"kind": "memcpy", "copy_kind": a.copy_kind, "bytes": a.bytes, "start": a.start, "end": a.end,
                    "device_id": a.device_id, "stream_id": a.stream_id, "correlation_id": a.correlation_id,
                    "graph_node_id": a.graph_node_id}
        if k == int(K.MEMSET):
            return {"kind": "memset", "bytes": a.bytes, "value": a.value, "start": a.start, "end": a.end,
                    "device_id": a.device_id, "stream_id": a.stream_id, "correlation_id": a.correlation_id,
                    "graph_node_id": a.graph_node_id}
        if k == int(K.SYNCHRONIZATION):
            stream = a.stream_id if a.stream_id != 0xFFFFFFFF else None
            return {"kind": "sync", "type": a.type, "start": a.start, "end": a.end, "context_id": a.context_id,
                    "stream_id": stream, "correlation_id": a.correlation_id}
        if k in (int(K.RUNTIME), int(K.DRIVER)):
            runtime = k == int(K.RUNTIME)
            domain = self._c.CallbackDomain.RUNTIME_API if runtime else self._c.CallbackDomain.DRIVER_API
            return {"kind": "runtime" if runtime else "driver", "name": self._api_name(domain, a.cbid),
                    "cbid": a.cbid, "start": a.start, "end": a.end, "process_id": a.process_id,
                    "thread_id": a.thread_id, "correlation_id": a.correlation_id}
        if k == int(K.MARKER):
            tid = None
            if int(a.object_kind) == int(self._c.ActivityObjectKind.THREAD):
                tid = a.object_id.pt.thread_id
            return {"kind": "marker", "id": a.id, "name": a.name or "", "domain": a.domain or "",
                    "flags": a.flags_, "timestamp": a.timestamp, "thread_id": tid}
        if k == int(K.GRAPH_TRACE):
            return {"kind": "graph", "graph_id": a.graph_id, "start": a.start, "end": a.end,
                    "device_id": a.device_id, "stream_id": a.stream_id, "correlation_id": a.correlation_id}
        if k == int(K.DEVICE):
            return {"kind": "device", "id": a.id, "name": a.name, "num_multiprocessors": a.num_multiprocessors,
                    "num_threads_per_warp": a.num_threads_per_warp,
                    "max_warps_per_multiprocessor": a.max_warps_per_multiprocessor,
                    "max_blocks_per_multiprocessor": a.max_blocks_per_multiprocessor,
                    "max_registers_per_multiprocessor": a.max_registers_per_multiprocessor,
                    "max_shared_memory_per_multiprocessor": a.max_shared_memory_per_multiprocessor,
                    "compute_capability": f"{a.compute_capability_major}.{a.compute_capability_minor}"}
        if k == int(K.OVERHEAD):
            return {"kind": "overhead", "overhead_kind": a.overhead_kind, "start": a.start, "end": a.end}
        return None


def _ignore_callback(*args: Any) -> None:  # pragma: no cover - called by CUPTI
    """The subscriber's callback: no callback domain is enabled, so CUPTI never calls it."""


class CuptiPmSampler:
    """PM sampling on one device through ``cupti.pm_sampling.Collector``.

    ``decode()`` returns ``(samples, overflowed)``: samples as ``(start_ns, end_ns, values)``
    tuples in metric order, and whether the hardware buffer overflowed (records lost).

    Errors come out as the adapter's own: :class:`CuptiLoadError` when the CUDA driver, libcupti
    or the nvperf libraries PM sampling needs cannot be loaded; :class:`CuptiCallError` for a
    CUPTI status (insufficient privileges, PM sampling already enabled on the device by another
    tool in this process); ``ValueError`` for metrics or a configuration the GPU cannot sample.
    """

    #: least / most sample slots provisioned per decode
    MIN_DECODE_SAMPLES = 256
    MAX_DECODE_SAMPLES = 1_000_000

    def __init__(self, device: int, metrics: list[str], interval_ns: int, buffer_bytes: int) -> None:
        self.device = device
        self.metrics = list(metrics)
        self.interval_ns = int(interval_ns)
        self.buffer_bytes = int(buffer_bytes)
        self._collector: Any = None
        self._last_decode_ns = 0

    def _guard(self, call: str, fn: Callable[[], Any]) -> Any:
        from cupti import cupti as c

        try:
            return fn()
        except c.cuptiError as e:
            raise CuptiCallError(int(e.status), call) from e
        except PermissionError as e:
            raise CuptiCallError(ERROR_INSUFFICIENT_PRIVILEGES, call, str(e)) from e
        except RuntimeError as e:
            raise _pm_runtime_error(e, call) from e

    def start(self) -> None:
        try:
            from cupti import pm_sampling
        except ImportError as e:
            raise CuptiLoadError("module", f"cupti-python's pm_sampling is not importable: {e}") from e
        col = pm_sampling.Collector(self.device)
        self._guard("cuptiPmSamplingEnable", col.enable)
        try:
            self._guard("cuptiPmSamplingSetConfig", lambda: col.configure(
                metrics=self.metrics, hardware_buffer_size=self.buffer_bytes, sampling_interval=self.interval_ns))
            self._guard("cuptiPmSamplingStart", col.start)
        except BaseException:
            with contextlib.suppress(Exception):
                col.disable()
            raise
        self._collector = col
        self._last_decode_ns = monotonic_ns()

    def decode_capacity(self, now_ns: int) -> int:
        """Sample slots to provision for a decode now: twice the samples due since the last decode."""
        due = (now_ns - self._last_decode_ns) // max(self.interval_ns, 1)
        return int(min(max(2 * due + 64, self.MIN_DECODE_SAMPLES), self.MAX_DECODE_SAMPLES))

    def decode(self) -> tuple[list[tuple[int, int, list[float]]], bool]:
        now = monotonic_ns()
        capacity = self.decode_capacity(now)
        self._last_decode_ns = now
        try:
            data = self._guard("cuptiPmSamplingDecodeData", lambda: self._collector.decode(max_samples=capacity))
        except MemoryError:  # cupti.pm_sampling's word for a hardware-buffer overflow
            return [], True
        samples = [(s.start_timestamp, s.end_timestamp, list(s.metric_values)) for s in data]
        # every slot filled: more samples may have been due than were decoded this time; they stay
        # in the hardware buffer for the next decode, so nothing is lost here
        return samples, False

    def stop(self) -> None:
        if self._collector is not None:
            self._guard("cuptiPmSamplingStop", self._collector.stop)

    def close(self) -> None:
        if self._collector is not None:
            col, self._collector = self._collector, None
            col.disable()


def _pm_runtime_error(e: RuntimeError, call: str) -> Exception:
    """cupti.pm_sampling's RuntimeErrors -> the adapter's errors (it words them; we classify)."""
    text = str(e)
    low = text.lower()
    if _is_load_failure(e):
        return _classify_load(e)
    if "nvperf" in low:
        return CuptiLoadError("nvperf", text)
    if "already" in low:
        return CuptiCallError(ERROR_INVALID_OPERATION, call, text)
    return CuptiCallError(-1, call, text)
