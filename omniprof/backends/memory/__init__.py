"""Backend ``memory``: sampled allocations with stacks, and heap snapshots."""

from omniprof.backends.memory.backend import MemoryBackend, MemoryOptions

__all__ = ["MemoryBackend", "MemoryOptions"]
