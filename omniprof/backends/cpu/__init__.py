"""Backend ``cpu``: in-process stack sampler."""

from omniprof.backends.cpu.backend import CpuOptions, CpuSamplerBackend

__all__ = ["CpuSamplerBackend", "CpuOptions"]
