"""Backend ``memory``: allocation sampling, as Julia's ``Profile.Allocs``.

Engines:
    * ``"native"``: a small C extension (``_allocsampler``) hooks CPython's MEM and OBJ allocator
      domains. Every allocation is counted exactly (number and bytes); each is recorded with its
      size and Python stack with probability ``sample_rate`` (a geometric skip count, so the common
      path is one decrement). Frees of recorded pointers are tracked: the report knows which sampled
      allocations were still alive at the end (leak candidates).
    * ``"tracemalloc"``: the fallback when the extension was not built. tracemalloc traces every
      allocation (slower); at the end, the allocations still alive are kept, each with probability
      ``sample_rate``; peak and current traced memory are exact.

Each recorded allocation stands for ``1 / sample_rate`` allocations: ``Allocation.count`` is that
number rounded up or down at random (up with probability equal to the fraction), so it is an
integer and every estimate built from it is unbiased. The exact totals are in
``summaries["memory"]`` beside the estimate and its standard error under the sampling model
(each allocation recorded independently with probability ``p``: the variance of the estimated
bytes is ``sum(size**2) * (1 - p) / p**2`` over the recorded ones).

Allocations made by omniprof itself while the session runs (its own bookkeeping, other backends
stopping, saving the result) are left out: an allocation whose innermost frame outside the
standard library (and attrs-generated methods) is omniprof's is omniprof's. They are counted in
the summary. Under ``omniprof run`` (``BackendContext.launcher_codes``) stacks start at the target:
the launcher's frames and their callers are left out (the tracemalloc engine, which records file
and line only, keeps them).
"""

from __future__ import annotations

import math
import os
import random
import resource
import sys
import threading
import warnings
from typing import Any

import attrs

from omniprof.plugin import Backend, Capability
from omniprof.backends.cpu.stacks import StackCut, resolve_frame
from omniprof.core import validators as v
from omniprof.core.forks import on_fork_child
from omniprof.core.results import (Allocation, BackendResult, ClockInfo, CounterSeries, Frame, Loss, ThreadInfo,
                                   Track)
from omniprof.errors import BackendOptionWarning, DataLossWarning, InvalidArgumentError

__all__ = ["MemoryBackend", "MemoryOptions", "native_available"]


def _native() -> Any:
    try:
        from omniprof.backends.memory import _allocsampler
    except ImportError:
        return None
    return _allocsampler


def native_available() -> bool:
    return _native() is not None


@attrs.frozen(kw_only=True)
class MemoryOptions:
    """Options of the ``memory`` backend.

    Attributes:
        sample_rate: probability that an allocation is recorded with its stack (0 <= rate <= 1;
            Julia's ``sample_rate``). 1.0 records every allocation, 0.0 none (totals still counted).
            Default 0.01 rather than Julia's 0.1: the overhead target (<= 1.15x) holds at 0.01
            (see docs/backends/memory.md for both figures).
        max_allocations: most recorded allocations; the rest are counted as dropped.
        max_frames: deepest stack kept per allocation.
        engine: ``"auto"`` (native if built, else tracemalloc), ``"native"`` or ``"tracemalloc"``.
        seed: seed of the sampling choice (None: from the OS), for reproducible sampling.
        largest: how many of the largest allocations the ``largest_allocations`` table lists.
        record_all_above_bytes: allocations of at least this many bytes are all recorded (each
            stands for itself, ``count`` 1), the rest sampled at ``sample_rate``: two strata, so
            the estimate of bytes stays unbiased and no longer hinges on catching the few large
            blocks that weigh most (a list's growth, big buffers). 0: sample everything alike.
            Not applied with ``sample_rate=0`` (nothing is recorded) nor by the tracemalloc engine.
    """

    sample_rate: float = attrs.field(default=0.01, validator=v.number_in_range(0.0, 1.0))
    max_allocations: int = attrs.field(default=1_000_000, validator=v.int_in_range(1, 2**31 - 1))
    max_frames: int = attrs.field(default=128, validator=v.int_in_range(1, 4096))
    engine: str = attrs.field(default="auto", validator=v.one_of("auto", "native", "tracemalloc"))
    seed: int | None = attrs.field(default=None, validator=v.int_in_range(0, 2**63 - 1, optional=True))
    largest: int = attrs.field(default=20, validator=v.int_in_range(0, 10_000))
    record_all_above_bytes: int = attrs.field(default=65_536, validator=v.int_in_range(0, 2**63 - 1))


_DOMAINS = {0: "raw", 1: "mem", 2: "obj"}
MEMORY_TRACK = "memory"
_PKG = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
# Code that allocates for its caller: the standard library, frozen modules and the methods attrs
# generates (``<attrs generated methods ...>``, e.g. a result class's ``__init__``); the caller says whose it is.
_STDLIB = tuple({os.path.dirname(os.__file__) + os.sep, "<frozen ", "<attrs generated "})


def _count(rate: float, rng: random.Random) -> int:
    """How many allocations one recorded allocation stands for: 1/rate rounded up with probability
    equal to its fraction, else down -- an integer whose mean is exactly 1/rate."""
    if rate <= 0:
        return 0
    inv = 1.0 / rate
    lo = math.floor(inv)
    return lo + (1 if rng.random() < inv - lo else 0)


def _frame_file(rf: Any) -> str:
    if isinstance(rf, Frame):
        return rf.file or ""
    code = rf[0] if isinstance(rf, tuple) else rf
    return getattr(code, "co_filename", "") or ""


def _cut_launcher(stack: tuple[Any, ...], cut: StackCut) -> tuple[Any, ...]:
    """``stack`` (root first) without the launcher's frames and their callers: what runs below the
    innermost frame of ``cut`` (see :class:`~omniprof.backends.cpu.stacks.StackCut`)."""
    for i in range(len(stack) - 1, -1, -1):
        rf = stack[i]
        if cut.hit(rf[0] if isinstance(rf, tuple) else rf):
            return stack[i + 1:]
    return stack


def _is_own(stack: tuple[Any, ...], memo: dict[Any, bool]) -> bool:
    """True when the innermost frame outside the standard library is omniprof's (stack: root first)."""
    for rf in reversed(stack):
        f = _frame_file(rf)
        if f.startswith(_STDLIB):
            continue
        hit = memo.get(f)
        if hit is None:
            hit = memo[f] = f.startswith(_PKG)
        return hit
    return False


def _known_types() -> dict[int, str]:
    """{id(type): name} of every class alive now (all are subclasses of object): what a sampled
    object allocation may be."""
    out: dict[int, str] = {}
    todo = [object]
    while todo:
        t = todo.pop()
        if id(t) in out:
            continue
        out[id(t)] = getattr(t, "__qualname__", None) or t.__name__
        try:
            todo.extend(type.__subclasses__(t))
        except TypeError:
            pass
    return out


def _timeline(t0: int, t1: int, points: list[tuple[int, int, int]], allocations: list[Allocation],
              frees: list[tuple[int, int]]) -> list[CounterSeries]:
    """Counter tracks: exact allocated bytes and allocations so far (the sampler's running totals,
    at most one point a millisecond), and estimated live bytes (sampled allocations not yet freed,
    each standing for its count)."""
    if not points and not allocations:
        return []
    out = []
    if points:
        ts = [t0, *(p[0] for p in points)]
        out.append(CounterSeries("allocated_bytes", "bytes", MEMORY_TRACK, ts, [0, *(p[2] for p in points)]))
        out.append(CounterSeries("allocations", "count", MEMORY_TRACK, ts, [0, *(p[1] for p in points)]))
    events = sorted([(a.t_ns, a.size_bytes * a.count) for a in allocations] + [(t, -b) for t, b in frees])
    ts_live, live, cur, last = [t0], [0.0], 0, t0
    for t, delta in events:
        cur += delta
        if t - last >= 1_000_000 or t == events[-1][0]:  # one point a millisecond at most
            ts_live.append(max(t, last))
            live.append(cur)
            last = ts_live[-1]
    out.append(CounterSeries("live_bytes_est", "bytes", MEMORY_TRACK, ts_live, live))
    return out


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak * (1 if sys.platform == "darwin" else 1024)


class MemoryBackend(Backend):
    """Sampled allocations with their stacks (see module docs)."""

    name = "memory"
    summary = "allocation sampling with stacks (sample_rate), leak candidates, peak memory"
    single_session = True
    Options = MemoryOptions

    @classmethod
    def capabilities(cls) -> list[Capability]:
        native = native_available()
        return [
            Capability("allocation sampling, native engine (C allocator hooks)", native,
                       "built" if native else "the _allocsampler extension was not built: the tracemalloc engine "
                                              "is used (slower); reinstall omniprof with a C compiler available"),
            Capability("allocation sampling, tracemalloc engine", True, "always available"),
            Capability("heap snapshots (.heapsnapshot for Chrome DevTools)", True,
                       "omniprof.memory.take_heap_snapshot"),
        ]

    def __init__(self, options: MemoryOptions | None = None, *, context: Any = None) -> None:
        super().__init__(options, context=context)
        self.engine = ""
        self._t0 = 0
        self._rss0 = 0
        self._running = False

    def prepare(self) -> None:
        engine = self.options.engine
        if engine == "auto":
            engine = "native" if native_available() else "tracemalloc"
        if engine == "native" and not native_available():
            raise InvalidArgumentError(
                "backend 'memory': engine='native' needs the _allocsampler extension, which was not built "
                "(reinstall omniprof with a C compiler available), or use engine='tracemalloc'")
        if engine == "tracemalloc":
            import tracemalloc

            if tracemalloc.is_tracing():
                raise InvalidArgumentError("backend 'memory': tracemalloc is already tracing in this process; "
                                           "stop it first or use engine='native'")
            if self.options.engine == "auto":
                warnings.warn("backend 'memory': the native allocation sampler is not built; falling back to "
                              "tracemalloc, which traces every allocation (higher overhead)",
                              BackendOptionWarning, stacklevel=2)
        if self.context.profile_options.python_tracer_level:
            warnings.warn("backend 'memory' records allocation stacks only; python_tracer_level=1 has no effect "
                          "here (combine with backend 'cpu' for call tracing)", BackendOptionWarning, stacklevel=2)
        self.engine = engine

    def start(self) -> None:
        if not self.engine:
            self.prepare()
        seed = self.options.seed if self.options.seed is not None else random.SystemRandom().getrandbits(63) | 1
        self._seed = seed
        self._rss0 = _rss_bytes()
        self._start_thread_names()
        self._t0 = self.clock.now_ns()
        on_fork_child(self._forked)  # before sampling starts: its own allocations are not the program's
        if self.engine == "native":
            _native().start(float(self.options.sample_rate), self.options.max_allocations,
                            self.options.max_frames, seed, False, self.options.record_all_above_bytes)
        else:
            import tracemalloc

            tracemalloc.start(self.options.max_frames)
        self._running = True

    def _forked(self) -> None:
        """In a forked child: the hooks and records are the parent's session; drop them, so the
        child allocates as under plain python and may start a session of its own."""
        if not self._running:
            return
        self._running = False
        if self.engine == "native":
            _native().discard()
        else:
            import tracemalloc

            tracemalloc.stop()

    def stop_deferred(self) -> Any:
        """Take the allocator hooks off now (no allocation of the program's leftover threads is
        recorded past this point); the result is built by the returned function. The tracemalloc
        engine's snapshot is its stop: None, and the Profiler calls :meth:`stop`."""
        if self.engine != "native" or not self._running:
            return None
        self._halt_ns = self.clock.now_ns()
        _native().stop()
        return self.stop

    def stop(self) -> BackendResult:
        t1 = getattr(self, "_halt_ns", None) or self.clock.now_ns()
        self._halt_ns = None
        timeline: list[tuple[int, int, int]] = []
        if self.engine == "native":
            mod = _native()
            mod.stop()
            records, stats = mod.take(_known_types())
            raw = [(t, size, tid, bool(freed), tuple(reversed(stack)), tname or None, _DOMAINS.get(d), t_free, sure)
                   for t, size, tid, freed, d, stack, tname, t_free, sure in records]
            del records
            timeline = stats["timeline"]
            summary = {"engine": "native", "sample_rate": self.options.sample_rate,
                       "allocations": stats["allocations"], "allocated_bytes": stats["allocated_bytes"],
                       "sampled_allocations": stats["sampled"]}
            dropped = stats["dropped"]
        else:
            raw, summary, dropped = self._stop_tracemalloc(t1)
        self._running = False
        names = self._stop_thread_names()
        rate = self.options.sample_rate
        rng = random.Random(self._seed ^ 0x5DEECE66D)
        frames: list[Frame] = []
        frame_ids: dict[Any, int] = {}
        stack_ids: dict[tuple[int, ...], int] = {}
        stacks: list[tuple[int, ...]] = []
        allocations: list[Allocation] = []
        tids: set[int] = set()
        own_is: dict[Any, bool] = {}
        own_n = own_bytes = 0
        var_bytes = 0.0
        n_sampled = 0  # recorded by chance (not for their size)
        frees: list[tuple[int, int]] = []  # (t_free_ns, bytes it stood for)
        cut = StackCut(self.context.launcher_codes) if self.context.launcher_codes else None
        for t, size, tid, freed, stack, tname, domain, t_free, sure in raw:
            if cut is not None:
                stack = _cut_launcher(stack, cut)
            if _is_own(stack, own_is):
                own_n += 1
                own_bytes += size
                continue
            ids = []
            for rf in stack:
                fid = frame_ids.get(rf)
                if fid is None:
                    fid = frame_ids[rf] = len(frames)
                    frames.append(resolve_frame(rf) if not isinstance(rf, Frame) else rf)
                ids.append(fid)
            key = tuple(ids)
            sid = stack_ids.get(key)
            if sid is None:
                sid = stack_ids[key] = len(stacks)
                stacks.append(key)
            tids.add(tid)
            count = 1 if sure else _count(rate, rng)
            allocations.append(Allocation(t_ns=t, size_bytes=size, stack_id=sid, thread_id=tid,
                                          alive_at_end=not freed, count=count, type=tname, domain=domain))
            if rate > 0 and not sure:
                n_sampled += 1
                var_bytes += size * size * (1.0 - rate) / (rate * rate)
            if freed and t_free:
                frees.append((t_free, size * count))
        del raw
        est_bytes = sum(a.size_bytes * a.count for a in allocations)
        alive_est = sum(a.size_bytes * a.count for a in allocations if a.alive_at_end)
        summary.update(est_allocated_bytes=est_bytes, est_allocated_bytes_stderr=round(math.sqrt(var_bytes)),
                       est_allocations=sum(a.count for a in allocations),
                       est_allocations_stderr=round(math.sqrt(n_sampled * (1.0 - rate)) / rate) if rate else 0,
                       est_live_at_end_bytes=alive_est, own_allocations_sampled=own_n,
                       own_bytes_sampled=own_bytes, rss_bytes=_rss_bytes(),
                       rss_growth_bytes=_rss_bytes() - self._rss0, peak_rss_bytes=_peak_rss_bytes())
        losses = []
        if dropped:
            losses.append(Loss("memory", "allocations_dropped", dropped, "allocations",
                               f"allocation buffer full at {self.options.max_allocations}; raise max_allocations "
                               f"or lower sample_rate"))
            warnings.warn(f"backend 'memory': {dropped} sampled allocations were not recorded (buffer full at "
                          f"{self.options.max_allocations}); counted in the result", DataLossWarning, stacklevel=2)
        threads = [ThreadInfo(tid, *names.get(tid, (f"thread {tid}", None))) for tid in sorted(tids)]
        counters = _timeline(self._t0, t1, timeline, allocations, frees)
        from omniprof.backends.memory.report import allocation_tables

        tracks = [Track(f"thread:{t.thread_id}", t.name) for t in threads]
        if counters:
            tracks.append(Track(MEMORY_TRACK, "memory", kind="counter"))
        part = BackendResult(
            backend=self.name, clock=ClockInfo(name="perf_counter_ns"), start_ns=self._t0, end_ns=t1,
            tracks=tracks, frames=frames, stacks=stacks, counters=counters,
            threads=threads, allocations=allocations, losses=losses,
            summaries={"memory": summary}, metadata={"engine": self.engine, "seed": self._seed},
        )
        return attrs.evolve(part, tables=allocation_tables(part, largest=self.options.largest))

    # -- thread names: kept for threads that end before stop() -------------------------------
    def _start_thread_names(self) -> None:
        self._names = {t.ident: (t.name, t.native_id) for t in threading.enumerate() if t.ident is not None}
        self._prev_thread_profile = threading.getprofile()
        names, prev = self._names, self._prev_thread_profile

        def note_thread(frame: Any, event: str, arg: Any) -> Any:
            # Runs once, on the first call in each new thread: remember its name, then hand the
            # thread to the profile hook that was there before (or none).
            t = threading.current_thread()
            names[t.ident] = (t.name, t.native_id)
            sys.setprofile(prev)
            return prev(frame, event, arg) if prev is not None else None

        self._note_thread = note_thread
        threading.setprofile(note_thread)

    def _stop_thread_names(self) -> dict[int, tuple[str, int | None]]:
        if threading.getprofile() is getattr(self, "_note_thread", None):
            threading.setprofile(self._prev_thread_profile)  # type: ignore[arg-type]
        names = dict(getattr(self, "_names", {}))
        names.update({t.ident: (t.name, t.native_id) for t in threading.enumerate() if t.ident is not None})
        return names

    def _stop_tracemalloc(self, t1: int) -> tuple[list[Any], dict[str, Any], int]:
        import tracemalloc

        snap = tracemalloc.take_snapshot()
        current, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        rng = random.Random(self._seed)
        rate = self.options.sample_rate
        raw = []
        dropped = 0
        for tr in snap.traces:
            if rng.random() >= rate:
                continue
            if len(raw) >= self.options.max_allocations:
                dropped += 1
                continue
            # tracemalloc keeps file and line only: the site is named after them. Its traceback
            # iterates oldest frame first: root first, as our stacks are.
            stack = tuple(Frame(name=f"{os.path.basename(f.filename)}:{f.lineno}", file=f.filename, line=f.lineno)
                          for f in tr.traceback)
            raw.append((t1, tr.size, 0, False, stack, None, None, 0, False))
        summary = {"engine": "tracemalloc", "sample_rate": rate, "traced_current_bytes": current,
                   "traced_peak_bytes": peak, "sampled_allocations": len(raw)}
        return raw, summary, dropped

    def close(self) -> None:
        if self._running:
            if self.engine == "native":
                _native().stop()
                _native().take(None)
            else:
                import tracemalloc

                tracemalloc.stop()
            self._stop_thread_names()
            self._running = False

