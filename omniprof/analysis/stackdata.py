"""Weighted stacks from any result, shared by the ``speedscope``, ``pprof`` and ``collapsed`` reporters.

A result holds three kinds of stack-shaped data, and each becomes a list of :class:`StackRecord`
(a stack, a thread or track label, a vector of values):

* ``samples``: stack samples; values ``(1, weight_ns)`` (sample count, wall time).
* ``spans``: timeline spans. Spans on one track nest into call stacks by the one nesting rule
  (:mod:`omniprof.analysis.nesting`); each span contributes its *self* time (its duration less its
  children's), the figure the op tables and ``diff`` give. Spans that overlap without nesting (real
  traces have them) are drawn on an extra lane of the track (:func:`span_lanes`), never dropped
  or cut.
* ``allocations``: sampled allocations; values ``(count, bytes, count if alive at the end
  else 0, bytes if alive else 0)``, pprof's ``alloc_objects, alloc_space, inuse_objects,
  inuse_space``, where ``bytes = size_bytes * count``: a record is one allocation of
  ``size_bytes`` standing for ``count`` allocations under sampling.

A record's stack is a :class:`StackNode` of one prefix tree per profile: the same path is the same
node, and a node holds only its frame and its parent, so spans nested ``n`` deep cost ``n`` nodes,
not ``n * n / 2`` frames (10,000 nested spans took 23 s in pprof and 9.7 s in folded stacks when
every record held its whole stack). Writers work per node, each node once.

Everything here is plain data; the reporters only format it.
"""

from __future__ import annotations

import heapq
import warnings
from collections.abc import Sequence

import attrs

from omniprof.analysis import calltree
from omniprof.analysis.nesting import SPANS, Nest, nest
from omniprof.analysis.timeline import Nesting, PlacedPart, placed, time_axis
from omniprof.core.results import BackendResult, Frame, ProfileResult, Span
from omniprof.errors import DataLossWarning, InvalidArgumentError

__all__ = [
    "SOURCES", "ValueType", "StackNode", "StackRecord", "StackProfile", "Lane", "span_lanes", "stack_profile",
    "pick_source", "frame_label",
]

SOURCES = ("auto", "samples", "spans", "allocations")


@attrs.frozen
class ValueType:
    """What one value of a record measures: pprof's ``(type, unit)``, e.g. ``("wall", "nanoseconds")``."""

    type: str
    unit: str


SAMPLE_TYPES = (ValueType("samples", "count"), ValueType("wall", "nanoseconds"))
SPAN_TYPES = (ValueType("spans", "count"), ValueType("time", "nanoseconds"))
ALLOC_TYPES = (ValueType("alloc_objects", "count"), ValueType("alloc_space", "bytes"),
               ValueType("inuse_objects", "count"), ValueType("inuse_space", "bytes"))


class StackNode:
    """One node of a profile's prefix tree of stacks: its ``frame`` and ``parent`` (None at the
    top), ``depth`` (1 at the top). Children are interned: one path, one node."""

    __slots__ = ("frame", "parent", "depth", "children")

    def __init__(self, frame: Frame | None, parent: StackNode | None) -> None:
        self.frame = frame
        self.parent = parent
        self.depth = parent.depth + 1 if parent is not None else 0
        self.children: dict[Frame, StackNode] = {}

    def child(self, frame: Frame) -> StackNode:
        node = self.children.get(frame)
        if node is None:
            node = self.children[frame] = StackNode(frame, self)
        return node

    def path(self, frames: Sequence[Frame]) -> StackNode:
        """The node of ``frames`` (root first) below this one."""
        node = self
        for f in frames:
            node = node.child(f)
        return node

    def frames(self) -> tuple[Frame, ...]:
        """The stack, root first (the root node itself has no frame)."""
        out = []
        node: StackNode | None = self
        while node is not None and node.frame is not None:
            out.append(node.frame)
            node = node.parent
        return tuple(reversed(out))

    def __repr__(self) -> str:
        return f"StackNode(depth={self.depth}, frame={self.frame!r})"


@attrs.frozen
class StackRecord:
    """One weighted stack.

    Attributes:
        node: the stack, a node of the profile's prefix tree (:attr:`frames`: root first).
        thread: the thread (samples, allocations) or track lane (spans) it belongs to.
        values: one per :attr:`StackProfile.value_types`.
        t_ns: when, on the run's time axis (:func:`omniprof.analysis.timeline.time_axis`: 0 is the
            earliest of the run's start and its data, so it is never negative); None for a record
            that sums several samples or allocations.
        labels: extra string labels (``task``).
    """

    node: StackNode
    thread: str
    values: tuple[int, ...]
    t_ns: int | None = None
    labels: tuple[tuple[str, str], ...] = ()

    @property
    def frames(self) -> tuple[Frame, ...]:
        """The stack, root first (walks the tree: O(depth))."""
        return self.node.frames()


@attrs.frozen
class StackProfile:
    """Weighted stacks of one kind of data.

    Attributes:
        source: ``"samples"``, ``"spans"`` or ``"allocations"``.
        value_types: what each value of a record measures.
        default_index: the value most viewers should show first.
        records: the stacks.
        period: pprof's period (ns between samples for samples; 1 otherwise).
        adjustments: counts of what was changed to fit the format: ``"spans_moved_to_overlap_lane"``,
            ``"negative_weights_set_to_zero"`` (a backend reported a sample with negative weight).
        skipped: counts of records that could not be used (bad stack ids), also warned about.
    """

    source: str
    value_types: tuple[ValueType, ...]
    default_index: int
    records: tuple[StackRecord, ...]
    period: int = 1
    adjustments: dict[str, int] = attrs.field(factory=dict)
    skipped: dict[str, int] = attrs.field(factory=dict)

    def totals(self) -> tuple[int, ...]:
        out = [0] * len(self.value_types)
        for r in self.records:
            for i, v in enumerate(r.values):
                out[i] += v
        return tuple(out)


def pick_source(result: ProfileResult, source: str) -> str:
    """``source`` itself, or for ``"auto"`` the first of samples, allocations, spans that has data
    (samples when the result is empty)."""
    if source not in SOURCES:
        raise InvalidArgumentError(f"'source' must be one of {', '.join(SOURCES)} (got {source!r})")
    if source != "auto":
        return source
    for name in ("samples", "allocations", "spans"):
        if any(getattr(p, name) for p in result.parts):
            return name
    return "samples"


def frame_label(frame: Frame, fmt: str = "function_file") -> str:
    """A frame as one line of text for flame graphs: ``name``, ``name (file)`` or ``name (file:line)``
    (py-spy's folded-stack convention), with the one path rule of every report
    (:func:`omniprof.analysis.calltree.frame_where`: relative to the working directory, to
    ``site-packages`` or to the standard library). Native frames show their module."""
    if fmt == "function" or frame.kind == "span":
        return frame.name or "?"
    where = calltree.frame_where(frame, line=fmt == "function_line")
    return f"{frame.name or '?'} ({where})" if where else (frame.name or "?")


# -- spans ---------------------------------------------------------------------------------------
@attrs.frozen
class Lane:
    """Properly nested spans of one track: ``track`` id, display ``name``, ``index`` (0 for the
    track's first lane, 1.. for the overlap lanes), spans in start order with their ``depth`` and
    ``parent`` (index into ``spans``, -1 for top level)."""

    track: str
    name: str
    index: int
    spans: tuple[Span, ...]
    depth: tuple[int, ...]
    parent: tuple[int, ...]


def span_lanes(part: BackendResult, nested: Nest | None = None) -> tuple[list[Lane], int]:
    """Split each track's spans into properly nested lanes, by the one nesting rule.

    :func:`omniprof.analysis.nesting.nest` decides each span's parent (``nested``: the caller's,
    if it has one); a span is drawn in its parent's lane, under it. A top-level span goes to the
    first lane free at its start, a new one if none is: a span that overlaps another without nesting
    in it (B[5,15) beside A[0,10)) gets an overlap lane, and what nests in it is drawn there,
    under it. Only a span whose siblings overlap it inside one parent cannot be drawn under that
    parent; it is drawn at the top of another lane. Returns the lanes and how many spans went to an
    overlap lane.
    """
    lanes, moved, _ = _span_lanes(part, nested if nested is not None else nest(part.spans, SPANS))
    return lanes, moved


def _span_lanes(part: BackendResult, nested: Nest) -> tuple[list[Lane], int, dict[int, str]]:
    """:func:`span_lanes`, and the name of each span's lane (by index in ``part.spans``)."""
    names = {t.id: t.name for t in part.tracks}
    lane_of: dict[int, str] = {}
    by_track: dict[str, list[int]] = {}
    for i in nested.order:  # each track's spans in nesting order: a parent before its children
        by_track.setdefault(part.spans[i].track, []).append(i)
    lanes: list[Lane] = []
    moved = 0
    order = {tid: i for i, tid in enumerate(names)}
    for track in sorted(by_track, key=lambda t: (order.get(t, len(order)), t)):
        placed_in = _place_lanes(part.spans, by_track[track], nested.parent)
        n_lanes = max((lane for lane, _, _ in placed_in.values()), default=-1) + 1
        lane_spans: list[list[Span]] = [[] for _ in range(n_lanes)]
        lane_depth: list[list[int]] = [[] for _ in range(n_lanes)]
        lane_parent: list[list[int]] = [[] for _ in range(n_lanes)]
        position: dict[int, int] = {}  # index of each span within its lane
        for i in by_track[track]:
            lane, depth, parent = placed_in[i]
            position[i] = len(lane_spans[lane])
            lane_parent[lane].append(position[parent] if parent >= 0 else -1)
            lane_depth[lane].append(depth)
            lane_spans[lane].append(part.spans[i])
            moved += lane > 0
        base = names.get(track, track)
        for k in range(n_lanes):
            lanes.append(Lane(track, base if k == 0 else f"{base} (overlap {k})", k, tuple(lane_spans[k]),
                              tuple(lane_depth[k]), tuple(lane_parent[k])))
        for i in by_track[track]:
            k = placed_in[i][0]
            lane_of[i] = base if k == 0 else f"{base} (overlap {k})"
    return lanes, moved, lane_of


def _place_lanes(spans: Sequence[Span], idx: list[int], parent: list[int]) -> dict[int, tuple[int, int, int]]:
    """Per span of one track (``idx``, in nesting order): ``(lane, depth, parent drawn)``. A span
    goes under its parent when it nests there; else to the lowest-numbered lane with nothing open
    at its start (found in O(log lanes) with two heaps), or a new lane."""
    lanes: list[Nesting] = []
    bottom: list[tuple[int, int]] = []  # (end of the lane's outermost open span, lane): lanes in use
    free: list[int] = []  # lanes with nothing open at the current start
    out: dict[int, tuple[int, int, int]] = {}
    for i in idx:
        s = spans[i]
        p = parent[i]
        if p >= 0:
            k = out[p][0]
            lane = lanes[k]
            while lane.ends and lane.ends[-1] <= s.start_ns:  # closed at this start (starts only grow)
                lane.ends.pop()
                lane.ids.pop()
            if lane.ids and lane.ids[-1] == p and s.end_ns <= lane.ends[-1]:
                out[i] = (k, lane.place(s.start_ns, s.end_ns, i), p)
                continue
        while bottom and bottom[0][0] <= s.start_ns:
            heapq.heappush(free, heapq.heappop(bottom)[1])
        if free:
            k = heapq.heappop(free)
        else:
            k = len(lanes)
            lanes.append(Nesting())
        lanes[k].place(s.start_ns, s.end_ns, i)  # nothing is open there: it is the lane's top level
        heapq.heappush(bottom, (s.end_ns, k))
        out[i] = (k, 0, -1)
    return out


def _span_frame(s: Span) -> Frame:
    return Frame(name=s.name, file="", line=0, module=s.category or None, kind="span")


def _span_records(pp: PlacedPart, root: StackNode) -> tuple[list[StackRecord], int]:
    """One record per span: its stack (its ancestors by the one nesting rule, outermost first: a
    node of ``root``'s tree), its lane's name, and its self time
    (:meth:`omniprof.analysis.nesting.Nest.self_ns`, the figure every view gives)."""
    spans = pp.part.spans
    nested = nest(spans, SPANS)
    lanes, moved, lane_of = _span_lanes(pp.part, nested)
    frame_cache: dict[tuple[str, str], Frame] = {}
    nodes: dict[int, StackNode] = {}
    out = []
    for i in nested.order:  # parents before their children: a child is one step below its parent
        s = spans[i]
        key = (s.name, s.category)
        frame = frame_cache.get(key)
        if frame is None:
            frame = frame_cache[key] = _span_frame(s)
        p = nested.parent[i]
        node = nodes[i] = (nodes[p] if p >= 0 else root).child(frame)
        # Floored at 0: only siblings that overlap inside one parent (torch subtracts both) go below.
        out.append(StackRecord(node, lane_of[i], (1, max(0, nested.self_ns(i))), pp.at(s.start_ns)))
    return out, moved


# -- samples and allocations ----------------------------------------------------------------------
def _thread_names(part: BackendResult) -> dict[int, str]:
    return {t.thread_id: t.name for t in part.threads}


def _task_names(part: BackendResult) -> dict[int, str]:
    return {t.task_id: t.name for t in part.tasks}


def _prefix(result: ProfileResult, part: BackendResult, thread: str) -> str:
    return f"{part.backend}: {thread}" if len(result.parts) > 1 else thread


def stack_profile(result: ProfileResult, source: str = "auto", *, aggregate: bool = False,
                  warn: bool = True) -> StackProfile:
    """The weighted stacks of ``source`` (``"samples"``, ``"spans"``, ``"allocations"`` or ``"auto"``)
    across every part of ``result``.

    With ``aggregate``, samples and allocations with the same stack, thread and task become one
    record with summed values, aggregated by the one call tree
    (:func:`omniprof.analysis.calltree.sample_stacks`, :func:`~omniprof.analysis.calltree.allocation_stacks`):
    what pprof and folded stacks need, and much faster on long runs. Without it there is one record
    per sample, in time order (speedscope's timeline). Times are on the run's time axis
    (:func:`omniprof.analysis.timeline.time_axis`). Records whose ``stack_id`` is not in the part's
    stack table are skipped, counted in ``skipped`` and warned about
    (:class:`~omniprof.errors.DataLossWarning`).
    """
    source = pick_source(result, source)
    axis = time_axis(result)
    root = StackNode(None, None)
    records: list[StackRecord] = []
    bad = 0
    moved = 0
    negative = 0
    periods: list[int] = []
    weights: list[int] = []
    for pp in placed(result, axis):
        part = pp.part
        threads = _thread_names(part)
        n_stacks = len(part.stacks)
        stack_cache: dict[int, StackNode] = {}

        def node_of(sid: int) -> StackNode:
            node = stack_cache.get(sid)
            if node is None:
                node = stack_cache[sid] = root.path(part.stack_frames(sid))
            return node

        if source == "samples":
            tasks = _task_names(part)
            over = part.summaries.get("overhead") or {}
            interval = over.get("interval_s")
            if isinstance(interval, (int, float)) and interval > 0:
                periods.append(round(interval * 1e9))
            names = {tid: _prefix(result, part, n) for tid, n in threads.items()}

            def thread_of(tid: int | None) -> str:
                return names.get(tid) or _prefix(result, part, f"thread {tid}")  # type: ignore[arg-type]

            def labels_of(task: int | None) -> tuple[tuple[str, str], ...]:
                return (("task", tasks.get(task, f"task {task}")),) if task is not None else ()

            valid = [smp for smp in part.samples if 0 <= smp.stack_id < n_stacks]
            bad += len(part.samples) - len(valid)
            # a negative weight is invalid from the backend; a viewer cannot draw negative time
            negative += sum(1 for smp in valid if smp.weight_ns < 0)
            weights.extend(max(smp.weight_ns, 0) for smp in valid)
            if aggregate:
                records.extend(StackRecord(root.path(st.frames), thread_of(st.thread_id), (st.count, st.weight), None,
                                           labels_of(st.task_id)) for st in calltree.sample_stacks(part))
            else:
                records.extend(StackRecord(node_of(smp.stack_id), thread_of(smp.thread_id),
                                           (1, max(smp.weight_ns, 0)), pp.at(smp.t_ns), labels_of(smp.task_id))
                               for smp in sorted(valid, key=lambda x: x.t_ns))
        elif source == "allocations":
            def alloc_thread(tid: int | None) -> str:
                name = threads.get(tid, f"thread {tid}") if tid is not None else part.backend
                return _prefix(result, part, name)

            valid_allocs = [a for a in part.allocations if 0 <= a.stack_id < n_stacks]
            bad += len(part.allocations) - len(valid_allocs)
            if aggregate:
                live = {(st.thread_id, st.frames): st for st in calltree.allocation_stacks(part, alive_only=True)}
                for st in calltree.allocation_stacks(part):
                    lv = live.get((st.thread_id, st.frames))
                    records.append(StackRecord(root.path(st.frames), alloc_thread(st.thread_id),
                                               (st.count, st.weight, lv.count if lv else 0, lv.weight if lv else 0)))
            else:
                for a in sorted(valid_allocs, key=lambda x: x.t_ns):
                    live_n = a.count if a.alive_at_end else 0
                    records.append(StackRecord(node_of(a.stack_id), alloc_thread(a.thread_id),
                                               (a.count, a.size_bytes * a.count, live_n, a.size_bytes * live_n),
                                               pp.at(a.t_ns)))
        else:
            recs, m = _span_records(pp, root)
            moved += m
            records.extend(attrs.evolve(r, thread=_prefix(result, part, r.thread)) for r in recs)
    skipped = {f"{source}_with_unknown_stack": bad} if bad else {}
    if bad and warn:
        warnings.warn(f"{bad} {source} refer to stacks missing from the result and were left out of the report",
                      DataLossWarning, stacklevel=3)
    if source == "samples":
        types, default = SAMPLE_TYPES, 1
        period = _median(periods) or _median(weights) or 1
    elif source == "allocations":
        types, default, period = ALLOC_TYPES, 3, 1
    else:
        types, default, period = SPAN_TYPES, 1, 1
    adjustments = {"spans_moved_to_overlap_lane": moved} if moved else {}
    if negative:
        adjustments["negative_weights_set_to_zero"] = negative
    return StackProfile(source, types, default, tuple(records), period, adjustments, skipped)


def _median(values: Sequence[int]) -> int:
    if not values:
        return 0
    ordered = sorted(values)
    return int(ordered[len(ordered) // 2])
