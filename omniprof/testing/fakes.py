"""Deterministic stand-ins: a clock you advance by hand, a backend that replays data, and a
result with one of each kind of data."""

from __future__ import annotations

from typing import Any, ClassVar

import attrs

from omniprof.plugin import Backend
from omniprof.core.clock import perf_counter_ns
from omniprof.core.results import (
    Allocation,
    Artifact,
    BackendResult,
    ClockInfo,
    CounterSeries,
    Flow,
    Frame,
    Instant,
    Loss,
    ProfileResult,
    RunMetadata,
    Span,
    StackSample,
    Table,
    TaskInfo,
    ThreadInfo,
    Track,
)

__all__ = ["FakeClock", "SkewedClock", "FakeBackend", "make_result"]


class FakeClock:
    """A clock that moves only when told: ``advance(ns)``; ``now_ns()`` returns the current time.

    ``step_ns`` (default 0) is added after every ``now_ns()`` call, for code that needs time to pass.
    """

    name = "fake"

    def __init__(self, start_ns: int = 1_000_000_000, step_ns: int = 0) -> None:
        self.t = start_ns
        self.step_ns = step_ns

    def now_ns(self) -> int:
        t = self.t
        self.t += self.step_ns
        return t

    def advance(self, ns: int) -> None:
        self.t += ns


class SkewedClock:
    """The real reference clock (``time.perf_counter_ns``) plus a fixed ``skew_ns``: a process
    whose clock is off by a known amount, for testing how ranks' clocks are realigned."""

    name = "perf_counter_ns+skew"

    def __init__(self, skew_ns: int) -> None:
        self.skew_ns = int(skew_ns)
        self.perf_counter_offset_ns = self.skew_ns  # a fixed offset: engines stamping in C can serve it

    def now_ns(self) -> int:
        return perf_counter_ns() + self.skew_ns


class FakeBackend(Backend):
    """Records one span per session on its clock; ``fail_at`` makes a lifecycle step raise.

    Registered in tests through a fake entry point, the way a third-party backend is.
    """

    name: ClassVar[str] = "fake"
    summary = "test backend"
    single_session = False

    @attrs.frozen(kw_only=True)
    class Options:
        """Attributes: fail_at ('', 'prepare', 'start', 'stop'), span_name, clock_shift_ns (the fake
        records on its own clock, ``reference - clock_shift_ns``, and reports that offset in its ClockInfo,
        as a backend with a device clock does)."""

        fail_at: str = attrs.field(default="", validator=attrs.validators.in_(["", "prepare", "start", "stop"]))
        span_name: str = "work"
        clock_shift_ns: int = 0

    def __init__(self, options: Any = None, *, context: Any = None) -> None:
        super().__init__(options, context=context)
        self.events: list[str] = []
        self._t0 = 0
        self._steps: list[int] = []
        self._annotations: list[tuple[str, int, int]] = []

    def _maybe_fail(self, phase: str) -> None:
        self.events.append(phase)
        if self.options.fail_at == phase:
            raise RuntimeError(f"fake failure at {phase}")

    def prepare(self) -> None:
        self._maybe_fail("prepare")

    def _now(self) -> int:
        return self.clock.now_ns() - self.options.clock_shift_ns

    def start(self) -> None:
        self._maybe_fail("start")
        self._t0 = self._now()

    def stop(self) -> BackendResult:
        self._maybe_fail("stop")
        return self._result()

    def snapshot(self) -> BackendResult:
        """The session so far (its annotations up to now), for checkpoints."""
        return self._result()

    def _result(self) -> BackendResult:
        t1 = self._now()
        spans = [Span(self.options.span_name, "main", self._t0, t1 - self._t0, category="fake")]
        spans += [Span(n, "main", s, e - s, category="annotation") for n, s, e in list(self._annotations)]
        return BackendResult(backend=self.name, clock=ClockInfo(name=f"{self.clock.name}-shifted" if self.options.clock_shift_ns
                                                                else self.clock.name,
                                                                offset_ns=self.options.clock_shift_ns),
                             start_ns=self._t0, end_ns=t1,
                             tracks=[Track("main", "main")], spans=spans, metadata={"steps": self._steps})

    def close(self) -> None:
        self.events.append("close")

    def step(self, step_num: int) -> None:
        self._steps.append(step_num)

    def annotation(self, name: str, args: dict[str, Any] | None = None) -> Any:
        import contextlib

        @contextlib.contextmanager
        def cm() -> Any:
            s = self._now()
            yield
            self._annotations.append((name, s, self._now()))

        return cm()


def make_result(*, empty: bool = False) -> ProfileResult:
    """A result with one of each kind of data (or an empty one), for reporter tests."""
    meta = RunMetadata(host="testhost", pid=4242, argv=("prog.py",), python="3.11.0", platform="Linux",
                       versions={"omniprof": "0.1.0"}, backends=("cpu",), options={"host_tracer_level": 2},
                       start_unix_ns=1_700_000_000_000_000_000, start_ns=1_000_000, end_ns=11_000_000)
    if empty:
        return ProfileResult(metadata=meta, parts=(BackendResult(backend="cpu"),))
    frames = (Frame("main", "prog.py", 10), Frame("work", "prog.py", 20), Frame("helper", "lib.py", 5),
              Frame("memcpy", "", 0, module="libc.so.6", kind="native"))
    stacks = ((0, 1), (0, 1, 2), (0, 2), (0, 1, 3))
    samples = tuple(StackSample(1_000_000 + i * 1_000_000, 1, sid, 1_000_000, task_id=7 if i % 2 else None)
                    for i, sid in enumerate([0, 1, 1, 2, 3, 0, 1, 1, 0, 0]))
    part = BackendResult(
        backend="cpu", clock=ClockInfo(), start_ns=1_000_000, end_ns=11_000_000,
        tracks=(Track("thread:1", "MainThread", "thread", "prog", pid=4242, tid=4242),
                Track("gpu:0:stream:7", "GPU 0 stream 7", "stream", "gpu0", device=0, stream=7)),
        spans=(Span("step 1", "thread:1", 1_000_000, 5_000_000, "step", {"step_num": 1}),
               Span("launch", "thread:1", 2_000_000, 100_000, "runtime", {"correlation": 5}, flow_ids=(5,)),
               Span("gemm_kernel", "gpu:0:stream:7", 2_500_000, 1_000_000, "kernel",
                    {"grid": [128, 1, 1], "block": [256, 1, 1], "registers_per_thread": 64,
                     "static_shared_memory_bytes": 4096, "occupancy_pct": 50.0}, flow_ids=(5,))),
        instants=(Instant("gc", "thread:1", 3_000_000, "gc"),),
        flows=(Flow(5, "launch", "cuda"),),
        frames=frames, stacks=stacks,
        threads=(ThreadInfo(1, "MainThread", 4242),), tasks=(TaskInfo(7, "Task-1", 1),),
        samples=samples,
        allocations=(Allocation(2_000_000, 4096, 1, 1, alive_at_end=True, type="bytearray", domain="obj"),
                     Allocation(3_000_000, 128, 2, 1)),
        counters=(CounterSeries("gpu_utilization", "percent", "gpu:0:stream:7", (1_000_000, 2_000_000), (10.0, 90.0)),),
        tables=(Table("op_stats", ("name", "count", "total_ns"), [("add", 3, 3000), ("mul", 1, 500)], "Op statistics"),),
        summaries={"flops": {"flops": 1.0e9, "flop_rate_per_s": 2.0e12}, "memory": {"peak_bytes": 1 << 20}},
        losses=(Loss("cpu", "samples_dropped", 3, "samples", "buffer full"),),
        artifacts=(Artifact("xplane", "/tmp/x.xplane.pb"),),
        metadata={"engine": "fake"},
    )
    return ProfileResult(metadata=meta, parts=(part,))
