"""A columnar, streaming read of a Kineto trace: one pass, numpy columns, no object per event.

:func:`read_columns` reads a trace's spans into :class:`KinetoColumns`: per span a name id (into
an interned name table), start and duration in integer ns, a track id, a category id, the CUDA
correlation id, the op's ``External id`` and FLOPs; and the ``[memory]`` events as four columns.
Names, tracks and categories are exactly those :func:`omniprof.formats.kineto.read_trace` gives
its spans (the same mapping, ``omniprof.formats.kineto_build``), and times are converted from the
decimal text exactly (:func:`~omniprof.formats.kineto_json.us_text_to_ns`).

The text is read in chunks of bytes (gzip streamed); each chunk's whole events are decoded in one
call of a fast JSON parser (``msgspec`` where installed, else the standard library's), cut at the
last ``}`` that ends a whole event: a cut inside a string or a nested value leaves the batch
unbalanced, so the parser refuses it and an earlier cut is tried. A trace this path does not read
(``B``/``E`` pairs, counters, legacy layouts, malformed events, JSON errors) is read by the full
reader instead and its spans turned into the same columns, so the result, the warnings and the
error messages are the full reader's.
"""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from omniprof.formats.kineto_build import _DEVICE_CATS, _STEP, CATEGORY_MAP, LEGACY_CATEGORY_MAP, _norm_id, _stream_of
from omniprof.formats.kineto_json import _Num, _plain, us_text_to_ns

__all__ = ["KinetoColumns", "read_columns", "columns_from_spans", "parser_name", "CHUNK_BYTES"]

CHUNK_BYTES = 1 << 22
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_ARRAY_END = re.compile(rb"\}\s*\]")
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_LOOK_BACK = 1 << 16
_TRY_CUTS = 8
_WIDTH = 9
_CORR_CATS = frozenset({"runtime", "kernel", "memcpy", "memset", "sync"})


def _get(value: Any) -> Any:
    """A field's value, None where the event does not have it (as ``dict.get``)."""
    return None if value is MISSING else value


@attrs.frozen(eq=False)
class KinetoColumns:
    """A Kineto trace's spans as columns (one row per span, in file order) and its ``[memory]`` events.

    Attributes:
        names: the interned span names; ``name_id`` indexes it.
        tracks: track ids (``thread:N``, ``device:D:stream:S``) as the full reader names them.
        categories: our span categories (``cpu_op``, ``runtime``, ``kernel``, ...).
        name_id, track_id, category_id: int32 indexes into the three tables.
        start_ns, dur_ns: int64 integer nanoseconds.
        correlation, external_id, flops: int64, -1 where the span has none.
        mem_track_id, mem_t_ns, mem_bytes: the ``[memory]`` events (int32/int64).
        mem_on_device: bool, the event is on a device (not the CPU).
        kernel_configs: the launch configurations, (block, grid, static shared memory) as written.
        kernel_config: int32 per span, its kernel's launch configuration (-1: not a kernel).
        occupancy_pct: float64 per span, the kernel's estimated achieved occupancy (NaN: none).
        bounds_ns: the profiler's session span, else the first to the last event (None: no events).
        top: the trace's top-level fields other than ``traceEvents``.
        parser: which JSON parser read it (``msgspec``, ``json``; ``full reader`` for the fallback).
    """

    names: list[str]
    tracks: list[str]
    categories: list[str]
    name_id: np.ndarray
    track_id: np.ndarray
    category_id: np.ndarray
    start_ns: np.ndarray
    dur_ns: np.ndarray
    correlation: np.ndarray
    external_id: np.ndarray
    flops: np.ndarray
    mem_track_id: np.ndarray
    mem_t_ns: np.ndarray
    mem_bytes: np.ndarray
    mem_on_device: np.ndarray
    kernel_configs: list[tuple[Any, Any, Any]]
    kernel_config: np.ndarray
    occupancy_pct: np.ndarray
    bounds_ns: tuple[int, int] | None
    top: dict[str, Any]
    parser: str

    def __len__(self) -> int:
        return len(self.start_ns)

    def category_mask(self, *cats: str) -> np.ndarray:
        """A bool column: the span's category is one of ``cats``."""
        ids = [self.categories.index(c) for c in cats if c in self.categories]
        return np.isin(self.category_id, np.asarray(ids, dtype=np.int32))


class _Unread(Exception):
    """This trace needs the full reader (it says why, for debugging)."""


#: What a field an event does not have reads as (``None`` is JSON's null, which differs for ``in``).
MISSING: Any = type("Missing", (), {"__repr__": lambda self: "MISSING", "__bool__": lambda self: False})()

#: The event fields read, and the args fields: (attribute, the name Kineto writes).
_EV_FIELDS = (("ph", "ph"), ("cat", "cat"), ("name", "name"), ("pid", "pid"), ("tid", "tid"), ("ts", "ts"),
              ("dur", "dur"), ("s", "s"), ("args", "args"))
_ARG_FIELDS = (("correlation", "correlation"), ("external_id", "External id"), ("flops", "flops"),
               ("stream", "stream"), ("device", "device"), ("in_device", "inDevice"), ("block", "block"),
               ("grid", "grid"), ("shared_memory", "shared memory"), ("static_shared_memory", "static shared memory"),
               ("occupancy", "est. achieved occupancy %"), ("bytes", "Bytes"), ("device_type", "Device Type"))


class _Obj:
    """A decoded JSON object seen through named attributes (the standard-library path)."""

    __slots__ = tuple(a for a, _ in _EV_FIELDS + _ARG_FIELDS)


def _from_dict(d: Any, fields: tuple[tuple[str, str], ...]) -> _Obj:
    if type(d) is not dict:
        raise _Unread("an event or its args is not an object")
    o = _Obj()
    for attr, key in fields:
        setattr(o, attr, d.get(key, MISSING))
    return o


_NO_ARGS = _from_dict({}, _ARG_FIELDS)


def _json_decoder() -> tuple[str, Callable[[bytes], list[Any]]]:
    """The standard library's parser (the fallback where msgspec is not installed)."""
    dec = json.JSONDecoder(parse_float=_Num)

    def decode(b: bytes) -> list[Any]:
        out = []
        for ev in dec.decode(b.decode("utf-8")):
            o = _from_dict(ev, _EV_FIELDS)
            if o.args is not MISSING and o.args is not None:
                o.args = _from_dict(o.args, _ARG_FIELDS)
            out.append(o)
        return out

    return "json", decode


def _decoder() -> tuple[str, Callable[[bytes], list[Any]]]:
    """The fastest parser here (measured: benchmarks/kineto_parsers.py), decoding a batch ``[...]``
    of events into objects with the fields read (msgspec skips the others without building them)."""
    try:
        import msgspec
    except ImportError:
        return _json_decoder()
    global _MSGSPEC
    if _MSGSPEC is None:
        args = msgspec.defstruct("KinetoArgs", [(a, Any, msgspec.field(default=MISSING, name=k)) for a, k in _ARG_FIELDS],
                                 omit_defaults=False)
        fields = [(a, Any, msgspec.field(default=MISSING, name=k)) for a, k in _EV_FIELDS[:-1]]
        fields.append(("args", args | None, msgspec.field(default=None, name="args")))  # type: ignore[operator]
        ev = msgspec.defstruct("KinetoEvent", fields)
        _MSGSPEC = msgspec.json.Decoder(list[ev], float_hook=_Num).decode  # type: ignore[valid-type]
    return "msgspec", _MSGSPEC


_MSGSPEC: Callable[[bytes], list[Any]] | None = None


def parser_name() -> str:
    """The JSON parser :func:`read_columns` uses here (``msgspec`` when installed, else ``json``)."""
    return _decoder()[0]


def _batches(raw: io.BufferedIOBase, decode: Callable[[bytes], Any]) -> Iterator[list[Any] | dict[str, Any]]:
    """The events of ``traceEvents`` in decoded batches, then (last) the top-level fields."""
    buf = b""
    while True:
        m = _EVENTS_KEY.search(buf)
        if m:
            break
        chunk = raw.read(CHUNK_BYTES)
        if not chunk or len(buf) > 1 << 26:
            raise _Unread("no traceEvents array near the start")
        buf += chunk
    head = buf[: m.start()].strip()
    buf = buf[m.end():]
    eof = False
    while True:
        if not eof:
            chunk = raw.read(CHUNK_BYTES)
            eof = not chunk
            buf += chunk
        s = buf.lstrip()
        if s[:1] == b",":
            s = s[1:]
        if eof:
            if s.lstrip()[:1] == b"]":
                tail = s.lstrip()[1:].strip()
                break
            for m in _ARRAY_END.finditer(s):  # the first that closes the batch is the array's end
                try:
                    events = decode(b"[" + s[: m.start() + 1] + b"]")
                except Exception:
                    continue
                tail = s[m.end():].strip()
                break
            else:
                raise _Unread("the event array does not end")
            if events:
                yield events
            break
        limit = len(s)
        for _ in range(_TRY_CUTS):
            # A failed try costs a whole parse: first the '}' of a "}, {" (an event's end nearly always).
            m = None
            for m in _BOUNDARY.finditer(s, max(0, limit - _LOOK_BACK), limit):
                pass
            cut = m.start() if m is not None else s.rfind(b"}", 0, limit)
            if cut < 0:
                break
            try:
                events = decode(b"[" + s[: cut + 1] + b"]")
            except Exception:
                limit = cut
                continue
            yield events
            s = s[cut + 1:]
            break
        buf = s
    # The top-level object without its event array: what comes before the key, and after the array.
    if head.startswith(b"{"):
        body = head[1:].strip().rstrip(b",")
        tail = tail.lstrip(b",").strip() if tail.startswith(b",") else tail
        text = b"{" + body + (b"," + tail if body and tail != b"}" else tail)
        try:
            top = json.loads(text.decode("utf-8"), parse_float=_Num)
        except (ValueError, UnicodeDecodeError):
            raise _Unread("the top-level fields do not decode") from None
        if not isinstance(top, dict):
            raise _Unread("the top level is not an object")
        yield {k: _plain(v) for k, v in top.items()}
    else:
        raise _Unread("not a JSON object")


class _Cols:
    """Growing columns (Python arrays of machine ints) while the trace streams by."""

    def __init__(self) -> None:
        from array import array

        #: Per span, _WIDTH ints in a row: name, track, category, start, duration, correlation,
        #: External id, FLOPs, kernel configuration (one append a span).
        self.rows = array("q")
        self.occ_rows, self.occ_vals = array("q"), array("d")  # kernels' occupancy: (span row, value)
        self.mem_track_id, self.mem_t_ns, self.mem_bytes, self.mem_on_device = array("i"), array("q"), array("q"), array("b")
        self.kcfgs: dict[tuple[str, str, str], int] = {}
        self.kcfg_values: list[tuple[Any, Any, Any]] = []
        self.names: dict[str, int] = {}
        self.tracks: dict[str, int] = {}
        self.cats: dict[str, int] = {}
        self._host: dict[tuple[Any, Any], int] = {}
        self._tids_used: dict[Any, Any] = {}
        self.t_min: int | None = None
        self.t_max: int | None = None
        self.session: tuple[int, int] | None = None

    def host_track(self, pid: Any, tid: Any) -> int:
        key = (pid, tid)
        got = self._host.get(key)
        if got is None:
            npid, ntid = _norm_id(pid), _norm_id(tid)
            owner = self._tids_used.setdefault(ntid, npid)
            tid_id = f"thread:{ntid}" if owner == npid else f"thread:{npid}:{ntid}"
            got = self._host[key] = self.tracks.setdefault(tid_id, len(self.tracks))
        return got

    def kernel(self, args: Any, row: int) -> int:
        """The kernel's launch configuration id; its occupancy noted for span ``row``."""
        smem = _get(args.static_shared_memory)
        if smem is None:
            smem = _get(args.shared_memory)
        block, grid = _get(args.block), _get(args.grid)
        key = (repr(block), repr(grid), repr(smem))
        k = self.kcfgs.get(key)
        if k is None:
            k = self.kcfgs[key] = len(self.kcfg_values)
            self.kcfg_values.append((_plain(block), _plain(grid), _plain(smem)))
        occ = args.occupancy
        if isinstance(occ, (int, float, _Num)) and type(occ) is not bool:
            self.occ_rows.append(row)
            self.occ_vals.append(float(occ))
        return k

    def extend(self, t0: int, t1: int) -> None:
        if self.t_min is None or t0 < self.t_min:
            self.t_min = t0
        if self.t_max is None or t1 > self.t_max:
            self.t_max = t1

    def add_batch(self, events: list[Any]) -> None:  # noqa: C901 - one loop, kept flat for speed
        names, cats, tracks = self.names, self.cats, self.tracks
        add = self.rows.extend
        rows = self.rows
        host_track = self.host_track
        for ev in events:
            ph = ev.ph
            if ph == "X":
                ts, dur = ev.ts, ev.dur
                if dur is MISSING:
                    dur = 0
                t0 = ts * 1000 if type(ts) is int else us_text_to_ns(ts)
                d = dur * 1000 if type(dur) is int else us_text_to_ns(dur)
                if d < 0 or not -(1 << 62) < t0 < 1 << 62:
                    raise _Unread("a negative duration or a time beyond 62 bits")
                cat = ev.cat
                if not cat:
                    cat = ""
                elif type(cat) is not str:
                    raise _Unread("a category that is not a string")
                name = ev.name
                if type(name) is not str:
                    raise _Unread("a name that is not a string")
                args = ev.args
                if not args:
                    args = _NO_ARGS
                if cat == "Trace":
                    self.session = (t0, t0 + d)
                    continue
                if cat in LEGACY_CATEGORY_MAP:
                    raise _Unread("a PyTorch 1.8-1.9 category")
                ours = CATEGORY_MAP.get(cat, cat)
                if cat in _DEVICE_CATS or (args.stream is not MISSING and args.device is not MISSING
                                           and ours not in ("runtime", "cpu_op")):
                    stream, dev = args.stream, args.device
                    if dev is MISSING:
                        dev = args.in_device if args.in_device is not MISSING else _get(ev.pid)
                    if stream is MISSING or stream is None:
                        stream = _stream_of(_get(ev.tid))
                    track = tracks.setdefault(f"device:{dev}:stream:{stream}", len(tracks))
                    host = False
                else:
                    if ours == "annotation" and _STEP.match(name):
                        ours = "step"
                    track = host_track(_get(ev.pid), _get(ev.tid))
                    host = True
                corr = args.correlation
                ext = args.external_id
                f = args.flops if ours == "cpu_op" or (ours == "annotation" and host) else None
                n = names.get(name)
                if n is None:
                    n = names[name] = len(names)
                c = cats.get(ours)
                if c is None:
                    c = cats[ours] = len(cats)
                add((n, track, c, t0, d, corr if type(corr) is int and ours in _CORR_CATS else -1,
                     ext if type(ext) is int else -1,
                     f if type(f) is int else int(float(f)) if type(f) is _Num else -1,
                     self.kernel(args, len(rows) // _WIDTH) if ours == "kernel" else -1))
            elif ph == "M":
                continue
            elif ph == "s" or ph == "f" or ph == "t":
                continue  # launch links are the spans' correlation ids; flows are not columns
            elif ph == "C":
                t = ev.ts
                t = t * 1000 if type(t) is int else us_text_to_ns(t)
                self.extend(t, t)
            elif ph in ("i", "I", "R"):
                t = ev.ts
                t = t * 1000 if type(t) is int else us_text_to_ns(t)
                name = ev.name
                args = ev.args
                if name == "[memory]" and args is not MISSING:
                    if not args:
                        args = _NO_ARGS
                    nbytes = args.bytes
                    if type(nbytes) is int:
                        self.mem_track_id.append(host_track(_get(ev.pid), _get(ev.tid)))
                        self.mem_t_ns.append(t)
                        self.mem_bytes.append(nbytes)
                        dt = args.device_type
                        self.mem_on_device.append(dt is not MISSING and dt not in (0, None))
                    self.extend(t, t)
                elif name in ("Iteration Start: PyTorch Profiler", "Record Window End") and ev.s == "g":
                    if name == "Record Window End":
                        self.extend(t, t)
                else:
                    self.extend(t, t)
            else:
                raise _Unread(f"phase {ph!r}")

    def finish(self, top: dict[str, Any], parser: str) -> KinetoColumns:
        m = np.frombuffer(self.rows, dtype=np.int64).reshape(-1, _WIDTH) if len(self.rows) else \
            np.zeros((0, _WIDTH), dtype=np.int64)
        if len(m):
            self.extend(int(m[:, 3].min()), int((m[:, 3] + m[:, 4]).max()))
        bounds = self.session
        if bounds is None and self.t_min is not None:
            bounds = (self.t_min, self.t_max if self.t_max is not None else self.t_min)
        elif bounds is not None and self.t_max is not None:
            bounds = (bounds[0], max(bounds[1], self.t_max))

        def arr(a: Any, dtype: Any) -> np.ndarray:
            return np.frombuffer(a, dtype=dtype).copy() if len(a) else np.zeros(0, dtype=dtype)

        occupancy = np.full(len(m), np.nan)
        occupancy[arr(self.occ_rows, np.int64)] = arr(self.occ_vals, np.float64)
        return KinetoColumns(
            names=list(self.names), tracks=list(self.tracks), categories=list(self.cats),
            name_id=m[:, 0].astype(np.int32), track_id=m[:, 1].astype(np.int32),
            category_id=m[:, 2].astype(np.int32), start_ns=m[:, 3], dur_ns=m[:, 4],
            correlation=m[:, 5], external_id=m[:, 6], flops=m[:, 7],  # views of the rows: no copy
            mem_track_id=arr(self.mem_track_id, np.int32), mem_t_ns=arr(self.mem_t_ns, np.int64),
            mem_bytes=arr(self.mem_bytes, np.int64), mem_on_device=arr(self.mem_on_device, np.int8).astype(bool),
            kernel_configs=self.kcfg_values, kernel_config=m[:, 8].astype(np.int32), occupancy_pct=occupancy,
            bounds_ns=bounds, top=top, parser=parser)


def columns_from_spans(spans: Any, instants: Any = (), bounds_ns: tuple[int, int] | None = None,
                       top: dict[str, Any] | None = None, parser: str = "full reader") -> KinetoColumns:
    """Columns from the full reader's spans and instants (the fallback, and a reference)."""
    cols = _Cols()
    for s in spans:
        n = cols.names.setdefault(s.name, len(cols.names))
        t = cols.tracks.setdefault(s.track, len(cols.tracks))
        c = cols.cats.setdefault(s.category, len(cols.cats))
        corr = s.args.get("correlation_id")
        ext = s.args.get("external_id")
        f = s.args.get("flops") if s.category in ("cpu_op", "annotation") else None
        k = -1
        if s.category == "kernel":
            a = s.args
            k = cols.kernel(_from_dict({"block": a.get("block"), "grid": a.get("grid"),
                                        "static shared memory": a.get("static_shared_memory_bytes"),
                                        "est. achieved occupancy %": a.get("occupancy_pct")}, _ARG_FIELDS),
                            len(cols.rows) // _WIDTH)
        cols.rows.extend((n, t, c, s.start_ns, s.dur_ns, corr if type(corr) is int else -1,
                          ext if type(ext) is int else -1, f if type(f) is int else -1, k))
    for i in instants:
        if i.category == "memory" and type(i.args.get("bytes")) is int:
            cols.mem_track_id.append(cols.tracks.setdefault(i.track, len(cols.tracks)))
            cols.mem_t_ns.append(i.t_ns)
            cols.mem_bytes.append(i.args["bytes"])
            cols.mem_on_device.append(i.args.get("device_type", 0) not in (0, None))
    cols.session = bounds_ns
    return cols.finish(top or {}, parser)


def read_columns(path: str | os.PathLike[str]) -> KinetoColumns:
    """Read a Kineto trace (``.json`` or ``.json.gz``) into :class:`KinetoColumns` in one streaming pass.

    Raises:
        TraceReadError: as :func:`omniprof.formats.kineto.read_trace` (the full reader reads a trace
            this path cannot, and reports its errors).
    """
    from omniprof.core.inputs import open_stream

    p = Path(path)
    parser, decode = _decoder()
    cols = _Cols()
    try:
        with open_stream(p) as raw:
            top: dict[str, Any] = {}
            for batch in _batches(raw, decode):
                if isinstance(batch, dict):
                    top = batch
                else:
                    cols.add_batch(batch)
        return cols.finish(top, parser)
    except (_Unread, KeyError, TypeError, ValueError, ArithmeticError):
        pass
    from omniprof.formats.kineto import parse_trace
    from omniprof.formats.kineto_json import open_text

    with open_text(p) as fh:
        part, top = parse_trace(fh, str(p))
    return columns_from_spans(part.spans, part.instants, (part.start_ns, part.end_ns), top)
