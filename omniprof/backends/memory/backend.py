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

Each recorded allocation stands for ``round(1 / sample_rate)`` allocations (``Allocation.count``),
so per-site estimates scale; the exact totals are in ``summaries["memory"]``.
"""

from __future__ import annotations

import os
import random
import resource
import sys
import threading
import time
import warnings
from typing import Any

import attrs

from omniprof.plugin import Backend, Capability
from omniprof.backends.cpu.stacks import resolve_frame
from omniprof.core import validators as v
from omniprof.core.results import Allocation, BackendResult, ClockInfo, Frame, Loss, ThreadInfo, Track
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
        sample_rate: probability that an allocation is recorded with its stack (0 < rate <= 1;
            Julia's ``sample_rate``). 1.0 records every allocation.
        max_allocations: most recorded allocations; the rest are counted as dropped.
        max_frames: deepest stack kept per allocation.
        engine: ``"auto"`` (native if built, else tracemalloc), ``"native"`` or ``"tracemalloc"``.
        seed: seed of the sampling choice (None: from the OS), for reproducible sampling.
        largest: how many of the largest allocations the ``largest_allocations`` table lists.
    """

    sample_rate: float = attrs.field(default=0.01, validator=v.number_in_range(0.0, 1.0, lo_open=True))
    max_allocations: int = attrs.field(default=1_000_000, validator=v.int_in_range(1, 2**31 - 1))
    max_frames: int = attrs.field(default=128, validator=v.int_in_range(1, 4096))
    engine: str = attrs.field(default="auto", validator=v.one_of("auto", "native", "tracemalloc"))
    seed: int | None = attrs.field(default=None, validator=v.int_in_range(0, 2**63 - 1, optional=True))
    largest: int = attrs.field(default=20, validator=v.int_in_range(0, 10_000))


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
            Capability("heap snapshots (.heapsnapshot for Chrome DevTools)", True, "omniprof.allocs.heap_snapshot"),
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
        self._t0 = self.clock.now_ns()
        if self.engine == "native":
            _native().start(float(self.options.sample_rate), self.options.max_allocations,
                            self.options.max_frames, seed, False)
        else:
            import tracemalloc

            tracemalloc.start(self.options.max_frames)
        self._running = True

    def stop(self) -> BackendResult:
        t1 = self.clock.now_ns()
        if self.engine == "native":
            mod = _native()
            mod.stop()
            records, stats = mod.take()
            raw = [(t, size, tid, bool(freed), tuple(reversed(stack))) for t, size, tid, freed, _d, stack in records]
            summary = {"engine": "native", "sample_rate": self.options.sample_rate,
                       "allocations": stats["allocations"], "allocated_bytes": stats["allocated_bytes"],
                       "sampled_allocations": stats["sampled"]}
            dropped = stats["dropped"]
        else:
            raw, summary, dropped = self._stop_tracemalloc(t1)
        self._running = False
        scale = max(1, round(1.0 / self.options.sample_rate))
        frames: list[Frame] = []
        frame_ids: dict[Any, int] = {}
        stack_ids: dict[tuple[int, ...], int] = {}
        stacks: list[tuple[int, ...]] = []
        allocations: list[Allocation] = []
        tids: set[int] = set()
        for t, size, tid, freed, stack in raw:
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
            allocations.append(Allocation(t_ns=t, size_bytes=size, stack_id=sid, thread_id=tid,
                                          alive_at_end=not freed, count=scale))
        alive_est = sum(a.size_bytes * a.count for a in allocations if a.alive_at_end)
        summary.update(est_live_at_end_bytes=alive_est, rss_bytes=_rss_bytes(),
                       rss_growth_bytes=_rss_bytes() - self._rss0, peak_rss_bytes=_peak_rss_bytes())
        losses = []
        if dropped:
            losses.append(Loss("memory", "allocations_dropped", dropped, "allocations",
                               f"allocation buffer full at {self.options.max_allocations}; raise max_allocations "
                               f"or lower sample_rate"))
            warnings.warn(f"backend 'memory': {dropped} sampled allocations were not recorded (buffer full at "
                          f"{self.options.max_allocations}); counted in the result", DataLossWarning, stacklevel=2)
        names = {t.ident: t for t in threading.enumerate()}
        threads = [ThreadInfo(tid, names[tid].name if tid in names else f"thread {tid}",
                              getattr(names.get(tid), "native_id", None)) for tid in sorted(tids)]
        from omniprof.backends.memory.report import allocation_tables

        part = BackendResult(
            backend=self.name, clock=ClockInfo(name="perf_counter_ns"), start_ns=self._t0, end_ns=t1,
            tracks=[Track(f"thread:{t.thread_id}", t.name) for t in threads], frames=frames, stacks=stacks,
            threads=threads, allocations=allocations, losses=losses,
            summaries={"memory": summary}, metadata={"engine": self.engine, "seed": self._seed},
        )
        import attrs as _attrs

        return _attrs.evolve(part, tables=allocation_tables(part, largest=self.options.largest))

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
            if rate < 1.0 and rng.random() >= rate:
                continue
            if len(raw) >= self.options.max_allocations:
                dropped += 1
                continue
            # tracemalloc keeps file and line only: the site is named after them.
            stack = tuple(Frame(name=f"{os.path.basename(f.filename)}:{f.lineno}", file=f.filename, line=f.lineno)
                          for f in reversed(tr.traceback))
            raw.append((t1, tr.size, 0, False, stack))
        summary = {"engine": "tracemalloc", "sample_rate": rate, "traced_current_bytes": current,
                   "traced_peak_bytes": peak, "sampled_allocations": len(raw)}
        return raw, summary, dropped

    def close(self) -> None:
        if self._running:
            if self.engine == "native":
                _native().stop()
                _native().take()
            else:
                import tracemalloc

                tracemalloc.stop()
            self._running = False


del time
