"""Clocks. Backends take a clock so tests can drive time deterministically (see testing.FakeClock)."""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "MonotonicClock", "DEFAULT_CLOCK", "perf_counter_offset_ns"]


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


def perf_counter_offset_ns(clock: object) -> int | None:
    """How far ``clock`` is from ``time.perf_counter_ns`` when that distance is fixed: 0 for the
    reference clock, ``clock.perf_counter_offset_ns`` for a clock that declares it is the reference
    plus a constant (a skewed clock in tests, a host clock shifted by a known offset), None for any
    other clock. Engines that stamp samples in C (on CLOCK_MONOTONIC, which is what perf_counter_ns
    reads on Linux) can serve such a clock by adding the offset."""
    if getattr(clock, "name", "") == MonotonicClock.name:
        return 0
    offset = getattr(clock, "perf_counter_offset_ns", None)
    return int(offset) if isinstance(offset, int) and not isinstance(offset, bool) else None
