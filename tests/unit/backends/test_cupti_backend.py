"""The cupti backend end to end through the Profiler, with fakes behind the NVML/CUPTI adapters."""

from __future__ import annotations

import gzip
import json
import time
import warnings

import pytest

import omniprof
from omniprof import (
    BackendError,
    BackendUnavailableError,
    InvalidArgumentError,
    ProfileOptions,
)
from omniprof.backends.cupti import CuptiBackend, CuptiOptions
from omniprof.backends.cupti.cupti_adapter import CuptiCallError, CuptiLoadError
from omniprof.backends.cupti.diagnostics import (
    DEVICE_HINTS,
    LD_LIBRARY_PATH_HINT,
    NVPERF_HINT,
    PRIVILEGES_HINT,
    SUBSCRIBER_HINT,
)
from omniprof.formats.kernels import kernel_stats
from omniprof.core.options import build_options
from omniprof.errors import BackendOptionWarning, DataLossWarning
from omniprof.testing.conformance import BackendConformance
from omniprof.testing.gpu_fakes import (
    A100_DEVICE,
    H100_DEVICE,
    FakeCupti,
    FakeNvml,
    FakePmSampler,
    fake_adapters,
    fake_cupti_backend,
    fake_gpu_registry,
    records_from_kineto,
)
from tests.tools import nvml_loads, shared_data

SMALL = [
    {"kind": "device", "id": 0, "name": "A100", "num_multiprocessors": 108, "num_threads_per_warp": 32,
     "max_warps_per_multiprocessor": 64, "max_blocks_per_multiprocessor": 32,
     "max_registers_per_multiprocessor": 65536, "max_shared_memory_per_multiprocessor": 167936,
     "compute_capability": "8.0"},
    {"kind": "runtime", "name": "cudaLaunchKernel", "cbid": 211, "start": 100, "end": 900, "process_id": 1,
     "thread_id": 5, "correlation_id": 1},
    {"kind": "kernel", "name": "gemm", "start": 1_000, "end": 6_000, "device_id": 0, "context_id": 1, "stream_id": 7,
     "correlation_id": 1, "grid": [108, 1, 1], "block": [128, 1, 1], "registers_per_thread": 64,
     "static_shared_memory": 4096, "dynamic_shared_memory": 0, "graph_id": 3, "graph_node_id": 17},
    {"kind": "driver", "name": "cuLaunchKernel", "cbid": 307, "start": 200, "end": 800, "process_id": 1,
     "thread_id": 5, "correlation_id": 2},
    {"kind": "memcpy", "copy_kind": 2, "bytes": 4096, "start": 7_000, "end": 8_000, "device_id": 0, "stream_id": 7,
     "correlation_id": 3, "graph_node_id": 0},
    {"kind": "kernel", "name": "other_gpu", "start": 1_000, "end": 2_000, "device_id": 1, "context_id": 2,
     "stream_id": 9, "correlation_id": 4, "grid": [1, 1, 1], "block": [32, 1, 1], "registers_per_thread": 8,
     "static_shared_memory": 0, "dynamic_shared_memory": 0, "graph_id": 0, "graph_node_id": 0},
]




def run(options=None, backend_options=None, nvml=None, cupti=None, pm=None, work=None):
    nvml = nvml or FakeNvml()
    cupti = cupti if cupti is not None else FakeCupti(SMALL)
    with omniprof.Profiler(backend="cupti", options=options, registry=fake_gpu_registry(nvml=nvml, cupti=cupti, pm=pm),
                           backend_options={"cupti": backend_options} if backend_options else None) as prof:
        if work:
            work()
    return prof.result.part("cupti"), nvml, cupti


def test_nvml_and_cupti_records_land_on_one_timeline():
    """A session yields NVML counter series, kernel/memcpy spans on streams and launch flows."""
    part, nvml, cupti = run()
    assert {c.name for c in part.counters} >= {"gpu0.gpu_utilization", "gpu0.power", "gpu0.pcie_rx"}
    kinds = {s.category for s in part.spans}
    assert {"kernel", "memcpy", "runtime"} <= kinds and "driver" not in {s.args.get("api") for s in part.spans}
    gemm = next(s for s in part.spans if s.name == "gemm")
    assert gemm.track == "device:0:stream:7" and gemm.dur_ns == 5_000 and gemm.flow_ids == (1,)
    assert part.start_ns <= gemm.start_ns <= part.end_ns  # mapped onto the reference clock
    assert [f.flow_id for f in part.flows] == [1]
    assert part.table("kernel_stats") is not None
    assert part.metadata["devices"][0]["name"] == A100_DEVICE["name"]
    # probe() checks NVML only; the session loads CUPTI and subscribes
    assert cupti.calls[:4] == ["load", "subscribe", "system_thread_ids", "register:8388608"]
    assert "unsubscribe" in cupti.calls and nvml.calls[-1] == "shutdown"


def test_device_tracer_level_0_samples_nvml_only():
    """device_tracer_level=0 never touches CUPTI: NVML series only, no spans."""
    part, _, cupti = run(ProfileOptions(device_tracer_level=0))
    assert part.counters and not [s for s in part.spans if s.category != "annotation"]
    assert cupti.calls == []


@pytest.mark.parametrize("options, backend_options", [
    (ProfileOptions(device_tracer_level=0), None), (None, {"record_activity": False}),
], ids=["device_tracer_level=0", "record_activity=false"])
def test_nvml_only_works_where_cupti_cannot(options, backend_options):
    """NVML metrics need no CUPTI: with another subscriber attached (torch.profiler, say) they are still recorded."""
    cupti = FakeCupti(subscribe_status=39)
    part, _, _ = run(options, backend_options, cupti=cupti)
    assert {c.name for c in part.counters} >= {"gpu0.gpu_utilization", "gpu0.power"}
    assert cupti.calls == [] and part.metadata["record_kinds"] == []


def test_without_cupti_the_error_says_how_to_get_nvml_only():
    """A session that needs CUPTI and cannot have it names the cause and the NVML-only way out."""
    with pytest.raises(BackendUnavailableError) as info:
        run(cupti=FakeCupti(subscribe_status=39))
    err = info.value
    assert isinstance(err, BackendUnavailableError) and "another CUPTI subscriber" in err.reason
    assert err.hint.endswith("set the cupti option record_activity=false")


@pytest.mark.parametrize("level, api", [(0, set()), (1, set()), (2, {"runtime"}), (3, {"runtime", "driver"})],
                         ids=lambda x: str(x))
def test_host_tracer_level_selects_api_records(level, api):
    """Level 2 adds CUDA runtime calls and 3 driver calls; 0 and 1 record none."""
    part, _, cupti = run(ProfileOptions(host_tracer_level=level))
    assert {k for k in ("runtime", "driver") if f"enable:{k}" in cupti.calls} == api
    assert {s.args["api"] for s in part.spans if s.category == "runtime"} == api


def test_annotations_and_steps_follow_host_tracer_level():
    """omniprof.annotate ranges are recorded at host_tracer_level >= 1 and not at 0."""
    def work():
        with omniprof.annotate("load_batch"):
            pass

    part, *_ = run(ProfileOptions(host_tracer_level=1), work=work)
    assert [s.name for s in part.spans if s.category == "annotation"] == ["load_batch"]
    part0, *_ = run(ProfileOptions(host_tracer_level=0), work=work)
    assert not [s for s in part0.spans if s.category == "annotation"]


def test_activity_cap_drops_are_counted_and_warned():
    """gpu_max_activity_api_events=1 keeps one device record, counts the others and warns."""
    with pytest.warns(DataLossWarning, match="gpu_max_activity_api_events=1"):
        part, *_ = run(ProfileOptions(advanced_configuration={"gpu_max_activity_api_events": 1}))
    assert len([s for s in part.spans if s.category in ("kernel", "memcpy")]) == 1
    (loss,) = part.losses
    assert loss.count == 2 and loss.source == "cupti"  # the 2nd kernel and the memcpy of GPU 0 and 1


def test_cupti_dropped_records_reported():
    """Records CUPTI drops for buffer space come back as a Loss."""
    with pytest.warns(DataLossWarning):
        part, *_ = run(cupti=FakeCupti(SMALL, dropped=17))
    assert [(lo.kind, lo.count) for lo in part.losses] == [("buffer_full", 17)]


def test_chips_to_profile_limits_devices():
    """gpu_num_chips_to_profile_per_task=1 samples and traces GPU 0 only."""
    nvml = FakeNvml(devices=[A100_DEVICE, A100_DEVICE])
    part, *_ = run(ProfileOptions(advanced_configuration={"gpu_num_chips_to_profile_per_task": 1}), nvml=nvml)
    assert {c.name.split(".")[0] for c in part.counters} == {"gpu0"}
    assert "other_gpu" not in {s.name for s in part.spans}
    assert part.metadata["filtered_records"] == 1
    both, *_ = run(nvml=FakeNvml(devices=[A100_DEVICE, A100_DEVICE]))
    assert {c.name.split(".")[0] for c in both.counters} == {"gpu0", "gpu1"} and "other_gpu" in {
        s.name for s in both.spans}


def test_devices_option_out_of_range_is_rejected():
    """devices=[3] on a one-GPU machine fails naming the valid indices."""
    nvml, cupti = FakeNvml(), FakeCupti()
    with pytest.raises(BackendError, match=r"GPU index\(es\) \[3\].*1 GPU\(s\)") as info:
        run(backend_options={"devices": [3]}, nvml=nvml, cupti=cupti)
    assert isinstance(info.value.__cause__, InvalidArgumentError)
    assert not nvml.initialized and not cupti.subscribed  # released although prepare() failed


def test_nvtx_tracking_enables_markers_and_needs_host_level(monkeypatch):
    """gpu_enable_nvtx_tracking turns marker records on; with host_tracer_level=0 it warns instead."""
    monkeypatch.setenv("NVTX_INJECTION64_PATH", "/opt/libcupti.so")
    nvtx = [{"kind": "marker", "id": 1, "name": "fwd", "domain": "", "flags": 2, "timestamp": 10, "thread_id": 5},
            {"kind": "marker", "id": 1, "name": "", "domain": "", "flags": 0, "timestamp": 90, "thread_id": 5}]
    part, _, cupti = run(ProfileOptions(advanced_configuration={"gpu_enable_nvtx_tracking": True}),
                         cupti=FakeCupti(SMALL + nvtx))
    assert "enable:marker" in cupti.calls
    assert [(s.name, s.dur_ns) for s in part.spans if s.category == "nvtx"] == [("fwd", 80)]
    with pytest.warns(BackendOptionWarning, match="needs host_tracer_level >= 1"):
        _, _, cupti0 = run(ProfileOptions(host_tracer_level=0,
                                          advanced_configuration={"gpu_enable_nvtx_tracking": True}))
    assert "enable:marker" not in cupti0.calls


def test_nvtx_without_injection_path_says_how_to_set_it(monkeypatch):
    """NVTX tracking without NVTX_INJECTION64_PATH warns with the libcupti path to use."""
    monkeypatch.delenv("NVTX_INJECTION64_PATH", raising=False)
    with pytest.warns(BackendOptionWarning, match="set NVTX_INJECTION64_PATH=.*libcupti"):
        run(ProfileOptions(advanced_configuration={"gpu_enable_nvtx_tracking": True}))


def test_graph_trace_enables_graph_records_or_explains_refusal():
    """gpu_enable_cupti_activity_graph_trace enables graph records; a CUPTI refusal says what to change."""
    graph = [{"kind": "graph", "graph_id": 3, "start": 0, "end": 50, "device_id": 0, "stream_id": 7,
              "correlation_id": 9}]
    opts = ProfileOptions(advanced_configuration={"gpu_enable_cupti_activity_graph_trace": True})
    part, _, cupti = run(opts, cupti=FakeCupti(SMALL + graph))
    assert "enable:graph" in cupti.calls
    assert [s.name for s in part.spans if s.category == "graph"] == ["CUDA graph 3"]
    with pytest.raises(BackendError, match="record_kernels=false") as info:
        run(opts, cupti=FakeCupti(SMALL, enable_status={"graph": 14}))
    assert isinstance(info.value.__cause__, InvalidArgumentError)


def test_graph_node_mapping_adds_graph_ids():
    """gpu_dump_graph_node_mapping puts graph and node ids in kernel args."""
    part, *_ = run(ProfileOptions(advanced_configuration={"gpu_dump_graph_node_mapping": True}))
    gemm = next(s for s in part.spans if s.name == "gemm")
    assert (gemm.args["graph_id"], gemm.args["graph_node_id"]) == (3, 17)
    plain, *_ = run()
    assert "graph_id" not in next(s for s in plain.spans if s.name == "gemm").args


def test_pm_sampling_series_and_configuration():
    """PM counters become per-GPU series; interval and buffer reach CUPTI in ns and bytes; overflow is a loss."""
    made = []

    def pm(device, metrics, interval_ns, buffer_bytes):
        s = FakePmSampler(device, metrics, interval_ns, buffer_bytes,
                          samples=[(0, 500, [41.0, 7.0]), (500, 1000, [55.0, 9.0])], overflow=True)
        made.append(s)
        return s

    opts = ProfileOptions(advanced_configuration={
        "gpu_pm_sample_counters": "sm__cycles_active.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg",
        "gpu_pm_sample_interval_us": 250, "gpu_pm_sample_buffer_size_per_gpu_mb": 16})
    with pytest.warns(DataLossWarning, match="PM sampling hardware buffer overflowed"):
        part, *_ = run(opts, pm=pm, nvml=FakeNvml(devices=[H100_DEVICE]))
    (s,) = made
    assert (s.interval_ns, s.buffer_bytes, s.state) == (250_000, 16 * 1024 * 1024, "closed")
    series = {c.name: c for c in part.counters if ".pm." in c.name}
    assert series["gpu0.pm.sm__cycles_active.avg.pct_of_peak_sustained_elapsed"].values == (41.0, 55.0)
    assert series["gpu0.pm.dram__throughput.avg"].values == (7.0, 9.0)
    assert [lo.kind for lo in part.losses] == ["buffer_full"]


def test_pm_sampling_unsupported_metrics_are_rejected():
    """A metric set CUPTI cannot sample is an InvalidArgumentError naming the counters."""
    def pm(*a):
        return FakePmSampler(*a, start_error=ValueError("cannot be collected in a single pass"))

    opts = ProfileOptions(advanced_configuration={"gpu_pm_sample_counters": "a__b,c__d"})
    with pytest.raises(BackendError, match="gpu_pm_sample_counters='a__b,c__d'.*single pass") as info:
        run(opts, pm=pm, nvml=FakeNvml(devices=[H100_DEVICE]))
    assert isinstance(info.value.__cause__, InvalidArgumentError)


def test_device_level_0_warns_about_ignored_gpu_keys():
    """GPU keys that need CUPTI warn when device_tracer_level=0 turns CUPTI off."""
    opts = ProfileOptions(device_tracer_level=0, advanced_configuration={"gpu_pm_sample_counters": "a__b"})
    with pytest.warns(BackendOptionWarning, match="gpu_pm_sample_counters has no effect"):
        run(opts)


def test_python_tracer_level_is_refused_visibly():
    """python_tracer_level=1 is not supported and says so."""
    with pytest.warns(BackendOptionWarning, match="python_tracer_level=1"):
        run(ProfileOptions(python_tracer_level=1))


@pytest.mark.parametrize("cupti, match, hint", [
    (FakeCupti(subscribe_status=39), "another CUPTI subscriber", SUBSCRIBER_HINT),
    (FakeCupti(enable_status={"kernel": 35}), "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES", PRIVILEGES_HINT),
    (FakeCupti(load_error=CuptiLoadError("cupti", "libcupti.so.13: cannot open shared object file")),
     "libcupti.so could not be loaded", LD_LIBRARY_PATH_HINT),
    (FakeCupti(enable_status={"kernel": 43}), "on this MIG instance", DEVICE_HINTS[43][1]),
], ids=["subscriber", "privileges", "libcupti", "mig"])
def test_cupti_failures_explain_the_fix(cupti, match, hint):
    """Each CUPTI failure is a BackendUnavailableError naming the cause and the documented remedy."""
    with pytest.raises((BackendUnavailableError, BackendError), match=match) as info:
        run(cupti=cupti)
    err = info.value if isinstance(info.value, BackendUnavailableError) else info.value.__cause__
    assert isinstance(err, BackendUnavailableError) and err.hint.startswith(hint)
    assert not cupti.subscribed and not cupti.enabled  # nothing left attached


@pytest.mark.parametrize("code, match", [(12, "no NVIDIA driver"), (9, "kernel driver is not loaded"),
                                         (4, "no permission")])
def test_probe_explains_nvml_failures(code, match):
    """probe() says why NVML is unusable: no driver, driver not loaded, no permission."""
    with pytest.raises(BackendUnavailableError, match=match):
        fake_cupti_backend(nvml=FakeNvml(init_error=code)).probe()


def test_probe_checks_nvml_only_and_leaves_cupti_alone():
    """probe() on a working (fake) GPU raises nothing and does not touch CUPTI, even a blocked one
    (NVML-only sessions need none; sessions that need CUPTI say why they cannot have it)."""
    cupti = FakeCupti(subscribe_status=39)
    nvml = FakeNvml()
    fake_cupti_backend(nvml=nvml, cupti=cupti).probe()
    assert cupti.calls == [] and nvml.calls == ["init", "shutdown"]


def test_probe_without_gpus():
    """NVML with zero devices: 'found no NVIDIA GPU'."""
    with pytest.raises(BackendUnavailableError, match="found no NVIDIA GPU"):
        fake_cupti_backend(nvml=FakeNvml(devices=[])).probe()


def test_real_probe_here_gives_a_reason():
    """On this machine the real probe either passes (a GPU) or names a cause with a fix."""
    try:
        CuptiBackend.probe()
    except BackendUnavailableError as e:
        assert e.reason and e.hint and e.plugin == "cupti"


def test_options_are_validated_with_clear_messages():
    """Bad options name the key, the value and what is allowed; config lists become tuples."""
    with pytest.raises(InvalidArgumentError, match=r"'nvml_interval_s' must be > 0.0 \(got 0\)"):
        CuptiOptions(nvml_interval_s=0)
    with pytest.raises(InvalidArgumentError, match="unknown metric 'powr'; did you mean 'power'"):
        CuptiOptions(nvml_metrics=["powr"])
    with pytest.raises(InvalidArgumentError, match="distinct GPU indices"):
        CuptiOptions(devices=[0, 0])
    with pytest.raises(InvalidArgumentError, match="did you mean 'record_kernels'"):
        build_options(CuptiOptions, {"record_kernel": False}, owner="backend 'cupti'")
    o = build_options(CuptiOptions, {"nvml_metrics": ["power"], "devices": [1]}, owner="backend 'cupti'")
    assert o.nvml_metrics == ("power",) and o.devices == (1,)


def test_record_options_choose_activity_kinds():
    """record_kernels/memcpy/memset/sync switch CUPTI kinds off; nvml_metrics limits NVML series."""
    part, _, cupti = run(backend_options={"record_kernels": False, "record_memset": False, "record_sync": False,
                                          "record_overhead": False, "nvml_metrics": ["power"]})
    enabled = {c.split(":")[1] for c in cupti.calls if c.startswith("enable:")}
    assert enabled == {"memcpy", "runtime"}
    assert {c.name for c in part.counters} == {"gpu0.power"}
    assert not [s for s in part.spans if s.category == "kernel"]


def test_result_round_trips_through_json():
    """The result with NVML and CUPTI data saves and loads back equal."""
    with omniprof.Profiler(backend="cupti", registry=fake_gpu_registry(cupti=FakeCupti(SMALL))) as prof:
        pass
    r = prof.result
    assert omniprof.ProfileResult.from_dict(json.loads(r.to_json())) == r


def test_cupti_joins_the_cpu_backend_on_one_timeline():
    """backend=['cpu', 'cupti'] runs both; CUDA calls (OS thread ids) land on the sampler's thread tracks."""
    import threading

    recs = [dict(r, thread_id=threading.get_native_id()) if r["kind"] == "runtime" else r for r in SMALL]
    with omniprof.Profiler(backend=["cpu", "cupti"], registry=fake_gpu_registry(cupti=FakeCupti(recs))) as prof:
        t0 = time.perf_counter()  # 0.1 s: the sampler sees this thread however loaded the machine (3 ms did not)
        while time.perf_counter() - t0 < 0.1:
            sum(i * i for i in range(5_000))
    r = prof.result
    cpu_tracks = {t.id for t in r.part("cpu").tracks}
    runtime = [s for s in r.part("cupti").spans if s.category == "runtime"]
    assert runtime and runtime[0].track in cpu_tracks


def test_replayed_alexnet_trace_gives_seed_kernel_table():
    """Replaying AlexNet's real A100 records gives the kernel table of the seed, matching the raw trace."""
    alexnet = shared_data("kineto", "alexnet_cuda_trace.json.gz")
    raw = json.loads(gzip.decompress(alexnet.read_bytes()))
    kernels = [e for e in raw["traceEvents"] if e.get("cat") == "kernel"]
    part, *_ = run(cupti=FakeCupti(records_from_kineto(alexnet)))
    rows = part.table("kernel_stats").records()
    assert sum(r["occurrences"] for r in rows) == len(kernels) == 79
    assert sum(r["total_ns"] for r in rows) == sum(int(round(e["dur"] * 1000)) for e in kernels)
    configs = {(e["name"], ",".join(map(str, e["args"]["block"])), ",".join(map(str, e["args"]["grid"])),
                e["args"]["shared memory"]) for e in kernels}
    assert len(rows) == len(configs)
    top = rows[0]
    assert top["kernel_name"] == "ampere_sgemm_32x32_sliced1x4_tn" and top["occurrences"] == 4
    assert top["min_ns"] <= top["avg_ns"] <= top["max_ns"] and top["static_shared_memory_bytes"] == 32768
    tc = {r["kernel_name"] for r in rows if r["tensor_core"]}
    assert tc and all("xmma" in n for n in tc)
    assert all(r["occupancy_pct"] is not None for r in rows)
    host = {e["args"].get("correlation") for e in raw["traceEvents"] if e.get("cat") == "cuda_runtime"}
    gpu = {e["args"].get("correlation") for e in raw["traceEvents"]
           if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")}
    assert len(part.flows) == len((host & gpu) - {None, 0}) > 0
    assert kernel_stats(part.spans) == rows


class SmallGpuBackend(CuptiBackend):
    """The ``cupti`` backend over fakes replaying SMALL: a plugin as a user would register it (by
    ``module:class``) to try the backend without a GPU."""

    adapters = fake_adapters(FakeNvml(), FakeCupti(SMALL))


class TestCuptiConformance(BackendConformance):
    """The shared backend conformance suite, with fakes behind the adapters."""

    backend_cls = SmallGpuBackend

    @pytest.fixture(autouse=True)
    def _quiet(self):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DataLossWarning)
            yield


def test_pm_sampling_without_nvperf_libraries_says_how_to_fix_it():
    """PM sampling whose nvperf libraries cannot load is unavailable, with the LD_LIBRARY_PATH fix."""
    def pm(*a):
        return FakePmSampler(*a, start_error=CuptiLoadError("nvperf", "CUPTI could not load the nvperf* libraries"))

    opts = ProfileOptions(advanced_configuration={"gpu_pm_sample_counters": "a__b"})
    with pytest.raises(BackendError) as info:
        run(opts, pm=pm, nvml=FakeNvml(devices=[H100_DEVICE]))
    cause = info.value.__cause__
    assert isinstance(cause, BackendUnavailableError)
    assert "PM sampling on GPU 0" in cause.reason and "libnvperf_host.so" in cause.reason
    assert cause.hint == NVPERF_HINT


def test_failed_pm_decode_is_a_loss_and_nvml_sampling_goes_on():
    """A PM decode that fails on the NVML thread stops PM sampling of that GPU only: counted, and NVML goes on."""
    made = []

    def pm(*a):
        s = FakePmSampler(*a, decode_error=CuptiCallError(8, "cuptiPmSamplingDecodeData"))
        made.append(s)
        return s

    opts = ProfileOptions(advanced_configuration={"gpu_pm_sample_counters": "a__b"})
    with pytest.warns(DataLossWarning, match="PM sampling stopped when decoding failed"):
        part, nvml, _ = run(opts, backend_options={"pm_poll_interval_s": 0.001}, pm=pm,
                            nvml=FakeNvml(devices=[H100_DEVICE]), work=lambda: time.sleep(0.1))
    (s,) = made
    assert s.decodes == 1  # not retried after the failure
    (loss,) = [lo for lo in part.losses if lo.source == "cupti.pm"]
    assert loss.kind == "decode_failed" and "cuptiPmSamplingDecodeData" in loss.detail
    util = next(c for c in part.counters if c.name == "gpu0.gpu_utilization")
    assert len(util.values) >= 3 and nvml.reads[0] == len(util.values)


def test_device_and_overhead_kinds_cupti_does_not_support_are_notes():
    """CUPTI_ERROR_NOT_SUPPORTED (27) for the device/overhead records is a note; kernels are still recorded."""
    part, *_ = run(cupti=FakeCupti(SMALL, enable_status={"device": 27, "overhead": 27}))
    notes = part.metadata["notes"]
    assert any("'device' not available here (CUPTI_ERROR_NOT_SUPPORTED)" in n and "occupancy" in n for n in notes)
    assert any("'overhead'" in n for n in notes)
    assert any(s.name == "gemm" for s in part.spans)


def test_hardware_busy_is_an_error_not_a_note():
    """Code 26 is CUPTI_ERROR_HARDWARE_BUSY (not NOT_SUPPORTED): enabling fails loudly, naming it."""
    with pytest.raises(BackendError, match="CUPTI_ERROR_HARDWARE_BUSY"):
        run(cupti=FakeCupti(SMALL, enable_status={"device": 26}))


def test_clock_map_keeps_durations_exact_unless_the_clocks_measurably_drift():
    """Jitter between two close sync readings is not drift; 500 ppm over 10 s with 1 us readings is."""
    from omniprof.backends.cupti.backend import clock_map

    # 100 us apart, 30 ns of disagreement (3e-4) but each reading only known to +-1 us: an offset
    short = clock_map([(1_000, 5_000, 1_000), (101_030, 105_000, 1_000)])
    assert short(5_080) - short(5_000) == 80 and short(5_000) == 1_015
    # 10 s apart, the reference clock runs 5e-4 fast, readings known to +-1 us: follow the drift
    long = clock_map([(0, 1_000_000, 1_000), (10_005_000_000, 10_001_000_000, 1_000)])
    assert long(1_000_000) == 0 and long(10_001_000_000) == 10_005_000_000
    assert long(5_001_000_000) == 5_002_500_000
    assert clock_map([])(123) == 123


def test_pm_sampling_on_a_gpu_without_the_time_trigger_is_refused_up_front():
    """An A100 (8.0) cannot run PM sampling's time-interval trigger: refused before CUPTI is touched."""
    cupti = FakeCupti(SMALL)
    opts = ProfileOptions(advanced_configuration={"gpu_pm_sample_counters": "a__b"})
    with pytest.raises(BackendError, match=r"GPU 0 NVIDIA A100.*compute capability 8.0.*8.6 or newer") as info:
        run(opts, cupti=cupti)
    assert isinstance(info.value.__cause__, InvalidArgumentError)
    assert not cupti.subscribed and not any(c.startswith("enable") for c in cupti.calls)


def test_nvml_metrics_beside_a_real_torch_profiler_session():
    """torch (real torch.profiler) and cupti with record_activity=false in one run: both parts, one timeline."""
    torch = pytest.importorskip("torch")
    reg = fake_gpu_registry(cupti=FakeCupti(subscribe_status=39))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BackendOptionWarning)  # torch: no CUDA device on this machine
        with omniprof.Profiler(backend=["torch", "cupti"], registry=reg,
                               backend_options={"cupti": {"record_activity": False,
                                                          "nvml_interval_s": 0.005}}) as prof:
            a = torch.randn(256, 256)
            for _ in range(20):
                a = torch.tanh(a @ a)
            time.sleep(0.05)
    t, g = prof.result.part("torch"), prof.result.part("cupti")
    assert any(s.name == "aten::mm" for s in t.spans)
    util = next(c for c in g.counters if c.name == "gpu0.gpu_utilization")
    assert len(util.t_ns) >= 3 and g.start_ns <= util.t_ns[0] and util.t_ns[-1] <= g.end_ns


def test_fake_gpu_is_chosen_per_registry_and_instance_never_process_wide():
    """A fake GPU lives in its own registry (or is given to one instance): the real backend class,
    the process-wide registry and a session of the real backend beside it are untouched."""
    from omniprof.backends.cupti.backend import GpuAdapters
    from omniprof.core.registry import get_registry

    nvml = FakeNvml()
    reg = fake_gpu_registry(nvml=nvml, cupti=FakeCupti(SMALL))
    fake_cls = reg.backend("cupti")
    assert issubclass(fake_cls, CuptiBackend) and fake_cls is not CuptiBackend
    assert CuptiBackend.adapters == GpuAdapters() and get_registry().backend("cupti") is CuptiBackend
    with omniprof.Profiler(backend="cupti", registry=reg) as prof:
        # meanwhile the real backend, named through the process-wide registry, still sees this
        # machine: a probe that fails exactly as it does without the fake (no driver here), or passes
        real_reason = None
        try:
            get_registry().backend("cupti").probe()
        except BackendUnavailableError as e:
            real_reason = e.reason
    kernels = [s for s in prof.result.part("cupti").spans if s.category == "kernel"]
    assert sorted(s.name for s in kernels) == sorted(r["name"] for r in SMALL if r["kind"] == "kernel")
    assert nvml.calls[0] == "init"  # the fake answered the session
    if not nvml_loads():
        assert real_reason is not None and "NVIDIA" in real_reason
    # one instance may be given its own adapters; its class keeps the real ones
    cupti = FakeCupti(SMALL)
    b = CuptiBackend(adapters=fake_adapters(FakeNvml(), cupti))
    b.prepare()
    b.start()
    part = b.stop()
    b.close()
    assert {s.name for s in part.spans if s.category == "kernel"} == {"gemm", "other_gpu"}
    assert "subscribe" in cupti.calls and CuptiBackend.adapters == GpuAdapters()
    with pytest.raises(InvalidArgumentError, match="'adapters' must be a GpuAdapters"):
        CuptiBackend(adapters={"nvml": FakeNvml})


def test_registry_add_validates_and_replaces_in_that_registry_only():
    """Registry.add checks the class as a loaded plugin is checked, and replaces the name there only."""
    from omniprof.core.registry import Registry, get_registry
    from omniprof.errors import PluginValidationError

    reg = Registry()
    with pytest.raises(PluginValidationError, match="is not a subclass of omniprof.plugin.Backend"):
        reg.add("backend", type("NotABackend", (), {"name": "cupti"}))
    with pytest.raises(InvalidArgumentError, match="'kind' must be one of"):
        reg.add("exporter", SmallGpuBackend)
    reg.add("backend", SmallGpuBackend)
    assert reg.backend("cupti") is SmallGpuBackend and Registry().backend("cupti") is CuptiBackend
    assert get_registry().backend("cupti") is CuptiBackend
    info = next(i for i in reg.infos("backend") if i.name == "cupti")
    assert info.status == "ok" and info.source == "added in code"
