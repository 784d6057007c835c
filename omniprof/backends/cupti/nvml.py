"""NVML device metrics: a thin adapter over nvidia-ml-py (``pynvml``) and the sampler behind it.

The adapter (:class:`PynvmlAdapter`) is the only code that calls NVML. Everything else -- the
polling loop, which metrics a device supports, counting samples that could not be taken, turning
samples into :class:`~omniprof.core.results.CounterSeries` -- lives in :class:`NvmlSampler`,
which talks to any object with the adapter's methods. Tests drive it with
:class:`omniprof.testing.gpu_fakes.FakeNvml`, which replays recorded values.

Metrics (name: unit, NVML call):

=====================  =========  ==================================================================
``gpu_utilization``    percent    ``nvmlDeviceGetUtilizationRates().gpu``
``memory_utilization`` percent    ``nvmlDeviceGetUtilizationRates().memory``
``memory_used``        bytes      ``nvmlDeviceGetMemoryInfo().used``
``memory_total``       bytes      ``nvmlDeviceGetMemoryInfo().total``
``power``              W          ``nvmlDeviceGetPowerUsage()`` (mW) / 1000
``sm_clock``           MHz        ``nvmlDeviceGetClockInfo(NVML_CLOCK_SM)``
``memory_clock``       MHz        ``nvmlDeviceGetClockInfo(NVML_CLOCK_MEM)``
``temperature``        C          ``nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)``
``pcie_tx``            bytes/s    PCIe TX byte counter (field value) differentiated, else
                                  ``nvmlDeviceGetPcieThroughput`` (KB/s over 20 ms) * 1024
``pcie_rx``            bytes/s    the same for RX
=====================  =========  ==================================================================
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from omniprof.core.results import CounterSeries, Loss, Track

__all__ = ["NVML_METRICS", "NvmlCallError", "PynvmlAdapter", "NvmlSampler", "NvmlDevice"]

#: metric name -> unit, in the order series are emitted.
NVML_METRICS: Mapping[str, str] = {
    "gpu_utilization": "percent",
    "memory_utilization": "percent",
    "memory_used": "bytes",
    "memory_total": "bytes",
    "power": "W",
    "sm_clock": "MHz",
    "memory_clock": "MHz",
    "temperature": "C",
    "pcie_tx": "bytes/s",
    "pcie_rx": "bytes/s",
}

# NVML return codes (nvml.h) the logic needs to tell apart; the adapter maps pynvml's to these.
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
#: The NVIDIA driver's NVML library, as pynvml loads it on Linux.
NVML_LIBRARY = "libnvidia-ml.so.1"


class NvmlCallError(Exception):
    """An NVML call failed. ``code`` is the NVML return code, ``call`` the function, ``text`` NVML's words."""

    def __init__(self, code: int, call: str, text: str = "") -> None:
        super().__init__(f"{call} failed: {text or 'NVML error'} (NVML return code {code})")
        self.code = code
        self.call = call
        self.text = text


class NvmlDevice(dict):  # plain mapping, JSON-ready
    """Facts about one device: index, name, uuid, pci_bus_id, memory_total_bytes, compute_capability."""


class PynvmlAdapter:
    """The real NVML, through nvidia-ml-py's ``pynvml`` module (imported on first use).

    Every method raises :class:`NvmlCallError` on an NVML error, never pynvml's own classes, so
    the logic above it does not import pynvml.
    """

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handles: dict[int, Any] = {}
        self._pcie_counters: dict[int, bool] = {}

    # -- lifecycle ------------------------------------------------------------------------------
    def _call(self, name: str, *args: Any) -> Any:
        nvml = self._nvml
        try:
            return getattr(nvml, name)(*args)
        except nvml.NVMLError as e:
            raise NvmlCallError(int(getattr(e, "value", -1)), name, str(e)) from e

    def init(self) -> None:
        if sys.platform.startswith("linux"):
            # No driver library, no NVML: say so as pynvml would (code 12) without importing
            # nvidia-ml-py, which `omniprof plugins` and `doctor` would pay on every machine
            # without a GPU. pynvml loads the same file by the same name.
            import ctypes

            try:
                ctypes.CDLL(NVML_LIBRARY)
            except OSError as e:
                raise NvmlCallError(NVML_ERROR_LIBRARY_NOT_FOUND, "nvmlInit", "NVML Shared Library Not Found") from e
        import pynvml

        self._nvml = pynvml
        self._call("nvmlInit")

    def shutdown(self) -> None:
        if self._nvml is not None:
            self._handles.clear()
            self._call("nvmlShutdown")

    def versions(self) -> dict[str, str]:
        out = {"driver": _text(self._call("nvmlSystemGetDriverVersion"))}
        try:
            cuda = int(self._call("nvmlSystemGetCudaDriverVersion"))
            out["cuda_driver"] = f"{cuda // 1000}.{(cuda % 1000) // 10}"
        except NvmlCallError:
            pass
        return out

    def device_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount"))

    def _handle(self, index: int) -> Any:
        h = self._handles.get(index)
        if h is None:
            h = self._handles[index] = self._call("nvmlDeviceGetHandleByIndex", index)
        return h

    def device(self, index: int) -> NvmlDevice:
        h = self._handle(index)
        info = NvmlDevice(index=index, name=_text(self._call("nvmlDeviceGetName", h)),
                          uuid=_text(self._call("nvmlDeviceGetUUID", h)))
        try:
            info["memory_total_bytes"] = int(self._call("nvmlDeviceGetMemoryInfo", h).total)
        except NvmlCallError:
            pass
        try:
            info["pci_bus_id"] = _text(self._call("nvmlDeviceGetPciInfo", h).busId)
        except NvmlCallError:
            pass
        try:
            major, minor = self._call("nvmlDeviceGetCudaComputeCapability", h)
            info["compute_capability"] = f"{major}.{minor}"
        except NvmlCallError:
            pass
        return info

    # -- sampling -------------------------------------------------------------------------------
    def read(self, index: int, metrics: Iterable[str], *, slow: bool) -> dict[str, float | NvmlCallError]:
        """One reading of ``metrics`` on device ``index``: value, or the error for that metric.

        ``slow`` allows the blocking PCIe throughput call (20 ms) when the device lacks the PCIe
        byte counters; without it those metrics are left out of this reading.
        """
        nvml = self._nvml
        h = self._handle(index)
        wanted = set(metrics)
        out: dict[str, float | NvmlCallError] = {}

        def get(keys: Sequence[str], fn: Callable[[], Any], pick: Callable[[Any], Sequence[float]]) -> None:
            keys = [k for k in keys if k in wanted]
            if not keys:
                return
            try:
                values = pick(fn())
            except NvmlCallError as e:
                for k in keys:
                    out[k] = e
                return
            for k, val in zip(keys, values):
                out[k] = float(val)

        all_keys = ("gpu_utilization", "memory_utilization")
        get(all_keys, lambda: self._call("nvmlDeviceGetUtilizationRates", h), lambda u: (u.gpu, u.memory))
        get(("memory_used", "memory_total"), lambda: self._call("nvmlDeviceGetMemoryInfo", h),
            lambda m: (m.used, m.total))
        get(("power",), lambda: self._call("nvmlDeviceGetPowerUsage", h), lambda mw: (mw / 1000.0,))
        get(("sm_clock",), lambda: self._call("nvmlDeviceGetClockInfo", h, nvml.NVML_CLOCK_SM), lambda v: (v,))
        get(("memory_clock",), lambda: self._call("nvmlDeviceGetClockInfo", h, nvml.NVML_CLOCK_MEM), lambda v: (v,))
        get(("temperature",), lambda: self._call("nvmlDeviceGetTemperature", h, nvml.NVML_TEMPERATURE_GPU),
            lambda v: (v,))
        pcie = [k for k in ("pcie_tx", "pcie_rx") if k in wanted]
        if pcie:
            out.update(self._read_pcie(index, h, pcie, slow=slow))
        return out

    def _read_pcie(self, index: int, h: Any, keys: list[str], *, slow: bool) -> dict[str, Any]:
        nvml = self._nvml
        # Cumulative byte counters (non-blocking) when the device has them; the sampler turns
        # them into rates. Marked by returning ("counter", bytes, t_us).
        if self._pcie_counters.get(index, True):
            fields = {"pcie_tx": nvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, "pcie_rx": nvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES}
            try:
                values = self._call("nvmlDeviceGetFieldValues", h, [fields[k] for k in keys])
                ok = all(int(v.nvmlReturn) == nvml.NVML_SUCCESS for v in values)
            except NvmlCallError:
                ok = False
            if ok:
                self._pcie_counters[index] = True
                return {k: ("counter", int(v.value.ullVal), int(v.timestamp)) for k, v in zip(keys, values)}
            self._pcie_counters[index] = False
        if not slow:
            return {}
        counters = {"pcie_tx": nvml.NVML_PCIE_UTIL_TX_BYTES, "pcie_rx": nvml.NVML_PCIE_UTIL_RX_BYTES}
        out: dict[str, Any] = {}
        for k in keys:
            try:
                out[k] = float(self._call("nvmlDeviceGetPcieThroughput", h, counters[k])) * 1024.0
            except NvmlCallError as e:
                out[k] = e
        return out


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class NvmlSampler:
    """Polls NVML metrics of some devices on a background thread (or by hand with :meth:`tick`).

    Args:
        adapter: :class:`PynvmlAdapter` or a fake with the same methods (already ``init()``-ed).
        devices: device indices to sample.
        metrics: metric names (keys of :data:`NVML_METRICS`).
        interval_s: time between readings.
        clock: the reference clock (``now_ns()``); readings are stamped on it.
        max_samples: readings kept per device; later ones are counted as lost.
        slow_interval_s: least time between blocking PCIe throughput calls (devices without
            PCIe byte counters only).

    A metric a device reports as not supported is dropped from later readings of that device and
    listed in :attr:`unsupported`. A device that fails otherwise (GPU lost, no permission) stops
    being sampled; the readings it missed are counted as lost.
    """

    def __init__(self, adapter: Any, devices: Sequence[int], metrics: Sequence[str], interval_s: float, clock: Any,
                 *, max_samples: int = 1_000_000, slow_interval_s: float = 0.1) -> None:
        self.adapter = adapter
        self.devices = list(devices)
        self.metrics = [m for m in NVML_METRICS if m in metrics]
        self.interval_s = interval_s
        self.clock = clock
        self.max_samples = max_samples
        self.slow_interval_ns = int(slow_interval_s * 1e9)
        self._active: dict[int, list[str]] = {d: list(self.metrics) for d in self.devices}
        self._data: dict[tuple[int, str], tuple[list[int], list[float]]] = {}
        self._counts: dict[int, int] = dict.fromkeys(self.devices, 0)
        self._prev_counter: dict[tuple[int, str], tuple[int, int]] = {}
        self._last_slow_ns: dict[int, int] = {}
        self.unsupported: dict[int, dict[str, str]] = {}
        self.failed: dict[int, str] = {}
        self.lost: dict[int, int] = dict.fromkeys(self.devices, 0)
        self.ticks = 0
        self.self_time_ns = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0
        self._t_end = 0
        #: callables run after every reading with the reading's time (PM sampling decode rides here)
        self.hooks: list[Callable[[int], None]] = []

    # -- driving ------------------------------------------------------------------------------
    def start(self) -> None:
        self._t0 = self.clock.now_ns()
        self.tick()
        self._thread = threading.Thread(target=self._run, name="omniprof-nvml", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.tick()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            self.tick()  # a last reading at the end of the session
        self._t_end = self.clock.now_ns()

    def tick(self) -> None:
        """Take one reading of every active device now."""
        start = self.clock.now_ns()
        self.ticks += 1
        for d in self.devices:
            if d in self.failed:
                self.lost[d] += 1
                continue
            if self._counts[d] >= self.max_samples:
                self.lost[d] += 1
                continue
            slow = start - self._last_slow_ns.get(d, -(1 << 62)) >= self.slow_interval_ns
            try:
                values = self.adapter.read(d, self._active[d], slow=slow)
            except NvmlCallError as e:
                self._fail(d, e)
                self.lost[d] += 1  # this reading too
                continue
            except Exception as e:  # a bug below NVML must not end sampling of the other devices silently
                self._fail(d, NvmlCallError(-1, "read", f"{type(e).__name__}: {e}"))
                self.lost[d] += 1
                continue
            if slow and any(k in values for k in ("pcie_tx", "pcie_rx")):
                self._last_slow_ns[d] = start
            t = self.clock.now_ns()
            self._counts[d] += 1
            for name, val in values.items():
                if isinstance(val, NvmlCallError):
                    if val.code == NVML_ERROR_NOT_SUPPORTED:
                        self._active[d].remove(name)
                        self.unsupported.setdefault(d, {})[name] = val.text or "not supported"
                        continue
                    self._fail(d, val)
                    break
                if isinstance(val, tuple):  # ("counter", cumulative bytes, device time in us)
                    _, total, t_us = val
                    prev = self._prev_counter.get((d, name))
                    self._prev_counter[(d, name)] = (total, t_us)
                    if prev is None or t_us <= prev[1]:
                        continue
                    val = (total - prev[0]) * 1e6 / (t_us - prev[1])
                ts, vs = self._data.setdefault((d, name), ([], []))
                ts.append(t)
                vs.append(float(val))
        self.self_time_ns += self.clock.now_ns() - start
        for hook in self.hooks:
            hook(start)

    def _fail(self, device: int, error: NvmlCallError) -> None:
        self.failed[device] = str(error)

    # -- results ------------------------------------------------------------------------------
    def tracks(self) -> list[Track]:
        return [Track(id=f"device:{d}:nvml", name=f"GPU {d} (NVML)", kind="counter", process=f"GPU {d}", device=d)
                for d in self.devices]

    def series(self) -> list[CounterSeries]:
        out = []
        for d in self.devices:
            for name in self.metrics:
                data = self._data.get((d, name))
                if data and data[0]:
                    out.append(CounterSeries(name=f"gpu{d}.{name}", unit=NVML_METRICS[name], track=f"device:{d}:nvml",
                                             t_ns=data[0], values=data[1]))
        return out

    def losses(self) -> list[Loss]:
        out = []
        for d in self.devices:
            n = self.lost.get(d, 0)
            if not n:
                continue
            if d in self.failed:
                detail = f"GPU {d}: sampling stopped after an NVML error: {self.failed[d]}"
            else:
                detail = f"GPU {d}: max_nvml_samples={self.max_samples} reached"
            out.append(Loss("cupti.nvml", "samples_dropped", n, "samples", detail))
        return out

    def summary(self) -> dict[str, Any]:
        dur = max(self._t_end - self._t0, 1)
        return {"nvml_ticks": self.ticks, "nvml_interval_s": self.interval_s,
                "nvml_achieved_rate_hz": self.ticks / (dur / 1e9), "nvml_time_ns": self.self_time_ns,
                "nvml_overhead_pct": 100.0 * self.self_time_ns / dur}
