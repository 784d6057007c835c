"""Clocks. Backends take a clock so tests can drive time deterministically (see testing.FakeClock)."""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "MonotonicClock", "DEFAULT_CLOCK"]


@runtime_checkable
class Clock(Protocol):
    """Anything with ``now_ns() -> int`` (monotonic integer nanoseconds) and a ``name``."""

    name: str

    def now_ns(self) -> int: ...


class MonotonicClock:
    """``time.perf_counter_ns``: the run's reference clock."""

    name = "perf_counter_ns"

    def now_ns(self) -> int:
        return time.perf_counter_ns()


DEFAULT_CLOCK = MonotonicClock()
