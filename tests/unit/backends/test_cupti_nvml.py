"""NVML sampling logic, driven through FakeNvml and FakeClock; the real adapter where it runs here."""

from __future__ import annotations

import subprocess
import sys

import pytest

from omniprof.backends.cupti.nvml import (
    NVML_METRICS,
    NvmlCallError,
    NvmlSampler,
    PynvmlAdapter,
)
from omniprof.testing.fakes import FakeClock
from omniprof.testing.gpu_fakes import A100_DEVICE, A100_READINGS, FakeNvml
from tests.tools import nvml_loads


def _sampler(nvml, devices=(0,), metrics=tuple(NVML_METRICS), **kw):
    nvml.init()
    return NvmlSampler(nvml, list(devices), list(metrics), 0.01, FakeClock(step_ns=0), **kw)


def test_each_tick_records_every_metric_with_replayed_values():
    """Three ticks give one series per metric with the recorded values in order, at the tick times."""
    s = _sampler(FakeNvml())
    for _ in range(3):
        s.tick()
        s.clock.advance(10_000_000)
    series = {c.name: c for c in s.series()}
    assert set(series) == {f"gpu0.{m}" for m in NVML_METRICS}
    assert series["gpu0.power"].values == tuple(r["power"] for r in A100_READINGS[:3])
    assert series["gpu0.power"].unit == "W"
    assert series["gpu0.sm_clock"].t_ns == (1_000_000_000, 1_010_000_000, 1_020_000_000)
    assert all(c.track == "device:0:nvml" for c in series.values())
    assert not s.losses()


def test_unsupported_metric_is_dropped_and_listed():
    """A metric NVML says is not supported is asked for once, then left out; the others go on."""
    nvml = FakeNvml(unsupported={0: ["power"]})
    s = _sampler(nvml)
    for _ in range(4):
        s.tick()
    names = {c.name for c in s.series()}
    assert "gpu0.power" not in names and "gpu0.temperature" in names
    assert s.unsupported == {0: {"power": "Not Supported"}}
    assert "power" not in s._active[0]
    assert not s.losses()


def test_lost_gpu_stops_sampling_and_counts_missed_readings():
    """A GPU that fails (GPU_IS_LOST) after 2 readings keeps its 2 and counts the 3 it missed."""
    nvml = FakeNvml(devices=[A100_DEVICE, A100_DEVICE], lost_after={1: 2})
    s = _sampler(nvml, devices=(0, 1))
    for _ in range(5):
        s.tick()
    by = {c.name: c for c in s.series()}
    assert len(by["gpu0.gpu_utilization"].values) == 5
    assert len(by["gpu1.gpu_utilization"].values) == 2
    (loss,) = s.losses()
    assert (loss.kind, loss.count, loss.unit) == ("samples_dropped", 3, "samples")
    assert "GPU 1" in loss.detail and "GPU is lost" in loss.detail


def test_unexpected_adapter_exception_stops_that_gpu_only_and_is_counted():
    """A non-NVML exception from one GPU's reading (a bug below us) does not kill the sampler thread."""
    class Broken(FakeNvml):
        def read(self, index, metrics, *, slow):
            if index == 1 and self.reads.get(1, 0) >= 1:
                self.reads[1] += 1
                raise TypeError("unexpected struct layout")
            return super().read(index, metrics, slow=slow)

    s = _sampler(Broken(devices=[A100_DEVICE, A100_DEVICE]), devices=(0, 1))
    for _ in range(4):
        s.tick()
    by = {c.name: c for c in s.series()}
    assert len(by["gpu0.power"].values) == 4 and len(by["gpu1.power"].values) == 1
    (loss,) = s.losses()
    assert loss.count == 3 and "TypeError: unexpected struct layout" in loss.detail


def test_max_samples_caps_readings_and_counts_the_rest():
    """With max_samples=2, five ticks keep two readings and count three as lost."""
    s = _sampler(FakeNvml(), max_samples=2)
    for _ in range(5):
        s.tick()
    assert all(len(c.values) == 2 for c in s.series())
    (loss,) = s.losses()
    assert loss.count == 3 and "max_nvml_samples=2" in loss.detail


def test_pcie_byte_counters_become_rates():
    """Cumulative PCIe byte counters (with NVML's microsecond stamps) are differentiated into bytes/s."""
    counters = [{"pcie_tx": ("counter", 1_000, 0)}, {"pcie_tx": ("counter", 51_000, 100_000)},
                {"pcie_tx": ("counter", 151_000, 200_000)}]

    class CounterNvml(FakeNvml):
        def read(self, index, metrics, *, slow):
            n = self.reads.get(index, 0)
            self.reads[index] = n + 1
            return dict(counters[n])

    s = _sampler(CounterNvml(), metrics=("pcie_tx",))
    for _ in range(3):
        s.tick()
    (series,) = s.series()
    assert series.values == (500_000.0, 1_000_000.0)  # 50 kB in 0.1 s, 100 kB in 0.1 s


def test_hooks_run_after_every_reading():
    """Hooks (PM sampling decode rides on them) get each tick's time."""
    s = _sampler(FakeNvml())
    seen = []
    s.hooks.append(seen.append)
    s.tick()
    s.clock.advance(5)
    s.tick()
    assert seen == [1_000_000_000, 1_000_000_005]


def test_threaded_sampler_reads_until_stopped():
    """start() reads at once and then on a thread; stop() joins it and takes a last reading."""
    from omniprof.core.clock import DEFAULT_CLOCK

    nvml = FakeNvml()
    nvml.init()
    s = NvmlSampler(nvml, [0], ["gpu_utilization"], 0.001, DEFAULT_CLOCK)
    s.start()
    import time

    time.sleep(0.05)
    s.stop()
    assert s.ticks >= 3
    assert s._thread is None
    assert s.summary()["nvml_ticks"] == s.ticks


def test_real_adapter_reports_missing_driver_as_nvml_error_12():
    """The real pynvml adapter turns 'NVML Shared Library Not Found' into NvmlCallError code 12."""
    adapter = PynvmlAdapter()
    try:
        adapter.init()
    except NvmlCallError as e:
        assert e.code == 12 and e.call == "nvmlInit"
        return
    adapter.shutdown()
    pytest.skip("this machine has an NVIDIA driver: NVML loaded")


def test_real_adapter_imports_pynvml_only_where_the_driver_library_loads():
    """Without the driver's NVML library (reference: ctypes loading it by name, as pynvml does),
    init() raises pynvml's code 12 without importing nvidia-ml-py (what `omniprof plugins` pays on
    a machine without a GPU); with it, init() goes through pynvml."""
    code = ("import sys\n"
            "from omniprof.backends.cupti.nvml import NvmlCallError, PynvmlAdapter\n"
            "a = PynvmlAdapter()\n"
            "try:\n"
            "    a.init()\n"
            "    a.shutdown()\n"
            "    print('initialised', 'pynvml' in sys.modules)\n"
            "except NvmlCallError as e:\n"
            "    print(e.code, e.call, 'pynvml' in sys.modules, repr(e.text))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    if nvml_loads():
        assert out == ["initialised", "True"]
    else:
        assert out == ["12", "nvmlInit", "False", "'NVML", "Shared", "Library", "Not", "Found'"]


def test_real_adapter_converts_units_and_maps_errors():
    """PynvmlAdapter.read turns mW into W and KB/s into bytes/s, and per-metric NVML errors into NvmlCallError.

    pynvml's functions cannot run without a driver; a stand-in with pynvml's names and return
    shapes takes their place, with pynvml's own error class and constants.
    """
    import types

    import pynvml

    def not_supported(*a):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    fake = types.SimpleNamespace(
        NVMLError=pynvml.NVMLError, NVML_CLOCK_SM=pynvml.NVML_CLOCK_SM, NVML_CLOCK_MEM=pynvml.NVML_CLOCK_MEM,
        NVML_TEMPERATURE_GPU=pynvml.NVML_TEMPERATURE_GPU, NVML_SUCCESS=pynvml.NVML_SUCCESS,
        NVML_FI_DEV_PCIE_COUNT_TX_BYTES=pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
        NVML_FI_DEV_PCIE_COUNT_RX_BYTES=pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
        NVML_PCIE_UTIL_TX_BYTES=pynvml.NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES=pynvml.NVML_PCIE_UTIL_RX_BYTES,
        nvmlDeviceGetHandleByIndex=lambda i: f"h{i}",
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=97, memory=40),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=1 << 30, total=1 << 34),
        nvmlDeviceGetPowerUsage=lambda h: 301_700,
        nvmlDeviceGetClockInfo=lambda h, t: 1410 if t == pynvml.NVML_CLOCK_SM else 1215,
        nvmlDeviceGetTemperature=not_supported,
        nvmlDeviceGetFieldValues=not_supported,
        nvmlDeviceGetPcieThroughput=lambda h, c: 2000 if c == pynvml.NVML_PCIE_UTIL_TX_BYTES else 3000,
    )
    a = PynvmlAdapter()
    a._nvml = fake
    out = a.read(0, list(NVML_METRICS), slow=True)
    assert out["power"] == 301.7 and out["gpu_utilization"] == 97.0 and out["memory_total"] == float(1 << 34)
    assert out["sm_clock"] == 1410.0 and out["memory_clock"] == 1215.0
    assert out["pcie_tx"] == 2000 * 1024.0 and out["pcie_rx"] == 3000 * 1024.0
    assert isinstance(out["temperature"], NvmlCallError) and out["temperature"].code == pynvml.NVML_ERROR_NOT_SUPPORTED
    fast = a.read(0, ["pcie_tx"], slow=False)
    assert fast == {}  # no byte counters on this device and the blocking call is not due
