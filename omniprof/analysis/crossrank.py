"""Cross-rank analysis of a distributed run: where each rank's time went, and who held the others up.

Input: a merged distributed result, an omniprof distributed run directory (``rank<N>/`` parts), or
a directory of per-rank Kineto traces (what Holistic Trace Analysis takes: the rank from the
trace's ``distributedInfo.rank``, else from a ``rank<N>`` in the file name). Each rank is reduced
alone first (:func:`reduce_rank`, in worker processes for directories, at most ``workers`` ranks in
memory at once) to a small :class:`RankSummary`; only those summaries meet in :func:`combine`.

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
import re
import statistics
import warnings
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import attrs

from omniprof.core.results import BackendResult, ProfileResult, Span
from omniprof.errors import InvalidArgumentError, TraceReadError

__all__ = [
    "RankSummary", "StepRow", "Straggler", "CrossRankReport", "reduce_rank", "combine", "analyze",
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


def _length(u: Intervals) -> int:
    return sum(b - a for a, b in u)


def _intersect(x: Intervals, y: Intervals) -> Intervals:
    out: Intervals = []
    i = j = 0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        if a < b:
            out.append((a, b))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return out


def _minus(x: Intervals, y: Intervals) -> Intervals:
    out: Intervals = []
    j = 0
    for a, b in x:
        while j < len(y) and y[j][1] <= a:
            j += 1
        k = j
        cur = a
        while k < len(y) and y[k][0] < b:
            if y[k][0] > cur:
                out.append((cur, y[k][0]))
            cur = max(cur, y[k][1])
            k += 1
        if cur < b:
            out.append((cur, b))
    return out


def _clip(u: Intervals, lo: int, hi: int) -> Intervals:
    return _intersect(u, [(lo, hi)]) if hi > lo else []


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


@attrs.frozen
class RankSummary:
    """One rank reduced: see the module docs for every figure's meaning. ``collectives`` are
    ``(name, start_ns, dur_ns)`` of its communication spans in start order (the primary kind only:
    GPU communication kernels, else ``gloo:``/``nccl:`` spans, else any)."""

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
    steps: tuple[StepRow, ...]
    collectives: tuple[tuple[str, int, int], ...]
    clock_offset_ns: int = 0
    clock_uncertainty_ns: int = 0
    label: str = ""
    #: name -> ``(count, median_ns, p90_ns, max_ns, total_ns)`` of every kernel (GPU ranks: compute,
    #: communication, memcpy/memset) or op (CPU ranks: CPU and XLA ops, communication spans) the
    #: breakdown classified, over the whole trace (see :func:`duration_stats`).
    durations: dict[str, tuple[int, int, int, int, int]] = attrs.field(factory=dict)
    #: names left out of ``durations`` (those with the least total time past :data:`MAX_DURATION_NAMES`).
    durations_left_out: int = 0

    @property
    def overlap_pct(self) -> float:
        return 100.0 * self.overlap_ns / self.communication_ns if self.communication_ns else 0.0

    def pct(self, value_ns: int) -> float:
        return 100.0 * value_ns / self.window_ns if self.window_ns else 0.0


def _step_number(span: Span, fallback: int) -> int:
    m = _STEP_NUM.search(span.name)
    return int(m.group(1)) if m else fallback


def reduce_rank(parts: Sequence[BackendResult], *, rank: int, host: str = "", clock_offset_ns: int = 0,
                clock_uncertainty_ns: int = 0, label: str = "") -> RankSummary:
    """Reduce one rank's parts (all on the same host clock after each part's offset) to a summary.

    Times in the summary are shifted by ``clock_offset_ns`` (the rank's offset to rank 0).
    """
    spans: list[tuple[Span, int]] = []
    flow_start: dict[int, list[int]] = {}
    for p in parts:
        off = p.clock.offset_ns + clock_offset_ns
        for s in p.spans:
            spans.append((s, off))
    has_gpu = any(s.category in _DEVICE_CATS for s, _ in spans)
    comp: Intervals = []
    comm: Intervals = []
    mem: Intervals = []
    step_marks = _step_marks(parts, clock_offset_ns)
    coll: list[tuple[str, int, int, int]] = []  # (priority, start, dur, name) gathered then filtered
    ops: list[tuple[int, int, str]] = []
    memops: list[tuple[int, str]] = []
    kernels: list[tuple[int, int, tuple[int, ...]]] = []
    bounds: list[tuple[int, int]] = []
    for p in parts:
        if p.start_ns or p.end_ns:
            bounds.append((p.start_ns + p.clock.offset_ns + clock_offset_ns, p.end_ns + p.clock.offset_ns + clock_offset_ns))
    for s, off in spans:
        a = s.start_ns + off
        b = a + s.dur_ns
        cat = s.category
        if cat == "step":
            continue
        if has_gpu:
            if cat in _DEVICE_CATS:
                if cat == "kernel" and is_comm(s.name):
                    comm.append((a, b))
                    coll.append((0, a, s.dur_ns, s.name))
                elif cat == "kernel":
                    comp.append((a, b))
                    ops.append((a, s.dur_ns, s.name))
                    kernels.append((a, b, s.flow_ids))
                else:
                    mem.append((a, b))
                    kernels.append((a, b, s.flow_ids))
                    memops.append((s.dur_ns, s.name))
            elif s.flow_ids and cat in ("runtime", "cuda_runtime", "cuda_driver", "cpu_op"):
                for f in s.flow_ids:
                    flow_start.setdefault(f, []).append(a)
            continue
        if is_comm(s.name) and cat != "runtime":  # not XLA's runtime marks ("end: all-reduce")
            comm.append((a, b))
            low = s.name.lower()
            coll.append((1 if cat == "xla_op" or low.startswith(("gloo:", "nccl:")) else 2, a, s.dur_ns, s.name))
        elif cat in ("cpu_op", "xla_op"):
            comp.append((a, b))
            ops.append((a, s.dur_ns, s.name))
    classified = comp + comm + mem
    steps = [(num, a, b) for num, (a, b) in step_marks.items()]
    if steps:
        steps.sort(key=lambda x: x[1])
        lo, hi = steps[0][1], max(b for _, _, b in steps)
    elif classified:  # as HTA: from the first to the last classified event (device events on a GPU rank)
        lo, hi = min(a for a, _ in classified), max(b for _, b in classified)
    elif bounds:
        lo, hi = min(a for a, _ in bounds), max(b for _, b in bounds)
    else:
        lo = hi = 0
    window = max(0, hi - lo)
    C = _clip(union(comp), lo, hi)
    M = _clip(union(comm), lo, hi)
    X = _clip(union(mem), lo, hi)
    CM = union(C + M)
    busy = union(CM + X)
    overlap = _length(_intersect(M, C))
    exposed_comm = _length(_minus(M, C))
    exposed_mem = _length(_minus(X, CM))
    idle = window - _length(busy)
    causes: dict[str, int] = {}
    if not has_gpu:
        causes["host outside ops"] = idle
    else:
        causes.update(_gpu_idle_causes(busy, kernels, flow_start, lo, hi))
    best = min((c[0] for c in coll), default=0)
    collectives = tuple((name, a, d) for pr, a, d, name in sorted(coll, key=lambda c: c[1]) if pr == best)
    ops.sort()
    starts = [o[0] for o in ops]
    rows = []
    for num, a, b in steps:
        w = [(a, b)]
        top: dict[str, int] = {}
        for i in range(bisect.bisect_left(starts, a), bisect.bisect_left(starts, b)):
            top[ops[i][2]] = top.get(ops[i][2], 0) + ops[i][1]
        best_ops = sorted(top.items(), key=lambda kv: (-kv[1], kv[0]))[:_TOP_OPS]
        rows.append(StepRow(num, a, b - a, _length(_intersect(C, w)), _length(_intersect(M, w)),
                            (b - a) - _length(_intersect(busy, w)), best_ops))
    per_name: dict[str, list[int]] = {}
    for dur, name in [(o[1], o[2]) for o in ops] + [(c[2], c[3]) for c in coll] + memops:
        per_name.setdefault(name, []).append(dur)
    durations = {name: duration_stats(ds) for name, ds in per_name.items()}
    left_out = 0
    if len(durations) > MAX_DURATION_NAMES:  # a summary stays small: the names with the least time go
        kept = sorted(durations.items(), key=lambda kv: (-kv[1][4], kv[0]))[:MAX_DURATION_NAMES]
        left_out = len(durations) - len(kept)
        durations = dict(kept)
    return RankSummary(rank=rank, host=host, source="gpu" if has_gpu else "cpu", window_ns=window,
                       compute_ns=_length(C), communication_ns=_length(M), memory_ns=_length(X), overlap_ns=overlap,
                       exposed_communication_ns=exposed_comm, exposed_memory_ns=exposed_mem, idle_ns=idle,
                       idle_causes=causes, steps=tuple(rows), collectives=collectives,
                       clock_offset_ns=clock_offset_ns, clock_uncertainty_ns=clock_uncertainty_ns, label=label,
                       durations=durations, durations_left_out=left_out)


def _step_marks(parts: Sequence[BackendResult], clock_offset_ns: int) -> dict[int, tuple[int, int]]:
    """Step number -> (start, end) from ONE part: several backends mark the same steps (torch's
    ``ProfilerStep#N``, the cpu backend's ``step N``, whose last step runs on until the session
    stops), so the framework's own markers (``ProfilerStep#``) win, else the first part's."""
    best: list[tuple[Span, int]] = []
    for p in parts:
        marks = [(s, p.clock.offset_ns + clock_offset_ns) for s in p.spans if s.category == "step"]
        if marks and (not best or (marks[0][0].name.startswith("ProfilerStep#")
                                   and not best[0][0].name.startswith("ProfilerStep#"))):
            best = marks
    out: dict[int, tuple[int, int]] = {}
    for i, (s, off) in enumerate(best):
        num = s.args.get("step_num")
        num = num if isinstance(num, int) else _step_number(s, i)
        a, b = s.start_ns + off, s.start_ns + off + s.dur_ns
        old = out.get(num)
        out[num] = (min(a, old[0]), max(b, old[1])) if old else (a, b)
    return out


def _gpu_idle_causes(busy: Intervals, kernels: list[tuple[int, int, tuple[int, ...]]],
                     flow_start: dict[int, list[int]], lo: int, hi: int) -> dict[str, int]:
    """Split each idle gap of the device by what ended it: the next kernel's launch on the host."""
    out = {"waiting on host launch": 0, "waiting on sync/dependency": 0, "before first / after last kernel": 0}
    if not busy:
        out["before first / after last kernel"] = hi - lo
        return out
    by_start: dict[int, int] = {}
    for a, _, flows in kernels:
        launches = [t for f in flows for t in flow_start.get(f, ()) if t <= a]
        if launches:
            t = max(launches)
            by_start[a] = max(by_start.get(a, t), t)
    out["before first / after last kernel"] = max(0, busy[0][0] - lo) + max(0, hi - busy[-1][1])
    for (_, g0), (g1, _) in zip(busy, busy[1:]):
        gap = g1 - g0
        launch = by_start.get(g1)
        host = min(gap, launch - g0) if launch is not None and launch > g0 else 0
        out["waiting on host launch"] += host
        out["waiting on sync/dependency"] += gap - host
    return out


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
    wait_ns: dict[tuple[int, int], int]
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
        for r in self.ranks:
            for s in r.steps:
                w = self.wait_ns.get((r.rank, s.step), 0)
                rows.append({"step": s.step, "rank": r.rank, "dur_ns": s.dur_ns, "wait_ns": w,
                             "own_ns": s.dur_ns - w, "compute_ns": s.compute_ns,
                             "communication_ns": s.communication_ns, "idle_ns": s.idle_ns})
        rows.sort(key=lambda x: (x["step"], x["rank"]))
        return rows

    def to_text(self) -> str:
        return _format(self)

    def durations(self, top: int | None = None) -> list[DurationRow]:
        """Each kernel's (GPU ranks) or op's (CPU ranks) duration distribution across ranks, the
        kernels with the most total time (all ranks) first; ``top`` keeps that many."""
        return duration_rows(self.ranks, top)


def combine(summaries: Iterable[RankSummary], *, threshold: float = 0.2, min_excess_ns: int = 1_000_000) -> CrossRankReport:
    """Match collectives across ranks, work out waiting and own time per step, name stragglers."""
    ranks = tuple(sorted(summaries, key=lambda r: r.rank))
    notes: list[str] = []
    wait: dict[tuple[int, int], int] = {}
    # k-th occurrence of each collective name on each rank
    occ: dict[tuple[str, int], dict[int, tuple[int, int]]] = {}
    counts: dict[str, dict[int, int]] = {}
    for r in ranks:
        seen: dict[str, int] = {}
        for name, a, d in r.collectives:
            k = seen.get(name, 0)
            seen[name] = k + 1
            occ.setdefault((name, k), {})[r.rank] = (a, d)
        for name, n in seen.items():
            counts.setdefault(name, {})[r.rank] = n
    for name, per in sorted(counts.items()):
        if len(set(per.values())) > 1 or len(per) != len(ranks):
            notes.append(f"collective {name!r} occurs {dict(sorted(per.items()))} times by rank; only occurrences "
                         f"seen on every rank are compared")
    step_starts = {r.rank: ([s.start_ns for s in r.steps], r.steps) for r in ranks}
    for (name, k), per in occ.items():
        if len(per) != len(ranks) or len(ranks) < 2:
            continue
        shortest = min(d for _, d in per.values())
        for rank, (a, d) in per.items():
            starts, steps = step_starts[rank]
            i = bisect.bisect_right(starts, a) - 1
            if i < 0 or a >= steps[i].start_ns + steps[i].dur_ns:
                continue
            key = (rank, steps[i].step)
            wait[key] = wait.get(key, 0) + (d - shortest)
    stragglers = _stragglers(ranks, wait, threshold, min_excess_ns)
    return CrossRankReport(ranks, wait, tuple(stragglers), tuple(notes))


def _stragglers(ranks: Sequence[RankSummary], wait: dict[tuple[int, int], int], threshold: float,
                min_excess_ns: int) -> list[Straggler]:
    if len(ranks) < 2:
        return []
    own: dict[int, dict[int, int]] = {}
    for r in ranks:
        for s in r.steps:
            own.setdefault(s.step, {})[r.rank] = s.dur_ns - wait.get((r.rank, s.step), 0)
    common = sorted(step for step, per in own.items() if len(per) == len(ranks))
    if not common:
        return []
    median = {step: int(statistics.median(own[step].values())) for step in common}
    out = []
    for r in ranks:
        slow = [st for st in common if own[st][r.rank] - median[st] > max(min_excess_ns, threshold * median[st])]
        if not slow or 2 * len(slow) < len(common):
            continue
        by_step = {s.step: s for s in r.steps}
        top: dict[str, int] = {}
        outside = 0
        for st in slow:
            for name, ns in by_step[st].top_ops:
                top[name] = top.get(name, 0) + ns
            outside += by_step[st].idle_ns
        others = sum(wait.get((o.rank, st), 0) for o in ranks if o.rank != r.rank for st in slow)
        out.append(Straggler(rank=r.rank, slow_steps=tuple(slow), steps=len(common),
                             own_ns={st: own[st][r.rank] for st in slow}, median_own_ns={st: median[st] for st in slow},
                             step_ns={st: by_step[st].dur_ns for st in slow}, others_wait_ns=others,
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
                                      clock_uncertainty_ns=int(row.get("clock_uncertainty_ns", 0) or 0)))
    return combine(summaries, **kw)


def _reduce_file(path: str, kind: str, rank_hint: int | None) -> RankSummary:
    """Worker: read one rank's file and reduce it (runs in a child process for directories)."""
    if kind == "result":
        from omniprof.core.results import load

        res = load(path)
        return _summary_of_result(res, rank_hint, label=Path(path).parent.name)
    from omniprof.formats.kineto import read_trace

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # losses stay counted in the part; the report notes per-rank reads only
        res = read_trace(path)
    info = res.parts[0].metadata.get("distributedInfo")
    rank = info.get("rank") if isinstance(info, dict) and isinstance(info.get("rank"), int) else rank_hint
    if rank is None:
        raise TraceReadError(f"{path}: no rank in the trace (distributedInfo.rank) nor in the file name (rank<N>)")
    return reduce_rank(res.parts, rank=int(rank), host=res.metadata.host, label=Path(path).name)


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


def analyze_dir(path: str | os.PathLike[str], *, workers: int | None = None, **kw: Any) -> CrossRankReport:
    """Analyse every rank under ``path``, reading and reducing ranks in ``workers`` processes
    (default: one per core, at most one per rank; 1 reads them one after another here). Only
    the small per-rank summaries come back, so memory holds at most ``workers`` ranks' data."""
    inputs = rank_inputs(path)
    n = workers if workers is not None else min(len(inputs), os.cpu_count() or 1)
    if n < 1:
        raise InvalidArgumentError(f"'workers' must be >= 1 (got {workers})")
    if n == 1 or len(inputs) == 1:
        summaries = [_reduce_file(*x) for x in inputs]
    else:
        import multiprocessing

        # spawn, not fork: the parent may hold threads (a torch job, a profiler's sampler).
        with ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("spawn")) as ex:
            summaries = list(ex.map(_reduce_file, *zip(*inputs)))
    ranks = [s.rank for s in summaries]
    if len(set(ranks)) != len(ranks):
        dup = sorted({r for r in ranks if ranks.count(r) > 1})
        raise TraceReadError(f"{path}: several files claim rank(s) {dup}; keep one trace per rank in the directory")
    return combine(summaries, **kw)


def analyze(source: ProfileResult | str | os.PathLike[str], **kw: Any) -> CrossRankReport:
    """Cross-rank analysis of a merged result, a run directory, or a directory of Kineto traces.

    .. versionadded:: 0.2
    """
    if isinstance(source, ProfileResult):
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
    """One kernel on one rank: ``count`` runs, their ``median_ns``, ``p90_ns``, ``max_ns``, ``total_ns``."""

    rank: int
    count: int
    median_ns: int
    p90_ns: int
    max_ns: int
    total_ns: int


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
        for name, (count, med, p90, mx, total) in r.durations.items():
            names.setdefault(name, []).append(RankDurations(r.rank, count, med, p90, mx, total))
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
MAX_DURATION_NAMES = 5000
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
    for row in rows:
        per = list(row.per_rank)
        if many:
            by_med = sorted(per, key=lambda x: (-x.median_ns, -x.p90_ns, x.rank))
            keep = {x.rank for x in by_med[:2]} | {row.fastest_rank}
            per = [x for x in per if x.rank in keep]
        name = row.name if len(row.name) <= _NAME_WIDTH else row.name[:_NAME_WIDTH - 1] + "…"
        for i, x in enumerate(per):
            mark = "*" if x.rank == row.slowest_rank and len(row.per_rank) > 1 else ""
            grid.append([name if i == 0 else "", f"{x.rank}{mark}", str(x.count), _us(x.median_ns), _us(x.p90_ns),
                         _us(x.max_ns), _ms(x.total_ns), f"{row.spread:.2f}" if i == 0 else ""])
    out: list[tuple[Any, ...]] = [("line", ""), ("line", f"{what.capitalize()} duration by rank, µs: the {len(rows)} "
                                                         f"{what}s with the most total time{note}; * = its slowest "
                                                         f"rank (highest median); spread = slowest median / fastest")]
    out.append(("grid", [what, "rank", "count", "median", "p90", "max", "total ms", "spread"], grid, "lrrrrrrr"))
    for r in rep.ranks:
        if r.durations_left_out:
            out.append(("line", f"note: rank {r.rank} ran more than {MAX_DURATION_NAMES} distinct {what} names; "
                                f"the {r.durations_left_out} with the least total time are left out of the distribution"))
    return out
