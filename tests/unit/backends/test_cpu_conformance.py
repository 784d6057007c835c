"""The cpu backend passes the shared backend conformance suite, with each in-process engine."""

from __future__ import annotations

from omniprof.backends.cpu import CpuOptions, CpuSamplerBackend
from omniprof.testing.conformance import BackendConformance


class TestCpuSignalConformance(BackendConformance):
    """Conformance with the default (signal) engine."""

    backend_cls = CpuSamplerBackend


class TestCpuThreadConformance(BackendConformance):
    """Conformance with the thread engine."""

    backend_cls = CpuSamplerBackend

    def backend_options(self) -> CpuOptions:
        return CpuOptions(engine="thread")
