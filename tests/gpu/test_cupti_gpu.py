"""The cupti backend on a real NVIDIA GPU (run with --run-gpu). Skipped with probe()'s reason elsewhere."""

from __future__ import annotations

import warnings

import pytest

import omniprof
from omniprof import BackendUnavailableError, ProfileOptions
from omniprof.backends.cupti import CuptiBackend


def _unavailable() -> str:
    try:
        CuptiBackend.probe()
    except BackendUnavailableError as e:
        return f"cupti unavailable: {e.reason}"
    return ""


REASON = _unavailable()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(bool(REASON), reason=REASON or "-")]


@pytest.fixture
def torch_cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA build of torch to launch kernels")
    return torch


def _work(torch, n=20):
    a = torch.randn(2048, 2048, device="cuda")
    for _ in range(n):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()


def test_real_session_records_kernels_metrics_and_launches(torch_cuda):
    """A matmul loop gives kernel spans with launch shapes, runtime calls linked to them, and NVML series."""
    torch = torch_cuda
    _work(torch, 2)  # warm up outside the session
    with omniprof.Profiler(backend="cupti") as prof:
        _work(torch)
    part = prof.result.part("cupti")
    kernels = [s for s in part.spans if s.category == "kernel"]
    assert len(kernels) >= 20
    k = kernels[0]
    assert len(k.args["grid"]) == 3 and len(k.args["block"]) == 3 and k.args["registers_per_thread"] > 0
    assert part.start_ns - 10**9 < k.start_ns < part.end_ns + 10**9  # on the reference clock
    assert any(s.category == "runtime" and "Launch" in s.name for s in part.spans)
    assert part.flows
    util = next(c for c in part.counters if c.name == "gpu0.gpu_utilization")
    assert all(0 <= x <= 100 for x in util.values) and max(util.values) > 0
    rows = part.table("kernel_stats").records()
    assert sum(r["occurrences"] for r in rows) == len(kernels)
    assert any(r["occupancy_pct"] for r in rows)


def test_real_activity_cap_counts_drops(torch_cuda):
    """A cap of 5 device records keeps 5 and counts the rest as lost."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with omniprof.Profiler(backend="cupti",
                               options=ProfileOptions(advanced_configuration={"gpu_max_activity_api_events": 5})) as p:
            _work(torch_cuda)
    part = p.result.part("cupti")
    assert len([s for s in part.spans if s.category in ("kernel", "memcpy", "memset", "sync")]) == 5
    assert any(lo.kind == "events_dropped" and lo.count > 0 for lo in part.losses)


def test_real_doctor_checks_pass():
    """On a working GPU machine every GPU check of the doctor passes."""
    from omniprof.core.doctor import run_doctor

    report = run_doctor(frameworks=False)
    assert all(c.ok for c in report.gpu), [c for c in report.gpu if not c.ok]
