"""The one event stream: every event of a trace as plain tuples, in file order, every decision
both encoders share taken once."""

from __future__ import annotations

import itertools
import math
import operator
import types
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import attrs

from omniprof.analysis.timeline import Nesting, PlacedPart, nest_lanes, placed, time_axis
from omniprof.core.results import BackendResult, CounterSeries, ProfileResult
from omniprof.errors import DataLossWarning
from omniprof.reporters.perfetto.layout import Layout, TrackRow, layout
from omniprof.reporters.perfetto.options import PerfettoOptions

__all__ = ["events", "expected_counts", "SliceKey", "EMPTY_STACK", "META", "TRACK", "SLICE", "FLOW", "INSTANT",
           "COUNTER", "MAPPING", "FRAME", "STACK", "SAMPLE"]

_INF = float("inf")
EMPTY_STACK = "<no frames>"  # the frame name shown for a sample whose stack was empty


# -- the event stream: one walk, every decision made once ----------------------------------------
# An event is a plain tuple whose first item is its kind. In the order :func:`events` yields them:
#   (META, other_data)                          first: the run's metadata (dict) for the file's header
#   (TRACK, row)                                a TrackRow; every track is announced before any event on it
#   (SLICE, key, start_ns, end_ns, args, flows) a span on key.row; ``flows``: None, or the ids of the
#                                               links it is an end of (leaving ones first)
#   (FLOW, link, name, category, from_row, from_ns, to_row, to_ns)
#                                               one arrow, after its part's slices, by link id
#   (INSTANT, row, t_ns, name, category, args)
#   (COUNTER, row, t_ns, value)                 finite values only
#   (MAPPING, mapping_id, path)                 sampled stacks: the file or module frames belong to,
#   (FRAME, frame_id, name, line, mapping_id)   their frames,
#   (STACK, stack_id, frame_ids)                and their stacks (root first, never empty),
#   (SAMPLE, row, t_ns, stack_id, weight_ns)    each before the first sample that uses it
# Times are on the trace's axis (no time is negative), ``args`` is empty where args are not written,
# and ids are unique across the whole trace.
META, TRACK, SLICE, FLOW, INSTANT, COUNTER = "meta", "track", "slice", "flow", "instant", "counter"
MAPPING, FRAME, STACK, SAMPLE = "mapping", "frame", "stack", "sample"
_NO_ARGS: Mapping[str, Any] = types.MappingProxyType({})
_FLOW_IDS = operator.attrgetter("flow_ids")


@attrs.frozen(eq=False)
class SliceKey:
    """What slices share: their track, name and category. The stream makes one per (track, name,
    category) of a part and every ``SLICE`` event refers to it, so an encoder can keep what it
    derives from a key (encoded bytes, JSON text) by the key's identity."""

    row: TrackRow
    name: str
    category: str


def events(result: ProfileResult, options: PerfettoOptions | None = None) -> Iterator[tuple[Any, ...]]:
    """Every event of the trace of ``result``, in file order (see the table above).

    The decisions both encoders share are taken here, once: the tracks (:func:`layout`), the time
    axis (:func:`omniprof.analysis.timeline.time_axis` with ``origin="reference"``: each part's
    clock offset, and the whole trace moved later where an offset puts data before 0; parts are
    read through :func:`omniprof.analysis.timeline.placed`), the overflow lanes that keep every
    slice track properly nested, which spans a flow links, what the options leave out, and what is
    dropped or mended with a warning that counts it (non-finite counter values, negative durations
    and weights).

    Per part: its slices (those that do not nest on their track afterwards, on overflow lanes),
    its flows, instants, counter values and samples. The slice loop is the hot loop, written
    here rather than in a helper so that no generator delegates its events. The nesting check of
    :class:`omniprof.analysis.timeline.Nesting` is inlined: per Perfetto track (shared by parts
    on one OS thread) a stack of open ends with an infinite sentinel at the bottom, and the
    track's last start in a one-element list.
    """
    o = options or PerfettoOptions()
    lay = layout(result)
    yield META, _other_data(result)
    yield from _announce(lay, 0)
    links = itertools.count(1)
    nesting: dict[int, tuple[list[Any], list[int]]] = {}
    lane_state: dict[int, list[Nesting]] = {}
    mended = {"durations": 0, "weights": 0}
    include_args = o.include_args
    for pp in placed(result, time_axis(result, origin="reference")):
        pi, part = pp.index, pp.part
        roles, labels = _flow_roles(part, links) if o.include_flows else ({}, {})
        ends: dict[int, list[Any]] = {}  # link -> [from_row, from_ns, to_row, to_ns]
        keys: dict[tuple[str, str, str], tuple[SliceKey, list[Any], list[int]]] = {}
        deferred: dict[int, list[tuple[int, int, int]]] = {}
        for si, s, start, end in pp.spans():
            k = keys.get((s.track, s.name, s.category))
            if k is None:
                known = len(lay.tracks)
                row = _row_for(lay, pi, s.track)
                yield from _announce(lay, known)
                state = nesting.get(row.uuid)
                if state is None:
                    state = nesting[row.uuid] = ([_INF], [-(1 << 63)])
                k = keys[(s.track, s.name, s.category)] = (SliceKey(row, s.name, s.category), *state)
            key, open_ends, last = k
            if end < start:
                mended["durations"] += 1
                end = start
            if start < last[0]:
                deferred.setdefault(key.row.uuid, []).append((start, end, si))
                continue
            while open_ends[-1] <= start:
                open_ends.pop()
            if end > open_ends[-1]:
                deferred.setdefault(key.row.uuid, []).append((start, end, si))
                continue
            open_ends.append(end)
            last[0] = start
            yield (SLICE, key, start, end, s.args if include_args else _NO_ARGS,
                   _slice_links(roles, ends, si, key.row, start) if roles else None)
        yield from _lane_slices(lay, part, deferred, lane_state, roles, ends, include_args)
        # After the part's slices, by link id: readers sort by time, keeping file order on ties, so a
        # link whose ends start at the same instant still begins before it ends.
        for link in sorted(ends):
            yield (FLOW, link, *labels[link], *ends[link])
        if o.include_instants:
            for ins, t in pp.instants():
                known = len(lay.tracks)
                row = _row_for(lay, pi, ins.track)
                yield from _announce(lay, known)
                yield INSTANT, row, t, ins.name, ins.category, ins.args if include_args else _NO_ARGS
        if o.include_counters:
            for ci, series in enumerate(part.counters):
                row = lay.counter_tracks[(pi, ci)]
                for t, value in _finite_points(series, pp):
                    yield COUNTER, row, t, value
        if o.include_samples and part.samples:
            yield from _sample_events(lay, pp, mended)
    if mended["durations"] or mended["weights"]:
        warnings.warn(DataLossWarning(
            f"perfetto: {mended['durations']} span(s) with a negative duration written with duration 0, "
            f"{mended['weights']} sample(s) with a negative weight written with weight 0 (the result is damaged)"),
            stacklevel=2)


def _announce(lay: Layout, known: int) -> Iterator[tuple[Any, ...]]:
    """TRACK events for the layout's tracks from index ``known`` on."""
    return ((TRACK, row) for row in lay.tracks[known:])


def _lane_slices(lay: Layout, part: BackendResult, deferred: dict[int, list[tuple[int, int, int]]],
                 lane_state: dict[int, list[Nesting]], roles: dict[int, tuple[list[int], list[int]]],
                 ends: dict[int, list[Any]], include_args: bool) -> Iterator[tuple[Any, ...]]:
    """The slices that did not nest on their track, on overflow lanes (each new lane announced)."""
    lane_keys: dict[tuple[int, str, str], SliceKey] = {}
    for base_uuid, items in deferred.items():
        known = len(lay.tracks)
        for row, start, end, si in _assign_lanes(items, lay, lay.tracks[base_uuid - 1], lane_state):
            if len(lay.tracks) > known:
                yield from _announce(lay, known)
                known = len(lay.tracks)
            s = part.spans[si]
            lk = (row.uuid, s.name, s.category)
            key = lane_keys.get(lk)
            if key is None:
                key = lane_keys[lk] = SliceKey(row, s.name, s.category)
            yield (SLICE, key, start, end, s.args if include_args else _NO_ARGS,
                   _slice_links(roles, ends, si, row, start) if roles else None)


def _slice_links(roles: dict[int, tuple[list[int], list[int]]], ends: dict[int, list[Any]], si: int,
                 row: TrackRow, start: int) -> tuple[int, ...] | None:
    """The link ids of span ``si``'s flows (leaving, then arriving; None: it has none), each noted
    in ``ends`` as leaving or arriving at ``row`` at ``start``, where the slice is written."""
    role = roles.get(si)
    if role is None:
        return None
    for f in role[0]:
        ends.setdefault(f, [None, 0, None, 0])[0:2] = row, start
    for f in role[1]:
        ends.setdefault(f, [None, 0, None, 0])[2:4] = row, start
    return (*role[0], *role[1])


def _flow_roles(part: BackendResult, links: Iterator[int]
                ) -> tuple[dict[int, tuple[list[int], list[int]]], dict[int, tuple[str, str]]]:
    """span index -> (ids of links leaving it, ids of links arriving at it), and each link's
    (name, category) from the part's ``Flow`` entries ("flow" where it has none).

    Spans sharing a ``Flow`` id are chained in start order; each consecutive pair is one link with
    its own trace-wide id (from ``links``), so a chain of k spans shows as k-1 arrows in both
    formats. A flow id on one span alone links nothing and writes nothing.
    """
    named = {f.flow_id: f for f in part.flows}
    members: dict[int, list[tuple[int, int]]] = {}
    spans = part.spans
    for si in itertools.compress(itertools.count(), map(_FLOW_IDS, spans)):  # the spans with flow ids, at C speed
        s = spans[si]
        for f in s.flow_ids:
            members.setdefault(f, []).append((s.start_ns, si))
    roles: dict[int, tuple[list[int], list[int]]] = {}
    labels: dict[int, tuple[str, str]] = {}
    for fid, spans in members.items():
        spans.sort()
        flow = named.get(fid)
        label = (flow.name if flow and flow.name else "flow", flow.category if flow and flow.category else "flow")
        for (_, a), (_, b) in zip(spans, spans[1:]):
            link = next(links)
            labels[link] = label
            roles.setdefault(a, ([], []))[0].append(link)
            roles.setdefault(b, ([], []))[1].append(link)
    return roles, labels


def _assign_lanes(deferred: list[tuple[int, int, int]], lay: Layout, base: TrackRow,
                  lane_state: dict[int, list[Nesting]]) -> Iterator[tuple[TrackRow, int, int, int]]:
    """Place spans ``(start, end, index)`` that did not fit ``base`` onto overflow lanes 2, 3, ...
    (sorted, nested): ``(lane row, start, end, index)``.

    ``lane_state`` keeps each lane's nesting across parts, so parts sharing a track never
    overlap on a lane either.
    """
    deferred.sort(key=lambda x: (x[0], -x[1]))
    lanes = lane_state.setdefault(base.uuid, [])
    for (lane, _, _), (start, end, si) in zip(nest_lanes([(start, end) for start, end, _ in deferred], lanes), deferred):
        yield lay.lane(base, lane + 2), start, end, si


def _row_for(lay: Layout, pi: int, track_id: str) -> TrackRow:
    row = lay.span_tracks.get((pi, track_id))
    if row is None:
        # A span/instant on a track the part did not declare: give it a named track of its own.
        row = lay.span_tracks[(pi, track_id)] = lay.named(lay.tracks[0], track_id)
    return row


def _finite_points(series: CounterSeries, pp: PlacedPart) -> Iterator[tuple[int, float]]:
    """The (t, value) points of a counter series that a counter track can hold.

    NaN and infinities (a reading that failed) have no place on a counter track in either
    format; they are left out with a DataLossWarning that counts them.
    """
    bad = sum(1 for v in series.values if not math.isfinite(v))
    if bad:
        warnings.warn(DataLossWarning(f"perfetto: {bad} non-finite value(s) of counter {series.name!r} are not "
                                      f"written (a counter track holds finite numbers only)"), stacklevel=4)
        return ((t, v) for t, v in pp.points(series) if math.isfinite(v))
    return pp.points(series)


def _sample_events(lay: Layout, pp: PlacedPart, mended: dict[str, int]) -> Iterator[tuple[Any, ...]]:
    """A part's sampled stacks: the mappings, frames and stacks its samples use, then the samples.

    Ids are offset per part so several parts never clash. A sample whose stack is empty, or
    whose stack id is out of range, gets a stack of one pseudo-frame (``EMPTY_STACK``), so the
    sample (and its weight) stays visible: Perfetto rejects an empty callstack
    (``stackprofile_empty_callstack``).
    """
    pi, part = pp.index, pp.part
    base = (pi + 1) << 32
    n_stacks = len(part.stacks)
    used = sorted({s.stack_id for s in part.samples if 0 <= s.stack_id < n_stacks})
    frame_ids = sorted({f for sid in used for f in part.stacks[sid] if 0 <= f < len(part.frames)})
    mapping_of: dict[str, int] = {}
    for fi in frame_ids:
        fr = part.frames[fi]
        path = fr.file or fr.module or fr.kind
        mid = mapping_of.get(path)
        if mid is None:
            mid = mapping_of[path] = base + len(mapping_of) + 1
            yield MAPPING, mid, path
        yield FRAME, base + fi + 1, fr.name, fr.line, mid
    valid_frames = set(frame_ids)
    empty_frame = base + len(part.frames) + 1
    unknown_sid = n_stacks  # the stack of a sample whose stack id is out of range
    if any(not 0 <= s.stack_id < n_stacks for s in part.samples):
        used.append(unknown_sid)
    made_empty = False
    for sid in used:
        frames = [base + f + 1 for f in part.stacks[sid] if f in valid_frames] if sid != unknown_sid else []
        if not frames:
            if not made_empty:
                made_empty = True
                yield MAPPING, empty_frame, "omniprof"
                yield FRAME, empty_frame, EMPTY_STACK, 0, empty_frame
            frames = [empty_frame]
        yield STACK, base + sid + 1, tuple(frames)
    for s, t in pp.samples():
        row = lay.sample_threads.get((pi, s.thread_id))
        if row is None:
            row = lay.sample_threads[(pi, s.thread_id)] = lay.thread(lay.tracks[0], None, part.thread_name(s.thread_id))
            yield TRACK, row
        sid = s.stack_id if 0 <= s.stack_id < n_stacks else unknown_sid
        weight = s.weight_ns
        if weight < 0:
            mended["weights"] += 1
            weight = 0
        yield SAMPLE, row, t, base + sid + 1, weight


def _other_data(result: ProfileResult) -> dict[str, Any]:
    md = result.metadata
    return {"omniprof_schema_version": result.schema_version, "host": md.host, "pid": md.pid,
            "backends": list(md.backends), "label": md.label, "start_unix_ns": md.start_unix_ns}


def expected_counts(result: ProfileResult, options: PerfettoOptions | None = None) -> dict[str, int]:
    """What a reader should find: slices (spans + instants), counter values, flows (arrows),
    samples and tracks' names. Used by tests and the benchmark to check read-back."""
    o = options or PerfettoOptions()
    spans = sum(len(p.spans) for p in result.parts)
    instants = sum(len(p.instants) for p in result.parts) if o.include_instants else 0
    counters = sum(sum(1 for v in c.values if math.isfinite(v)) for p in result.parts for c in p.counters) \
        if o.include_counters else 0
    samples = sum(len(p.samples) for p in result.parts) if o.include_samples else 0
    flows = 0
    if o.include_flows:
        for p in result.parts:
            per: dict[int, int] = {}
            for s in p.spans:
                for f in s.flow_ids:
                    per[f] = per.get(f, 0) + 1
            flows += sum(n - 1 for n in per.values() if n >= 2)
    return {"slices": spans + instants, "spans": spans, "instants": instants, "counter_values": counters,
            "flows": flows, "samples": samples}


