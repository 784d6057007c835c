"""Backend ``cpu``: a sampler of every Python thread's stack, in-process or through py-spy.

Engines (``engine`` option; ``"auto"`` picks the first that fits):
    * ``"native"`` (the default where it runs): a C thread of its own, outside the GIL, reads every
      Python thread's frames at each tick, at the instruction executing (see :mod:`.native`).
      Modes (``mode``): ``wall`` (every thread, idle ones marked), ``cpu`` (threads on a CPU),
      ``gil`` (the GIL holder). Where it cannot run, ``auto`` falls back to ``signal`` and warns.
    * ``"signal"``: ``setitimer(ITIMER_REAL)`` + a SIGALRM handler in the main thread. Delivers the
      requested rate (1 kHz measured here) and samples every thread at each tick. ``auto`` uses it
      when profiling starts in the main thread, SIGALRM is unused and ``native`` is off.
    * ``"thread"``: a daemon thread that wakes every ``interval_s``. Works anywhere (any thread,
      SIGALRM taken), but the achieved rate is bounded by the GIL switch interval (~200/s here);
      the result says the achieved rate.
    * ``"py-spy"``: py-spy samples the process from outside (ptrace), with native (C) frames when
      ``native=True``. ``auto`` uses it when ``native=True``. Per-sample times are not available
      from py-spy (see :mod:`.pyspy`).

Levels (``ProfileOptions``):
    * ``host_tracer_level`` 0: nothing; 1: annotations and steps only; 2 (default): plus stack
      samples; 3: plus garbage collections (a ``gc`` span per collection and a ``<gc gen N>``
      leaf frame carrying its time).
    * ``python_tracer_level`` 1: plus exact Python call/return spans (category ``python``).
"""

from __future__ import annotations

import contextlib
import gc
import os
import random
import signal
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import attrs

from omniprof.plugin import Backend, Capability
from omniprof.backends.cpu import buffer as cpu_buffer
from omniprof.backends.cpu.sampler import BYTES_PER_SAMPLE, Sampler, stopped_loss
from omniprof.backends.cpu.stacks import NO_CUT, WALK_MAX_DEPTH, StackCut, python_stacks, walks_truncated
from omniprof.core import validators as v
from omniprof.core.annotations import user_args
from omniprof.core.clock import perf_counter, perf_counter_offset_ns
from omniprof.core.forks import OwnedHandler, on_fork_child
from omniprof.core.results import BackendResult, ClockInfo, Frame, Loss, Span, TaskInfo, ThreadInfo, Track
from omniprof.errors import BackendOptionWarning, DataLossWarning, InvalidArgumentError

__all__ = ["CpuSamplerBackend", "CpuOptions"]

ENGINES = ("auto", "native", "signal", "thread", "py-spy")
MODES = ("wall", "cpu", "gil")
#: What the fallback engines get wrong, said in the warning when ``auto`` cannot use the native one.
SIGNAL_BIAS = ("samples are taken at the next bytecode boundary the interpreter checks for signals (a call or a "
               "backward jump), not where the thread is: time of straight-line code is charged to the next call "
               "or loop back-edge, and other threads are seen only at their own such points")
_warned_fallback: list[str] = []
#: The shortest sampling interval (100 kHz). Below it the timer (microsecond resolution) would fire
#: without pause or round to zero, and the program would not run at all.
MIN_INTERVAL_S = 1e-5
#: Samples (and annotation spans) a checkpoint (``snapshot()``) writes at most: the latest ones. Building and writing a
#: result costs about 0.4 KiB of memory per sample for a moment (measured: benchmarks/soak.py).
CHECKPOINT_MAX_SAMPLES = 100_000


def _fast_enough(inst: Any, attribute: Any, value: float) -> None:
    if value < MIN_INTERVAL_S:
        raise InvalidArgumentError(f"'interval_s' must be >= {MIN_INTERVAL_S:g} (100 kHz, the fastest the sampler runs; "
                                   f"got {value!r})")


@attrs.frozen(kw_only=True)
class CpuOptions:
    """Options of the ``cpu`` backend.

    Attributes:
        interval_s: time between samples (default 0.001: 1 kHz; ``omniprof.cpu.init`` sets the default).
        max_samples: sample buffer size, shared by sessions until ``omniprof.cpu.clear()``;
            when full, recording stops (the program goes on) and the rest is counted. It also
            bounds the annotation spans one session keeps (the rest counted as ``annotations_dropped``).
        engine: ``"auto"``, ``"native"``, ``"signal"``, ``"thread"`` or ``"py-spy"`` (see the module docs).
        mode: ``"wall"`` (every thread at every tick, idle ones marked), ``"cpu"`` (only threads on a
            CPU) or ``"gil"`` (only the thread holding the GIL); modes other than wall need the
            native engine.
        native: record native (C) frames; needs the ``py-spy`` engine (``auto`` picks it).
        max_python_events: bound of the exact call tracer (``python_tracer_level=1``).
        record_offsets: keep each frame's bytecode offset (``Frame.offset``), so reports with
            ``combine=False`` can tell apart operations on one line (Julia's instruction
            pointers). Off by default: frames on one line are then one frame, which every
            reporter expects.
        accumulate: keep earlier sessions' samples in the process-wide buffer (Julia's model,
            ``omniprof.cpu.clear()`` empties it); False empties it when this session starts,
            so ``max_samples`` is this session's own budget.
    """

    interval_s: float = attrs.field(factory=lambda: cpu_buffer.default_interval_s(),
                                    validator=[v.number_in_range(0.0, 10.0, lo_open=True), _fast_enough])
    max_samples: int = attrs.field(factory=lambda: cpu_buffer.default_max_samples(), validator=v.int_in_range(1, 2**31 - 1))
    engine: str = attrs.field(default="auto", validator=v.one_of(*ENGINES))
    mode: str = attrs.field(default="wall", validator=v.one_of(*MODES))
    native: bool = attrs.field(default=False, validator=v.is_bool)
    max_python_events: int = attrs.field(default=2_000_000, validator=v.int_in_range(1, 2**31 - 1))
    record_offsets: bool = attrs.field(default=False, validator=v.is_bool)
    accumulate: bool = attrs.field(default=True, validator=v.is_bool)


class _SignalTrigger:
    def __init__(self, sampler: Sampler, interval_s: float, frame_box: list[Any]) -> None:
        self.sampler = sampler
        self.interval_s = interval_s
        self.frame_box = frame_box
        self._owned: OwnedHandler | None = None
        self._armed = False
        sample = sampler.sample
        own: set[int] = set()

        # Intervals drawn around interval_s (mean interval_s, +-50%), cycled: a fixed period can
        # lock onto a workload's own period and bias the shares (aliasing); a one-shot timer re-armed
        # with the next delay after each tick cannot. The draws are precomputed, nothing random runs
        # in the handler.
        rng = random.Random(0x5EED)
        delays = [interval_s * (0.5 + rng.random()) for _ in range(251)]
        scale = interval_s * len(delays) / sum(delays)
        delays = [d * scale for d in delays]
        pos = [0]
        due = [0.0]  # when the next tick is due (perf_counter seconds): the schedule, not the handler's
        # own run time, sets the rate
        setitimer, real, now = signal.setitimer, signal.ITIMER_REAL, perf_counter
        self._due = due

        def rearm() -> None:
            i = pos[0] = (pos[0] + 1) % len(delays)
            t = now()
            nxt = due[0] + delays[i]
            if nxt < t + 0.05 * interval_s:  # far behind (a long stall): start the schedule afresh
                nxt = t + delays[i]
            due[0] = nxt
            setitimer(real, nxt - t)

        def handler(signum: int, frame: Any) -> None:
            # A signal handled while the handler itself runs (Python checks for signals between
            # bytecodes, the handler's included) would sample omniprof's own frames: skip it; its
            # time goes to the next sample through the weights.
            if frame_box[0] is not None or id(frame.f_code) in own:
                sampler.ticks += 1
                return
            frame_box[0] = frame
            try:
                sample()  # counts its own failures (Sampler.errors), never raises
            finally:
                frame_box[0] = None
                if self._armed:
                    try:
                        rearm()
                    except Exception as e:  # never into the program: this runs inside its main thread
                        sampler.errors += 1
                        sampler.first_error = sampler.first_error or f"re-arming the timer: {type(e).__name__}: {e}"
                        with contextlib.suppress(Exception):
                            setitimer(real, interval_s)

        own.update(id(c) for c in _own_codes(handler))
        self.handler = handler

    def start(self) -> None:
        self._owned = OwnedHandler(signal.SIGALRM, self.handler).install()
        self._armed = True
        on_fork_child(self._forked)
        self._due[0] = perf_counter() + self.interval_s
        signal.setitimer(signal.ITIMER_REAL, self.interval_s)

    def stop(self) -> None:
        # Disarm first, then give the handler back: a SIGALRM that found SIGALRM's default action
        # would kill the process.
        self._armed = False
        # The profiled program may have installed its own SIGALRM handler (and timer) meanwhile:
        # then the timer and the handler are its own now and stay as they are; the sampling
        # stopped when it took them over (reported as a loss by the backend).
        self.taken = signal.getsignal(signal.SIGALRM) is not self.handler
        if self.taken:
            return
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
        if self._owned is not None:
            self._owned.restore()

    def _forked(self) -> None:
        # A forked child inherits the handler but not the timer (fork(2)); it gets its own
        # process's handler back and never rearms.
        self._armed = False
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
        if self._owned is not None:
            self._owned.restore()


def _own_codes(handler: Any) -> list[Any]:
    """Code objects of the sampler's hot path (kept alive by their modules, so ids are stable)."""
    from omniprof.backends.cpu import sampler as sampler_mod
    from omniprof.backends.cpu import stacks as stacks_mod

    codes = [handler.__code__]
    for mod in (sampler_mod, stacks_mod):
        for obj in vars(mod).values():
            members = vars(obj).values() if isinstance(obj, type) else (obj,)
            codes += [m.__code__ for m in members if hasattr(m, "__code__")]
    codes += [c for c in Sampler.record.__code__.co_consts if hasattr(c, "co_code")]
    src = python_stacks()
    codes.append(src.__code__)
    return codes


class _ThreadTrigger:
    def __init__(self, sampler: Sampler, interval_s: float) -> None:
        self.sampler = sampler
        self.interval_s = interval_s
        self._stop = threading.Event()
        self.thread: threading.Thread | None = None

    def _run(self) -> None:
        wait = self._stop.wait
        sample = self.sampler.sample
        while not wait(self.interval_s):
            sample()

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="omniprof-sampler", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self.thread is not None:
            self.thread.join()

    def ident(self) -> tuple[int, ...]:
        return (self.thread.ident,) if self.thread is not None and self.thread.ident else ()


_PKG_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep


_PROFILER_FILE = os.path.join(_PKG_DIR, "core", "profiler.py")


def _own_threads() -> set[int]:
    """omniprof's helper threads alive now (``omniprof-*``: the Profiler's checkpoint thread, the
    peek thread, a drain thread)."""
    return {t.ident for t in threading.enumerate() if t.ident is not None and t.name.startswith("omniprof-")}


def _drop_own(frames: Any, stacks: Any, samples: Any, own_threads: set[int] = frozenset()  # type: ignore[assignment]
              ) -> tuple[Any, int, int]:
    """Samples whose leaf is omniprof's own code (the signal handler and its re-arming, starting and
    stopping the profiler, the gc callback), that were taken inside the Profiler's start, stop or
    step (the leaf may be the standard library they call: ``signal.getsignal``, ``Event.set``), or
    on one of omniprof's own threads (``own_threads``: the signal and thread engines sample every
    thread) are not the program's: dropped, counted apart."""
    own_frames = {i for i, f in enumerate(frames) if f.file and f.file.startswith(_PKG_DIR)}
    if not own_frames and not own_threads:
        return samples, 0, 0
    from omniprof.core.profiler import LIFECYCLE_METHODS

    lifecycle_names = {f"Profiler.{n}" for n in LIFECYCLE_METHODS}
    lifecycle = {i for i in own_frames if frames[i].file == _PROFILER_FILE and frames[i].name in lifecycle_names}
    own_stacks = {k for k, st in enumerate(stacks)
                  if st and (st[-1] in own_frames or (lifecycle and not lifecycle.isdisjoint(st)))}
    if not own_stacks and not own_threads:
        return samples, 0, 0
    kept, own_ns = [], 0
    for x in samples:
        if x.stack_id in own_stacks or x.thread_id in own_threads:
            own_ns += x.weight_ns
        else:
            kept.append(x)
    if len(kept) == len(samples):
        return samples, 0, 0
    return tuple(kept), len(samples) - len(kept), own_ns


def _signal_usable() -> bool:
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        return False
    return signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None) and signal.getitimer(signal.ITIMER_REAL)[0] == 0


class CpuSamplerBackend(Backend):
    """Sampler of every Python thread's stack (see module docs)."""

    name = "cpu"
    summary = "sampler of every Python thread's stack (1 kHz default; native frames through py-spy)"
    single_session = True
    Options = CpuOptions

    @classmethod
    def capabilities(cls) -> list[Capability]:
        from omniprof.backends.cpu.native import native_available
        from omniprof.backends.cpu.stacks import FAST_WALK


        timer = hasattr(signal, "setitimer")
        nat_ok, nat_how = native_available()
        caps = [
            Capability("native engine (C thread reads every thread's frames; modes wall/cpu/gil)", nat_ok,
                       f"reads through {nat_how}" if nat_ok else f"{nat_how}: engine 'auto' falls back to 'signal'"),
            Capability("signal engine (SIGALRM timer, every thread's stack)", timer,
                       "setitimer(ITIMER_REAL)" if timer else "no setitimer on this platform: use engine='thread'"),
            Capability("thread engine", True, "a sampling thread; works anywhere"),
            Capability("fast stack walk (C extension)", FAST_WALK,
                       "built" if FAST_WALK else "not built or disabled: a pure-Python walk is used (slower)"),
        ]
        from omniprof.backends.cpu.pyspy import which_pyspy

        exe = which_pyspy()
        if exe is None:
            caps.append(Capability("native frames (engine='py-spy')", False, "py-spy is not installed: pip install py-spy"))
        else:
            from omniprof.backends.cpu.pyspy import ptrace_allowed

            ok, why = ptrace_allowed()
            caps.append(Capability("native frames (engine='py-spy')", ok, f"{exe}; {why}"))
        caps.append(Capability("peek (report on SIGUSR1 while running)", hasattr(signal, "SIGUSR1"),
                               "kill -USR1 <pid>" if hasattr(signal, "SIGUSR1") else "no SIGUSR1 on this platform"))
        return caps

    def __init__(self, options: CpuOptions | None = None, *, context: Any = None,
                 sampler: Sampler | None = None) -> None:
        super().__init__(options, context=context)
        #: where this session's stacks are cut: the launcher's frames (``omniprof run``), or nowhere
        self._cut = StackCut(self.context.launcher_codes) if self.context.launcher_codes else NO_CUT
        self._frame_box: list[Any] = [None]
        self._trigger: Any = None
        self._own_sampler = sampler
        self.sampler: Sampler | None = None
        self._annotations: list[tuple[str, int, int, int, dict[str, Any]]] = []
        self._annotations_dropped = 0
        self._steps: list[tuple[int, int]] = []
        self._threads: dict[int, ThreadInfo] = {}
        self._start_ns = 0
        self._gc_spans: list[Any] = []  # raw tuples while recording (see _install_gc), Spans after stop
        self._gc_cb: Any = None
        self._tracer: Any = None
        self._pyspy: Any = None
        self._pyspy_since: tuple[int, int] = (0, 0)  # (clock ns when py-spy sampled, native id of the waiter)
        self._native: Any = None
        self.engine = ""
        self.sampling = False

    # -- lifecycle -----------------------------------------------------------------------------
    def prepare(self) -> None:
        opts = self.options
        po = self.context.profile_options
        self.sampling = po.host_tracer_level >= 2
        self._prepared = True
        if po.python_tracer_level and po.host_tracer_level == 0:
            warnings.warn("backend 'cpu': python_tracer_level=1 with host_tracer_level=0 traces Python calls "
                          "only (no samples, no annotations)", BackendOptionWarning, stacklevel=2)
        if not self.sampling:
            if opts.native:
                warnings.warn("backend 'cpu': native=True has no effect below host_tracer_level=2 (no samples)",
                              BackendOptionWarning, stacklevel=2)
            return
        engine = opts.engine
        if engine == "auto":
            if opts.native:
                engine = "py-spy"
            else:
                from omniprof.backends.cpu.native import native_available

                ok, why = native_available()
                if ok and perf_counter_offset_ns(self.clock) is None:
                    ok, why = False, (f"the session clock {getattr(self.clock, 'name', '?')!r} is neither "
                                      f"perf_counter_ns nor a fixed offset from it")
                engine = "native" if ok else ("signal" if _signal_usable() else "thread")
                if not ok and why not in _warned_fallback:
                    _warned_fallback.append(why)
                    warnings.warn(f"backend 'cpu': the native engine cannot run here ({why}); using the {engine} "
                                  f"engine, whose {SIGNAL_BIAS}", BackendOptionWarning, stacklevel=2)
        elif engine == "native":
            from omniprof.backends.cpu.native import native_available

            ok, why = native_available()
            if not ok:
                raise InvalidArgumentError(f"backend 'cpu': engine='native' cannot run here: {why}; use engine='auto'")
        elif engine == "signal" and not _signal_usable():
            raise InvalidArgumentError(
                "backend 'cpu': engine='signal' needs profiling to start in the main thread with SIGALRM unused; "
                "use engine='thread' or 'auto'")
        if opts.native and engine != "py-spy":
            raise InvalidArgumentError(
                f"backend 'cpu': native=True needs engine='py-spy' (got engine={engine!r}); an in-process sampler "
                f"cannot unwind C frames. Use engine='auto' or 'py-spy'")
        if opts.mode != "wall" and engine != "native":
            raise InvalidArgumentError(f"backend 'cpu': mode={opts.mode!r} needs the native engine (got "
                                       f"engine={engine!r}); only mode='wall' works with the others")
        if engine == "py-spy":
            from omniprof.backends.cpu.pyspy import find_pyspy

            find_pyspy()
        self.engine = engine
        self.sampler = self._own_sampler if self._own_sampler is not None else cpu_buffer.buffer()
        self.sampler.max_samples = opts.max_samples
        if not opts.accumulate:
            self.sampler.clear()

    def start(self) -> None:
        if not getattr(self, "_prepared", False):
            self.prepare()
        opts = self.options
        po = self.context.profile_options
        self._start_ns = self.clock.now_ns()
        self._note_threads()
        if self.sampler is not None:
            s = self.sampler
            self._base = (s.ticks, s.self_time_ns, s.dropped)
            self._errors0 = s.errors
            self._walks_cut0 = walks_truncated()
            if self.engine == "signal":
                source = python_stacks(main_frame=lambda: self._frame_box[0])
                self._start_idx = s.begin(source, self.clock, self._cut, round(opts.interval_s * 1e9))
                self._trigger = _SignalTrigger(s, opts.interval_s, self._frame_box)
            elif self.engine == "native":
                from omniprof.backends.cpu.native import NativeEngine

                self._start_idx = s.begin(None, self.clock, self._cut)
                self._native = NativeEngine(s, opts.interval_s, opts.mode,
                                            offset_ns=perf_counter_offset_ns(self.clock) or 0)
                self._native.start()
            elif self.engine == "thread":
                holder: list[_ThreadTrigger] = []
                source = python_stacks(exclude=lambda: holder[0].ident() if holder else ())
                self._start_idx = s.begin(source, self.clock, self._cut, round(opts.interval_s * 1e9))
                trig = _ThreadTrigger(s, opts.interval_s)
                holder.append(trig)
                self._trigger = trig
            else:
                from omniprof.backends.cpu.pyspy import PySpyEngine

                self._start_idx = s.begin(None, self.clock, self._cut)
                self._pyspy = PySpyEngine(os.getpid(), round(1.0 / opts.interval_s), opts.native)
                self._pyspy.start()
                # py-spy samples from here on (start() waited for it); the thread that waited is the
                # clock of its ticks (pyspy.add_samples)
                self._pyspy_since = (self.clock.now_ns(), threading.get_native_id())
            if self._trigger is not None:
                self._trigger.start()
        on_fork_child(self._forked)
        if po.host_tracer_level >= 3:
            self._install_gc()
        if po.python_tracer_level >= 1:
            from omniprof.backends.cpu.tracer import PythonTracer

            ignore = frozenset(c for c in (getattr(self._trigger, "handler", None),) if c is not None)
            self._tracer = PythonTracer(self.clock, opts.max_python_events,
                                        frozenset(getattr(f, "__code__", None) for f in ignore) - {None},
                                        frozenset(self.context.launcher_codes or ()))
            self._tracer.install()

    def snapshot(self) -> BackendResult | None:
        """The samples and annotations recorded so far, while sampling goes on (checkpoints).

        Reads a consistent prefix of the sample buffer (every column at least that long) and
        changes nothing, so the signal handler or sampler thread may keep appending meanwhile.
        """
        s = self.sampler
        if s is None or self._pyspy is not None:
            return None
        n = min(len(s.t_ns), len(s.thread_ids), len(s.task_ids), len(s.stack_ids), len(s.weights_ns), len(s.flags))
        first = max(self._start_idx, n - CHECKPOINT_MAX_SAMPLES)  # the latest ones: a checkpoint stays cheap
        frames, stacks, samples, losses = s.export(first, n, dropped=s.dropped - self._base[2],
                                                   offsets=self.options.record_offsets, flush=False, cut=self._cut)
        if first > self._start_idx:
            losses = (*losses, Loss(source="cpu", kind="checkpoint_window", count=first - self._start_idx,
                                    unit="samples", detail=f"a checkpoint keeps the latest {CHECKPOINT_MAX_SAMPLES} "
                                                           f"samples; the final result has them all"))
        known = {**dict(s.threads), **dict(self._threads)}
        annotations = self._annotations[-CHECKPOINT_MAX_SAMPLES:]  # the latest, as for samples
        if len(self._annotations) > len(annotations):
            losses = (*losses, Loss(source="cpu", kind="checkpoint_window", count=len(self._annotations) -
                                    len(annotations), unit="spans", detail=f"a checkpoint keeps the latest "
                                    f"{CHECKPOINT_MAX_SAMPLES} annotation spans; the final result has them all"))
        tids = {x.thread_id for x in samples} | {a[1] for a in annotations}
        threads = tuple(known.get(t, ThreadInfo(t, f"thread {t}")) for t in sorted(tids))
        tracks = [Track(id=f"thread:{t.thread_id}", name=t.name, kind="thread", tid=t.native_id) for t in threads]
        spans = [Span(name=name, track=f"thread:{tid}", start_ns=b, dur_ns=e - b, category="annotation", args=a)
                 for name, tid, b, e, a in annotations]
        return BackendResult(
            backend=self.name, clock=ClockInfo(name=getattr(self.clock, "name", "clock"), offset_ns=0),
            start_ns=self._start_ns, end_ns=self.clock.now_ns(), tracks=tracks, spans=spans, frames=frames,
            stacks=stacks, threads=threads, samples=samples, losses=losses,
            metadata={"engine": self.engine or "off", "checkpoint": True})

    def stop(self) -> BackendResult:
        timer_taken = False
        if self._trigger is not None:  # the timer first: nothing may fire into a half-stopped backend
            self._trigger.stop()
            timer_taken = bool(getattr(self._trigger, "taken", False))
            self._trigger = None
        native = self._native
        if native is not None:
            native.stop()
            self._native = None
        if self._tracer is not None:
            self._tracer.uninstall()
        self._remove_gc()
        self._gc_spans = [sp if isinstance(sp, Span) else
                          Span(name=f"gc gen {sp[3]}", track=f"thread:{sp[0]}", start_ns=sp[1], dur_ns=sp[2],
                               category="gc", args={"generation": sp[3], "collected": sp[4], "uncollectable": sp[5]})
                          for sp in self._gc_spans]
        end_ns = self.clock.now_ns()
        pyspy_lines = None
        if self._pyspy is not None:
            pyspy_lines = self._pyspy.stop()
            self._pyspy = None
        self._note_threads()
        po = self.context.profile_options
        frames: tuple[Frame, ...] = ()
        stacks: tuple[tuple[int, ...], ...] = ()
        samples: tuple[Any, ...] = ()
        losses: list[Loss] = []
        summary: dict[str, Any] = {"engine": self.engine or "off", "interval_s": self.options.interval_s,
                                   "requested_rate_hz": 1.0 / self.options.interval_s}
        duration_s = max(end_ns - self._start_ns, 1) / 1e9
        if self.sampler is not None:
            s = self.sampler
            pyspy_ticks = 0
            if pyspy_lines is not None:
                from omniprof.backends.cpu.pyspy import add_samples

                pyspy_ticks = add_samples(s, pyspy_lines, end_ns, *self._pyspy_since,
                                          round(self.options.interval_s * 1e9))
            ticks0, self0, dropped0 = self._base
            if native is not None and self._gc_spans:
                self._mark_gc(s)
            dropped = s.dropped - dropped0
            frames, stacks, samples, loss = s.export(self._start_idx, dropped=dropped,
                                                     offsets=self.options.record_offsets, cut=self._cut)
            samples, own_n, own_ns = _drop_own(frames, stacks, samples, _own_threads())
            losses.extend(loss)
            if self.engine in ("signal", "thread") and s.stopped_ns:
                losses.append(stopped_loss(s.stopped_ns, s.stops))
            self._threads.update({k: t for k, t in s.threads.items() if k in {x.thread_id for x in samples}})
            ticks = s.ticks - ticks0 if pyspy_lines is None else pyspy_ticks
            self_ns = s.self_time_ns - self0
            summary.update(own_samples=own_n, own_time_ns=own_ns)
            summary.update(ticks=ticks, samples=len(samples), samples_dropped=dropped,
                           achieved_rate_hz=ticks / duration_s, sampler_time_ns=self_ns,
                           sampler_overhead_pct=100.0 * self_ns / (duration_s * 1e9),
                           bytes_per_sample=BYTES_PER_SAMPLE)
            if native is not None:
                st = native.stats
                ticks = int(st.get("ticks", 0))
                self_ns = int(st.get("engine_cpu_ns", 0))
                idle = sum(1 for x in samples if x.idle)
                summary.update(ticks=ticks, achieved_rate_hz=ticks / duration_s, sampler_time_ns=self_ns,
                               sampler_overhead_pct=100.0 * self_ns / (duration_s * 1e9), mode=self.options.mode,
                               engine_cpu_ns=self_ns, torn_samples=int(st.get("torn", 0)),
                               retried_samples=int(st.get("retries", 0)),
                               idle_samples=idle, own_samples=native.own_samples + own_n,
                               own_time_ns=native.own_ns + own_ns,
                               stale_codes=native.stale_codes, max_tick_lag_ns=int(st.get("max_lag_ns", 0)),
                               samples_dropped=dropped + int(st.get("dropped", 0)),
                               handler_cpu_ns=int(st.get("handler_cpu_ns", 0)), drain_cpu_ns=native.drain_cpu_ns,
                               process_cpu_ns=native.process_cpu_ns,
                               sampler_time_note="sampler_time_ns is the CPU time of the native engine's own thread "
                                                 "(beside the program, not in its threads); handler_cpu_ns is the "
                                                 "CPU time the program's threads spent in the engine's snapshot "
                                                 "signal handler; drain_cpu_ns the drain thread's, under the GIL; "
                                                 "process_cpu_ns every thread's; torn samples (read while the "
                                                 "thread changed them) are counted, not reported")
                if st.get("torn"):
                    losses.append(Loss(source="cpu", kind="torn_samples", count=int(st["torn"]), unit="samples",
                                       detail="thread stacks that changed while being read (failed validation); "
                                              "not reported"))
                if st.get("dropped"):
                    losses.append(Loss(source="cpu", kind="samples_dropped", count=int(st["dropped"]),
                                       unit="samples", detail="native engine's pending buffer full"))
                if st.get("stopped_ns"):
                    losses.append(stopped_loss(int(st["stopped_ns"]), int(st.get("stops", 0))))
                if st.get("truncated"):
                    from omniprof.backends.cpu.native import MAX_DEPTH

                    losses.append(Loss(source="cpu", kind="stack_truncated", count=int(st["truncated"]),
                                       unit="samples", detail=f"stacks deeper than {MAX_DEPTH} frames: the innermost "
                                                              f"{MAX_DEPTH} kept, the frames below them left out"))
            failed = s.errors - getattr(self, "_errors0", 0)
            if failed > 0:
                losses.append(Loss(source="cpu", kind="sampler_errors", count=failed, unit="ticks",
                                   detail=f"the sampler failed on these ticks and went on; the first: {s.first_error}"))
                warnings.warn(f"omniprof cpu: the sampler failed on {failed} tick(s) and went on (those samples are "
                              f"missing); the first: {s.first_error}", DataLossWarning, stacklevel=3)
            if pyspy_lines is not None:
                window_s = max(end_ns - self._pyspy_since[0], 1) / 1e9
                summary.update(achieved_rate_hz=ticks / window_s, sampled_window_s=window_s)
                summary["sampler_time_note"] = ("py-spy runs in its own process; its CPU time is not charged here, "
                                                "but it pauses this process briefly at each sample")
        if timer_taken:
            missing = max(round(duration_s / self.options.interval_s) - summary.get("ticks", 0), 0)
            losses.append(Loss(source="cpu", kind="timer_taken", count=missing, unit="samples",
                               detail="the program installed its own SIGALRM handler (signal.signal / setitimer), "
                                      "which the signal engine needs; sampling stopped there. Use engine='thread' "
                                      "(-O cpu.engine=thread)"))
            warnings.warn(f"backend 'cpu': the program installed its own SIGALRM handler while profiling, so the "
                          f"signal engine stopped sampling (about {missing} samples missing); profile it with "
                          f"-O cpu.engine=thread", DataLossWarning, stacklevel=3)
        cut = 0
        if self.engine in ("signal", "thread") and walks_truncated() > getattr(self, "_walks_cut0", 0):
            # The walker counts its cut walks process-wide, some of them for samples not kept (omniprof's
            # own, or taken as the session ended): the loss is the kept samples the walk cut.
            cut = sum(1 for x in samples if len(stacks[x.stack_id]) >= WALK_MAX_DEPTH)
        if cut > 0:
            losses.append(Loss(source="cpu", kind="stack_truncated", count=cut, unit="samples",
                               detail=f"stacks deeper than {WALK_MAX_DEPTH} frames: the innermost {WALK_MAX_DEPTH} "
                                      f"kept, the frames below them left out"))
        for loss in losses:
            if loss.kind == "stack_truncated":
                warnings.warn(f"omniprof cpu: {loss.count} sample(s) of a stack deeper than the sampler reads: "
                              f"{loss.detail}", DataLossWarning, stacklevel=3)
        if self._annotations_dropped:
            losses.append(Loss(source="cpu", kind="annotations_dropped", count=self._annotations_dropped, unit="spans",
                               detail=f"more than max_samples={self.options.max_samples} annotation spans in this "
                                      f"session; raise 'max_samples' to keep more"))
            warnings.warn(f"omniprof cpu: {self._annotations_dropped} annotation span(s) not recorded: more than "
                          f"max_samples={self.options.max_samples} in one session. Raise 'max_samples' to keep more",
                          DataLossWarning, stacklevel=3)
        tasks: list[TaskInfo] = []
        if self.sampler is not None:
            used = {x.task_id for x in samples if x.task_id is not None}
            tasks = [t for k, t in sorted(self.sampler.task_info.items()) if k in used]
        tids = ({x.thread_id for x in samples} | {a[1] for a in self._annotations}
                | {int(sp.track.split(":")[1]) for sp in self._gc_spans})
        spans: list[Span] = list(self._gc_spans)
        if self._tracer is not None:
            py_spans, py_losses = self._tracer.spans(end_ns)
            spans += py_spans
            losses += py_losses
            tids |= {int(sp.track.split(":")[1]) for sp in py_spans}
            summary["python_calls"] = len(py_spans)
        threads = tuple(self._threads.get(t, ThreadInfo(t, f"thread {t}")) for t in sorted(tids))
        tracks = [Track(id=f"thread:{t.thread_id}", name=t.name, kind="thread", tid=t.native_id) for t in threads]
        spans += [Span(name=n, track=f"thread:{tid}", start_ns=s_, dur_ns=e - s_, category="annotation", args=a)
                  for n, tid, s_, e, a in self._annotations]
        if self._steps:
            tracks.append(Track(id="steps", name="Steps", kind="other"))
            bounds = [*self._steps, (None, end_ns)]
            spans += [Span(name=f"step {n}", track="steps", start_ns=t, dur_ns=bounds[i + 1][1] - t, category="step",
                           args={"step_num": n}) for i, (n, t) in enumerate(self._steps)]
        if self._gc_spans:
            summary["gc_collections"] = len(self._gc_spans)
            summary["gc_time_ns"] = sum(sp.dur_ns for sp in self._gc_spans)
        return BackendResult(
            backend=self.name, clock=ClockInfo(name=getattr(self.clock, "name", "clock"), offset_ns=0),
            start_ns=self._start_ns, end_ns=end_ns, tracks=tracks, spans=spans, frames=frames, stacks=stacks,
            threads=threads, tasks=tasks, samples=samples, losses=losses, summaries={"overhead": summary},
            metadata={"engine": self.engine or "off", "host_tracer_level": po.host_tracer_level,
                      "python_tracer_level": po.python_tracer_level, "native": self.options.native},
        )

    def close(self) -> None:
        if self._tracer is not None:
            with contextlib.suppress(Exception):
                self._tracer.uninstall()
        if self._trigger is not None:
            with contextlib.suppress(Exception):
                self._trigger.stop()
            self._trigger = None
        if self._pyspy is not None:
            with contextlib.suppress(Exception):
                self._pyspy.cleanup()
            self._pyspy = None
        if self._native is not None:
            with contextlib.suppress(Exception):
                self._native.stop()
            self._native = None
        self._remove_gc()

    def _forked(self) -> None:
        """In a forked child: stop recording into this (the parent's) session, touch nothing
        outside this process (the parent's py-spy is the parent's)."""
        self._trigger = None  # a signal trigger resets itself; a sampler thread does not exist here
        self._pyspy = None
        self._native = None  # the native engine's thread is the parent's: not in this process
        if self._tracer is not None:
            with contextlib.suppress(Exception):
                self._tracer.uninstall()
            self._tracer = None
        self._remove_gc()

    # -- py-spy --------------------------------------------------------------------------------
    def _mark_gc(self, s: Sampler) -> None:
        """Native engine: samples taken while a collection ran on their thread get a ``<gc gen N>``
        leaf (the engine saw the Python line that triggered it; the gc callback knows when it ran)."""
        from bisect import bisect_right

        from omniprof.backends.cpu.stacks import GC_KEY

        spans: dict[int, list[tuple[int, int, int]]] = {}
        for sp in self._gc_spans:
            spans.setdefault(int(sp.track.split(":")[1]), []).append((sp.start_ns, sp.start_ns + sp.dur_ns,
                                                                       int(sp.args["generation"])))
        for v_ in spans.values():
            v_.sort()
        starts = {k: [x[0] for x in v_] for k, v_ in spans.items()}
        for i in range(self._start_idx, len(s.t_ns)):
            tid = s.thread_ids[i]
            lst = spans.get(tid)
            if not lst:
                continue
            j = bisect_right(starts[tid], s.t_ns[i]) - 1
            if j < 0 or s.t_ns[i] > lst[j][1]:
                continue
            raw = (GC_KEY, lst[j][2], *s.stack_list[s.stack_ids[i]])
            sid = s.stack_index.get(raw)
            if sid is None:
                sid = s.stack_index[raw] = len(s.stack_list)
                s.stack_list.append(raw)
            s.stack_ids[i] = sid

    # -- gc (level 3) ------------------------------------------------------------------------------
    def _install_gc(self) -> None:
        starts: dict[int, int] = {}
        clock = self.clock
        sampler = self.sampler
        spans = self._gc_spans

        def callback(phase: str, info: dict[str, Any]) -> None:
            tid = threading.get_ident()
            if phase == "start":
                starts[tid] = clock.now_ns()
                return
            t0 = starts.pop(tid, None)
            if t0 is None:
                return
            t1 = clock.now_ns()
            gen = int(info.get("generation", 0))
            # plain tuples (Spans are built at stop): the callback runs at every collection, its own
            # cost is the program's time
            spans.append((tid, t0, t1 - t0, gen, int(info.get("collected", 0)), int(info.get("uncollectable", 0))))
            if sampler is not None and self.engine in ("signal", "thread"):
                sampler.record_gc(tid, sys._getframe(1), gen, t0, t1)

        if sampler is not None:
            sampler.gc_quantum_ns = round(self.options.interval_s * 1e9)
        self._gc_cb = callback
        gc.callbacks.append(callback)

    def _remove_gc(self) -> None:
        if self._gc_cb is not None:
            with contextlib.suppress(ValueError):
                gc.callbacks.remove(self._gc_cb)
            self._gc_cb = None

    # -- hooks ---------------------------------------------------------------------------------
    def annotation(self, name: str, args: dict[str, Any] | None = None) -> Any:
        if self.context.profile_options.host_tracer_level < 1:
            return None
        return self._annotate(name, user_args(args))

    @contextlib.contextmanager
    def _annotate(self, name: str, args: dict[str, Any]) -> Iterator[None]:
        tid = threading.get_ident()
        if tid not in self._threads:
            self._note_threads()
        start = self.clock.now_ns()
        try:
            yield
        finally:
            if len(self._annotations) < self.options.max_samples:
                self._annotations.append((name, tid, start, self.clock.now_ns(), args))
            else:  # bounded like the samples, so a tight annotated loop cannot grow memory without end
                self._annotations_dropped += 1

    def step(self, step_num: int) -> None:
        self._steps.append((step_num, self.clock.now_ns()))

    def _note_threads(self) -> None:
        for t in threading.enumerate():
            if t.ident is not None and not t.name.startswith("omniprof-"):
                self._threads[t.ident] = ThreadInfo(t.ident, t.name, getattr(t, "native_id", None))
