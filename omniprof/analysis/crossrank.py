"""Cross-rank analysis of a distributed run: where each rank's time went, and who held the others up.

Input: a merged distributed result, an omniprof distributed run directory (``rank<N>/`` parts), or
a directory of per-rank Kineto traces (what Holistic Trace Analysis takes: the rank from the
trace's ``distributedInfo.rank``, else from a ``rank<N>`` in the file name). Each rank is reduced
alone first to a small :class:`RankSummary` by a :class:`RankReducer` fed as the rank's spans stream
by (:func:`reduce_file` reads a Kineto trace in a stream, never whole), in worker processes here or
on a Dask cluster (:mod:`omniprof.analysis.executor`); only those summaries meet, folded into a
:class:`Combiner` as they arrive. A summary's size follows the rank's steps and collectives, not
its events nor the number of ranks: per step and per collective one row of int64 columns, and per
kernel/op name (at most :data:`MAX_DURATION_NAMES`, the rest summed into one counted sketch) a
:class:`~omniprof.analysis.sketch.DurationSketch` whose median and p90 are exact up to 1,024
distinct durations and within 1 % past that. Everything else is exact.

Per rank (:class:`RankSummary`), over its profiled steps (its ``step`` spans, from the framework's
``ProfilerStep#N`` markers where several backends mark steps; else from its first to its last
classified event):

* **Temporal breakdown.** GPU kernels when the rank has any (``source="gpu"``), else CPU ops
  (``source="cpu"``). Communication: spans named like a collective (NCCL/RCCL kernels,
  ``gloo:``/``nccl:`` annotations, ``c10d::`` ops, ``record_param_comms``); memory: memcpy and
  memset (GPU only); compute: every other kernel (GPU) or CPU op. Each class is the union of its
  intervals on all streams/threads. The four shares partition the window:
  ``compute_ns + exposed_communication_ns + exposed_memory_ns + idle_ns == window_ns``, where
  "exposed" is the time not hidden under compute (nor, for memory, under communication).
* **Overlap:** ``overlap_ns`` is communication time during compute; ``overlap_pct`` its share of
  all communication time.
* **Idle causes:** CPU: idle is host time outside any op (Python code, data loading, sleeps). GPU:
  a gap before a kernel whose launch (CUDA runtime call linked by a flow) began after the GPU went
  idle counts as waiting on the host; other gaps as waiting on synchronisation or dependencies.

Across ranks (:func:`combine`): collectives are matched by name and order of occurrence; in each,
a rank waited ``its duration - the shortest duration of that collective on any rank`` (the last
rank to arrive waits least; no clock alignment needed). A step's **own time** is its duration minus
that waiting. A rank is a **straggler** when, in at least half of the steps, its own time exceeds
the median rank's by more than ``threshold`` (20 %) and ``min_excess_ns`` (1 ms); the report names
it with its step times and its slowest ops in those steps.

.. versionadded:: 0.2
"""

from __future__ import annotations

import bisect
import os
from array import array
import re
import statistics
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import attrs

from omniprof.analysis.sketch import EXACT_VALUES, RELATIVE_ERROR, DurationSketch
from omniprof.core.results import BackendResult, ProfileResult, Span
from omniprof.core.validators import to_tuple
from omniprof.errors import InvalidArgumentError, TraceReadError

__all__ = [
    "RankSummary", "StepRow", "StepTable", "CollectiveTable", "Straggler", "CrossRankReport", "RankReducer",
    "reduce_rank", "reduce_file", "reduce_local", "iter_reduce_local", "Combiner", "WaitTable", "DurationSketch",
    "rank_inputs", "combine", "analyze",
    "analyze_result", "analyze_dir", "is_comm", "union", "COMM_PATTERN", "text_blocks", "load_kineto_dir",
    "DurationRow", "RankDurations", "duration_stats", "duration_rows",
]

#: names of communication spans (kernels, annotations, ops), matched case-insensitively.
COMM_PATTERN = re.compile(
    r"nccl|rccl|^gloo:|^c10d::|record_param_comms|all[-_]?reduce|all[-_]?gather|reduce[-_]?scatter|all[-_]?to[-_]?all|"
    r"^ncclDevKernel|sendrecv|broadcast_|^collective-permute", re.IGNORECASE)
_STEP_NUM = re.compile(r"(\d+)\s*$")
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
_DEVICE_CATS = frozenset({"kernel", "memcpy", "memset"})
_TOP_OPS = 5


def is_comm(name: str) -> bool:
    """Whether a span name is a collective or point-to-point communication."""
    return COMM_PATTERN.search(name) is not None


# -- interval arithmetic ----------------------------------------------------------------------------
Intervals = list[tuple[int, int]]


def union(intervals: Iterable[tuple[int, int]]) -> Intervals:
    """Sorted, disjoint union of half-open intervals ``(start, end)``; empty ones dropped."""
    out: Intervals = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


class _Iv:
    """Sorted, disjoint half-open intervals as two int64 columns (16 bytes an interval, not a tuple
    of two ints: what a rank's reduction holds of its busy time at its peak)."""

    __slots__ = ("s", "e")

    def __init__(self, s: array[int] | None = None, e: array[int] | None = None) -> None:
        self.s = s if s is not None else array("q")
        self.e = e if e is not None else array("q")

    def __len__(self) -> int:
        return len(self.s)

    def length(self) -> int:
        return sum(self.e) - sum(self.s)

    def pairs(self) -> Intervals:
        return list(zip(self.s, self.e))


def _iv_of(starts: array[int], ends: array[int]) -> _Iv:
    """The union of (unsorted, possibly overlapping, non-empty) intervals."""
    out = _Iv()
    os_, oe = out.s, out.e
    for i in sorted(range(len(starts)), key=starts.__getitem__):
        a, b = starts[i], ends[i]
        if oe and a <= oe[-1]:
            if b > oe[-1]:
                oe[-1] = b
        else:
            os_.append(a)
            oe.append(b)
    return out


def _iv_union(x: _Iv, y: _Iv) -> _Iv:
    """The union of two sorted disjoint sets, in one merge pass."""
    out = _Iv()
    os_, oe = out.s, out.e
    xs, xe, ys, ye = x.s, x.e, y.s, y.e
    i = j = 0
    nx, ny = len(xs), len(ys)
    while i < nx or j < ny:
        if j >= ny or (i < nx and xs[i] <= ys[j]):
            a, b = xs[i], xe[i]
            i += 1
        else:
            a, b = ys[j], ye[j]
            j += 1
        if oe and a <= oe[-1]:
            if b > oe[-1]:
                oe[-1] = b
        else:
            os_.append(a)
            oe.append(b)
    return out


def _iv_overlap(x: _Iv, y: _Iv) -> int:
    """Length of the intersection of two sorted disjoint sets (nothing built)."""
    xs, xe, ys, ye = x.s, x.e, y.s, y.e
    i = j = total = 0
    nx, ny = len(xs), len(ys)
    while i < nx and j < ny:
        a = xs[i] if xs[i] > ys[j] else ys[j]
        b = xe[i] if xe[i] < ye[j] else ye[j]
        if a < b:
            total += b - a
        if xe[i] < ye[j]:
            i += 1
        else:
            j += 1
    return total


def _iv_clip(u: _Iv, lo: int, hi: int) -> _Iv:
    if hi <= lo:
        return _Iv()
    if not u.s or (u.s[0] >= lo and u.e[-1] <= hi):
        return u  # all inside already: no copy
    i = max(0, bisect.bisect_right(u.s, lo) - 1)
    out = _Iv()
    while i < len(u.s) and u.s[i] < hi:
        a, b = max(u.s[i], lo), min(u.e[i], hi)
        if a < b:
            out.s.append(a)
            out.e.append(b)
        i += 1
    return out


class _Within:
    """Length of a sorted disjoint union inside a window, found by bisection (per-step figures
    cost O(log n + intervals in the step), not a pass over the whole union per step)."""

    __slots__ = ("u",)

    def __init__(self, u: _Iv) -> None:
        self.u = u

    def length(self, lo: int, hi: int) -> int:
        s, e = self.u.s, self.u.e
        i = max(0, bisect.bisect_right(s, lo) - 1)
        total = 0
        while i < len(s) and s[i] < hi:
            a, b = s[i], e[i]
            if b > lo:
                total += min(b, hi) - max(a, lo)
            i += 1
        return total


# -- per-rank reduction -----------------------------------------------------------------------------
@attrs.frozen
class StepRow:
    """One step on one rank: ``step`` number, ``start_ns`` (rank 0's clock where offsets are known),
    ``dur_ns``, ``compute_ns``/``communication_ns``/``idle_ns`` inside it, and its ``top_ops``
    (``(name, total_ns)``, communication excluded, longest first)."""

    step: int
    start_ns: int
    dur_ns: int
    compute_ns: int
    communication_ns: int
    idle_ns: int
    top_ops: tuple[tuple[str, int], ...] = attrs.field(default=(), converter=lambda x: tuple(tuple(r) for r in x))


def _q(values: Iterable[int] = ()) -> array[int]:
    return array("q", values)


@attrs.frozen
class StepTable:
    """A rank's steps column by column (8 bytes a figure, not a Python object a row): a sequence of
    :class:`StepRow` (each row built when asked for). ``top_*``: each step's top ops, rows
    ``top_at[i]:top_at[i + 1]`` of ``top_name`` (index into ``names``) and ``top_ns``."""

    step: array[int] = attrs.field(factory=_q)
    start_ns: array[int] = attrs.field(factory=_q)
    dur_ns: array[int] = attrs.field(factory=_q)
    compute_ns: array[int] = attrs.field(factory=_q)
    communication_ns: array[int] = attrs.field(factory=_q)
    idle_ns: array[int] = attrs.field(factory=_q)
    top_at: array[int] = attrs.field(factory=lambda: array("q", [0]))
    top_name: array[int] = attrs.field(factory=_q)
    top_ns: array[int] = attrs.field(factory=_q)
    names: tuple[str, ...] = ()

    @classmethod
    def of(cls, rows: Iterable[StepRow]) -> StepTable:
        t = cls()
        ids: dict[str, int] = {}
        names: list[str] = []
        for r in rows:
            t.step.append(r.step)
            t.start_ns.append(r.start_ns)
            t.dur_ns.append(r.dur_ns)
            t.compute_ns.append(r.compute_ns)
            t.communication_ns.append(r.communication_ns)
            t.idle_ns.append(r.idle_ns)
            for name, ns in r.top_ops:
                i = ids.get(name)
                if i is None:
                    i = ids[name] = len(names)
                    names.append(name)
                t.top_name.append(i)
                t.top_ns.append(ns)
            t.top_at.append(len(t.top_ns))
        return attrs.evolve(t, names=tuple(names))

    def __len__(self) -> int:
        return len(self.step)

    def __getitem__(self, i: int) -> StepRow:
        if not -len(self.step) <= i < len(self.step):
            raise IndexError(f"step row {i} of {len(self.step)}")
        i %= len(self.step)
        tops = tuple((self.names[self.top_name[k]], self.top_ns[k]) for k in range(self.top_at[i], self.top_at[i + 1]))
        return StepRow(self.step[i], self.start_ns[i], self.dur_ns[i], self.compute_ns[i], self.communication_ns[i],
                       self.idle_ns[i], tops)

    def __iter__(self) -> Iterator[StepRow]:
        return (self[i] for i in range(len(self.step)))


@attrs.frozen
class CollectiveTable:
    """A rank's collectives column by column: a sequence of ``(name, start_ns, dur_ns)`` in start
    order; ``name`` indexes ``names``."""

    name: array[int] = attrs.field(factory=_q)
    start_ns: array[int] = attrs.field(factory=_q)
    dur_ns: array[int] = attrs.field(factory=_q)
    names: tuple[str, ...] = ()

    @classmethod
    def of(cls, rows: Iterable[tuple[str, int, int]]) -> CollectiveTable:
        t = cls()
        ids: dict[str, int] = {}
        for name, a, d in rows:
            i = ids.setdefault(name, len(ids))
            t.name.append(i)
            t.start_ns.append(a)
            t.dur_ns.append(d)
        return attrs.evolve(t, names=tuple(ids))

    def __len__(self) -> int:
        return len(self.name)

    def __getitem__(self, i: int) -> tuple[str, int, int]:
        return (self.names[self.name[i]], self.start_ns[i], self.dur_ns[i])

    def __iter__(self) -> Iterator[tuple[str, int, int]]:
        names = self.names
        return ((names[n], a, d) for n, a, d in zip(self.name, self.start_ns, self.dur_ns))


def _step_table(x: Iterable[StepRow]) -> StepTable:
    return x if isinstance(x, StepTable) else StepTable.of(x)


def _collective_table(x: Iterable[tuple[str, int, int]]) -> CollectiveTable:
    return x if isinstance(x, CollectiveTable) else CollectiveTable.of(x)


@attrs.frozen
class RankSummary:
    """One rank reduced: see the module docs for every figure's meaning. Its size follows the rank's
    steps and collectives, not its events nor the number of ranks: ``steps`` holds one row per step
    (8 bytes a figure), ``collectives`` one ``(name, start_ns, dur_ns)`` per communication span (20
    bytes each) in start order (the primary kind only: GPU communication kernels, else
    ``gloo:``/``nccl:`` spans, else any), ``durations`` bounded sketches. ``read_notes``: what
    reading the rank lost (malformed events, unread phases, samples its backends dropped), one line
    each; the report lists them."""

    rank: int
    host: str
    source: str
    window_ns: int
    compute_ns: int
    communication_ns: int
    memory_ns: int
    overlap_ns: int
    exposed_communication_ns: int
    exposed_memory_ns: int
    idle_ns: int
    idle_causes: dict[str, int]
    steps: StepTable = attrs.field(converter=_step_table)
    collectives: CollectiveTable = attrs.field(converter=_collective_table)
    clock_offset_ns: int = 0
    clock_uncertainty_ns: int = 0
    label: str = ""
    #: name -> :class:`~omniprof.analysis.sketch.DurationSketch` of every kernel (GPU ranks: compute,
    #: communication, memcpy/memset) or op (CPU ranks: CPU and XLA ops, communication spans) the
    #: breakdown classified, over the whole trace: at most :data:`MAX_DURATION_NAMES` names, those
    #: with the most total time.
    durations: dict[str, DurationSketch] = attrs.field(factory=dict)
    #: how many names past :data:`MAX_DURATION_NAMES` (those with the least total time) are summed
    #: into ``durations_other`` (one sketch of all their runs) instead.
    durations_left_out: int = 0
    durations_other: DurationSketch | None = None
    read_notes: tuple[str, ...] = attrs.field(default=(), converter=to_tuple)

    @property
    def overlap_pct(self) -> float:
        return 100.0 * self.overlap_ns / self.communication_ns if self.communication_ns else 0.0

    def pct(self, value_ns: int) -> float:
        return 100.0 * value_ns / self.window_ns if self.window_ns else 0.0


_CHUNK = 1 << 16  # intervals buffered before they are merged into the union so far
_LAUNCH_CATS = frozenset({"runtime", "cuda_runtime", "cuda_driver", "cpu_op"})
#: spans whose ``correlation_id`` links a host launch to device work (the Kineto reader's launch flows)
_LINKED_CATS = frozenset({"runtime", "kernel", "memcpy", "memset", "sync"})


class _Union:
    """A union of intervals built as they stream in (any order): a buffer of two int64 columns,
    merged every ``_CHUNK`` intervals, so memory follows the number of disjoint busy stretches, not
    of events. ``lo``/``hi``: the first start and last end of every interval added, empty ones
    included."""

    __slots__ = ("merged", "bs", "be", "lo", "hi")

    def __init__(self) -> None:
        self.merged = _Iv()
        self.bs = array("q")
        self.be = array("q")
        self.lo: int | None = None
        self.hi: int | None = None

    def add(self, a: int, b: int) -> None:
        if self.lo is None or a < self.lo:
            self.lo = a
        if self.hi is None or b > self.hi:
            self.hi = b
        if b > a:
            self.bs.append(a)
            self.be.append(b)
            if len(self.bs) >= _CHUNK:
                self._flush()

    def _flush(self) -> None:
        self.merged = _iv_union(self.merged, _iv_of(self.bs, self.be))
        self.bs = array("q")
        self.be = array("q")

    def result(self) -> _Iv:
        if self.bs:
            self._flush()
        return self.merged


class _Ops:
    """Op (or kernel) times and names, compactly: three arrays and an interned name table."""

    __slots__ = ("start", "dur", "name", "names", "ids")

    def __init__(self) -> None:
        self.start = array("q")
        self.dur = array("q")
        self.name = array("l")
        self.names: list[str] = []
        self.ids: dict[str, int] = {}

    def add(self, a: int, d: int, name: str) -> None:
        i = self.ids.get(name)
        if i is None:
            i = self.ids[name] = len(self.names)
            self.names.append(name)
        self.start.append(a)
        self.dur.append(d)
        self.name.append(i)


class RankReducer:
    """One rank reduced as its spans stream by, in any order, keeping only compact tables: the
    union of each class's intervals, op start/duration/name arrays, kernel launch links, the
    collectives and the step marks. :func:`reduce_rank` (parts in memory) and :func:`reduce_file`
    (a trace read in a stream) both feed one.

    .. versionadded:: 0.2
    """

    def __init__(self, clock_offset_ns: int = 0) -> None:
        self.clock_offset_ns = clock_offset_ns
        self.has_gpu = False
        # GPU view (device spans), kept from the start
        self.g_comp, self.g_comm, self.g_mem = _Union(), _Union(), _Union()
        self.g_ops = _Ops()
        self.g_memops = _Ops()  # memcpy/memset durations by name, for the duration distribution
        self.g_coll: list[tuple[int, int, int, str]] = []
        self.k_start = array("q")   # device work with a launch link: its start, one row per flow id
        self.k_flow = array("q")
        self.f_id = array("q")      # host launch times per flow id
        self.f_time = array("q")
        # CPU view, dropped once a device span shows the rank is a GPU rank
        self.c_comp: _Union | None = _Union()
        self.c_comm: _Union | None = _Union()
        self.c_ops: _Ops | None = _Ops()
        self.c_coll: list[tuple[int, int, int, str]] | None = []
        self.steps: list[list[tuple[str, int, int, Any]]] = []  # per part: (name, start, end, step_num arg)
        self.bounds: list[tuple[int, int]] = []

    def begin_part(self, start_ns: int = 0, end_ns: int = 0, offset_ns: int = 0) -> None:
        """A new part (backend) of the rank starts: its step marks are kept apart from the others'."""
        self.steps.append([])
        if start_ns or end_ns:
            off = offset_ns + self.clock_offset_ns
            self.bounds.append((start_ns + off, end_ns + off))

    def add(self, name: str, category: str, start_ns: int, dur_ns: int, flow_ids: Sequence[int] = (),
            offset_ns: int = 0, step_num: Any = None) -> None:
        a = start_ns + offset_ns + self.clock_offset_ns
        b = a + dur_ns
        if category == "step":
            if not self.steps:
                self.steps.append([])
            self.steps[-1].append((name, a, b, step_num))
            return
        if category in _DEVICE_CATS:
            if not self.has_gpu:
                self.has_gpu = True
                self.c_comp = self.c_comm = self.c_ops = self.c_coll = None
            if category == "kernel" and is_comm(name):
                self.g_comm.add(a, b)
                self.g_coll.append((0, a, dur_ns, name))
                return
            if category == "kernel":
                self.g_comp.add(a, b)
                self.g_ops.add(a, dur_ns, name)
            else:
                self.g_mem.add(a, b)
                self.g_memops.add(a, dur_ns, name)
            for f in flow_ids:
                self.k_start.append(a)
                self.k_flow.append(f)
            return
        if flow_ids and category in _LAUNCH_CATS:
            for f in flow_ids:
                self.f_id.append(f)
                self.f_time.append(a)
        if self.has_gpu:
            return
        assert self.c_comp is not None and self.c_comm is not None and self.c_ops is not None and self.c_coll is not None
        if is_comm(name) and category != "runtime":  # not XLA's runtime marks ("end: all-reduce")
            self.c_comm.add(a, b)
            low = name.lower()
            self.c_coll.append((1 if category == "xla_op" or low.startswith(("gloo:", "nccl:")) else 2, a, dur_ns, name))
        elif category in ("cpu_op", "xla_op"):
            self.c_comp.add(a, b)
            self.c_ops.add(a, dur_ns, name)

    def add_span(self, s: Span, offset_ns: int = 0) -> None:
        num = s.args.get("step_num") if s.category == "step" else None
        self.add(s.name, s.category, s.start_ns, s.dur_ns, s.flow_ids, offset_ns, num)

    def _step_marks(self) -> dict[int, tuple[int, int]]:
        # Several backends mark the same steps (torch's ``ProfilerStep#N``, the cpu backend's ``step N``,
        # whose last step runs on until the session stops): the framework's own markers win, else the
        # first part's.
        best: list[tuple[str, int, int, Any]] = []
        for marks in self.steps:
            if marks and (not best or (marks[0][0].startswith("ProfilerStep#")
                                       and not best[0][0].startswith("ProfilerStep#"))):
                best = marks
        out: dict[int, tuple[int, int]] = {}
        for i, (name, a, b, num) in enumerate(best):
            if not isinstance(num, int):
                m = _STEP_NUM.search(name)
                num = int(m.group(1)) if m else i
            old = out.get(num)
            out[num] = (min(a, old[0]), max(b, old[1])) if old else (a, b)
        return out

    def finish(self, *, rank: int, host: str = "", clock_uncertainty_ns: int = 0, label: str = "") -> RankSummary:
        if self.has_gpu:
            comp, comm, mem, ops, coll = self.g_comp, self.g_comm, self.g_mem, self.g_ops, self.g_coll
            memops = self.g_memops
        else:
            assert self.c_comp is not None and self.c_comm is not None and self.c_ops is not None and self.c_coll is not None
            comp, comm, mem, ops, coll = self.c_comp, self.c_comm, _Union(), self.c_ops, self.c_coll
            memops = _Ops()
        steps = sorted(((num, a, b) for num, (a, b) in self._step_marks().items()), key=lambda x: x[1])
        los = [u.lo for u in (comp, comm, mem) if u.lo is not None]
        his = [u.hi for u in (comp, comm, mem) if u.hi is not None]
        if steps:
            lo, hi = steps[0][1], max(b for _, _, b in steps)
        elif los:  # as HTA: from the first to the last classified event (device events on a GPU rank)
            lo, hi = min(los), max(his)
        elif self.bounds:
            lo, hi = min(a for a, _ in self.bounds), max(b for _, b in self.bounds)
        else:
            lo = hi = 0
        window = max(0, hi - lo)
        C = _iv_clip(comp.result(), lo, hi)
        M = _iv_clip(comm.result(), lo, hi)
        X = _iv_clip(mem.result(), lo, hi)
        CM = _iv_union(C, M)
        busy = _iv_union(CM, X)
        idle = window - busy.length()
        causes = self._gpu_idle_causes(busy, lo, hi) if self.has_gpu else {"host outside ops": idle}
        best = min((c[0] for c in coll), default=0)
        collectives = CollectiveTable.of((name, a, d) for pr, a, d, name in sorted(coll, key=lambda c: c[1])
                                         if pr == best)
        table = StepTable()
        top_ids: dict[str, int] = {}
        c_at, m_at, busy_at = _Within(C), _Within(M), _Within(busy)
        for (num, a, b), top in zip(steps, _top_ops_by_step(ops, steps)):
            table.step.append(num)
            table.start_ns.append(a)
            table.dur_ns.append(b - a)
            table.compute_ns.append(c_at.length(a, b))
            table.communication_ns.append(m_at.length(a, b))
            table.idle_ns.append((b - a) - busy_at.length(a, b))
            for name, ns in top:
                table.top_name.append(top_ids.setdefault(name, len(top_ids)))
                table.top_ns.append(ns)
            table.top_at.append(len(table.top_ns))
        table = attrs.evolve(table, names=tuple(top_ids))
        durations, left_out, other = _duration_sketches(ops, memops, coll)
        overlap = _iv_overlap(M, C)
        return RankSummary(rank=rank, host=host, source="gpu" if self.has_gpu else "cpu", window_ns=window,
                           compute_ns=C.length(), communication_ns=M.length(), memory_ns=X.length(),
                           overlap_ns=overlap, exposed_communication_ns=M.length() - overlap,
                           exposed_memory_ns=X.length() - _iv_overlap(X, CM), idle_ns=idle, idle_causes=causes,
                           steps=table, collectives=collectives, clock_offset_ns=self.clock_offset_ns,
                           clock_uncertainty_ns=clock_uncertainty_ns, label=label, durations=durations,
                           durations_left_out=left_out, durations_other=other)

    def _gpu_idle_causes(self, busy: _Iv, lo: int, hi: int) -> dict[str, int]:
        """Split each idle gap of the device by what ended it: the next kernel's launch on the host."""
        out = {"waiting on host launch": 0, "waiting on sync/dependency": 0, "before first / after last kernel": 0}
        if not busy:
            out["before first / after last kernel"] = hi - lo
            return out
        bs, be = busy.s, busy.e
        out["before first / after last kernel"] = max(0, bs[0] - lo) + max(0, hi - be[-1])
        nb = len(bs)
        # Only the launch links of work that starts a busy stretch (after the first) matter: those
        # (flow, stretch) pairs, joined with the host launches by flow id after sorting both by flow
        # (columns and index lists: no dict or set per kernel).
        wf, wi = array("q"), array("q")
        for a, f in zip(self.k_start, self.k_flow):
            i = bisect.bisect_left(bs, a)
            if 0 < i < nb and bs[i] == a:
                wf.append(f)
                wi.append(i)
        launch = array("q", bytes(8 * nb))  # per stretch: the latest launch at or before its start
        has = bytearray(nb)
        if wf:
            fid, ftime = self.f_id, self.f_time
            w_order = sorted(range(len(wf)), key=wf.__getitem__)
            l_order = sorted(range(len(fid)), key=fid.__getitem__)
            j = 0
            k = 0
            while k < len(w_order):
                f = wf[w_order[k]]
                k1 = k
                while k1 < len(w_order) and wf[w_order[k1]] == f:
                    k1 += 1
                while j < len(l_order) and fid[l_order[j]] < f:
                    j += 1
                j1 = j
                while j1 < len(l_order) and fid[l_order[j1]] == f:
                    j1 += 1
                times = sorted(ftime[l_order[x]] for x in range(j, j1))
                for x in range(k, k1):
                    i = wi[w_order[x]]
                    p = bisect.bisect_right(times, bs[i])
                    if p:
                        t = times[p - 1]
                        if not has[i] or t > launch[i]:
                            launch[i] = t
                            has[i] = 1
                k, j = k1, j1
            del w_order, l_order
        for i in range(1, nb):
            g0, g1 = be[i - 1], bs[i]
            gap = g1 - g0
            host = min(gap, launch[i] - g0) if has[i] and launch[i] > g0 else 0
            out["waiting on host launch"] += host
            out["waiting on sync/dependency"] += gap - host
        return out


def _top_ops_by_step(ops: _Ops, steps: list[tuple[int, int, int]]) -> list[tuple[tuple[str, int], ...]]:
    """Per step (sorted by start), its ``_TOP_OPS`` longest ops by total time: every op whose start
    lies in ``[start, end)`` of the step, summed by name, longest first (ties by name)."""
    starts = [a for _, a, _ in steps]
    reach = []  # the furthest end of any step up to this one: steps that may hold an op
    far = None
    for _, _, b in steps:
        far = b if far is None or b > far else far
        reach.append(far)
    tops: list[dict[int, int]] = [{} for _ in steps]
    for a, d, n in zip(ops.start, ops.dur, ops.name):
        i = bisect.bisect_right(starts, a) - 1
        while i >= 0 and reach[i] > a:
            if a < steps[i][2]:
                top = tops[i]
                top[n] = top.get(n, 0) + d
            i -= 1
    return [tuple(sorted(((ops.names[n], v) for n, v in top.items()), key=lambda kv: (-kv[1], kv[0]))[:_TOP_OPS])
            for top in tops]


def _duration_sketches(ops: _Ops, memops: _Ops, coll: list[tuple[int, int, int, str]]
                       ) -> tuple[dict[str, DurationSketch], int, DurationSketch | None]:
    """Each name's durations as a sketch; past :data:`MAX_DURATION_NAMES` names, those with the
    least total time summed into one sketch (with how many they were)."""
    per_name: dict[str, array[int]] = {}
    for o in (ops, memops):
        by_id: dict[int, array[int]] = {}
        for d, n in zip(o.dur, o.name):
            got = by_id.get(n)
            if got is None:
                got = by_id[n] = per_name.setdefault(o.names[n], array("q"))
            got.append(d)
    for _, _, d, name in coll:
        per_name.setdefault(name, array("q")).append(d)
    sketches = {}
    while per_name:
        name, ds = per_name.popitem()
        sketches[name] = DurationSketch.of(ds)
    if len(sketches) <= MAX_DURATION_NAMES:
        return sketches, 0, None
    order = sorted(sketches, key=lambda n: (-sketches[n].total_ns, n))
    other = DurationSketch.of(())
    for name in order[MAX_DURATION_NAMES:]:
        other = other.merge(sketches.pop(name))
    return sketches, len(order) - MAX_DURATION_NAMES, other


def reduce_rank(parts: Sequence[BackendResult], *, rank: int, host: str = "", clock_offset_ns: int = 0,
                clock_uncertainty_ns: int = 0, label: str = "") -> RankSummary:
    """Reduce one rank's parts (all on the same host clock after each part's offset) to a summary.

    Times in the summary are shifted by ``clock_offset_ns`` (the rank's offset to rank 0).
    """
    red = RankReducer(clock_offset_ns)
    for p in parts:
        red.begin_part(p.start_ns, p.end_ns, p.clock.offset_ns)
        off = p.clock.offset_ns
        for s in p.spans:
            red.add_span(s, off)
    return red.finish(rank=rank, host=host, clock_uncertainty_ns=clock_uncertainty_ns, label=label)


# -- across ranks -----------------------------------------------------------------------------------
@attrs.frozen
class Straggler:
    """A rank slower than the median rank in ``slow_steps`` (of ``steps`` compared).

    ``own_ns`` and ``median_own_ns``: ``{step: ns}`` of this rank's own time (step minus waiting on
    peers) and the median rank's; ``step_ns``: its step durations; ``others_wait_ns``: time the
    other ranks spent waiting in collectives during those steps; ``top_ops``: its slowest ops over
    those steps (``(name, total_ns)``), and ``outside_ops_ns`` its host time outside any op there.
    """

    rank: int
    slow_steps: tuple[int, ...]
    steps: int
    own_ns: dict[int, int]
    median_own_ns: dict[int, int]
    step_ns: dict[int, int]
    others_wait_ns: int
    top_ops: tuple[tuple[str, int], ...]
    outside_ops_ns: int


@attrs.frozen
class CrossRankReport:
    """Every rank's summary, per-step per-rank waiting, and the stragglers found.

    ``wait_ns[(rank, step)]``: time the rank waited in collectives for slower peers during the step.
    ``notes``: what could not be matched (unequal collective counts, missing ranks), never silent.
    """

    ranks: tuple[RankSummary, ...]
    wait_ns: Mapping[tuple[int, int], int]
    stragglers: tuple[Straggler, ...]
    notes: tuple[str, ...] = ()

    def rank(self, rank: int) -> RankSummary:
        for r in self.ranks:
            if r.rank == rank:
                return r
        raise KeyError(f"no rank {rank} (ranks: {[r.rank for r in self.ranks]})")

    def breakdown_rows(self) -> list[dict[str, Any]]:
        """One row per rank: the temporal breakdown in ns and % of the window."""
        rows = []
        for r in self.ranks:
            rows.append({"rank": r.rank, "host": r.host, "source": r.source, "window_ns": r.window_ns,
                         "compute_ns": r.compute_ns, "exposed_communication_ns": r.exposed_communication_ns,
                         "exposed_memory_ns": r.exposed_memory_ns, "idle_ns": r.idle_ns,
                         "compute_pct": r.pct(r.compute_ns),
                         "exposed_communication_pct": r.pct(r.exposed_communication_ns),
                         "exposed_memory_pct": r.pct(r.exposed_memory_ns), "idle_pct": r.pct(r.idle_ns),
                         "communication_ns": r.communication_ns, "overlap_ns": r.overlap_ns,
                         "overlap_pct": r.overlap_pct, "clock_offset_ns": r.clock_offset_ns,
                         "clock_uncertainty_ns": r.clock_uncertainty_ns})
        return rows

    def step_rows(self) -> list[dict[str, Any]]:
        """One row per (step, rank): duration, waiting on peers, own time."""
        rows = []
        wait = self.wait_ns
        for r in self.ranks:
            t = r.steps
            ws = wait.column(r.rank) if isinstance(wait, WaitTable) else [wait.get((r.rank, st), 0) for st in t.step]
            for st, d, w, c, m, i in zip(t.step, t.dur_ns, ws, t.compute_ns, t.communication_ns, t.idle_ns):
                rows.append({"step": st, "rank": r.rank, "dur_ns": d, "wait_ns": w, "own_ns": d - w, "compute_ns": c,
                             "communication_ns": m, "idle_ns": i})
        rows.sort(key=lambda x: (x["step"], x["rank"]))
        return rows

    def to_text(self) -> str:
        return _format(self)

    def durations(self, top: int | None = None) -> list[DurationRow]:
        """Each kernel's (GPU ranks) or op's (CPU ranks) duration distribution across ranks, the
        kernels with the most total time (all ranks) first; ``top`` keeps that many."""
        return duration_rows(self.ranks, top)


class WaitTable(Mapping[tuple[int, int], int]):
    """``{(rank, step): ns}`` waited in collectives for slower peers, held as one array per rank
    aligned with its :class:`StepTable` (a key exists where a compared collective fell in the step)."""

    def __init__(self, per_rank: dict[int, tuple[array[int], array[int], bytearray]]) -> None:
        self._cols = per_rank  # rank -> (step numbers, wait per step, whether the step holds a compared collective)
        self._index: dict[int, dict[int, int]] = {}

    def column(self, rank: int) -> array[int]:
        """The rank's waiting per step, in its steps' order."""
        return self._cols[rank][1]

    def __getitem__(self, key: tuple[int, int]) -> int:
        rank, step = key
        cols = self._cols.get(rank)
        if cols is None:
            raise KeyError(key)
        idx = self._index.get(rank)
        if idx is None:
            idx = self._index[rank] = {st: i for i, st in enumerate(cols[0])}
        i = idx.get(step)
        if i is None or not cols[2][i]:
            raise KeyError(key)
        return cols[1][i]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        for rank in sorted(self._cols):
            steps, _, has = self._cols[rank]
            for st, h in zip(steps, has):
                if h:
                    yield (rank, st)

    def __len__(self) -> int:
        return sum(sum(has) for _, _, has in self._cols.values())

    def __repr__(self) -> str:
        return f"WaitTable({dict(self.items())!r})"


class Combiner:
    """Rank summaries brought together as they arrive, in any order: each collective's shortest
    duration on any rank so far is kept per name and occurrence (one array per name, folded with
    each arrival, never one entry per rank), and each rank's summary, whose size does not depend on
    its number of events. :meth:`report` works out waiting, own time and stragglers.

    .. versionadded:: 0.2
    """

    def __init__(self, source: str = "") -> None:
        self.source = source
        self.summaries: dict[int, RankSummary] = {}
        self.shortest: dict[str, array[int]] = {}
        self.counts: dict[str, dict[int, int]] = {}

    def add(self, s: RankSummary) -> None:
        if s.rank in self.summaries:
            where = f"{self.source}: several files claim" if self.source else "several summaries claim"
            raise TraceReadError(f"{where} rank(s) [{s.rank}]; keep one trace per rank in the directory")
        self.summaries[s.rank] = s
        c = s.collectives
        seen = [0] * len(c.names)
        tables = [self.shortest.setdefault(name, array("q")) for name in c.names]
        for n, d in zip(c.name, c.dur_ns):
            k = seen[n]
            seen[n] = k + 1
            t = tables[n]
            if k < len(t):
                if d < t[k]:
                    t[k] = d
            else:
                t.append(d)
        for name, n in zip(c.names, seen):
            self.counts.setdefault(name, {})[s.rank] = n

    def report(self, *, threshold: float = 0.2, min_excess_ns: int = 1_000_000) -> CrossRankReport:
        ranks = tuple(self.summaries[r] for r in sorted(self.summaries))
        notes: list[str] = []
        common: dict[str, int] = {}  # per name: occurrences seen on every rank (those compared)
        for name, per in sorted(self.counts.items()):
            if len(set(per.values())) > 1 or len(per) != len(ranks):
                notes.append(f"collective {name!r} occurs {dict(sorted(per.items()))} times by rank; only occurrences "
                             f"seen on every rank are compared")
            common[name] = min(per.values()) if len(per) == len(ranks) and len(ranks) >= 2 else 0
        cols: dict[int, tuple[array[int], array[int], bytearray]] = {}
        for r in ranks:
            st = r.steps
            wait = array("q", bytes(8 * len(st)))
            has = bytearray(len(st))
            c = r.collectives
            seen = [0] * len(c.names)
            limit = [common.get(name, 0) for name in c.names]
            shortest = [self.shortest[name] for name in c.names]
            starts, durs = st.start_ns, st.dur_ns
            for n, a, d in zip(c.name, c.start_ns, c.dur_ns):
                k = seen[n]
                seen[n] = k + 1
                if k >= limit[n]:
                    continue
                i = bisect.bisect_right(starts, a) - 1
                if i < 0 or a >= starts[i] + durs[i]:
                    continue
                wait[i] += d - shortest[n][k]
                has[i] = 1
            cols[r.rank] = (st.step, wait, has)
        table = WaitTable(cols)
        stragglers = _stragglers(ranks, table, threshold, min_excess_ns)
        for r in ranks:
            if r.durations_left_out and r.durations_other is not None:
                o = r.durations_other
                notes.append(f"rank {r.rank} ran more than {MAX_DURATION_NAMES} distinct kernel/op names: the "
                             f"{r.durations_left_out} with the least total time are summed as one row out of the "
                             f"duration distribution ({o.count:,} runs, {_ms(o.total_ns)} ms)")
        notes += [n for r in ranks for n in r.read_notes]
        return CrossRankReport(ranks, table, tuple(stragglers), tuple(notes))


def combine(summaries: Iterable[RankSummary], *, threshold: float = 0.2, min_excess_ns: int = 1_000_000) -> CrossRankReport:
    """Match collectives across ranks, work out waiting and own time per step, name stragglers
    (a :class:`Combiner` fed every summary)."""
    c = Combiner()
    for s in summaries:
        c.add(s)
    return c.report(threshold=threshold, min_excess_ns=min_excess_ns)


def _stragglers(ranks: Sequence[RankSummary], wait: WaitTable, threshold: float,
                min_excess_ns: int) -> list[Straggler]:
    if len(ranks) < 2:
        return []
    n = len(ranks)
    present: dict[int, int] = {}
    for r in ranks:
        for st in r.steps.step:
            present[st] = present.get(st, 0) + 1
    common = sorted(st for st, k in present.items() if k == n)
    del present
    if not common:
        return []
    col = {st: c for c, st in enumerate(common)}
    own = array("q", bytes(8 * len(common) * n))  # own[c * n + i]: rank i's own time in common step c
    wait_sum = array("q", bytes(8 * len(common)))  # all ranks' waiting in common step c
    for i, r in enumerate(ranks):
        w = wait.column(r.rank)
        for st, d, x in zip(r.steps.step, r.steps.dur_ns, w):
            c = col.get(st)
            if c is not None:
                own[c * n + i] = d - x
                wait_sum[c] += x
    median = [int(statistics.median(own[c * n:(c + 1) * n])) for c in range(len(common))]
    out = []
    for i, r in enumerate(ranks):
        slow = [c for c in range(len(common))
                if own[c * n + i] - median[c] > max(min_excess_ns, threshold * median[c])]
        if not slow or 2 * len(slow) < len(common):
            continue
        w = wait.column(r.rank)
        by_step = {st: k for k, st in enumerate(r.steps.step)}
        top: dict[str, int] = {}
        outside = others = 0
        for c in slow:
            row = r.steps[by_step[common[c]]]
            for name, ns in row.top_ops:
                top[name] = top.get(name, 0) + ns
            outside += row.idle_ns
            others += wait_sum[c] - w[by_step[common[c]]]
        slow_steps = [common[c] for c in slow]
        out.append(Straggler(rank=r.rank, slow_steps=tuple(slow_steps), steps=len(common),
                             own_ns={common[c]: own[c * n + i] for c in slow},
                             median_own_ns={common[c]: median[c] for c in slow},
                             step_ns={st: r.steps.dur_ns[by_step[st]] for st in slow_steps}, others_wait_ns=others,
                             top_ops=tuple(sorted(top.items(), key=lambda kv: (-kv[1], kv[0]))[:_TOP_OPS]),
                             outside_ops_ns=outside))
    return out


# -- inputs -----------------------------------------------------------------------------------------
def _summary_of_result(result: ProfileResult, rank: int | None = None, label: str = "") -> RankSummary:
    d = result.metadata.distributed
    r = int(d.get("rank", 0)) if rank is None else rank
    return reduce_rank(result.parts, rank=r, host=result.metadata.host, clock_offset_ns=int(d.get("clock_offset_ns", 0)),
                       clock_uncertainty_ns=int(d.get("clock_uncertainty_ns", 0)), label=label)


def analyze_result(result: ProfileResult, **kw: Any) -> CrossRankReport:
    """Analyse a merged distributed result (its parts grouped by their ``rank``; times already on
    rank 0's clock)."""
    groups: dict[int, list[BackendResult]] = {}
    for p in result.parts:
        groups.setdefault(int(p.metadata.get("rank", 0)), []).append(p)
    rows = {int(x["rank"]): x for x in result.metadata.distributed.get("ranks", []) if isinstance(x, dict)}
    summaries = []
    for rank, parts in sorted(groups.items()):
        row = rows.get(rank, {})
        # The parts' offsets already hold the rank's clock offset; it is kept in the summary for display only.
        s = reduce_rank(parts, rank=rank, host=str(parts[0].metadata.get("rank_host", "")))
        summaries.append(attrs.evolve(s, clock_offset_ns=int(row.get("clock_offset_ns", 0) or 0),
                                      clock_uncertainty_ns=int(row.get("clock_uncertainty_ns", 0) or 0),
                                      read_notes=_loss_notes(parts, rank)))
    return combine(summaries, **kw)


def _loss_notes(parts: Sequence[BackendResult], rank: int) -> tuple[str, ...]:
    """What a rank's parts say they lost, one line each (the same from a run dir or a merged result)."""
    return tuple(f"rank {rank}: {loss.count} {loss.unit} not read ({loss.kind}): {loss.detail}"
                 for p in parts for loss in p.losses)


def reduce_file(path: str, kind: str, rank_hint: int | None = None) -> RankSummary:
    """Read one rank's file and reduce it: the one per-rank step, run by the local worker pool and
    by a distributed executor's workers (:mod:`omniprof.analysis.executor`) alike.

    ``kind`` is ``"kineto"`` (a per-rank Kineto trace, read in a stream: only the reduction's
    compact tables are held, never the trace's spans) or ``"result"`` (an omniprof rank part).
    The rank: the trace's ``distributedInfo.rank``, else ``rank_hint`` (from the file name).
    What the reader could not read is kept in the summary's ``read_notes``.
    """
    if kind == "result":
        from omniprof.core.results import load

        res = load(path)
        s = _summary_of_result(res, rank_hint, label=Path(path).parent.name)
        notes = _loss_notes(res.parts, s.rank)
        return attrs.evolve(s, read_notes=notes) if notes else s
    if kind != "kineto":
        raise InvalidArgumentError(f"unknown rank file kind {kind!r} (expected 'kineto' or 'result')")
    from omniprof.formats.kineto import stream_spans

    red = RankReducer()
    red.begin_part()
    add = red.add

    def sink(s: Span) -> None:
        cat = s.category
        corr = s.args.get("correlation_id") if cat in _LINKED_CATS else None
        add(s.name, cat, s.start_ns, s.dur_ns, (corr,) if type(corr) is int else (), 0,
            s.args.get("step_num") if cat == "step" else None)

    top = stream_spans(path, sink)
    if top["_bounds_ns"] is not None:
        red.bounds.append(top["_bounds_ns"])
    info = top.get("distributedInfo")
    rank = info.get("rank") if isinstance(info, dict) and isinstance(info.get("rank"), int) else rank_hint
    if rank is None:
        raise TraceReadError(f"{path}: no rank in the trace (distributedInfo.rank) nor in the file name (rank<N>)")
    s = red.finish(rank=int(rank), host=str(top.get("host_name", "")), label=Path(path).name)
    notes = tuple(f"{Path(path).name}: {x}" for x in top["_losses"])
    return attrs.evolve(s, read_notes=notes) if notes else s


def _is_trace_file(p: Path) -> bool:
    n = p.name
    return p.is_file() and (n.endswith((".json", ".json.gz")) and not n.startswith("omniprof."))


def rank_inputs(path: str | os.PathLike[str]) -> list[tuple[str, str, int | None]]:
    """``(file, kind, rank hint)`` per rank in a run directory or a directory of Kineto traces."""
    from omniprof.core.distributed import find_rank_results

    d = Path(path)
    if not d.is_dir():
        raise TraceReadError(f"{d}: not a directory (give a distributed run directory or a directory of per-rank "
                             f"Kineto traces)")
    ours = find_rank_results(d)
    if ours:
        return [(str(p), "result", rank) for rank, p in ours.items()]
    files = sorted(p for p in d.iterdir() if _is_trace_file(p))
    if not files:
        raise TraceReadError(f"{d}: no rank<N>/omniprof.result.json and no Kineto trace (*.json, *.json.gz) inside")
    out = []
    for p in files:
        m = _RANK_IN_NAME.search(p.name)
        out.append((str(p), "kineto", int(m.group(1)) if m else None))
    return out


def load_kineto_dir(path: str | os.PathLike[str]) -> ProfileResult:
    """A directory of per-rank Kineto traces (HTA's input) as one merged result: each trace's rank
    from its ``distributedInfo.rank``, else from ``rank<N>`` in its name. Times stay each trace's own
    Kineto clock (Unix-based, so hosts line up as well as their clocks do; no offset is estimated)."""
    from omniprof.formats.kineto import read_trace
    from omniprof.core.distributed import load_run, merge_ranks

    results = []
    for file, kind, hint in rank_inputs(path):
        if kind != "kineto":
            return load_run(path)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = read_trace(file)
        for w in caught:  # losses stay counted in the part; say them once, naming the file
            warnings.warn(str(w.message), w.category, stacklevel=2)
        info = res.parts[0].metadata.get("distributedInfo")
        rank = info.get("rank") if isinstance(info, dict) and isinstance(info.get("rank"), int) else hint
        if rank is None:
            raise TraceReadError(f"{file}: no rank in the trace (distributedInfo.rank) nor in the file name (rank<N>)")
        world = info.get("world_size", 0) if isinstance(info, dict) else 0
        results.append(attrs.evolve(res, metadata=attrs.evolve(
            res.metadata, distributed={"rank": int(rank), "world_size": int(world or 0), "launcher": "kineto trace"})))
    ranks = [r.metadata.distributed["rank"] for r in results]
    if len(set(ranks)) != len(ranks):
        dup = sorted({r for r in ranks if ranks.count(r) > 1})
        raise TraceReadError(f"{path}: several files claim rank(s) {dup}; keep one trace per rank in the directory")
    return merge_ranks(results)


def iter_reduce_local(inputs: Sequence[tuple[str, str, int | None]], workers: int | None = None
                      ) -> Iterator[RankSummary]:
    """:func:`reduce_file` of every input in ``workers`` processes here (default: one per core, at
    most one per rank; 1 reads them one after another in this process), each summary yielded as
    soon as it is done (in any order). At most ``2 * workers`` ranks are in flight, so finished
    summaries do not pile up in the pool."""
    n = workers if workers is not None else min(len(inputs), os.cpu_count() or 1)
    if n < 1:
        raise InvalidArgumentError(f"'workers' must be >= 1 (got {workers})")
    if n == 1 or len(inputs) <= 1:
        for x in inputs:
            yield reduce_file(*x)
        return
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, wait

    # spawn, not fork: the parent may hold threads (a torch job, a profiler's sampler).
    with ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("spawn")) as ex:
        todo = list(reversed(inputs))
        running: set[Any] = set()
        while todo or running:
            while todo and len(running) < 2 * n:
                running.add(ex.submit(reduce_file, *todo.pop()))
            done, running = wait(running, return_when=FIRST_COMPLETED)
            for f in done:
                yield f.result()


def reduce_local(inputs: Sequence[tuple[str, str, int | None]], workers: int | None = None) -> list[RankSummary]:
    """:func:`reduce_file` of every input (see :func:`iter_reduce_local`), as a list in the inputs' order."""
    n = workers if workers is not None else min(len(inputs), os.cpu_count() or 1)
    if n < 1:
        raise InvalidArgumentError(f"'workers' must be >= 1 (got {workers})")
    if n == 1 or len(inputs) <= 1:
        return [reduce_file(*x) for x in inputs]
    import multiprocessing

    with ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("spawn")) as ex:
        return list(ex.map(reduce_file, *zip(*inputs)))


def analyze_dir(path: str | os.PathLike[str], *, workers: int | None = None, executor: Any = None,
                **kw: Any) -> CrossRankReport:
    """Analyse every rank under ``path``: each rank read (in a stream) and reduced alone, and each
    small per-rank summary folded into a :class:`Combiner` as it arrives.

    Args:
        workers: processes here (default: one per core, at most one per rank).
        executor: ``"dask://host:port"`` (or a ``distributed.Client``): read and reduce each rank on
            a Dask worker that sees its file (:mod:`omniprof.analysis.executor`); ``path`` is then
            the directory as the workers see it. ``workers`` does not apply.
    """
    if executor is not None:
        from omniprof.analysis.executor import iter_reduce_ranks

        summaries: Iterable[RankSummary] = iter_reduce_ranks(path, executor)
    else:
        summaries = iter_reduce_local(rank_inputs(path), workers)
    c = Combiner(str(path))
    for s in summaries:
        c.add(s)
    return c.report(**kw)


def analyze(source: ProfileResult | str | os.PathLike[str], **kw: Any) -> CrossRankReport:
    """Cross-rank analysis of a merged result, a run directory, or a directory of Kineto traces.

    ``workers`` and ``executor`` (directories only): see :func:`analyze_dir`.

    .. versionadded:: 0.2
    """
    if isinstance(source, ProfileResult):
        if kw.pop("executor", None) is not None:
            raise InvalidArgumentError("an executor reads rank files where they are: give the run directory, not a "
                                       "result already in memory")
        kw.pop("workers", None)
        return analyze_result(source, **kw)
    return analyze_dir(source, **kw)


def is_rank_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a directory :func:`analyze_dir` reads: a distributed run (rank parts) or
    a directory holding only Kineto traces."""
    from omniprof.core.readers import detect_format

    try:
        return Path(path).is_dir() and detect_format(path) in ("result", "kineto")
    except TraceReadError:
        return False


# -- text -------------------------------------------------------------------------------------------
_FULL_STEP_RANKS = 8  # more ranks than this: per step, only the slowest ranks by own time


def _ms(ns: int) -> str:
    return f"{ns / 1e6:,.3f}"


def text_blocks(rep: CrossRankReport) -> list[tuple[Any, ...]]:
    """The report as blocks: ``("line", text)`` and ``("grid", header, rows, align)`` (the table
    reporter draws them at its width; :meth:`CrossRankReport.to_text` as plain text)."""
    out: list[tuple[Any, ...]] = []
    src = {r.source for r in rep.ranks}
    what = "GPU kernels" if src == {"gpu"} else "CPU ops" if src == {"cpu"} else "GPU kernels or CPU ops (per rank)"
    out.append(("line", f"Cross-rank temporal breakdown: {len(rep.ranks)} ranks, from {what}; % of each rank's "
                        f"window (its profiled steps, else first to last event)"))
    rows = [[str(r.rank), r.host or "-", r.source, _ms(r.window_ns), f"{r.pct(r.compute_ns):.1f}",
             f"{r.pct(r.exposed_communication_ns):.1f}", f"{r.pct(r.exposed_memory_ns):.1f}", f"{r.pct(r.idle_ns):.1f}",
             f"{r.overlap_pct:.1f}", f"{r.clock_offset_ns / 1e3:+,.1f} ± {r.clock_uncertainty_ns / 1e3:,.1f}"]
            for r in rep.ranks]
    out.append(("grid", ["rank", "host", "src", "window ms", "compute%", "comm%", "mem%", "idle%", "overlap%",
                         "clock offset µs"], rows, "rllrrrrrrr"))
    out.append(("line", "comm%/mem%: exposed (not under compute); overlap%: share of communication time under "
                        "compute; clock offset: to rank 0, ± its uncertainty"))
    steps = rep.step_rows()
    if steps:
        shown = steps
        note = ""
        if len(rep.ranks) > _FULL_STEP_RANKS:
            by_step: dict[int, list[dict[str, Any]]] = {}
            for x in steps:
                by_step.setdefault(x["step"], []).append(x)
            shown = [x for st in sorted(by_step) for x in sorted(by_step[st], key=lambda x: -x["own_ns"])[:3]]
            note = f" (the 3 slowest of {len(rep.ranks)} ranks per step)"
        out.append(("line", ""))
        out.append(("line", f"Per-step time by rank, ms{note}: wait = in collectives for slower peers, own = step - wait"))
        out.append(("grid", ["step", "rank", "step ms", "wait", "own", "compute", "comm", "idle"],
                    [[str(x["step"]), str(x["rank"]), _ms(x["dur_ns"]), _ms(x["wait_ns"]), _ms(x["own_ns"]),
                      _ms(x["compute_ns"]), _ms(x["communication_ns"]), _ms(x["idle_ns"])] for x in shown],
                    "rrrrrrrr"))
    out.append(("line", ""))
    if rep.stragglers:
        for s in rep.stragglers:
            times = ", ".join(f"step {st} {_ms(s.step_ns[st])} ms (own {_ms(s.own_ns[st])} vs median "
                              f"{_ms(s.median_own_ns[st])})" for st in s.slow_steps)
            out.append(("line", f"Straggler: rank {s.rank}, slow in {len(s.slow_steps)} of {s.steps} steps: {times}. "
                                f"The other ranks waited {_ms(s.others_wait_ns)} ms in all for it in collectives."))
            ops = "; ".join(f"{name} {_ms(ns)} ms" for name, ns in s.top_ops)
            out.append(("line", f"  its slowest ops in those steps: {ops or 'none recorded'}; its idle time there "
                                f"(outside any op): {_ms(s.outside_ops_ns)} ms"))
    else:
        out.append(("line", "No straggler: no rank's own step time exceeds the median rank's by more than 20 % "
                            "(and 1 ms) in half the steps."))
    causes: dict[str, int] = {}
    for r in rep.ranks:
        for k, v in r.idle_causes.items():
            causes[k] = causes.get(k, 0) + v
    if any(causes.values()):
        out.append(("line", "Idle time by cause, all ranks: " + ", ".join(f"{k} {_ms(v)} ms" for k, v in causes.items())))
    out += _duration_blocks(rep)
    for n in rep.notes:
        out.append(("line", f"note: {n}"))
    return out


def _format(rep: CrossRankReport, width: int = 110) -> str:
    import textwrap

    lines: list[str] = []
    for block in text_blocks(rep):
        if block[0] == "line":
            text = block[1]
            lines += textwrap.wrap(text, width, subsequent_indent="    ") if text else [""]
            continue
        _, header, rows, align = block
        widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
        for cells in [header, *rows]:
            lines.append("  ".join(c.rjust(w) if a == "r" else c.ljust(w)
                                   for c, w, a in zip(cells, widths, align)).rstrip())
    return "\n".join(lines) + "\n"


# -- duration distribution across ranks -------------------------------------------------------------
def duration_stats(durations_ns: Sequence[int]) -> tuple[int, int, int, int, int]:
    """``(count, median_ns, p90_ns, max_ns, total_ns)``; the median and the 90th percentile
    interpolate linearly between the two nearest values (numpy's default method), rounded to
    the ns.

    >>> duration_stats([10, 20, 30, 40])
    (4, 25, 37, 40, 100)
    """
    xs = sorted(durations_ns)
    n = len(xs)
    if not n:
        return (0, 0, 0, 0, 0)

    def q(frac: float) -> int:
        pos = frac * (n - 1)
        lo = int(pos)
        hi = min(lo + 1, n - 1)
        return round(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))

    return (n, q(0.5), q(0.9), xs[-1], sum(xs))


@attrs.frozen
class RankDurations:
    """One kernel on one rank: ``count`` runs, their ``median_ns``, ``p90_ns``, ``max_ns``, ``total_ns``.
    ``exact``: False where the median and p90 come from a bucketed sketch (within
    :data:`omniprof.analysis.sketch.RELATIVE_ERROR`, 1 %); count, max and total are always exact."""

    rank: int
    count: int
    median_ns: int
    p90_ns: int
    max_ns: int
    total_ns: int
    exact: bool = True


@attrs.frozen
class DurationRow:
    """One kernel (or op) across ranks: ``per_rank`` (ranks that ran it, by rank), ``total_ns`` on
    all ranks, ``slowest_rank`` (the highest median; ties: higher p90, then lower rank),
    ``fastest_rank`` (the lowest median), and ``missing_ranks`` (ranks of the run that never ran it).
    ``spread`` is the slowest rank's median over the fastest's (1.0: every rank alike)."""

    name: str
    per_rank: tuple[RankDurations, ...]
    total_ns: int
    slowest_rank: int
    fastest_rank: int
    missing_ranks: tuple[int, ...] = ()

    @property
    def spread(self) -> float:
        by = {r.rank: r for r in self.per_rank}
        fast = by[self.fastest_rank].median_ns
        return by[self.slowest_rank].median_ns / fast if fast else float("inf")

    def rank(self, rank: int) -> RankDurations:
        for r in self.per_rank:
            if r.rank == rank:
                return r
        raise KeyError(f"{self.name!r} did not run on rank {rank} (ranks: {[r.rank for r in self.per_rank]})")


def duration_rows(ranks: Sequence[RankSummary], top: int | None = None) -> list[DurationRow]:
    """:meth:`CrossRankReport.durations` over rank summaries."""
    names: dict[str, list[RankDurations]] = {}
    for r in ranks:
        for name, sketch in r.durations.items():
            names.setdefault(name, []).append(RankDurations(r.rank, *sketch.stats(), exact=sketch.exact))
    all_ranks = {r.rank for r in ranks}
    rows = []
    for name, per in names.items():
        per.sort(key=lambda x: x.rank)
        slow = max(per, key=lambda x: (x.median_ns, x.p90_ns, -x.rank))
        fast = min(per, key=lambda x: (x.median_ns, x.p90_ns, x.rank))
        rows.append(DurationRow(name, tuple(per), sum(x.total_ns for x in per), slow.rank, fast.rank,
                                tuple(sorted(all_ranks - {x.rank for x in per}))))
    rows.sort(key=lambda x: (-x.total_ns, x.name))
    return rows if top is None else rows[:top]


_TOP_KERNELS = 10
#: per rank, the duration distribution keeps this many kernel/op names (those with the most time).
MAX_DURATION_NAMES = 1000
_NAME_WIDTH = 60


def _us(ns: int) -> str:
    return f"{ns / 1e3:,.1f}"


def _duration_blocks(rep: CrossRankReport) -> list[tuple[Any, ...]]:
    rows = rep.durations(_TOP_KERNELS)
    if not rows:
        return []
    src = {r.source for r in rep.ranks}
    what = "kernel" if src == {"gpu"} else "op" if src == {"cpu"} else "kernel/op"
    many = len(rep.ranks) > _FULL_STEP_RANKS
    note = " (per kernel: its 2 slowest ranks and its fastest)" if many else ""
    grid = []
    shown_approx = False
    for row in rows:
        per = list(row.per_rank)
        if many:
            by_med = sorted(per, key=lambda x: (-x.median_ns, -x.p90_ns, x.rank))
            keep = {x.rank for x in by_med[:2]} | {row.fastest_rank}
            per = [x for x in per if x.rank in keep]
        name = row.name if len(row.name) <= _NAME_WIDTH else row.name[:_NAME_WIDTH - 1] + "…"
        for i, x in enumerate(per):
            mark = "*" if x.rank == row.slowest_rank and len(row.per_rank) > 1 else ""
            approx = "" if x.exact else "~"
            shown_approx |= not x.exact
            grid.append([name if i == 0 else "", f"{x.rank}{mark}", str(x.count), approx + _us(x.median_ns),
                         approx + _us(x.p90_ns), _us(x.max_ns), _ms(x.total_ns), f"{row.spread:.2f}" if i == 0 else ""])
    out: list[tuple[Any, ...]] = [("line", ""), ("line", f"{what.capitalize()} duration by rank, µs: the {len(rows)} "
                                                         f"{what}s with the most total time{note}; * = its slowest "
                                                         f"rank (highest median); spread = slowest median / fastest")]
    out.append(("grid", [what, "rank", "count", "median", "p90", "max", "total ms", "spread"], grid, "lrrrrrrr"))
    if shown_approx:
        out.append(("line", f"~: within {RELATIVE_ERROR:.0%} (from the rank's log-bucketed sketch of that {what}'s "
                            f"durations; exact up to {EXACT_VALUES:,} distinct durations)"))
    return out
