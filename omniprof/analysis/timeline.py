"""One timeline from several backends: every part's times moved onto the run's reference clock.

Each :class:`~omniprof.core.results.BackendResult` keeps its own clock; ``t + part.clock.offset_ns``
is the same instant on the reference clock (the Profiler's ``perf_counter_ns``). A backend whose
native timestamps use another clock (``time.monotonic_ns``, CUPTI, a device clock) measures that
offset once with :func:`measure_offset` and stores it in its ``ClockInfo``.

There is one way here to read a part on a time axis: :func:`placed` gives each part as a
:class:`PlacedPart`, whose iterators yield the part's spans (each track in start order), instants,
counter points, samples and allocations with ``t + offset`` already applied, lazily, without
copying the part (``at(t)`` places one time, for a writer that walks a part its own way). :func:`time_axis` chooses the
offsets a writer uses (each part's clock offset, moved so that nothing falls before 0); by default
they are the clock offsets themselves (the reference clock). The Perfetto reporter's event stream
walks parts through it, and :func:`merge` materialises the same iterators into one sorted
:class:`Timeline` (track ids prefixed with the backend name so parts never collide): the copy costs
memory per event, which a streaming writer does not pay.

>>> from omniprof.core.results import BackendResult, ClockInfo, ProfileResult, Span, Track
>>> a = BackendResult(backend="cpu", tracks=[Track("t", "main")], spans=[Span("x", "t", 100, 10)])
>>> b = BackendResult(backend="dev", clock=ClockInfo("device", offset_ns=1000),
...                   tracks=[Track("t", "stream")], spans=[Span("k", "t", -895, 5)])
>>> [(s.track, s.start_ns) for s in merge(ProfileResult(parts=(a, b))).spans]
[('cpu/t', 100), ('dev/t', 105)]

.. versionadded:: 0.1
"""

from __future__ import annotations

import heapq
import itertools
import operator
from collections.abc import Callable, Iterable, Iterator, Sequence

import attrs

from omniprof.core.clock import Clock
from omniprof.core.results import (
    Allocation,
    BackendResult,
    CounterSeries,
    Instant,
    ProfileResult,
    Span,
    StackSample,
    Track,
)
from omniprof.errors import InvalidArgumentError

__all__ = [
    "Timeline", "merge", "measure_offset", "Nesting", "nest_lanes", "time_axis",
    "TimeAxis", "time_bounds", "PlacedPart", "placed", "track_order",
]


@attrs.frozen
class Timeline:
    """Spans, instants and counters of every part on the reference clock, sorted by time.

    Attributes:
        tracks: every part's tracks, ids prefixed ``"<backend>/"`` (``"rank<N>/<backend>/"`` for the
            parts of a merged distributed result).
        spans, instants, counters: the parts' data with times shifted and tracks renamed.
        start_ns, end_ns: the earliest part start and the latest part end, on the reference clock.
        parts: ``backend`` (or ``rank<N>/backend``) ``-> (start_ns, end_ns)`` of each part on the
            reference clock.
    """

    tracks: tuple[Track, ...]
    spans: tuple[Span, ...]
    instants: tuple[Instant, ...]
    counters: tuple[CounterSeries, ...]
    start_ns: int
    end_ns: int
    parts: dict[str, tuple[int, int]]


def merge(result: ProfileResult) -> Timeline:
    """Put every part of ``result`` on one timeline (the reference clock): :func:`placed` with the
    parts' own clock offsets, materialised and sorted (spans by start, longest first, then track)."""
    tracks: list[Track] = []
    spans: list[Span] = []
    instants: list[Instant] = []
    counters: list[CounterSeries] = []
    bounds: dict[str, tuple[int, int]] = {}
    evolve = attrs.evolve
    for pp in placed(result):
        part = pp.part
        # Parts of a merged distributed result carry their rank: rank N's tracks are "rank<N>/<backend>/...".
        pre = f"rank{part.metadata['rank']}/{part.backend}/" if "rank" in part.metadata else f"{part.backend}/"
        tracks += [evolve(t, id=pre + t.id) for t in part.tracks]
        spans += [evolve(s, track=pre + s.track, start_ns=start) for _, s, start, _ in pp.spans()]
        instants += [evolve(i, track=pre + i.track, t_ns=t) for i, t in pp.instants()]
        counters += [evolve(c, track=pre + c.track, t_ns=tuple(t for t, _ in pp.points(c))) for c in part.counters]
        if pp.bounds is not None:
            bounds[pre[:-1]] = pp.bounds
    spans.sort(key=lambda s: (s.start_ns, -s.dur_ns, s.track))
    instants.sort(key=lambda i: (i.t_ns, i.track))
    starts = [b[0] for b in bounds.values()]
    ends = [b[1] for b in bounds.values()]
    return Timeline(tuple(tracks), tuple(spans), tuple(instants), tuple(counters),
                    min(starts) if starts else 0, max(ends) if ends else 0, bounds)


@attrs.frozen
class PlacedPart:
    """One part read on a time axis: every time its iterators yield is the part's own time plus
    ``offset_ns``, added here and nowhere else. Nothing is copied; each call walks the part afresh.

    Attributes:
        index: the part's position among the parts given to :func:`placed` (all of ``result.parts`` by default).
        part: the part itself (its own clock).
        offset_ns: what is added to each of its times (:func:`placed`).
    """

    index: int
    part: BackendResult
    offset_ns: int

    def at(self, t_ns: int) -> int:
        """One of the part's own times on the axis (for a writer that walks the part its own way)."""
        return t_ns + self.offset_ns

    @property
    def bounds(self) -> tuple[int, int] | None:
        """The session's ``(start_ns, end_ns)`` on the axis; None when the part has none."""
        p = self.part
        return (p.start_ns + self.offset_ns, p.end_ns + self.offset_ns) if p.start_ns or p.end_ns else None

    def spans(self) -> Iterator[tuple[int, Span, int, int]]:
        """``(index in part.spans, span, start, end)`` on the axis, each track's spans in start order
        as :func:`track_order` visits them."""
        off = self.offset_ns
        for i, s in track_order(self.part.spans):
            start = s.start_ns + off
            yield i, s, start, start + s.dur_ns

    def instants(self) -> Iterator[tuple[Instant, int]]:
        """``(instant, t)`` on the axis, in the part's order."""
        off = self.offset_ns
        return ((i, i.t_ns + off) for i in self.part.instants)

    def points(self, series: CounterSeries) -> Iterator[tuple[int, float]]:
        """``(t, value)`` of one of the part's counter series, on the axis."""
        return zip(map(self.offset_ns.__add__, series.t_ns), series.values)

    def samples(self) -> Iterator[tuple[StackSample, int]]:
        """``(sample, t)`` on the axis, in the part's order."""
        off = self.offset_ns
        return ((s, s.t_ns + off) for s in self.part.samples)

    def allocations(self) -> Iterator[tuple[Allocation, int]]:
        """``(allocation, t)`` on the axis, in the part's order."""
        off = self.offset_ns
        return ((a, a.t_ns + off) for a in self.part.allocations)


def placed(result: ProfileResult, axis: TimeAxis | None = None,
           parts: Sequence[BackendResult] | None = None) -> list[PlacedPart]:
    """Every part of ``result`` (or of ``parts``, a selection of them) on one time axis:
    ``axis.offsets`` (from :func:`time_axis` for the same parts), or by default each part's own
    ``clock.offset_ns`` (the reference clock itself, where times may be negative). ``index`` is the
    part's position in ``parts``.

    >>> from omniprof.core.results import BackendResult, ClockInfo, Span
    >>> b = BackendResult(backend="b", clock=ClockInfo("dev", offset_ns=-300), spans=[Span("k", "t", 250, 5)])
    >>> r = ProfileResult(parts=(b,))
    >>> [(s.name, start, end) for _, s, start, end in placed(r)[0].spans()]
    [('k', -50, -45)]
    >>> [(s.name, start, end) for _, s, start, end in placed(r, time_axis(r, origin="reference"))[0].spans()]
    [('k', 0, 5)]
    """
    parts = tuple(result.parts if parts is None else parts)
    if axis is None:
        return [PlacedPart(i, p, p.clock.offset_ns) for i, p in enumerate(parts)]
    if len(axis.offsets) != len(parts):
        raise InvalidArgumentError(f"the time axis has {len(axis.offsets)} offsets for {len(parts)} parts: "
                                   f"make it with time_axis(result, parts) for the same parts")
    return [PlacedPart(i, p, off) for i, (p, off) in enumerate(zip(parts, axis.offsets))]


def track_order(spans: Sequence[Span]) -> Iterable[tuple[int, Span]]:
    """``(index, span)`` in start order per track: as listed when every track is listed in start
    order, else sorted by start, longer first on equal starts.

    Most results list each track's spans in start order already. That is checked in constant
    memory and mostly at C speed: the places where the list steps back in time are found with
    ``map``; when there are few such sorted runs and no track appears in two of them (tracks
    listed one after another), every track is in order. Otherwise a per-track pass decides, and
    a part that is really out of order (annotations recorded as they close, children before
    parents) is visited through a sorted index, so parents still nest their children instead of
    landing on overflow lanes; that index costs memory per span.

    >>> [s.name for _, s in track_order((Span("child", "t", 20, 5), Span("parent", "t", 10, 50)))]
    ['parent', 'child']
    """
    order = _sorted_index(spans)
    return enumerate(spans) if order is None else ((i, spans[i]) for i in order)


_START = operator.attrgetter("start_ns")
_DUR = operator.attrgetter("dur_ns")
_T = operator.attrgetter("t_ns")
_WEIGHT = operator.attrgetter("weight_ns")


def _sorted_index(spans: Sequence[Span]) -> list[int] | None:
    """The indices of ``spans`` sorted by (start, longest first); None when every track's spans
    are listed in start order already (:func:`track_order`)."""
    later = map(_START, spans)
    next(later, None)
    steps_back = itertools.compress(itertools.count(1), map(operator.gt, map(_START, spans), later))
    breaks = list(itertools.islice(steps_back, 65))
    if not breaks:
        return None
    if len(breaks) <= 64:
        track = operator.attrgetter("track")
        seen: set[str] = set()
        bounds = [0, *breaks, len(spans)]
        for a, b in zip(bounds, bounds[1:]):
            tracks = set(map(track, itertools.islice(spans, a, b)))
            if not seen.isdisjoint(tracks):
                break
            seen |= tracks
        else:
            return None
    last: dict[str, int] = {}
    for s in spans:
        t = s.track
        if s.start_ns < last.get(t, s.start_ns):
            break
        last[t] = s.start_ns
    else:
        return None
    return sorted(range(len(spans)), key=lambda i: (spans[i].start_ns, -spans[i].dur_ns))


def measure_offset(own_now_ns: Callable[[], int], reference: Clock, *, rounds: int = 7) -> int:
    """The offset that maps times of clock ``own_now_ns`` onto ``reference``: ``own + offset = ref``.

    Reads ``reference``, then the own clock, then ``reference`` again, ``rounds`` times, and keeps the
    tightest bracket (least disturbed by preemption), taking the own reading to be at its middle.
    """
    best_width, best_offset = -1, 0
    for _ in range(max(1, rounds)):
        r0 = reference.now_ns()
        own = own_now_ns()
        r1 = reference.now_ns()
        if best_width < 0 or r1 - r0 < best_width:
            best_width, best_offset = r1 - r0, (r0 + r1) // 2 - own
    return best_offset


def time_bounds(result: ProfileResult, parts: Sequence[BackendResult] | None = None, *,
                include_run: bool = True) -> tuple[int, int] | None:
    """The first and last instant on the reference clock that the run covers: its start and end
    (``RunMetadata.start_ns``/``end_ns``, with ``include_run``) and everything ``parts`` (default:
    all) hold: session bounds, spans, instants, the interval ``(t - weight, t]`` each stack sample
    stands for, allocations and counter samples. None when there is nothing.

    >>> from omniprof.core.results import BackendResult, ClockInfo, RunMetadata, Span, StackSample
    >>> p = BackendResult(backend="dev", clock=ClockInfo("dev", offset_ns=-300), spans=[Span("k", "t", 250, 5)],
    ...                   samples=[StackSample(400, 1, 0, 200)])
    >>> time_bounds(ProfileResult(metadata=RunMetadata(start_ns=100, end_ns=900), parts=(p,)))
    (-100, 900)
    """
    lo: list[int] = []
    hi: list[int] = []
    meta = result.metadata
    if include_run and (meta.start_ns or meta.end_ns):
        lo.append(meta.start_ns)
        hi.append(max(meta.end_ns, meta.start_ns))
    for p in result.parts if parts is None else parts:
        off = p.clock.offset_ns
        if p.start_ns or p.end_ns:
            lo.append(p.start_ns + off)
            hi.append(p.end_ns + off)
        # At C speed (map, min, max) and in constant memory: this runs over every event of the run
        # before a writer starts.
        # A span covers [start, start + max(dur, 0)] and a sample [t - max(weight, 0), t]; the
        # bounds of those are taken as the bounds of the ends with and without the length.
        if p.spans:
            lo.append(min(map(_START, p.spans)) + off)
            hi.append(max(max(map(_START, p.spans)), max(map(operator.add, map(_START, p.spans), map(_DUR, p.spans))))
                      + off)
        for events in (p.instants, p.allocations):
            if events:
                lo.append(min(map(_T, events)) + off)
                hi.append(max(map(_T, events)) + off)
        counter_times = [c.t_ns for c in p.counters if c.t_ns]
        if counter_times:
            lo.append(min(map(min, counter_times)) + off)
            hi.append(max(map(max, counter_times)) + off)
        if p.samples:
            lo.append(min(min(map(_T, p.samples)), min(map(operator.sub, map(_T, p.samples), map(_WEIGHT, p.samples))))
                      + off)
            hi.append(max(map(_T, p.samples)) + off)
    if not lo:
        return None
    return min(lo), max(hi)


@attrs.frozen
class TimeAxis:
    """One time axis for a writer: ``t + offsets[i]`` is part ``i``'s time ``t`` on it.

    Attributes:
        origin_ns: the instant on the reference clock that is 0 on the axis.
        end_ns: the last instant of the run or its data on the axis (0 when there is none).
        offsets: one per part (of the ``parts`` given to :func:`time_axis`): the part's clock
            offset less ``origin_ns``.
    """

    origin_ns: int
    end_ns: int
    offsets: tuple[int, ...]


def time_axis(result: ProfileResult, parts: Sequence[BackendResult] | None = None, *,
              origin: str = "start") -> TimeAxis:
    """The axis every timeline writer puts ``parts`` (default: all of ``result``'s) on: each
    part's clock offset applied once, here, and nothing before 0, so no time is clamped and every
    interval keeps its length.

    ``origin="start"``: 0 is the earliest of the run's start and every time in ``parts``
    (speedscope, XProf, the stack records of pprof and folded stacks). ``origin="reference"``: the
    reference clock itself, moved back only as far as a part's clock offset puts data before 0
    (Perfetto's unsigned timestamps).

    >>> from omniprof.core.results import BackendResult, ClockInfo, RunMetadata, Span
    >>> a = BackendResult(backend="a", spans=[Span("x", "t", 100, 10)])
    >>> b = BackendResult(backend="b", clock=ClockInfo("dev", offset_ns=-300), spans=[Span("k", "t", 250, 5)])
    >>> r = ProfileResult(metadata=RunMetadata(start_ns=90, end_ns=200), parts=(a, b))
    >>> time_axis(r)
    TimeAxis(origin_ns=-50, end_ns=250, offsets=(50, -250))
    >>> time_axis(r, origin="reference")
    TimeAxis(origin_ns=-50, end_ns=250, offsets=(50, -250))
    >>> time_axis(ProfileResult(metadata=RunMetadata(start_ns=90, end_ns=200), parts=(a,)))
    TimeAxis(origin_ns=90, end_ns=110, offsets=(-90,))
    """
    if origin not in ("start", "reference"):
        raise InvalidArgumentError(f"'origin' must be one of start, reference (got {origin!r})")
    parts = tuple(result.parts if parts is None else parts)
    bounds = time_bounds(result, parts)
    first, last = bounds if bounds is not None else (0, 0)
    zero = first if origin == "start" else min(0, first)
    return TimeAxis(zero, last - zero if bounds is not None else 0, tuple(p.clock.offset_ns - zero for p in parts))


class Nesting:
    """One lane of a track: the spans open at the last placed start, innermost last.

    Spans are placed in (start, longest first) order. A span nests when it starts no earlier than
    the last one placed and ends no later than the innermost open span that it starts inside;
    intervals are half-open, so a span starting where another ends follows it.
    """

    __slots__ = ("ends", "ids", "last_start", "parent")

    def __init__(self) -> None:
        self.ends: list[int] = []
        self.ids: list[int] = []
        self.last_start = -(1 << 63)
        self.parent = -1

    def place(self, start: int, end: int, ident: int = -1) -> int:
        """Put ``[start, end)`` here if it nests: its depth (``parent``: the enclosing span's
        ``ident``, -1 at the top); -1 (and nothing changed) if it does not."""
        if start < self.last_start:
            return -1
        ends, ids = self.ends, self.ids
        while ends and ends[-1] <= start:
            ends.pop()
            ids.pop()
        if ends and end > ends[-1]:
            return -1
        self.parent = ids[-1] if ids else -1
        ends.append(end)
        ids.append(ident)
        self.last_start = start
        return len(ends) - 1


def nest_lanes(intervals: Sequence[tuple[int, int]], lanes: list[Nesting] | None = None
               ) -> list[tuple[int, int, int]]:
    """Split intervals ``(start, end)`` of one track into properly nested lanes (the one lane
    algorithm of every timeline writer: Perfetto, speedscope, XProf).

    Taken by start (longest first on ties, then input order), each goes to the first lane where it
    nests (:class:`Nesting`); one that overlaps without nesting everywhere opens a new lane.
    Returns ``(lane, depth, parent)`` per interval in input order, ``parent`` the index of the
    enclosing interval or -1. ``lanes`` carries the lanes over from an earlier call (a track shared
    by several parts).

    The first lane that takes an interval is found in O(log lanes), not by trying each lane in
    turn (quadratic when every interval overlaps the others: 20k of them took a minute). A lane
    takes ``[start, end)`` when its innermost span still open at ``start`` ends at or after
    ``end`` (or none is open), so each lane is keyed by that end in a max-tree over the lanes,
    and the first lane whose key is ``>= end`` is the one the lane-by-lane search would find.
    Keys change only when the innermost open span ends (a heap of those ends, in start order)
    or a span is placed. The lanes are left exactly as the lane-by-lane search leaves them.

    >>> nest_lanes([(0, 10), (2, 5), (5, 12), (20, 21)])
    [(0, 0, -1), (0, 1, 0), (1, 0, -1), (0, 0, -1)]
    """
    lanes = [] if lanes is None else lanes
    n = len(intervals)
    out: list[tuple[int, int, int]] = [(0, 0, -1)] * n
    if not n:
        return out
    order = sorted(range(n), key=lambda k: (intervals[k][0], intervals[k][0] - intervals[k][1], k))
    inf, neg = float("inf"), float("-inf")
    n_before = len(lanes)
    size = 1
    while size < n_before + n:
        size *= 2
    tree: list[float] = [neg] * (2 * size)  # tree[size + j]: lane j's key; inner nodes: max of children
    eff = [0] * (n_before + n)  # per lane: how many of its open ends are > the current start
    version = [0] * (n_before + n)
    expiring: list[tuple[int, int, int]] = []  # (innermost open end, lane, version)
    waiting: list[tuple[int, int]] = []  # carried-over lanes that take nothing before their last start
    first_start = intervals[order[0]][0]

    def set_key(j: int, key: float) -> None:
        i = size + j
        tree[i] = key
        i >>= 1
        while i:
            m = tree[2 * i] if tree[2 * i] >= tree[2 * i + 1] else tree[2 * i + 1]
            if tree[i] == m:
                break
            tree[i] = m
            i >>= 1

    def refresh(j: int, start: int) -> None:
        ends = lanes[j].ends
        e = eff[j]
        while e and ends[e - 1] <= start:
            e -= 1
        eff[j] = e
        version[j] += 1
        if e:
            set_key(j, ends[e - 1])
            heapq.heappush(expiring, (ends[e - 1], j, version[j]))
        else:
            set_key(j, inf)

    for j, lane in enumerate(lanes):
        eff[j] = len(lane.ends)
        if lane.last_start > first_start:
            heapq.heappush(waiting, (lane.last_start, j))
        else:
            refresh(j, first_start)
    active_from = [lane.last_start for lane in lanes]  # a carried-over lane scanned earlier is not popped
    placed_at = [-1] * (n_before + n)  # per lane: the rank (in ``order``) of its last placement here
    chosen = [0] * n  # per rank: the lane taken
    for rank, i in enumerate(order):
        start, end = intervals[i]
        while waiting and waiting[0][0] <= start:
            refresh(heapq.heappop(waiting)[1], start)
        while expiring and expiring[0][0] <= start:
            _, j, ver = heapq.heappop(expiring)
            if ver == version[j]:
                refresh(j, start)
        if tree[1] >= end:
            node = 1
            while node < size:
                node = 2 * node if tree[2 * node] >= end else 2 * node + 1
            k = node - size
        else:
            k = len(lanes)
            lanes.append(Nesting())
            active_from.append(start)
        lane = lanes[k]
        depth = lane.place(start, end, i)
        out[i] = (k, depth, lane.parent)
        chosen[rank] = k
        placed_at[k] = rank
        eff[k] = len(lane.ends)
        version[k] += 1
        set_key(k, end if end > start else inf)
        if end > start:
            heapq.heappush(expiring, (end, k, version[k]))
        else:  # an empty (or reversed) span ends at once: open nothing here
            refresh(k, start)
    # The lane-by-lane search tried every lane before the one taken, dropping the spans that had
    # ended by then from each it tried; leave each lane as that search would.
    tried_last = [-1] * len(lanes)
    covered = -1
    for rank in range(n - 1, -1, -1):
        k = chosen[rank]
        if k - 1 > covered:
            for j in range(covered + 1, k):
                tried_last[j] = rank
            covered = k - 1
    for j, rank in enumerate(tried_last):
        if rank < 0 or rank < placed_at[j]:
            continue
        start = intervals[order[rank]][0]
        if placed_at[j] < 0 and start < active_from[j]:
            continue  # never taken here and not yet open to spans at that start: left as it was
        lane = lanes[j]
        while lane.ends and lane.ends[-1] <= start:
            lane.ends.pop()
            lane.ids.pop()
    return out

