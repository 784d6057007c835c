"""The protobuf encoder: an event stream as Perfetto ``TracePacket`` messages, streamed in chunks."""

from __future__ import annotations

import functools
import json
import math
import struct
from collections.abc import Iterable, Mapping
from typing import IO, Any

from omniprof.core.results import ProfileResult
from omniprof.formats.protowire import f_bytes as _f_bytes
from omniprof.formats.protowire import f_double as _f_double
from omniprof.formats.protowire import f_fixed64 as _f_fixed64
from omniprof.formats.protowire import f_str as _f_str
from omniprof.formats.protowire import f_uint as _f_uint
from omniprof.formats.protowire import tag as _tag
from omniprof.formats.protowire import varint as _varint
from omniprof.reporters.perfetto.layout import TrackRow
from omniprof.reporters.perfetto.options import PerfettoOptions
from omniprof.reporters.perfetto.stream import (
    COUNTER,
    FRAME,
    INSTANT,
    MAPPING,
    SAMPLE,
    SLICE,
    STACK,
    TRACK,
    SliceKey,
    events,
)

__all__ = ["write_proto", "encode_proto"]

SEQ_ID = 1
_SEQ_CLEARED = 1   # TracePacket.SequenceFlags.SEQ_INCREMENTAL_STATE_CLEARED
_SEQ_NEEDS = 2     # TracePacket.SequenceFlags.SEQ_NEEDS_INCREMENTAL_STATE


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
        return _f_str(9, json.dumps(_nulls_as_text(value), default=str))
    if isinstance(value, Mapping):
        return b"".join(_f_bytes(11, _f_str(10, str(k)) + _debug_value(x, depth + 1)) for k, x in value.items()) \
            or _f_str(9, "{}")
    if isinstance(value, (list, tuple)):
        return b"".join(_f_bytes(12, _debug_value(x, depth + 1)) for x in value) or _f_str(9, "[]")
    if value is None:
        # Perfetto's trace processor has no null argument: a legacy_json_value of null (alone or
        # inside JSON text) stops the import (json_utils.cc "Unreachable"). Shown as the text null.
        return _f_str(6, "null")
    return _f_str(6, str(value))


def _nulls_as_text(value: Any) -> Any:
    """``value`` with every None (at any depth) as the string ``"null"``, for JSON text that
    Perfetto's trace processor parses (it stops at a JSON null)."""
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return {k: _nulls_as_text(x) for k, x in value.items()}
    if isinstance(value, (list, tuple)):
        return [_nulls_as_text(x) for x in value]
    return value


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


