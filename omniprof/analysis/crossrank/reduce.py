"""One rank reduced alone: a :class:`RankReducer` fed the rank's spans as they stream by, in any
order, on the run's reference clock, keeping only compact tables; :meth:`RankReducer.finish` turns
them into a :class:`~omniprof.analysis.crossrank.summary.RankSummary` (the module docs of
:mod:`omniprof.analysis.crossrank` say what each figure means)."""

from __future__ import annotations

import bisect
import re
from array import array
from collections.abc import Sequence
from typing import Any

import attrs

from omniprof.analysis.crossrank.intervals import Iv, UnionBuilder, Within, iv_clip, iv_overlap, iv_union
from omniprof.analysis.sketch import DurationSketch
from omniprof.analysis.crossrank.summary import CollectiveTable, RankSummary, StepTable
from omniprof.analysis.timeline import placed
from omniprof.core.results import BackendResult, ProfileResult

__all__ = ["COMM_PATTERN", "is_comm", "OpTable", "RankReducer", "reduce_rank", "duration_sketches", "LINKED_CATS",
           "TOP_OPS", "MAX_DURATION_NAMES"]

#: names of communication spans (kernels, annotations, ops), matched case-insensitively.
COMM_PATTERN = re.compile(
    r"nccl|rccl|^gloo:|^c10d::|record_param_comms|all[-_]?reduce|all[-_]?gather|reduce[-_]?scatter|all[-_]?to[-_]?all|"
    r"^ncclDevKernel|sendrecv|broadcast_|^collective-permute", re.IGNORECASE)
_STEP_NUM = re.compile(r"(\d+)\s*$")
_DEVICE_CATS = frozenset({"kernel", "memcpy", "memset"})
#: per rank, the duration distribution keeps this many kernel/op names (those with the most time).
MAX_DURATION_NAMES = 1000
#: ops kept per step, the longest (the straggler report names them)
TOP_OPS = 5


def is_comm(name: str) -> bool:
    """Whether a span name is a collective or point-to-point communication."""
    return COMM_PATTERN.search(name) is not None


_LAUNCH_CATS = frozenset({"runtime", "cuda_runtime", "cuda_driver", "cpu_op"})
#: spans whose ``correlation_id`` links a host launch to device work (the Kineto reader's launch flows)
LINKED_CATS = frozenset({"runtime", "kernel", "memcpy", "memset", "sync"})


class OpTable:
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
    collectives and the step marks. Times are on the run's reference clock already: :func:`reduce_rank`
    reads parts in memory through :func:`omniprof.analysis.timeline.placed`, and
    :func:`~omniprof.analysis.crossrank.pool.reduce_file` a trace in a stream (its own clock).

    .. versionadded:: 0.2
    """

    def __init__(self) -> None:
        self.has_gpu = False
        # GPU view (device spans), kept from the start
        self.g_comp, self.g_comm, self.g_mem = UnionBuilder(), UnionBuilder(), UnionBuilder()
        self.g_ops = OpTable()
        self.g_memops = OpTable()  # memcpy/memset durations by name, for the duration distribution
        self.g_coll: list[tuple[int, int, int, str]] = []
        self.k_start = array("q")   # device work with a launch link: its start, one row per flow id
        self.k_flow = array("q")
        self.f_id = array("q")      # host launch times per flow id
        self.f_time = array("q")
        # CPU view, dropped once a device span shows the rank is a GPU rank
        self.c_comp: UnionBuilder | None = UnionBuilder()
        self.c_comm: UnionBuilder | None = UnionBuilder()
        self.c_ops: OpTable | None = OpTable()
        self.c_coll: list[tuple[int, int, int, str]] | None = []
        self.steps: list[list[tuple[str, int, int, Any]]] = []  # per part: (name, start, end, step_num arg)
        self.bounds: list[tuple[int, int]] = []

    def begin_part(self, bounds_ns: tuple[int, int] | None = None) -> None:
        """A new part (backend) of the rank starts, its session lasting ``bounds_ns`` (if known): its
        step marks are kept apart from the other parts'."""
        self.steps.append([])
        if bounds_ns is not None:
            self.bounds.append(bounds_ns)

    def add(self, name: str, category: str, start_ns: int, dur_ns: int, flow_ids: Sequence[int] = (),
            step_num: Any = None) -> None:
        """One span, ``start_ns`` on the reference clock; ``flow_ids`` link a host launch to device
        work; ``step_num``: a step span's number where its backend states it."""
        a = start_ns
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
            # A communication kernel keeps its launch link like any other: a gap it ends is split by
            # the same rule (waiting on host launch / on sync or dependency).
            if category == "kernel" and is_comm(name):
                self.g_comm.add(a, b)
                self.g_coll.append((0, a, dur_ns, name))
            elif category == "kernel":
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

    def finish(self, *, rank: int, host: str = "", clock_offset_ns: int = 0, clock_uncertainty_ns: int = 0,
               label: str = "") -> RankSummary:
        """The summary; ``clock_offset_ns`` and ``clock_uncertainty_ns`` (the rank's clock against
        rank 0's) are shown beside it, never added (its times are placed already)."""
        if self.has_gpu:
            comp, comm, mem, ops, coll = self.g_comp, self.g_comm, self.g_mem, self.g_ops, self.g_coll
            memops = self.g_memops
        else:
            assert self.c_comp is not None and self.c_comm is not None and self.c_ops is not None and self.c_coll is not None
            comp, comm, mem, ops, coll = self.c_comp, self.c_comm, UnionBuilder(), self.c_ops, self.c_coll
            memops = OpTable()
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
        C = iv_clip(comp.result(), lo, hi)
        M = iv_clip(comm.result(), lo, hi)
        X = iv_clip(mem.result(), lo, hi)
        CM = iv_union(C, M)
        busy = iv_union(CM, X)
        idle = window - busy.length()
        causes = self._gpu_idle_causes(busy, lo, hi) if self.has_gpu else {"host outside ops": idle}
        best = min((c[0] for c in coll), default=0)
        collectives = CollectiveTable.of((name, a, d) for pr, a, d, name in sorted(coll, key=lambda c: c[1])
                                         if pr == best)
        table = StepTable()
        top_ids: dict[str, int] = {}
        c_at, m_at, busy_at = Within(C), Within(M), Within(busy)
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
        durations, left_out, other = duration_sketches(ops, memops, coll)
        overlap = iv_overlap(M, C)
        return RankSummary(rank=rank, host=host, source="gpu" if self.has_gpu else "cpu", window_ns=window,
                           compute_ns=C.length(), communication_ns=M.length(), memory_ns=X.length(),
                           overlap_ns=overlap, exposed_communication_ns=M.length() - overlap,
                           exposed_memory_ns=X.length() - iv_overlap(X, CM), idle_ns=idle, idle_causes=causes,
                           steps=table, collectives=collectives, clock_offset_ns=clock_offset_ns,
                           clock_uncertainty_ns=clock_uncertainty_ns, label=label, durations=durations,
                           durations_left_out=left_out, durations_other=other)

    def _gpu_idle_causes(self, busy: Iv, lo: int, hi: int) -> dict[str, int]:
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


def _top_ops_by_step(ops: OpTable, steps: list[tuple[int, int, int]]) -> list[tuple[tuple[str, int], ...]]:
    """Per step (sorted by start), its ``TOP_OPS`` longest ops by total time: every op whose start
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
    return [tuple(sorted(((ops.names[n], v) for n, v in top.items()), key=lambda kv: (-kv[1], kv[0]))[:TOP_OPS])
            for top in tops]


def duration_sketches(ops: OpTable, memops: OpTable, coll: list[tuple[int, int, int, str]]
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
    """Reduce one rank's parts to a summary, each part read on the reference clock (its own clock
    offset added by :func:`omniprof.analysis.timeline.placed`). ``clock_offset_ns`` and
    ``clock_uncertainty_ns``: the rank's clock against rank 0's, for display (a rank's parts are put
    on rank 0's clock by :func:`omniprof.core.distributed.merge_ranks`)."""
    red = RankReducer()
    add = red.add
    for pp in placed(ProfileResult(parts=tuple(parts))):
        red.begin_part(pp.bounds)
        for _, s, a, _ in pp.spans():
            add(s.name, s.category, a, s.dur_ns, s.flow_ids, s.args.get("step_num") if s.category == "step" else None)
    return red.finish(rank=rank, host=host, clock_offset_ns=clock_offset_ns, clock_uncertainty_ns=clock_uncertainty_ns,
                      label=label)
