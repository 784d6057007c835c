"""The real CUPTI adapter, where it runs without a GPU: record conversion from cupti-python's own
record classes, error mapping, and the load failure this machine really has."""

from __future__ import annotations

import pytest

from omniprof.backends.cupti.cupti_adapter import (
    ERROR_INVALID_OPERATION,
    ERROR_NOT_SUPPORTED,
    RESULT_NAMES,
    CuptiCallError,
    CuptiLoadError,
    CuptiPmSampler,
    CuptiPythonAdapter,
    _pm_runtime_error,
)
from omniprof.backends.cupti.diagnostics import explain_cupti

c = pytest.importorskip("cupti.cupti", reason="cupti-python is not installed")


@pytest.fixture
def adapter():
    a = CuptiPythonAdapter()
    a._c = c  # the module, without load(): that needs the CUDA driver
    return a


def test_kernel_record_converts_every_field(adapter):
    """A cupti.cupti.ActivityKernel11 becomes the plain kernel record with its launch shape."""
    k = c.ActivityKernel11()
    k.kind = int(c.ActivityKind.CONCURRENT_KERNEL)
    k.name = "gemm"
    k.start, k.end = 1_000, 6_000
    k.device_id, k.context_id, k.stream_id, k.correlation_id = 1, 2, 7, 42
    k.grid_x, k.grid_y, k.grid_z = 108, 2, 1
    k.block_x, k.block_y, k.block_z = 128, 1, 1
    k.registers_per_thread, k.static_shared_memory, k.dynamic_shared_memory = 64, 4096, 1024
    k.graph_id, k.graph_node_id = 3, 9
    assert adapter._to_dict(k) == {
        "kind": "kernel", "name": "gemm", "start": 1_000, "end": 6_000, "device_id": 1, "context_id": 2,
        "stream_id": 7, "correlation_id": 42, "grid": [108, 2, 1], "block": [128, 1, 1],
        "registers_per_thread": 64, "static_shared_memory": 4096, "dynamic_shared_memory": 1024, "graph_id": 3,
        "graph_node_id": 9}


def test_memcpy_sync_marker_and_device_records(adapter):
    """memcpy, synchronisation (no stream), NVTX marker (thread object) and device records convert."""
    m = c.ActivityMemcpy6()
    m.kind, m.copy_kind, m.bytes, m.start, m.end = int(c.ActivityKind.MEMCPY), 1, 4096, 5, 9
    assert adapter._to_dict(m)["copy_kind"] == 1 and adapter._to_dict(m)["bytes"] == 4096
    s = c.ActivitySynchronization2()
    s.kind, s.type, s.stream_id, s.context_id = int(c.ActivityKind.SYNCHRONIZATION), 4, 0xFFFFFFFF, 1
    assert adapter._to_dict(s)["stream_id"] is None and adapter._to_dict(s)["type"] == 4
    mk = c.ActivityMarker2()
    mk.kind, mk.name, mk.flags_, mk.timestamp, mk.id = int(c.ActivityKind.MARKER), "fwd", 2, 123, 5
    mk.object_kind = int(c.ActivityObjectKind.THREAD)
    mk.object_id.pt.thread_id = 77
    assert adapter._to_dict(mk) == {"kind": "marker", "id": 5, "name": "fwd", "domain": "", "flags": 2,
                                    "timestamp": 123, "thread_id": 77}
    d = c.ActivityDevice5()
    d.kind, d.id, d.num_multiprocessors, d.max_warps_per_multiprocessor = int(c.ActivityKind.DEVICE), 0, 108, 64
    d.compute_capability_major, d.compute_capability_minor = 8, 0
    dev = adapter._to_dict(d)
    assert dev["num_multiprocessors"] == 108 and dev["compute_capability"] == "8.0"


def test_api_record_name_falls_back_without_a_driver(adapter):
    """A runtime record is named by cuptiGetCallbackName, or 'cbid N' when that cannot run."""
    a = c.ActivityAPI()
    a.kind, a.cbid, a.thread_id, a.correlation_id = int(c.ActivityKind.RUNTIME), 211, 99, 4
    r = adapter._to_dict(a)
    assert r["kind"] == "runtime" and r["thread_id"] == 99 and r["correlation_id"] == 4
    assert r["name"] in ("cudaLaunchKernel", "cbid 211") or r["name"].startswith("cudaLaunchKernel")


def test_unknown_kinds_are_ignored(adapter):
    """Records of kinds the backend does not use convert to None."""
    x = c.ActivityCudaEvent2()
    x.kind = int(c.ActivityKind.CUDA_EVENT)
    assert adapter._to_dict(x) is None


def test_cupti_errors_become_call_errors(adapter):
    """A cuptiError from a binding becomes CuptiCallError with its status."""
    def fail(*a):
        raise c.cuptiError(int(c.Result.ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED))

    adapter._c = type("M", (), {"cuptiError": c.cuptiError, "subscribe": staticmethod(fail)})
    with pytest.raises(CuptiCallError) as info:
        adapter.subscribe()
    assert info.value.status == 39 and "MULTIPLE_SUBSCRIBERS" in str(info.value)


def test_load_without_driver_says_which_library_is_missing():
    """On a machine without libcuda, load() raises CuptiLoadError('driver')."""
    a = CuptiPythonAdapter()
    try:
        a.load()
    except CuptiLoadError as e:
        assert e.missing in ("driver", "cupti") and e.detail
        return
    pytest.skip("CUPTI loaded: this machine has a CUDA driver")


def test_pm_sampler_start_without_driver_is_a_load_error():
    """cupti.pm_sampling's own failure here (no libcuda) comes out as CuptiLoadError('driver'), not a RuntimeError."""
    pytest.importorskip("cupti.pm_sampling", reason="cupti-python without pm_sampling")
    s = CuptiPmSampler(0, ["sm__cycles_active.avg"], 500_000, 1 << 20)
    try:
        s.start()
    except CuptiLoadError as e:
        assert e.missing == "driver" and "libcuda" in e.detail
        reason, hint = explain_cupti(e)
        assert "libcuda.so.1" in reason and "driver" in hint
        return
    s.stop()
    s.close()
    pytest.skip("PM sampling started: this machine has a GPU")


@pytest.mark.parametrize(("words", "kind", "status", "fix"), [
    ("CUPTI could not load the nvperf* libraries required for profiling.", "nvperf", None, "libnvperf_target.so"),
    ("PM sampling is already enabled on this device.", None, 7, "Stop the other PM sampling session"),
    ("PM Sampling collection has already started", None, 7, "Stop the other PM sampling session"),
])
def test_pm_sampling_runtime_errors_are_classified(words, kind, status, fix):
    """The RuntimeErrors cupti.pm_sampling words its failures in map to the adapter's errors and their fixes."""
    e = _pm_runtime_error(RuntimeError(words), "cuptiPmSamplingEnable")
    if kind:
        assert isinstance(e, CuptiLoadError) and e.missing == kind
    else:
        assert isinstance(e, CuptiCallError) and e.status == status and words in str(e)
    assert fix in explain_cupti(e)[1]


def test_pm_decode_capacity_follows_the_time_since_the_last_decode():
    """Each decode provisions twice the samples due since the last one, within the bounds."""
    s = CuptiPmSampler(0, ["m"], 500_000, 1 << 20)  # 500 us interval
    s._last_decode_ns = 0
    assert s.decode_capacity(100_000_000) == 2 * 200 + 64  # 0.1 s: 200 due
    assert s.decode_capacity(1_000_000) == s.MIN_DECODE_SAMPLES
    assert s.decode_capacity(10**15) == s.MAX_DECODE_SAMPLES


def test_result_names_are_cuptis_own():
    """Every CUptiResult code the adapter names is the code cupti-python's enum gives that name."""
    real = {int(m): f"CUPTI_{m.name}" for m in c.Result if 0 < int(m) < 1 << 31 - 1}
    assert {k: v for k, v in RESULT_NAMES.items()} == real
    assert (ERROR_NOT_SUPPORTED, ERROR_INVALID_OPERATION) == (int(c.Result.ERROR_NOT_SUPPORTED),
                                                               int(c.Result.ERROR_INVALID_OPERATION))


_RECORD_CLASSES = {
    "kernel": ("CONCURRENT_KERNEL", "ActivityKernel9", "ActivityKernel10", "ActivityKernel11", "ActivityKernel12",
               "ActivityKernel13"),
    "memcpy": ("MEMCPY", "ActivityMemcpy5", "ActivityMemcpy6", "ActivityMemcpy7"),
    "memset": ("MEMSET", "ActivityMemset4", "ActivityMemset5"),
    "sync": ("SYNCHRONIZATION", "ActivitySynchronization", "ActivitySynchronization2"),
    "runtime": ("RUNTIME", "ActivityAPI"),
    "marker": ("MARKER", "ActivityMarker2"),
    "graph": ("GRAPH_TRACE", "ActivityGraphTrace2"),
    "device": ("DEVICE", "ActivityDevice5", "ActivityDevice6"),
    "overhead": ("OVERHEAD", "ActivityOverhead3"),
}


@pytest.mark.parametrize(("ours", "cls"), [(k, n) for k, (_kind, *ns) in _RECORD_CLASSES.items() for n in ns
                                          if hasattr(c, n)])
def test_every_record_version_cupti_python_has_converts(adapter, ours, cls):
    """Each version of a record class that cupti-python may deliver (older CUPTI, newer CUPTI) converts."""
    r = getattr(c, cls)()
    r.kind = int(getattr(c.ActivityKind, _RECORD_CLASSES[ours][0]))
    d = adapter._to_dict(r)
    assert d["kind"] == ours
    # plain data only: nothing that points into CUPTI's buffer survives the callback
    assert all(type(v) in (int, float, str, list, type(None)) for v in d.values()), {k: type(v) for k, v in d.items()}
