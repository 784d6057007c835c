"""The memory backend passes the shared backend conformance suite."""

from __future__ import annotations

from omniprof.backends.memory import MemoryBackend
from omniprof.testing.conformance import BackendConformance


class TestMemoryConformance(BackendConformance):
    backend_cls = MemoryBackend
