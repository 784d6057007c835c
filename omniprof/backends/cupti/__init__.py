"""Backend ``cupti``: NVIDIA GPU metrics through NVML and GPU activity through CUPTI.

Importing this package imports neither ``pynvml`` nor ``cupti``; the adapters import them when a
session (or ``probe()``) needs them.
"""

from omniprof.backends.cupti.backend import CuptiBackend, CuptiOptions, GpuAdapters

__all__ = ["CuptiBackend", "CuptiOptions", "GpuAdapters"]
