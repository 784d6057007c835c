"""docs/backends/torch.md: without a GPU the torch backend is quiet at the default device level and
warns only when device_tracer_level=1 was asked for."""

from __future__ import annotations

import warnings

import pytest

import omniprof
from omniprof.errors import BackendOptionWarning

torch = pytest.importorskip("torch")


def _warnings(options):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with omniprof.Profiler(backend="torch", options=options):
            torch.ones(4).sum()
    return [w for w in caught if issubclass(w.category, BackendOptionWarning) and "no CUDA" in str(w.message)]


def test_no_gpu_is_quiet_by_default_and_warns_when_device_level_1_is_asked_for():
    if torch.cuda.is_available():
        pytest.skip("GPU test machine: the device is there")  # a GPU-only condition, as the GPU tests skip
    assert _warnings(omniprof.ProfileOptions()) == []
    assert len(_warnings(omniprof.ProfileOptions(device_tracer_level=1))) == 1
