"""``omniprof.memory``: allocation profiling in the shape of Julia's ``Profile.Allocs``.

>>> import omniprof
>>> with omniprof.memory.profile(sample_rate=1.0) as prof:
...     data = [bytearray(1000) for _ in range(10)]
>>> sum(a.size_bytes >= 1000 for a in prof.result.part("memory").allocations) >= 10
True

Sessions (:func:`profile`, or :func:`start` ... :func:`stop`) accumulate into one process-wide
buffer until :func:`clear`, as Julia's do; :func:`fetch` returns them as one result. The buffer
keeps at most :data:`MAX_KEPT_ALLOCATIONS` recorded allocations (set with :func:`init`): past
that, a session's further allocations are counted as a loss (with a ``DataLossWarning``) and kept
only in that session's own result.

.. versionadded:: 0.1
"""

from __future__ import annotations

import os
import platform
import socket
import threading
import warnings
from typing import IO, Any

from omniprof.backends.memory.heapsnapshot import assemble_snapshot, take_heap_snapshot
from omniprof.backends.memory.report import flat_rows, format_allocs, tree_rows
from omniprof.core.host import platform_string
from omniprof.core.results import Allocation, BackendResult, ClockInfo, Frame, Loss, ProfileResult, RunMetadata
from omniprof.errors import DataLossWarning, InvalidArgumentError, ProfilerStateError

__all__ = ["profile", "start", "stop", "fetch", "clear", "print", "init", "flat_rows", "tree_rows",
           "take_heap_snapshot", "assemble_snapshot", "MAX_KEPT_ALLOCATIONS"]

MAX_KEPT_ALLOCATIONS = 1_000_000
_lock = threading.Lock()


class _Kept:
    """The accumulated sessions: frames and stacks de-duplicated, allocations appended."""

    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self.frame_ids: dict[Frame, int] = {}
        self.stacks: list[tuple[int, ...]] = []
        self.stack_ids: dict[tuple[int, ...], int] = {}
        self.allocations: list[Allocation] = []
        self.threads: dict[int, Any] = {}
        self.totals: dict[str, int] = {}
        self.sessions = 0
        self.not_kept = 0
        self.start_ns = self.end_ns = 0
        self.rates: set[float] = set()
        self.var_bytes = 0.0

    def add(self, part: BackendResult, limit: int) -> int:
        fmap = []
        for f in part.frames:
            fid = self.frame_ids.get(f)
            if fid is None:
                fid = self.frame_ids[f] = len(self.frames)
                self.frames.append(f)
            fmap.append(fid)
        smap = []
        for st in part.stacks:
            key = tuple(fmap[i] for i in st)
            sid = self.stack_ids.get(key)
            if sid is None:
                sid = self.stack_ids[key] = len(self.stacks)
                self.stacks.append(key)
            smap.append(sid)
        room = max(0, limit - len(self.allocations))
        for a in part.allocations[:room]:
            self.allocations.append(Allocation(a.t_ns, a.size_bytes, smap[a.stack_id], a.thread_id, a.alive_at_end,
                                               a.count, a.type, a.domain))
        lost = max(0, len(part.allocations) - room)
        self.not_kept += lost
        for t in part.threads:
            self.threads[t.thread_id] = t
        s = part.summaries.get("memory", {})
        for k in ("allocations", "allocated_bytes", "sampled_allocations", "est_allocated_bytes"):
            if isinstance(s.get(k), int):
                self.totals[k] = self.totals.get(k, 0) + s[k]
        self.var_bytes += float(s.get("est_allocated_bytes_stderr", 0)) ** 2
        if "sample_rate" in s:
            self.rates.add(s["sample_rate"])
        self.start_ns = part.start_ns if not self.sessions else min(self.start_ns, part.start_ns)
        self.end_ns = max(self.end_ns, part.end_ns)
        self.sessions += 1
        return lost


_kept = _Kept()


def init(max_kept_allocations: int | None = None) -> int:
    """Set how many recorded allocations the process-wide buffer keeps across sessions (default
    1,000,000: about 100 MB with their stacks); returns the current limit."""
    global MAX_KEPT_ALLOCATIONS
    if max_kept_allocations is not None:
        if isinstance(max_kept_allocations, bool) or not isinstance(max_kept_allocations, int) \
                or max_kept_allocations < 0:
            raise InvalidArgumentError(f"'max_kept_allocations' must be an int >= 0 (got {max_kept_allocations!r})")
        MAX_KEPT_ALLOCATIONS = max_kept_allocations
    return MAX_KEPT_ALLOCATIONS


def profile(sample_rate: float = 0.01, **options: Any) -> Any:
    """A :class:`omniprof.Profiler` on the ``memory`` backend; use as a context manager or decorator
    (Julia's ``Allocs.@profile``). Its allocations are also added to the buffer :func:`fetch` reads.

    ``options`` are other ``memory`` backend options (``max_allocations``, ``engine``, ``seed``, ...).
    ``sample_rate``: 0.01 by default, not Julia's 0.1, for the overhead (docs/backends/memory.md).
    """
    from omniprof.core.profiler import Profiler

    return Profiler(backend="memory", backend_options={"memory": {"sample_rate": sample_rate, **options}},
                    on_result=_keep)


_running: list[Any] = []


def start(sample_rate: float = 0.01, **options: Any) -> None:
    """Start recording allocations (Julia's ``Allocs.start``); :func:`stop` ends it."""
    with _lock:
        if _running:
            raise ProfilerStateError("omniprof.memory is already recording; call omniprof.memory.stop() first")
        prof = profile(sample_rate, **options)
        prof.start()
        _running.append(prof)


def stop() -> ProfileResult:
    """Stop the recording :func:`start` began; returns that session's result (also kept for :func:`fetch`)."""
    with _lock:
        if not _running:
            raise ProfilerStateError("omniprof.memory is not recording; call omniprof.memory.start() first")
        prof = _running.pop()
    prof.stop()
    return prof.result


def _keep(result: ProfileResult) -> None:
    part = next((p for p in result.parts if p.backend == "memory"), None)
    if part is None:
        return
    with _lock:
        lost = _kept.add(part, MAX_KEPT_ALLOCATIONS)
    if lost:
        warnings.warn(f"omniprof.memory: the buffer keeps {MAX_KEPT_ALLOCATIONS} allocations across sessions "
                      f"(omniprof.memory.init(n) to change); {lost} of this session's were not kept for fetch() "
                      f"(they are in the session's own result); clear() empties it", DataLossWarning, stacklevel=3)


def fetch() -> ProfileResult:
    """Every allocation recorded since the last :func:`clear`, all sessions together, as one result
    (Julia's ``Allocs.fetch()``)."""
    with _lock:
        k = _kept
        if not k.sessions:
            raise ProfilerStateError("no allocation profile yet: run code under omniprof.memory.profile() "
                                     "(or start()/stop()) first")
        losses = []
        if k.not_kept:
            losses.append(Loss("memory", "allocations_not_kept", k.not_kept, "allocations",
                               f"the buffer keeps {MAX_KEPT_ALLOCATIONS} allocations across sessions; raise it "
                               f"with omniprof.memory.init(n)"))
        summary: dict[str, Any] = {"engine": "buffer", "sessions": k.sessions, **k.totals,
                                   "est_allocated_bytes_stderr": round(k.var_bytes ** 0.5),
                                   "sample_rate": next(iter(k.rates)) if len(k.rates) == 1 else None}
        part = BackendResult(backend="memory", clock=ClockInfo(name="perf_counter_ns"), start_ns=k.start_ns,
                             end_ns=k.end_ns, frames=tuple(k.frames), stacks=tuple(k.stacks),
                             threads=tuple(k.threads[t] for t in sorted(k.threads)),
                             allocations=tuple(k.allocations), losses=losses, summaries={"memory": summary},
                             metadata={"source": "omniprof.memory.fetch"})
    import attrs

    from omniprof.backends.memory.report import allocation_tables

    part = attrs.evolve(part, tables=allocation_tables(part))
    md = RunMetadata(host=socket.gethostname(), pid=os.getpid(), python=platform.python_version(),
                     platform=platform_string(), backends=("memory",), start_ns=part.start_ns, end_ns=part.end_ns)
    return ProfileResult(metadata=md, parts=(part,))


def clear() -> None:
    """Forget every kept allocation (Julia's ``Allocs.clear()``)."""
    global _kept
    with _lock:
        _kept = _Kept()


def print(*args: Any, file: IO[str] | None = None, by: str = "bytes", **options: Any) -> None:  # noqa: A001
    """Print an allocation profile as Julia's ``Allocs.print([io,] [data]; kwargs...)``.

    Arguments: an optional stream first, then an optional result (default :func:`fetch`); or
    ``file=``. Options are those of ``omniprof.cpu.print`` (``format``, ``C``, ``combine``,
    ``maxdepth``, ``sortedby``, ``groupby``, ``noisefloor``, ``mincount``, ``recur``, ``threads``,
    ``cols``); counts are recorded allocations, and ``by`` ("bytes" or "count") picks the weight
    the tree shows beside them (estimated bytes or estimated allocations).
    """
    rest = list(args)
    if rest and hasattr(rest[0], "write"):
        if file is not None:
            raise InvalidArgumentError("give the stream positionally or as file=, not both")
        file = rest.pop(0)
    if len(rest) > 1:
        raise InvalidArgumentError("omniprof.memory.print([io,] [data]; options...): too many arguments")
    data = rest[0] if rest else fetch()
    out = file if file is not None else __import__("sys").stdout
    if options.get("cols") is None:  # fitted to the terminal; 120 on a pipe or file
        from omniprof.analysis.render import terminal_width

        options["cols"] = terminal_width(out) or 120
    out.write("\n".join(format_allocs(data, by=by, **options)) + "\n")

