"""Clocks. Backends take a clock so tests can drive time deterministically (see testing.FakeClock).

omniprof's own time reads never go through the ``time`` module's attributes at call time: the
profiled program may replace them (freezegun, a ``mock.patch`` left running, a ``MagicMock``,
``time.perf_counter_ns = lambda: 2**70``), and a profiler that reads the patched clock records a
631,150,166 s session, "0.000 s", a string for a start time, or a number no result can hold. The
functions here call the interpreter's own clock functions, bound when this module is imported and
held in closures (freezegun also swaps module attributes that hold the real functions); when even
that import comes after a patch, they are taken from a fresh instance of the built-in ``time``
module, which no patch of the program's ``time`` reaches.
"""

from __future__ import annotations

import time as _time
import types
from typing import Any, Callable, Protocol, runtime_checkable

__all__ = ["Clock", "MonotonicClock", "DEFAULT_CLOCK", "perf_counter_offset_ns",
           "perf_counter_ns", "perf_counter", "monotonic_ns", "monotonic", "time_ns", "wall_time", "localtime",
           "strftime", "thread_time_ns", "process_time_ns"]


def _pristine_time_module() -> Any:
    """A new instance of the built-in ``time`` module (its functions are the C ones)."""
    import importlib.machinery
    import importlib.util

    spec = importlib.machinery.BuiltinImporter.find_spec("time")
    if spec is None or spec.loader is None:  # pragma: no cover - every CPython has a built-in time
        return _time
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _bind(*names: str) -> list[Callable[..., Any]]:
    funcs = [getattr(_time, n) for n in names]
    if not all(isinstance(f, types.BuiltinFunctionType) and getattr(f, "__name__", "") == n
               for f, n in zip(funcs, names)):
        fresh = _pristine_time_module()  # the program patched time before omniprof was imported
        funcs = [getattr(fresh, n) for n in names]
    return [_hidden(f, n) for f, n in zip(funcs, names)]


def _hidden(func: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``func`` held in a closure. freezegun replaces every module attribute that *is* one of the
    real ``time`` functions, in every loaded module (a bound builtin here would be frozen too); a
    closure's cell is out of its reach."""
    if name in ("localtime", "strftime"):
        def call(*args: Any) -> Any:
            return func(*args)
    else:
        def call() -> Any:  # type: ignore[misc]
            return func()
    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"``time.{name}`` as the interpreter has it, bound when omniprof was imported."
    return call


(perf_counter_ns, perf_counter, monotonic_ns, monotonic, time_ns, wall_time, localtime, strftime, thread_time_ns,
 process_time_ns) = _bind("perf_counter_ns", "perf_counter", "monotonic_ns", "monotonic", "time_ns", "time",
                          "localtime", "strftime", "thread_time_ns", "process_time_ns")


@runtime_checkable
class Clock(Protocol):
    """Anything with ``now_ns() -> int`` (monotonic integer nanoseconds) and a ``name``."""

    name: str

    def now_ns(self) -> int: ...


class MonotonicClock:
    """``time.perf_counter_ns``, bound at import: the run's reference clock."""

    name = "perf_counter_ns"

    def now_ns(self) -> int:
        return perf_counter_ns()


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
