"""Backend ``cpu``: an in-process sampler of every Python thread's stack.

Engines (``engine`` option):
    * ``"signal"``: ``setitimer(ITIMER_REAL)`` + a SIGALRM handler in the main thread. Delivers the
      requested rate (1 kHz measured here) and samples every thread at each tick. Used by
      ``"auto"`` when profiling starts in the main thread and SIGALRM is not in use.
    * ``"thread"``: a daemon thread that wakes every ``interval_s``. Works anywhere, but the
      achieved rate is bounded by the GIL switch interval (~200/s measured here); the result says
      the achieved rate.

Levels: ``host_tracer_level`` 0 records nothing, 1 only annotations and steps, 2 (default) also
stack samples. Higher levels are handled as documented in ``docs/backends/cpu.md``.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

import attrs

from omniprof.backends.base import Backend
from omniprof.backends.cpu.sampler import Sampler
from omniprof.backends.cpu.stacks import python_stacks
from omniprof.core import validators as v
from omniprof.core.results import BackendResult, ClockInfo, Span, ThreadInfo, Track
from omniprof.errors import BackendOptionWarning, InvalidArgumentError

__all__ = ["CpuSamplerBackend"]


@attrs.frozen(kw_only=True)
class CpuOptions:
    """Options of the ``cpu`` backend.

    Attributes:
        interval_s: time between samples (default 0.001: 1 kHz).
        max_samples: sample buffer size; when full, recording stops and the rest is counted.
        engine: ``"auto"``, ``"signal"`` or ``"thread"`` (see the module docs).
    """

    interval_s: float = attrs.field(default=0.001, validator=v.number_in_range(0.0, 10.0, lo_open=True))
    max_samples: int = attrs.field(default=1_000_000, validator=v.int_in_range(1, 2**31 - 1))
    engine: str = attrs.field(default="auto", validator=v.one_of("auto", "signal", "thread"))


class _SignalTrigger:
    def __init__(self, sampler: Sampler, interval_s: float, frame_box: list[Any]) -> None:
        self.sampler = sampler
        self.interval_s = interval_s
        self.frame_box = frame_box
        self._old: Any = None

    def _handler(self, signum: int, frame: Any) -> None:
        self.frame_box[0] = frame
        try:
            self.sampler.sample()
        finally:
            self.frame_box[0] = None

    def start(self) -> None:
        self._old = signal.signal(signal.SIGALRM, self._handler)
        signal.setitimer(signal.ITIMER_REAL, self.interval_s, self.interval_s)

    def stop(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
        signal.signal(signal.SIGALRM, self._old if self._old is not None else signal.SIG_DFL)


class _ThreadTrigger:
    def __init__(self, sampler: Sampler, interval_s: float) -> None:
        self.sampler = sampler
        self.interval_s = interval_s
        self._stop = threading.Event()
        self.thread: threading.Thread | None = None

    def _run(self) -> None:
        wait = self._stop.wait
        while not wait(self.interval_s):
            self.sampler.sample()

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="omniprof-sampler", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self.thread is not None:
            self.thread.join()

    def ident(self) -> tuple[int, ...]:
        return (self.thread.ident,) if self.thread is not None and self.thread.ident else ()


def _signal_usable() -> bool:
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        return False
    return signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None) and signal.getitimer(signal.ITIMER_REAL)[0] == 0


class CpuSamplerBackend(Backend):
    """In-process stack sampler of every Python thread (see module docs)."""

    name = "cpu"
    summary = "in-process sampler of every Python thread's stack (1 kHz default)"
    single_session = True
    Options = CpuOptions

    def __init__(self, options: CpuOptions | None = None, *, context: Any = None) -> None:
        super().__init__(options, context=context)
        self._frame_box: list[Any] = [None]
        self._trigger: Any = None
        self.sampler: Sampler | None = None
        self._annotations: list[tuple[str, int, int, int, dict[str, Any]]] = []
        self._steps: list[tuple[int, int]] = []
        self._threads: dict[int, ThreadInfo] = {}
        self._start_ns = 0
        self.engine = ""

    def prepare(self) -> None:
        opts = self.options
        level = self.context.profile_options.host_tracer_level
        if self.context.profile_options.python_tracer_level:
            warnings.warn("backend 'cpu': python_tracer_level=1 (exact call tracing) is not supported by this "
                          "version; stacks are sampled only", BackendOptionWarning, stacklevel=2)
        self.sampling = level >= 2
        if not self.sampling:
            return
        engine = opts.engine
        if engine == "auto":
            engine = "signal" if _signal_usable() else "thread"
        elif engine == "signal" and not _signal_usable():
            raise InvalidArgumentError(
                "backend 'cpu': engine='signal' needs profiling to start in the main thread with SIGALRM unused; "
                "use engine='thread' or 'auto'")
        self.engine = engine
        if engine == "signal":
            source = python_stacks(main_frame=lambda: self._frame_box[0])
            self.sampler = Sampler(source, self.clock, opts.max_samples, on_new_thread=self._new_thread)
            self._trigger = _SignalTrigger(self.sampler, opts.interval_s, self._frame_box)
        else:
            holder: list[_ThreadTrigger] = []
            source = python_stacks(exclude=lambda: holder[0].ident() if holder else ())
            self.sampler = Sampler(source, self.clock, opts.max_samples, on_new_thread=self._new_thread)
            trig = _ThreadTrigger(self.sampler, opts.interval_s)
            holder.append(trig)
            self._trigger = trig

    def start(self) -> None:
        if not hasattr(self, "sampling"):
            self.prepare()
        self._start_ns = self.clock.now_ns()
        self._note_threads()
        if self.sampler is not None:
            self.sampler.begin()
            self._trigger.start()

    def stop(self) -> BackendResult:
        if self._trigger is not None:
            self._trigger.stop()
            self._trigger = None
        end_ns = self.clock.now_ns()
        self._note_threads()
        frames, stacks, samples, losses = self.sampler.export() if self.sampler else ((), (), (), ())
        tids = {s.thread_id for s in samples} | {a[1] for a in self._annotations}
        threads = tuple(self._threads.get(t, ThreadInfo(t, f"thread {t}")) for t in sorted(tids))
        tracks = [Track(id=f"thread:{t.thread_id}", name=t.name, kind="thread", tid=t.native_id) for t in threads]
        spans = [Span(name=n, track=f"thread:{tid}", start_ns=s, dur_ns=e - s, category="annotation", args=a)
                 for n, tid, s, e, a in self._annotations]
        if self._steps:
            tracks.append(Track(id="steps", name="Steps", kind="other"))
            bounds = [*self._steps, (None, end_ns)]
            spans += [Span(name=f"step {n}", track="steps", start_ns=t, dur_ns=bounds[i + 1][1] - t, category="step",
                           args={"step_num": n}) for i, (n, t) in enumerate(self._steps)]
        duration_s = max(end_ns - self._start_ns, 1) / 1e9
        summary: dict[str, Any] = {"engine": self.engine or "off", "interval_s": self.options.interval_s,
                                   "requested_rate_hz": 1.0 / self.options.interval_s}
        if self.sampler is not None:
            summary.update(ticks=self.sampler.ticks, samples=len(samples), samples_dropped=self.sampler.dropped,
                           achieved_rate_hz=self.sampler.ticks / duration_s,
                           sampler_time_ns=self.sampler.self_time_ns,
                           sampler_overhead_pct=100.0 * self.sampler.self_time_ns / (duration_s * 1e9))
        return BackendResult(
            backend=self.name, clock=ClockInfo(name=getattr(self.clock, "name", "clock"), offset_ns=0),
            start_ns=self._start_ns, end_ns=end_ns, tracks=tracks, spans=spans, frames=frames, stacks=stacks,
            threads=threads, samples=samples, losses=losses, summaries={"overhead": summary},
            metadata={"engine": self.engine or "off", "host_tracer_level": self.context.profile_options.host_tracer_level},
        )

    def close(self) -> None:
        if self._trigger is not None:
            with contextlib.suppress(Exception):
                self._trigger.stop()
            self._trigger = None

    # -- hooks ---------------------------------------------------------------------------------
    def annotation(self, name: str, args: dict[str, Any] | None = None) -> Any:
        if self.context.profile_options.host_tracer_level < 1:
            return None
        return self._annotate(name, dict(args or {}))

    @contextlib.contextmanager
    def _annotate(self, name: str, args: dict[str, Any]) -> Iterator[None]:
        tid = threading.get_ident()
        if tid not in self._threads:
            self._note_threads()
        start = self.clock.now_ns()
        try:
            yield
        finally:
            self._annotations.append((name, tid, start, self.clock.now_ns(), args))

    def step(self, step_num: int) -> None:
        self._steps.append((step_num, self.clock.now_ns()))

    def _new_thread(self, tid: int) -> None:
        t = threading._active.get(tid)  # type: ignore[attr-defined]  # O(1), safe in a signal handler
        if t is not None:
            self._threads[tid] = ThreadInfo(tid, t.name, getattr(t, "native_id", None))

    def _note_threads(self) -> None:
        for t in threading.enumerate():
            if t.ident is not None and t.name != "omniprof-sampler":
                self._threads[t.ident] = ThreadInfo(t.ident, t.name, getattr(t, "native_id", None))


del time
