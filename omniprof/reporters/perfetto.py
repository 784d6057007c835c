"""Reporters ``perfetto`` and ``chrome``: timelines that open in Perfetto (ui.perfetto.dev).

``perfetto`` writes the native Perfetto protobuf trace (``trace.perfetto-trace``): a stream of
``TracePacket`` messages carrying ``TrackDescriptor`` (process, thread, device/stream and counter
tracks), ``TrackEvent`` (slices, instants, counter values, flows) and ``PerfSample`` (sampled
stacks, with interned frames and callstacks). ``chrome`` writes the Chrome trace-event JSON
(``trace.json.gz``) that older tools (chrome://tracing, catapult) read; ``perfetto`` with
``format="json"`` writes the same file.

How it is built: one walk, two encoders.

* **Layout first** (:func:`layout`): every result track becomes a Perfetto track with a uuid, a
  process (pid) and, for host threads, a thread (tid). Device and stream tracks become named
  tracks under a process per device; counter series get counter tracks. Tests assert on it.
* **One event stream** (:func:`events`): a generator of plain tuples (tracks, slices, flows,
  instants, counter values, sampled stacks and samples) in file order. Every decision both formats
  share is taken there, once: times on the trace's axis, overflow lanes, flow links, what the
  options leave out, what is dropped or mended (and counted in a warning).
* **Encoders** (:func:`encode_proto`, :func:`encode_json`) only translate events into bytes; the
  proto encoder keeps its fast path (precomputed bytes per slice key, table-made timestamp
  varints, interning) to itself.
* **Lanes**: a slice track must hold properly nested slices. Spans are visited in start order
  per track (:func:`omniprof.analysis.timeline.track_order`); a span that overlaps a sibling
  without nesting moves to an overflow lane (a child track named ``"<track> (lane 2)"``), so
  every span is present and Perfetto reports no import error.
* **Streaming, constant memory**: packets are encoded by hand in the protobuf wire format (field
  numbers from Perfetto's ``perfetto_trace.proto``) and written to the handle in chunks of
  ``chunk_bytes``. Event names, categories and argument names are interned (``InternedData``)
  on one packet sequence that starts with ``SEQ_INCREMENTAL_STATE_CLEARED``; every event packet
  carries ``SEQ_NEEDS_INCREMENTAL_STATE``. Memory grows with the number of distinct names and
  tracks, not with the number of events; only spans that need bookkeeping cost memory each:
  spans carrying flow ids (to chain them), spans moved to lanes, and, for a part not listed in
  start order, the sorted index.
* Timestamps are the run's reference clock, in ns (the JSON has microseconds with three
  decimals, so no precision is lost): each part is read through
  :func:`omniprof.analysis.timeline.placed` on :func:`omniprof.analysis.timeline.time_axis` with
  ``origin="reference"``, so where a part's clock offset puts data before 0 the whole trace moves
  later by the same amount: nothing is clamped. No ``displayTimeUnit`` key is written (some
  Perfetto versions misread it).
"""

from __future__ import annotations

import functools
import gzip
import io
import itertools
import json
import math
import operator
import struct
import types
import warnings
from collections.abc import Iterable, Iterator, Mapping
from typing import IO, Any

import attrs

from omniprof.analysis.timeline import Nesting, PlacedPart, nest_lanes, placed, time_axis
from omniprof.core import validators as v
from omniprof.core.reporter import check_times
from omniprof.core.results import BackendResult, CounterSeries, ProfileResult, Track
from omniprof.errors import DataLossWarning, OmniprofWarning
from omniprof.formats.protowire import f_bytes as _f_bytes
from omniprof.formats.protowire import f_double as _f_double
from omniprof.formats.protowire import f_fixed64 as _f_fixed64
from omniprof.formats.protowire import f_str as _f_str
from omniprof.formats.protowire import f_uint as _f_uint
from omniprof.formats.protowire import tag as _tag
from omniprof.formats.protowire import varint as _varint
from omniprof.plugin import Reporter

__all__ = [
    "PerfettoReporter", "ChromeTraceReporter", "PerfettoOptions", "ChromeTraceOptions", "layout", "Layout",
    "TrackRow", "write_proto", "write_chrome_json", "chrome_events", "expected_counts", "events", "SliceKey",
    "encode_proto", "encode_json",
]

SEQ_ID = 1
_SEQ_CLEARED = 1   # TracePacket.SequenceFlags.SEQ_INCREMENTAL_STATE_CLEARED
_SEQ_NEEDS = 2     # TracePacket.SequenceFlags.SEQ_NEEDS_INCREMENTAL_STATE
_PID_BASE = 10_000_000  # synthetic pids/tids start here: above Linux's pid_max (2**22)

# Practical sizes past which ui.perfetto.dev, running in a browser, usually cannot open a trace:
# the browser gives the page about 2 GB, and the trace processor's in-memory form of a trace is
# 2-4x its protobuf size (perfetto.dev/docs/visualization/large-traces); JSON traces of ~900 MB
# crashed the UI (google/perfetto#99). Uncompressed bytes.
UI_LIMIT_BYTES = {"proto": 1 << 30, "json": 512 << 20}
_INF = float("inf")
EMPTY_STACK = "<no frames>"  # the frame name shown for a sample whose stack was empty


# -- options ------------------------------------------------------------------------------------
def _fmt_validator(inst: Any, attribute: Any, value: Any) -> None:
    v.one_of("proto", "json")(inst, attribute, value)


@attrs.frozen(kw_only=True)
class PerfettoOptions:
    """Options of the ``perfetto`` reporter.

    Attributes:
        format: ``"proto"`` (native Perfetto protobuf, default) or ``"json"`` (Chrome trace JSON).
        compress: gzip the JSON output (default True: ``trace.json.gz``); the protobuf is never gzipped.
        include_args: write span/instant args (debug annotations / JSON ``args``).
        include_counters: write counter series (counter tracks).
        include_samples: write sampled stacks (``PerfSample`` with interned callstacks; in JSON,
            the trace's ``stackFrames`` / ``samples`` arrays).
        include_flows: write flows (CPU launch -> GPU kernel arrows).
        include_instants: write instant events.
        chunk_bytes: bound on the memory the writer buffers between writes to the output handle.
    """

    format: str = attrs.field(default="proto", validator=_fmt_validator)
    compress: bool = attrs.field(default=True, validator=v.is_bool)
    include_args: bool = attrs.field(default=True, validator=v.is_bool)
    include_counters: bool = attrs.field(default=True, validator=v.is_bool)
    include_samples: bool = attrs.field(default=True, validator=v.is_bool)
    include_flows: bool = attrs.field(default=True, validator=v.is_bool)
    include_instants: bool = attrs.field(default=True, validator=v.is_bool)
    chunk_bytes: int = attrs.field(default=1 << 20, validator=v.int_in_range(4096, 1 << 30))


@attrs.frozen(kw_only=True)
class ChromeTraceOptions(PerfettoOptions):
    """Options of the ``chrome`` reporter: those of ``perfetto``, with ``format="json"``."""

    format: str = attrs.field(default="json", validator=_fmt_validator)


class PerfettoReporter(Reporter):
    """A Perfetto timeline: native protobuf (default) or Chrome JSON (``format="json"``).

    >>> import io, omniprof
    >>> from omniprof.testing.fakes import make_result
    >>> buf = io.BytesIO()
    >>> PerfettoReporter().report(make_result(), buf)
    >>> buf.getvalue()[:1] == b"\\x0a"     # a Trace: repeated TracePacket packet = 1
    True

    .. versionadded:: 0.1
    """

    name = "perfetto"
    output = "file"
    default_filename = "trace.perfetto-trace"
    summary = "Perfetto timeline (native protobuf, or Chrome JSON with format=json); omniprof view --perfetto FILE"
    Options = PerfettoOptions

    def __init__(self, options: Any = None) -> None:
        super().__init__(options)
        if self.options.format == "json":
            self.default_filename = "trace.json.gz" if self.options.compress else "trace.json"

    def report(self, result: ProfileResult, dest: IO[bytes]) -> None:  # type: ignore[override]
        check_times(result, self.name)
        if self.options.format == "proto":
            written = write_proto(result, dest, self.options)
        else:
            written = write_chrome_json(result, dest, self.options)
        fmt = self.options.format
        if written > UI_LIMIT_BYTES[fmt]:
            warnings.warn(f"{self.name}: the trace is {written / 2**20:,.0f} MiB ({fmt}), more than ui.perfetto.dev "
                          f"can usually open in a browser (~{UI_LIMIT_BYTES[fmt] >> 20} MiB). Open it with a native "
                          f"trace processor (trace_processor --httpd FILE, then ui.perfetto.dev), or record less "
                          f"(a schedule with fewer active steps, include_samples=false)", OmniprofWarning, stacklevel=2)


class ChromeTraceReporter(PerfettoReporter):
    """Chrome trace-event JSON (``trace.json.gz``) for chrome://tracing, catapult and Perfetto.

    .. versionadded:: 0.1
    """

    name = "chrome"
    default_filename = "trace.json.gz"
    summary = "Chrome trace-event JSON (trace.json.gz) for chrome://tracing and older tools"
    Options = ChromeTraceOptions


# -- layout: tracks, processes, threads ---------------------------------------------------------
@attrs.frozen
class TrackRow:
    """One Perfetto track.

    Attributes:
        uuid: TrackDescriptor.uuid (> 0).
        kind: ``"process"``, ``"thread"``, ``"named"`` (device/stream/other), ``"lane"`` or ``"counter"``.
        name: shown name.
        pid: the process it belongs to. tid: for thread tracks.
        parent_uuid: enclosing track (0: none).
        unit: counter unit (counter tracks).
    """

    uuid: int
    kind: str
    name: str
    pid: int = attrs.field(converter=v.to_int)  # a plain int: JSON gets 1, never True
    tid: int = attrs.field(default=0, converter=v.to_int)
    parent_uuid: int = 0
    unit: str = ""


@attrs.define
class Layout:
    """All tracks of a result, and how each part's track ids, threads and counters map onto them.

    ``span_tracks[(part, track_id)]`` is the TrackRow spans of that track go to;
    ``sample_threads[(part, thread_id)]`` the thread TrackRow of a sampled thread;
    ``counter_tracks[(part, series_index)]`` a counter's TrackRow.
    """

    tracks: list[TrackRow] = attrs.field(factory=list)
    span_tracks: dict[tuple[int, str], TrackRow] = attrs.field(factory=dict)
    sample_threads: dict[tuple[int, int], TrackRow] = attrs.field(factory=dict)
    counter_tracks: dict[tuple[int, int], TrackRow] = attrs.field(factory=dict)
    _procs: dict[tuple[str, int], TrackRow] = attrs.field(factory=dict)
    _threads: dict[tuple[int, int], TrackRow] = attrs.field(factory=dict)
    _lanes: dict[tuple[int, int], TrackRow] = attrs.field(factory=dict)
    _next_synthetic: int = _PID_BASE

    def _uuid(self) -> int:
        return len(self.tracks) + 1

    def synthetic_id(self) -> int:
        self._next_synthetic += 1
        return self._next_synthetic

    def process(self, name: str, pid: int | None) -> TrackRow:
        key = (name, pid if pid is not None else -1)
        row = self._procs.get(key)
        if row is None:
            row = TrackRow(self._uuid(), "process", name, pid if pid is not None else self.synthetic_id())
            self.tracks.append(row)
            self._procs[key] = row
        return row

    def thread(self, proc: TrackRow, tid: int | None, name: str) -> TrackRow:
        tid = tid if tid is not None else self.synthetic_id()
        row = self._threads.get((proc.pid, tid))
        if row is None:
            row = TrackRow(self._uuid(), "thread", name, proc.pid, tid, proc.uuid)
            self.tracks.append(row)
            self._threads[(proc.pid, tid)] = row
        return row

    def named(self, proc: TrackRow, name: str) -> TrackRow:
        # Chrome JSON has no named tracks: these become threads with a synthetic tid there.
        row = TrackRow(self._uuid(), "named", name, proc.pid, self.synthetic_id(), proc.uuid)
        self.tracks.append(row)
        return row

    def counter(self, proc: TrackRow, name: str, unit: str) -> TrackRow:
        row = TrackRow(self._uuid(), "counter", name, proc.pid, 0, proc.uuid, unit)
        self.tracks.append(row)
        return row

    def lane(self, base: TrackRow, n: int) -> TrackRow:
        """Overflow lane ``n`` (2, 3, ...) of slice track ``base``."""
        row = self._lanes.get((base.uuid, n))
        if row is None:
            row = TrackRow(self._uuid(), "lane", f"{base.name} (lane {n})", base.pid, self.synthetic_id(), base.uuid)
            self.tracks.append(row)
            self._lanes[(base.uuid, n)] = row
        return row


def _host_process_name(result: ProfileResult) -> str:
    md = result.metadata
    prog = " ".join(md.argv[:1]) if md.argv else ""
    base = f"python {prog}".strip() if prog else "python"
    return f"{base} ({md.host})" if md.host else base


def _rank_processes(lay: Layout, result: ProfileResult) -> dict[int, TrackRow]:
    """A merged distributed result: one process per rank, ``host / rank N`` (part index -> row).

    A rank keeps its own pid unless another rank (on another host) has the same one; then it gets a
    synthetic pid, since viewers identify processes by pid."""
    out: dict[int, TrackRow] = {}
    by_rank: dict[int, TrackRow] = {}
    used: set[int] = set()
    for pi, part in enumerate(result.parts):
        if "rank" not in part.metadata:
            continue
        rank = int(part.metadata["rank"])
        row = by_rank.get(rank)
        if row is None:
            host = str(part.metadata.get("rank_host") or "")
            pid = part.metadata.get("rank_pid")
            pid = pid if isinstance(pid, int) and pid > 0 and pid not in used else lay.synthetic_id()
            used.add(pid)
            row = by_rank[rank] = lay.process(f"{host} / rank {rank}" if host else f"rank {rank}", pid)
        out[pi] = row
    return out


def layout(result: ProfileResult) -> Layout:
    """Assign every track of every part a Perfetto track (plain data; no encoding).

    The parts of a merged distributed result (``rank`` in their metadata) each go under their
    rank's process, ``host / rank N``: threads as its threads, devices and streams as its named tracks.
    """
    lay = Layout()
    ranks = _rank_processes(lay, result)
    if ranks:
        for pi, part in enumerate(result.parts):
            _rank_layout(lay, pi, part, ranks.get(pi) or lay.process(_host_process_name(result), None))
        return lay
    host_pid = result.metadata.pid or None
    host = lay.process(_host_process_name(result), host_pid)
    for pi, part in enumerate(result.parts):
        counter_owners: dict[str, TrackRow] = {}
        for t in part.tracks:
            if t.kind == "counter":  # a counter-only track: its series go under its process, no slice track
                counter_owners[t.id] = _track_process(lay, result, host, t)
            else:
                lay.span_tracks[(pi, t.id)] = _track_row(lay, result, host, t)
        natives = {t.tid: lay.span_tracks[(pi, t.id)] for t in part.tracks
                   if t.kind == "thread" and t.tid is not None and (t.pid in (None, host_pid))}
        for th in part.threads:
            row = natives.get(th.native_id) if th.native_id is not None else None
            if row is None:
                row = lay.thread(host, th.native_id, th.name)
            lay.sample_threads[(pi, th.thread_id)] = row
        for ci, series in enumerate(part.counters):
            owner = lay.span_tracks.get((pi, series.track))
            proc = counter_owners.get(series.track) or (
                lay.tracks[owner.parent_uuid - 1] if owner is not None and owner.parent_uuid else host)
            lay.counter_tracks[(pi, ci)] = lay.counter(proc, series.name, series.unit)
    return lay


def _rank_layout(lay: Layout, pi: int, part: BackendResult, proc: TrackRow) -> None:
    counter_owner: dict[str, TrackRow] = {}
    for t in part.tracks:
        if t.kind == "counter":
            counter_owner[t.id] = proc
        elif t.kind == "thread" and t.device is None and t.tid is not None:
            lay.span_tracks[(pi, t.id)] = lay.thread(proc, t.tid, t.name)
        else:
            name = t.name if t.device is None or t.name.startswith("/device") else f"/device:{t.device} {t.name}"
            lay.span_tracks[(pi, t.id)] = lay.named(proc, name)
    natives = {t.tid: lay.span_tracks[(pi, t.id)] for t in part.tracks
               if t.kind == "thread" and t.device is None and t.tid is not None}
    for th in part.threads:
        row = natives.get(th.native_id) if th.native_id is not None else None
        lay.sample_threads[(pi, th.thread_id)] = row if row is not None else lay.thread(proc, th.native_id, th.name)
    for ci, series in enumerate(part.counters):
        lay.counter_tracks[(pi, ci)] = lay.counter(proc, series.name, series.unit)


def _device_process_name(t: Track) -> str:
    return f"/device:{t.device}" if t.device is not None else "other"


def _track_process(lay: Layout, result: ProfileResult, host: TrackRow, t: Track) -> TrackRow:
    """The process row a track belongs to: the run's process for its host threads (and for
    counter tracks of no device), a process per other pid, per device, or per named process."""
    host_pid = result.metadata.pid or None
    if t.kind in ("thread", "counter") and t.device is None:
        if t.pid is None or t.pid == host_pid:
            return host
        return lay.process(t.process or f"process {t.pid}", t.pid)
    if t.kind == "process":
        return lay.process(t.process or t.name, t.pid)
    return lay.process(t.process or _device_process_name(t), t.pid)


def _track_row(lay: Layout, result: ProfileResult, host: TrackRow, t: Track) -> TrackRow:
    proc = _track_process(lay, result, host, t)
    if t.kind == "thread" and t.device is None:
        return lay.thread(proc, t.tid, t.name)
    return lay.named(proc, t.name)


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


# -- protobuf wire format: omniprof.formats.protowire -------------------------------------------
# TracePacket fields
_P_TIMESTAMP, _P_TRACK_EVENT, _P_SEQ_ID, _P_INTERNED, _P_FLAGS = 8, 11, 10, 12, 13
_P_CLEARED, _P_TRACK_DESCRIPTOR, _P_PERF_SAMPLE, _P_FIRST_ON_SEQ = 41, 60, 66, 87
# TrackEvent fields
_TE_CATEGORY_IIDS, _TE_DEBUG, _TE_TYPE, _TE_NAME_IID, _TE_TRACK = 3, 4, 9, 10, 11
_TE_DOUBLE_COUNTER, _TE_FLOW_IDS = 44, 47
_TYPE_BEGIN, _TYPE_END, _TYPE_INSTANT, _TYPE_COUNTER = 1, 2, 3, 4
# InternedData fields
_I_CATEGORIES, _I_NAMES, _I_ARG_NAMES, _I_FUNCTIONS, _I_FRAMES, _I_CALLSTACKS = 1, 2, 3, 5, 6, 7
_I_MAPPING_PATHS, _I_MAPPINGS = 17, 19
_SEQ_TAIL = _f_uint(_P_SEQ_ID, SEQ_ID) + _f_uint(_P_FLAGS, _SEQ_NEEDS)
_TE_TAG = _tag(_P_TRACK_EVENT, 2)


@functools.lru_cache(maxsize=None)
def _varint_tables() -> tuple[list[bytes], list[bytes]]:
    """Built on the first write, not at import (16k small objects: `omniprof plugins` loads this
    module only to list it). ``[0]``: the two low varint groups of a value >= 2**14, by its low 14
    bits (both bytes carry the continuation bit); ``[1]``: the varint of every length below 4096."""
    return ([bytes(((i & 0x7F) | 0x80, (i >> 7) | 0x80)) for i in range(1 << 14)],
            [_varint(i) for i in range(1 << 12)])


class _Sink:
    """Buffers encoded packets and writes them to the handle in chunks (constant memory)."""

    __slots__ = ("fh", "parts", "size", "limit", "written")

    def __init__(self, fh: IO[bytes], limit: int) -> None:
        self.fh, self.parts, self.size, self.limit, self.written = fh, [], 0, limit, 0

    def packet(self, body: bytes) -> None:
        self.parts.append(b"\x0a" + _varint(len(body)) + body)
        self.size += len(body) + 4
        if self.size >= self.limit:
            self.flush()

    def flush(self) -> None:
        if self.parts:
            data = b"".join(self.parts)
            self.fh.write(data)
            self.written += len(data)
            self.parts.clear()
            self.size = 0


class _Interner:
    """Interned strings of one kind; a new one is announced in an InternedData packet."""

    __slots__ = ("ids", "field", "sink")

    def __init__(self, sink: _Sink, field: int) -> None:
        self.ids: dict[str, int] = {}
        self.field = field
        self.sink = sink

    def __call__(self, text: str) -> int:
        iid = self.ids.get(text)
        if iid is None:
            iid = self.ids[text] = len(self.ids) + 1
            entry = _f_uint(1, iid) + _f_str(2, text)
            self.sink.packet(_f_bytes(_P_INTERNED, _f_bytes(self.field, entry)) + _SEQ_TAIL)
        return iid


# Nested args deeper than this are written as JSON text (DebugAnnotation.legacy_json_value):
# protobuf readers refuse messages nested past 100 levels (upb's limit; the packet, the track
# event and the annotation take three), so a 100-deep value made the whole trace unreadable.
_MAX_ARG_DEPTH = 64


def _debug_value(value: Any, depth: int = 0) -> bytes:
    """The value fields of a DebugAnnotation."""
    if isinstance(value, bool):
        return _f_uint(2, int(value))
    if isinstance(value, int):
        if -(1 << 63) <= value < (1 << 63):
            return _f_uint(4, value)
        return _f_str(6, str(value))
    if isinstance(value, float):
        if math.isfinite(value):
            return _f_double(5, value)
        return _f_str(6, str(value))
    if isinstance(value, str):
        return _f_str(6, value)
    if isinstance(value, (Mapping, list, tuple)) and depth >= _MAX_ARG_DEPTH:
        return _f_str(9, json.dumps(value, default=str))
    if isinstance(value, Mapping):
        return b"".join(_f_bytes(11, _f_str(10, str(k)) + _debug_value(x, depth + 1)) for k, x in value.items()) \
            or _f_str(9, "{}")
    if isinstance(value, (list, tuple)):
        return b"".join(_f_bytes(12, _debug_value(x, depth + 1)) for x in value) or _f_str(9, "[]")
    if value is None:
        return _f_str(9, "null")
    return _f_str(6, str(value))


def _debug_annotations(args: Mapping[str, Any], arg_names: _Interner, cache: dict[Any, bytes] | None = None) -> bytes:
    """TrackEvent.debug_annotations for ``args`` (names interned).

    ``cache`` maps (name, type, value) of scalar args to their encoded annotation: the same
    ``hlo_module`` or ``device`` repeats on every span, so most args are encoded once.
    """
    if cache is None:
        return b"".join(_f_bytes(_TE_DEBUG, _f_uint(1, arg_names(str(k))) + _debug_value(x)) for k, x in args.items())
    out = []
    for k, x in args.items():
        key = (k, x.__class__, x) if isinstance(x, (str, int, float, bool)) or x is None else None
        enc = cache.get(key) if key is not None else None
        if enc is None:
            enc = _f_bytes(_TE_DEBUG, _f_uint(1, arg_names(str(k))) + _debug_value(x))
            if key is not None:
                if len(cache) > 65536:
                    cache.clear()
                cache[key] = enc
        out.append(enc)
    return b"".join(out)


def _descriptor(row: TrackRow) -> bytes:
    body = _f_uint(1, row.uuid)
    if row.kind == "process":
        body += _f_bytes(3, _f_uint(1, row.pid) + _f_str(6, row.name))
    elif row.kind == "thread":
        body += _f_bytes(4, _f_uint(1, row.pid) + _f_uint(2, row.tid) + _f_str(5, row.name))
    else:
        body += _f_uint(5, row.parent_uuid) + _f_str(2, row.name)
        if row.kind == "counter":
            body += _f_bytes(8, _counter_unit(row.unit))
    return _f_bytes(_P_TRACK_DESCRIPTOR, body)


_UNITS = {"ns": 1, "time_ns": 1, "count": 2, "events": 2, "samples": 2, "bytes": 3, "size_bytes": 3}


def _counter_unit(unit: str) -> bytes:
    """CounterDescriptor: unit enum where one fits (TIME_NS, COUNT, SIZE_BYTES), else unit_name."""
    code = _UNITS.get(unit.lower())
    if code is not None:
        return _f_uint(3, code)
    return _f_str(6, unit) if unit else b""



def write_proto(result: ProfileResult, fh: IO[bytes], options: PerfettoOptions | None = None) -> int:
    """Stream ``result`` to ``fh`` as a Perfetto protobuf trace. Returns the bytes written."""
    o = options or PerfettoOptions()
    return encode_proto(events(result, o), fh, o.chunk_bytes)


def encode_proto(stream: Iterable[tuple[Any, ...]], fh: IO[bytes], chunk_bytes: int = 1 << 20) -> int:
    """Translate an event stream (:func:`events`) into Perfetto protobuf packets on ``fh``.

    One packet sequence: the first packet clears the incremental state, every other one needs it.
    Event names, categories and argument names are interned as they first appear; sampled stacks'
    mappings, frames and stacks go into ``InternedData`` packets (up to 64 KiB each) before the
    samples that use them. Flows travel as the flow ids of their slices, so ``FLOW`` events add
    nothing here.

    The hot path: two packets (SLICE_BEGIN, SLICE_END) per slice, most bytes precomputed. For each
    :class:`SliceKey` the TrackEvent bytes after the timestamp are built once; a timestamp varint
    is its two low groups from a table plus the cached varint of ``t >> 14``; the pieces go to the
    sink as they are, and one ``b"".join`` per chunk does the copying.
    """
    sink = _Sink(fh, chunk_bytes)
    sink.packet(_f_uint(_P_SEQ_ID, SEQ_ID) + _f_uint(_P_FLAGS, _SEQ_CLEARED) + _f_uint(_P_CLEARED, 1)
                + _f_uint(_P_FIRST_ON_SEQ, 1))
    names = _Interner(sink, _I_NAMES)
    cats = _Interner(sink, _I_CATEGORIES)
    arg_names = _Interner(sink, _I_ARG_NAMES)
    ext = sink.parts.extend
    low, lens = _varint_tables()
    varint = _varint
    tails: dict[SliceKey, tuple[bytes, bytes, list[bytes], list[bytes], bytes]] = {}
    high: dict[int, bytes] = {}
    arg_cache: dict[Any, bytes] = {}
    counter_heads: dict[int, bytes] = {}
    interned = bytearray()  # mappings, frames and stacks waiting for their InternedData packet

    def emit_interned() -> None:
        sink.packet(_f_bytes(_P_INTERNED, bytes(interned)) + _SEQ_TAIL)
        interned.clear()

    te_tag = _TE_TAG
    seq_tail = _SEQ_TAIL
    # Flush every `limit` slices. A slice is 8 pieces (~85 bytes), and b"".join keeps an 80-byte
    # buffer view per piece while it copies: ~640 bytes per buffered slice in all.
    limit = sink.limit // 640 + 1
    count = 0
    last_h, last_hb = -1, b""
    for ev in stream:
        kind = ev[0]
        if kind is SLICE:
            _, key, start, end, args, flows = ev
            tail = tails.get(key)
            if tail is None:
                tail = tails[key] = _slice_tail(key, names, cats)
            b1, b2, pre1, pre2, te_begin = tail
            if flows is not None or start < 16384:
                te = te_begin
                if args:
                    te += _debug_annotations(args, arg_names, arg_cache)
                if flows:
                    # Both ends carry the link id as a (non-terminating) flow id: the reader links the
                    # two slices in the order it meets them, so a link whose ends start at the same
                    # instant (a CUDA sync and its stream event) is not lost when the arriving end
                    # happens to be read first.
                    te += b"".join(_f_fixed64(_TE_FLOW_IDS, f) for f in flows)
                sink.packet(_f_uint(_P_TIMESTAMP, _ts(start)) + _f_bytes(_P_TRACK_EVENT, te) + seq_tail)
                sink.packet(_f_uint(_P_TIMESTAMP, _ts(end)) + b2)
                continue
            h = start >> 14
            if h != last_h:  # consecutive slices mostly share the high part of their start
                last_h = h
                last_hb = high.get(h)
                if last_hb is None:
                    if len(high) > 4096:
                        high.clear()
                    last_hb = high[h] = varint(h)
            hb = last_hb
            if end >> 14 == h:  # most slices are shorter than 16 µs: same high part
                he = hb
            else:
                h = end >> 14
                he = high.get(h)
                if he is None:
                    he = high[h] = varint(h)
            if args:
                te = te_begin + _debug_annotations(args, arg_names, arg_cache)
                b1 = b"%b%b%b%b" % (te_tag, varint(len(te)), te, seq_tail)
                ext((b"\x0a%b\x40" % varint(3 + len(hb) + len(b1)), low[start & 16383], hb, b1,
                     pre2[len(he)], low[end & 16383], he, b2))
            else:
                ext((pre1[len(hb)], low[start & 16383], hb, b1, pre2[len(he)], low[end & 16383], he, b2))
            count += 1
            if count >= limit:
                count = 0
                sink.flush()
            continue
        if interned and kind is not FRAME and kind is not STACK and kind is not MAPPING:
            emit_interned()
        if kind is COUNTER:
            _, row, t, value = ev
            head = counter_heads.get(row.uuid)
            if head is None:
                head = counter_heads[row.uuid] = (_f_uint(_TE_TYPE, _TYPE_COUNTER) + _f_uint(_TE_TRACK, row.uuid)
                                                  + _tag(_TE_DOUBLE_COUNTER, 1))
            te = head + struct.pack("<d", value)
            sink.packet(_f_uint(_P_TIMESTAMP, _ts(t)) + te_tag + lens[len(te)] + te + seq_tail)
        elif kind is SAMPLE:
            # timebase_count: the CPU-clock ns since the thread's previous sample, i.e. the weight.
            _, row, t, sid, weight = ev
            body = _f_uint(2, row.pid) + _f_uint(3, row.tid) + _f_uint(4, sid) + _f_uint(6, weight)
            sink.packet(_f_uint(_P_TIMESTAMP, _ts(t)) + _f_bytes(_P_PERF_SAMPLE, body) + seq_tail)
        elif kind is TRACK:
            sink.packet(_descriptor(ev[1]))
        elif kind is INSTANT:
            _, row, t, name, category, args = ev
            te = _f_uint(_TE_TYPE, _TYPE_INSTANT) + _f_uint(_TE_TRACK, row.uuid) + _f_uint(_TE_NAME_IID, names(name))
            if category:
                te += _f_uint(_TE_CATEGORY_IIDS, cats(category))
            if args:
                te += _debug_annotations(args, arg_names, arg_cache)
            sink.packet(_f_uint(_P_TIMESTAMP, _ts(t)) + _f_bytes(_P_TRACK_EVENT, te) + seq_tail)
        elif kind is MAPPING:
            _, mid, path = ev
            interned += _f_bytes(_I_MAPPING_PATHS, _f_uint(1, mid) + _f_str(2, path))
            interned += _f_bytes(_I_MAPPINGS, _f_uint(1, mid) + _f_uint(7, mid))
        elif kind is FRAME:
            # The frame's name carries its line (``work:20``) so lines stay apart in the flame graph.
            _, fid, name, line, mid = ev
            interned += _f_bytes(_I_FUNCTIONS, _f_uint(1, fid) + _f_str(2, f"{name}:{line}" if line else name))
            interned += _f_bytes(_I_FRAMES, _f_uint(1, fid) + _f_uint(2, fid) + _f_uint(3, mid))
        elif kind is STACK:
            _, sid, frames = ev
            interned += _f_bytes(_I_CALLSTACKS, _f_uint(1, sid) + b"".join(_f_uint(2, f) for f in frames))
        # META and FLOW: nothing to write (flows are their slices' flow ids)
        if len(interned) > (1 << 16):
            emit_interned()
    if interned:
        emit_interned()
    sink.flush()
    return sink.written


def _slice_tail(key: SliceKey, names: _Interner, cats: _Interner
                ) -> tuple[bytes, bytes, list[bytes], list[bytes], bytes]:
    """Precomputed bytes of a slice key: (begin tail, end packet's bytes after its timestamp, begin
    packet header by high-part length, same for end, the begin TrackEvent's own fields)."""
    uuid = key.row.uuid
    te_begin = (_f_uint(_TE_TYPE, _TYPE_BEGIN) + _f_uint(_TE_TRACK, uuid) + _f_uint(_TE_NAME_IID, names(key.name))
                + (_f_uint(_TE_CATEGORY_IIDS, cats(key.category)) if key.category else b""))
    te_end = _f_uint(_TE_TYPE, _TYPE_END) + _f_uint(_TE_TRACK, uuid)
    b1 = _TE_TAG + _varint(len(te_begin)) + te_begin + _SEQ_TAIL
    b2 = _TE_TAG + _varint(len(te_end)) + te_end + _SEQ_TAIL
    # packet = 0x40 tag (1) + two low timestamp bytes (2) + high part + tail; the packet's own
    # header (0x0a, its length, the timestamp tag) by the length of the high part (1..9 bytes)
    pre1 = [b"\x0a%b\x40" % _varint(3 + n + len(b1)) for n in range(10)]
    pre2 = [b"\x0a%b\x40" % _varint(3 + n + len(b2)) for n in range(10)]
    return b1, b2, pre1, pre2, te_begin


def _ts(t: int) -> int:
    # The stream's time axis moved the whole trace so that no time is negative; a negative one here
    # would be a bug, not data to clamp.
    if t < 0:
        raise ValueError(f"negative timestamp {t} reached the Perfetto encoder")
    return t


# -- Chrome trace-event JSON --------------------------------------------------------------------
def _us(t: int) -> str:
    """ns -> microseconds as JSON number text with three decimals (no precision lost)."""
    if t < 0:
        raise ValueError(f"negative time {t} reached the Chrome JSON encoder")
    return f"{t // 1000}.{t % 1000:03d}"


def chrome_events(result: ProfileResult, options: PerfettoOptions | None = None) -> Iterator[dict[str, Any]]:
    """The trace events as plain dicts (``ts``/``dur`` as float microseconds), in file order.

    For tests and tools; :func:`write_chrome_json` streams the same events without building dicts.
    """
    buf = io.BytesIO()
    write_chrome_json(result, buf, attrs.evolve(options or ChromeTraceOptions(), compress=False))
    yield from json.loads(buf.getvalue())["traceEvents"]


def write_chrome_json(result: ProfileResult, fh: IO[bytes], options: PerfettoOptions | None = None) -> int:
    """Stream ``result`` to ``fh`` as Chrome trace-event JSON (gzipped if ``options.compress``)."""
    o = options or ChromeTraceOptions()
    if o.compress:
        gz = gzip.GzipFile(fileobj=fh, mode="wb", compresslevel=6, mtime=0)
        try:
            return encode_json(events(result, o), gz, o.chunk_bytes)
        finally:
            gz.close()
    return encode_json(events(result, o), fh, o.chunk_bytes)


def encode_json(stream: Iterable[tuple[Any, ...]], out: IO[bytes], chunk_bytes: int = 1 << 20) -> int:
    """Translate an event stream (:func:`events`) into Chrome trace-event JSON on ``out``; returns
    the bytes written (before any compression ``out`` does).

    Tracks become ``process_name``/``thread_name`` metadata (a named track or lane is a thread with
    a synthetic tid), slices complete (``X``) events, flows an ``s``/``f`` pair bound to the
    enclosing slices (``"bp":"e"``), counters ``C`` events, and samples instant events of category
    ``sample`` on their thread, the leaf frame's name as the name and the whole stack (root first)
    in ``args.stack``. ``META`` becomes the ``otherData`` object after the events.
    """
    chunks: list[str] = ['{"traceEvents":[\n']
    size = 0
    written = 0
    sep = ""

    def flush() -> None:
        nonlocal size, written
        data = "".join(chunks).encode("utf-8")
        out.write(data)
        written += len(data)
        chunks.clear()
        size = 0

    dumps = _dumps
    us = _us
    heads: dict[SliceKey, tuple[str, str]] = {}
    frame_names: dict[int, str] = {}
    stack_text: dict[int, str] = {}
    other: dict[str, Any] = {}
    for ev in stream:
        kind = ev[0]
        if kind is SLICE:
            key, start, end, args = ev[1:5]
            head = heads.get(key) or _json_slice_head(heads, key)
            tail = f',"args":{dumps(args)}}}' if args else "}"
            text = f'{sep}{head[0]}{us(start)},"dur":{us(end - start)}{head[1]}{tail}'
        elif kind is COUNTER:
            _, row, t, value = ev
            text = f'{sep}{{"ph":"C","name":{dumps(row.name)},"ts":{us(t)},"pid":{row.pid},"args":{{"value":{value!r}}}}}'
        elif kind is SAMPLE:
            _, row, t, sid, weight = ev
            text = (f'{sep}{{"ph":"i","s":"t","cat":"sample",{stack_text[sid]},"weight_ns":{weight}}},'
                    f'"ts":{us(t)},"pid":{row.pid},"tid":{row.tid}}}')
        elif kind is FLOW:
            _, link, name, category, src, src_ns, dst, dst_ns = ev
            label = f'"name":{dumps(name)},"cat":{dumps(category)}'
            text = (f'{sep}{{"ph":"s","id":{link},{label},"ts":{us(src_ns)},"pid":{src.pid},"tid":{src.tid},"bp":"e"}},\n'
                    f'{{"ph":"f","id":{link},{label},"ts":{us(dst_ns)},"pid":{dst.pid},"tid":{dst.tid},"bp":"e"}}')
        elif kind is INSTANT:
            _, row, t, name, category, args = ev
            extra = f',"args":{dumps(args)}' if args else ""
            text = (f'{sep}{{"ph":"i","s":"t","name":{dumps(name)},"cat":{dumps(category or "event")},'
                    f'"ts":{us(t)},"pid":{row.pid},"tid":{row.tid}{extra}}}')
        elif kind is TRACK:
            row = ev[1]
            if row.kind == "process":
                text = f'{sep}{{"ph":"M","name":"process_name","pid":{row.pid},"tid":0,"args":{{"name":{dumps(row.name)}}}}}'
            elif row.kind in ("thread", "named", "lane"):
                text = (f'{sep}{{"ph":"M","name":"thread_name","pid":{row.pid},"tid":{row.tid},'
                        f'"args":{{"name":{dumps(row.name)}}}}}')
            else:  # a counter track: its events name it
                continue
        elif kind is FRAME:
            frame_names[ev[1]] = ev[2]
            continue
        elif kind is STACK:
            names = [frame_names[f] for f in ev[2]]
            stack_text[ev[1]] = f'"name":{dumps(names[-1])},"args":{{"stack":{dumps(names)}'
            continue
        elif kind is META:
            other = ev[1]
            continue
        else:  # MAPPING: the JSON names no files
            continue
        sep = ",\n"
        chunks.append(text)
        size += len(text)
        if size >= chunk_bytes:
            flush()
    chunks.append("\n]")
    chunks.append(f',\n"otherData":{dumps(other)}')
    chunks.append("}\n")
    flush()
    return written


def _json_slice_head(heads: dict[SliceKey, tuple[str, str]], key: SliceKey) -> tuple[str, str]:
    """The text of a slice key's X events before ``ts`` and after ``dur`` (kept in ``heads``)."""
    row = key.row
    head = heads[key] = (f'{{"ph":"X","name":{_dumps(key.name)},"cat":{_dumps(key.category or "span")},"ts":',
                         f',"pid":{row.pid},"tid":{row.tid}')
    return head


def _dumps(value: Any) -> str:
    """JSON for the Chrome format: strict (no NaN: args are made JSON-safe first), and not
    ASCII-escaped, so a lone surrogate fails the UTF-8 encode and the core writes it out instead."""
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except ValueError:
        from omniprof.core.results import json_safe

        return json.dumps(json_safe(value), ensure_ascii=False, allow_nan=False)
