"""Read Kineto traces (``*.pt.trace.json[.gz]``, what ``torch.profiler`` writes) into results.

This module never imports torch: a GPU trace recorded on a cluster reads on a laptop.

The file is parsed as a stream: the ``traceEvents`` array is decoded one event at a time from a
bounded text buffer, each event is turned into compact result objects at once, and the decoded
JSON is dropped. Peak memory is therefore the result itself plus one buffer, not the whole JSON
tree (``benchmarks/kineto_reader.py`` measures it on 10^6 events).

Mapping (see ``docs/readers.md`` for the full table):

* ``cpu_op`` -> ``cpu_op`` spans (``input_shapes``, ``input_dtypes``, ``flops``);
  ``user_annotation`` / ``gpu_user_annotation`` -> ``annotation``, ``ProfilerStep#N`` -> ``step``;
  ``cuda_runtime`` / ``cuda_driver`` (and xpu/privateuse1) -> ``runtime``; ``kernel`` -> ``kernel``
  with the launch parameters of docs/results.md; ``gpu_memcpy`` / ``gpu_memset`` -> ``memcpy`` /
  ``memset``; ``cuda_sync`` -> ``sync``; ``python_function`` -> ``python``; other categories keep
  their own name.
* ``[memory]`` instants -> ``memory_allocated`` / ``memory_reserved`` counter series per device,
  and memory per op in the ``op_stats`` table.
* A CPU launch and its GPU work share ``flow_ids`` (the CUDA correlation id) with a
  ``Flow(id, "launch", "cuda")``; forward/backward links (``fwdbwd``) become flows too.
* Times: Kineto writes microseconds (floats with ns decimals); they are converted to integer ns
  exactly from their decimal text, never through float arithmetic.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import warnings
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import IO, Any

from omniprof.formats.kernels import add_kernel_stats
from omniprof.core import opstats
from omniprof.core.results import (
    Artifact,
    BackendResult,
    ClockInfo,
    CounterSeries,
    Flow,
    Instant,
    Loss,
    ProfileResult,
    RunMetadata,
    Span,
    Table,
    Track,
    json_safe,
)
from omniprof.errors import DataLossWarning, InvalidArgumentError, OmniprofWarning, TraceReadError

__all__ = ["read_trace", "parse_trace", "stream_spans", "op_stats_table", "op_table", "call_stacks", "OP_STATS_COLUMNS", "CATEGORY_MAP", "LEGACY_CATEGORY_MAP",
           "FWDBWD_FLOW_BASE", "us_text_to_ns"]

#: Kineto category -> our span category (docs/results.md). Others keep their Kineto name.
CATEGORY_MAP = {
    "cpu_op": "cpu_op", "user_annotation": "annotation", "gpu_user_annotation": "gpu_annotation",
    "cuda_runtime": "runtime", "cuda_driver": "runtime", "xpu_runtime": "runtime", "xpu_driver": "runtime",
    "privateuse1_runtime": "runtime", "privateuse1_driver": "runtime", "mtia_runtime": "runtime",
    "kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset", "cuda_sync": "sync",
    "python_function": "python", "overhead": "overhead", "cuda_profiler_range": "annotation",
}
#: Category names of older Kineto releases (PyTorch 1.8-1.9, 2021) -> today's names. Their trace logger
#: wrote ``Operator`` (CPU ops), ``Runtime``, ``Kernel``, ``Memcpy``, ``Memset`` and ``User`` (the GPU-side
#: projection of a user annotation, on tid ``"stream N user"``); a 2021 release spelled it
#: ``gpu_user_Annotation``. Launches were linked by ``ph: s/f`` events of category ``async``.
LEGACY_CATEGORY_MAP = {
    "Operator": "cpu_op", "Runtime": "cuda_runtime", "Kernel": "kernel", "Memcpy": "gpu_memcpy",
    "Memset": "gpu_memset", "User": "gpu_user_annotation", "gpu_user_Annotation": "gpu_user_annotation",
    "Python": "python_function",
}
_DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync", "gpu_instant_event"})
#: Our categories the op and kernel tables are built from: a trace with none of them yields no table.
_ANALYSED = frozenset({"cpu_op", "annotation", "step", "kernel", "memcpy", "memset", "runtime", "gpu_annotation"})
_STREAM_TID = re.compile(r"^stream (\d+)")
_DEVICE_WORK = frozenset({"kernel", "memcpy", "memset"})

#: Forward/backward flow ids are shifted by this so they never collide with CUDA correlation ids.
FWDBWD_FLOW_BASE = 1 << 40


CHUNK_CHARS = 1 << 20
_LOOKAHEAD = 1 << 16
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_WS = re.compile(r"[ \t\n\r]*")
_PROFILER_MARKERS = frozenset({"Iteration Start: PyTorch Profiler", "Record Window End"})
_MEMORY_ARGS = (("bytes", "Bytes"), ("addr", "Addr"), ("total_allocated_bytes", "Total Allocated"),
                ("total_reserved_bytes", "Total Reserved"), ("device_type", "Device Type"), ("device_id", "Device Id"))
_MEMCPY_KIND = re.compile(r"\b([HDPA]to[HDPA])\b")


class _Num(str):
    """A JSON number with a fraction or exponent, kept as its text (exact ns conversion)."""

    __slots__ = ()


_DECODER = json.JSONDecoder(parse_float=_Num)
#: torch's Python tracer now and then writes a frame name holding a raw control character (seen with
#: torch 2.13: ``"torch/profiler/_cupti_monitor.py(0): \x07"``), which strict JSON forbids; such a
#: value is read as written and counted (``metadata["values_with_control_characters"]``).
_LENIENT = json.JSONDecoder(parse_float=_Num, strict=False)


def _t64(ns: int) -> int:
    """``ns`` if a result can hold it (signed 64 bits); else ValueError (the event is counted as
    malformed: a time of -10**20 us made a result that could not be saved)."""
    if not -(1 << 63) <= ns < 1 << 63:
        raise ValueError(f"time {ns} ns is beyond 64 bits")
    return ns


def us_text_to_ns(value: Any) -> int:
    """Microseconds (a JSON int, or a decimal's text) to integer ns, exactly (half-even rounding).

    >>> us_text_to_ns(_Num("4385052688052.478")), us_text_to_ns(12), us_text_to_ns(_Num("1.0005"))
    (4385052688052478, 12000, 1000)
    """
    t = type(value)
    if t is int:
        return value * 1000
    if t is _Num or t is str:
        if "e" in value or "E" in value or value.count(".") > 1:
            return int((Decimal(value) * 1000).to_integral_value(ROUND_HALF_EVEN))
        neg = value.startswith("-")
        whole, _, frac = (value[1:] if neg else value).partition(".")
        ns = int(whole or "0") * 1000 + (int((frac + "000")[:3]) if frac else 0)
        if len(frac) > 3:
            rest = frac[3:]
            half = "5" + "0" * (len(rest) - 1)
            if rest > half or (rest == half and ns % 2):
                ns += 1
        return -ns if neg else ns
    if t is float:
        return round(value * 1000)
    raise TypeError(f"not a number: {value!r}")


def _plain(value: Any) -> Any:
    """Decoded JSON with exact-number texts turned back into floats."""
    t = type(value)
    if t is _Num:
        return float(value)
    if t is dict:
        return {k: _plain(v) for k, v in value.items()}
    if t is list:
        return [_plain(v) for v in value]
    return value


def _num(value: Any) -> float | int | None:
    if type(value) is _Num:
        return float(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return None


# -- streaming JSON ----------------------------------------------------------------------------
class _JsonStream:
    """Tokenizer over a text file: whitespace, punctuation, and whole values via raw_decode."""

    def __init__(self, fh: IO[str], name: str) -> None:
        self.fh = fh
        self.name = name
        self.buf = ""
        self.pos = 0
        self.eof = False
        self.offset = 0      # absolute char offset of buf[0]
        self.line = 1        # line number of buf[0]
        self.line_start = 0  # absolute offset where that line starts
        self.control_characters = 0  # values read leniently: raw control characters in strings

    def _read(self) -> bool:
        if self.eof:
            return False
        try:
            chunk = self.fh.read(CHUNK_CHARS)
        except EOFError as e:
            raise self.error(f"the compressed data ends early ({e}): the file is truncated", len(self.buf)) from None
        except (gzip.BadGzipFile, zlib.error) as e:
            raise self.error(f"corrupt gzip data ({e})", len(self.buf)) from None
        except UnicodeDecodeError as e:
            raise self.error(f"not UTF-8 text ({e.reason})", len(self.buf)) from None
        except OSError as e:
            raise TraceReadError(f"{self.name}: cannot read: {e.strerror or e}") from e
        if not chunk:
            self.eof = True
            return False
        if self.pos:
            done = self.buf[: self.pos]
            n = done.count("\n")
            if n:
                self.line += n
                self.line_start = self.offset + done.rfind("\n") + 1
            self.offset += self.pos
            self.buf = self.buf[self.pos:]
            self.pos = 0
        self.buf += chunk
        return True

    def where(self, pos: int | None = None) -> str:
        pos = self.pos if pos is None else min(pos, len(self.buf))
        part = self.buf[:pos]
        n = part.count("\n")
        absolute = self.offset + pos
        start = self.offset + part.rfind("\n") + 1 if n else self.line_start
        return f"line {self.line + n} column {absolute - start + 1} (char {absolute})"

    def error(self, msg: str, pos: int | None = None) -> TraceReadError:
        return TraceReadError(f"{self.name}: {msg} at {self.where(pos)}")

    def peek(self) -> str:
        """Skip whitespace; the next character, or '' at the end of the file."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self._read():
                return ""

    def expect(self, chars: str, what: str) -> str:
        c = self.peek()
        if c == "":
            raise self.error(f"the file ends early (truncated?): expected {what}")
        if c not in chars:
            raise self.error(f"invalid JSON: expected {what}, found {c!r}")
        self.pos += 1
        return c

    def value(self) -> Any:
        if self.peek() == "":
            raise self.error("the file ends early (truncated?): expected a value")
        while True:
            try:
                value, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as e:
                if e.msg.startswith("Invalid control character"):
                    try:
                        value, end = _LENIENT.raw_decode(self.buf, self.pos)
                    except json.JSONDecodeError as lenient:
                        e = lenient  # another error (or the value goes on in the next chunk): handled below
                    else:
                        if end < len(self.buf) or not self._read():
                            self.control_characters += 1
                            self.pos = end
                            return value
                        continue
                near_end = e.pos >= len(self.buf) - _LOOKAHEAD or e.msg.startswith("Unterminated string")
                if near_end and self._read():
                    continue
                if self.eof and (e.pos >= len(self.buf.rstrip()) or e.msg.startswith("Unterminated string")):
                    raise self.error("the file ends inside a JSON value: it is truncated", e.pos) from None
                raise self.error(f"invalid JSON: {e.msg}", e.pos) from None
            except RecursionError:
                raise self.error("invalid JSON: nested too deeply") from None
            if end >= len(self.buf) and self._read():
                continue  # a number may continue in the next chunk
            self.pos = end
            return value


def _open_text(path: Path) -> IO[str]:
    # Bounded (size, gzip expansion ratio); pipes, devices and link loops each get their message.
    from omniprof.core.inputs import open_stream

    return io.TextIOWrapper(open_stream(path), encoding="utf-8")


# -- building the result -------------------------------------------------------------------------
def _fast_span(name: str, track: str, start_ns: int, dur_ns: int, category: str, args: Mapping[str, Any],
               flow_ids: tuple[int, ...] = ()) -> Span:
    """A Span built without re-normalising ``args`` (already JSON-safe and possibly shared between
    spans of the same op and shapes: that sharing is what keeps 10^6-event traces compact)."""
    s = object.__new__(Span)
    for k, v in (("name", name), ("track", track), ("start_ns", start_ns), ("dur_ns", dur_ns),
                 ("category", category), ("args", args), ("flow_ids", flow_ids)):
        object.__setattr__(s, k, v)
    return s


_EMPTY: dict[str, Any] = {}


class _Builder:
    """Turns decoded Kineto events into spans, instants, counters and flows as they stream by."""

    def __init__(self, source: str, flops: Mapping[int, int] | None = None,
                 keep: Callable[[str], bool] | None = None) -> None:
        self.source = source
        self.flops = flops or {}
        self.keep = keep
        self.spans: list[Span] = []
        self.instants: list[Instant] = []
        self.tracks: dict[str, Track] = {}
        self._host_tracks: dict[tuple[Any, Any], str] = {}
        self._tids_used: dict[Any, Any] = {}
        self.process_names: dict[Any, str] = {}
        self.process_labels: dict[Any, str] = {}
        self.thread_names: dict[tuple[Any, Any], str] = {}
        self._strings: dict[str, str] = {}
        self._args_cache: dict[tuple, dict[str, Any]] = {}
        self._lists: dict[tuple, list] = {}
        self._stacks: dict[str, list[str]] = {}
        self.host_corr: set[int] = set()
        self.device_corr: set[int] = set()
        self.corr_spans: list[int] = []         # indices of spans carrying a correlation id
        self.fwdbwd: dict[tuple[str, int], list[int]] = {}  # (track, ts) -> flow ids
        self.mem: list[tuple[str, int, int, bool]] = []   # (track, t_ns, bytes, on_device)
        self.mem_series: dict[tuple[str, str], tuple[list[int], list[int]]] = {}
        self.counters: dict[tuple[str, str], tuple[list[int], list[float]]] = {}
        self.open_begins: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
        self.unsupported: dict[str, int] = {}
        self.malformed = 0
        self.malformed_first = ""
        self.filtered = 0
        self.cat_counts: dict[str, int] = {}
        self.trace_bounds: tuple[int, int] | None = None
        self.t_min: int | None = None
        self.t_max: int | None = None
        self.pids: dict[Any, int] = {}
        self.async_ids: set[int] = set()

    # -- helpers ---------------------------------------------------------------------------------
    def _s(self, text: str) -> str:
        return self._strings.setdefault(text, text)

    def _host_track(self, pid: Any, tid: Any) -> str:
        pid, tid = _norm_id(pid), _norm_id(tid)
        key = (pid, tid)
        tid_id = self._host_tracks.get(key)
        if tid_id is None:
            owner = self._tids_used.setdefault(tid, pid)
            tid_id = f"thread:{tid}" if owner == pid else f"thread:{pid}:{tid}"
            self._host_tracks[key] = tid_id
        return tid_id

    def _device_track(self, device: Any, stream: Any) -> str:
        tid = f"device:{device}:stream:{stream}"
        if tid not in self.tracks:
            dev, num = _id_int(device), _id_int(stream)
            self.tracks[tid] = Track(id=tid, name=f"GPU {device} stream {stream}", kind="stream",
                                     process=f"GPU {device}", pid=dev, tid=num, device=dev, stream=num)
        return tid

    def _bad(self, where: Callable[[], str], why: str) -> None:
        self.malformed += 1
        if not self.malformed_first:
            self.malformed_first = f"{why} at {where()}"

    def _extend(self, t0: int, t1: int) -> None:
        if self.t_min is None or t0 < self.t_min:
            self.t_min = t0
        if self.t_max is None or t1 > self.t_max:
            self.t_max = t1

    # -- events ------------------------------------------------------------------------------------
    def add(self, ev: Any, where: Callable[[], str]) -> None:
        if type(ev) is not dict:
            self._bad(where, f"an event is a JSON {type(ev).__name__}, not an object")
            return
        if not ev:
            return
        ph = ev.get("ph")
        try:
            if ph == "X":
                t0, dur = _t64(us_text_to_ns(ev["ts"])), us_text_to_ns(ev.get("dur", 0))
                _t64(t0 + dur)
                self._complete(ev, t0, dur)
            elif ph in ("i", "I", "R"):
                self._instant(ev, _t64(us_text_to_ns(ev["ts"])))
            elif ph in ("s", "f", "t"):
                self._flow(ev)
            elif ph == "M":
                self._meta(ev)
            elif ph == "B":
                ev["_t"] = _t64(us_text_to_ns(ev["ts"]))
                self.open_begins.setdefault((ev.get("pid"), ev.get("tid")), []).append(ev)
            elif ph == "E":
                stack = self.open_begins.get((ev.get("pid"), ev.get("tid")))
                if not stack:
                    self._bad(where, "an 'E' event without a matching 'B'")
                    return
                b = stack.pop()
                t1 = _t64(us_text_to_ns(ev["ts"]))
                if ev.get("args"):
                    b = {**b, "args": {**(b.get("args") or {}), **ev["args"]}}
                self._complete(b, b["_t"], max(t1 - b["_t"], 0))
            elif ph == "C":
                self._counter(ev, _t64(us_text_to_ns(ev["ts"])))
            else:
                key = str(ph)
                self.unsupported[key] = self.unsupported.get(key, 0) + 1
        except (KeyError, TypeError, ValueError, ArithmeticError, AttributeError) as e:  # e.g. "args": 5
            self._bad(where, f"an event with ph={ph!r} lacks a valid field ({type(e).__name__}: {e})")

    def _complete(self, ev: dict[str, Any], t0: int, dur: int) -> None:
        cat = ev.get("cat") or ""
        if type(cat) is not str:
            cat = str(cat)
        name = ev.get("name")
        if not isinstance(name, str):
            name = str(name)
        args = ev.get("args") or _EMPTY
        if type(args) is not dict:
            args = {"value": args}
        if cat == "Trace":  # the profiler's own session span: the part's bounds
            self.trace_bounds = (t0, t0 + dur)
            return
        if dur < 0:
            raise ValueError(f"negative duration {dur} ns")
        self.cat_counts[cat] = self.cat_counts.get(cat, 0) + 1
        raw_cat = cat
        cat = LEGACY_CATEGORY_MAP.get(cat, cat)
        ours = CATEGORY_MAP.get(cat, cat)
        if self.keep is not None and not self.keep(ours):
            self.filtered += 1
            return
        pid, tid = ev.get("pid"), ev.get("tid")
        if cat in _DEVICE_CATS or ("stream" in args and "device" in args and ours not in ("runtime", "cpu_op")):
            device = args.get("device", args.get("inDevice", pid))
            stream = args.get("stream")
            track = self._device_track(device, _stream_of(tid) if stream is None else stream)
            on_device = True
        else:
            track = self._host_track(pid, tid)
            on_device = False
            self.pids[pid] = self.pids.get(pid, 0) + 1
        corr = args.get("correlation")
        cs = args.get("Call stack")  # torch's Python stack of the event (with_stack; torch 2.x: verbose only)
        if ours == "cpu_op" and cat != raw_cat and _STEP.match(name):
            ours = "step"  # PyTorch 1.8-1.9 wrote the step ranges as "Operator" events
            span_args = {"step_num": int(name[len("ProfilerStep#"):])}
            if type(cs) is str:
                span_args["call_stack"] = self._call_stack(cs)
        elif ours == "cpu_op":
            span_args = self._op_args(name, args)
        elif ours == "kernel":
            span_args = _kernel_args(args, self._lists)
        elif ours in ("memcpy", "memset"):
            span_args = _copy_args(name, args, self._lists)
        elif ours == "runtime":
            span_args = {k: json_safe(v) for k, v in (("correlation_id", corr), ("cbid", args.get("cbid")))
                         if v is not None}
        elif ours == "annotation" or ours == "gpu_annotation":
            m = _STEP.match(name) if ours == "annotation" else None
            if m and not on_device:
                ours = "step"
                span_args = {"step_num": int(m.group(1))}
                if type(cs) is str:
                    span_args["call_stack"] = self._call_stack(cs)
            else:
                ext = args.get("External id")
                span_args = {k: v for k, v in (("external_id", ext if type(ext) is int else None),
                                               ("call_stack", self._call_stack(cs) if type(cs) is str else None))
                             if v is not None} or _EMPTY
        elif ours == "python":
            span_args = {"call_stack": self._call_stack(cs)} if type(cs) is str else _EMPTY
        elif ours == "sync":
            span_args = {k: json_safe(v) for k, v in (("kind", args.get("cuda_sync_kind")), ("device", args.get("device")),
                                                      ("stream", args.get("stream")), ("correlation_id", corr))
                         if v is not None}
        else:
            span_args = json_safe(_plain({k: v for k, v in args.items() if k != "Ev Idx"}))
        self._extend(t0, t0 + dur)
        if isinstance(corr, int) and ours in ("runtime", "kernel", "memcpy", "memset", "sync"):
            (self.device_corr if on_device else self.host_corr).add(corr)
            self.corr_spans.append(len(self.spans))
        self.spans.append(_fast_span(self._s(name), track, t0, dur, ours, span_args))

    def _op_args(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        dims = args.get("Input Dims", args.get("Input dims"))
        types = args.get("Input type")
        strides = args.get("Input Strides")
        concrete = args.get("Concrete Inputs")
        flops = args.get("flops")
        ext = args.get("External id")
        if flops is None and self.flops:
            flops = self.flops.get(ext) if isinstance(ext, int) else None
        key = (name, repr(dims), repr(types), repr(strides), repr(concrete), flops)
        cached = self._args_cache.get(key)
        if cached is None:
            cached = {}
            for ours, value in (("input_shapes", dims), ("input_dtypes", types), ("input_strides", strides),
                                ("concrete_inputs", concrete)):
                if value is not None:
                    cached[ours] = json_safe(_plain(value))
            f = _num(flops)
            if f is not None:
                cached["flops"] = int(f)
            self._args_cache[key] = cached
        # Per-op ids (their own dict; the shapes part above is shared between ops of the same signature).
        ids = [(ours, v) for ours, theirs in _OP_IDS if type(v := args.get(theirs)) is int]
        cs = args.get("Call stack")
        if type(cs) is str:
            ids.append(("call_stack", self._call_stack(cs)))
        if ids:
            return {**cached, **dict(ids)}
        return cached

    def _call_stack(self, text: str) -> list[str]:
        """torch's ``Call stack`` (frames joined by ``;``, innermost first) as a list, shared between
        the spans of one call site."""
        got = self._stacks.get(text)
        if got is None:
            got = self._stacks[text] = [self._s(f) for f in text.split(";") if f]
        return got

    def _instant(self, ev: dict[str, Any], t: int) -> None:
        name = ev.get("name")
        args = ev.get("args") or _EMPTY
        pid, tid = ev.get("pid"), ev.get("tid")
        if name == "[memory]" and type(args) is dict:
            track = self._host_track(pid, tid)
            dev_type = args.get("Device Type", 0)
            dev_id = args.get("Device Id", -1)
            on_device = dev_type not in (0, None)  # c10 DeviceType 0 is CPU
            label = "cpu" if not on_device else f"device {dev_id}"
            nbytes = args.get("Bytes")
            if isinstance(nbytes, int):
                self.mem.append((track, t, nbytes, on_device))
            # Each allocation (bytes > 0) or free (< 0) stays an event of its own, as torch wrote it.
            self.instants.append(Instant("[memory]", track, t, "memory", {
                ours: v for ours, theirs in _MEMORY_ARGS if (v := args.get(theirs)) is not None and type(v) is not dict}))
            for key, field in (("memory_allocated", "Total Allocated"), ("memory_reserved", "Total Reserved")):
                value = args.get(field)
                if isinstance(value, int):
                    ts, vals = self.mem_series.setdefault((key, label), ([], []))
                    ts.append(t)
                    vals.append(value)
            self._extend(t, t)
            return
        if name in _PROFILER_MARKERS and ev.get("s") == "g":
            # The profiler's own global markers: session bounds, not data.
            if name == "Record Window End":
                self._extend(t, t)
            return
        track = self._host_track(pid, tid)
        self.instants.append(Instant(self._s(str(name)), track, t, ev.get("cat") or "",
                                     json_safe(_plain({k: v for k, v in args.items() if k != "Ev Idx"}))
                                     if type(args) is dict else {}))
        self._extend(t, t)

    def _flow(self, ev: dict[str, Any]) -> None:
        cat = ev.get("cat")
        fid = ev.get("id")
        if cat == "async" and isinstance(fid, int):
            # PyTorch 1.8-1.9 launch links: the id is the CUDA correlation id, rebuilt below from the spans'
            # own correlation ids; ids that match no span pair are counted in finish().
            self.async_ids.add(fid)
            return
        if cat == "ac2g" or not isinstance(fid, int):
            return  # launch flows are rebuilt from correlation ids, which every span carries
        fid += FWDBWD_FLOW_BASE if cat == "fwdbwd" else 0
        track = self._host_track(ev.get("pid"), ev.get("tid"))
        self.fwdbwd.setdefault((track, us_text_to_ns(ev["ts"])), []).append(fid)

    def _meta(self, ev: dict[str, Any]) -> None:
        name = ev.get("name")
        args = ev.get("args") or {}
        pid, tid = ev.get("pid"), ev.get("tid")
        if name == "process_name":
            self.process_names[_norm_id(pid)] = str(args.get("name", ""))
        elif name == "process_labels":
            self.process_labels[_norm_id(pid)] = str(args.get("labels", ""))
        elif name == "thread_name":
            self.thread_names[(_norm_id(pid), _norm_id(tid))] = str(args.get("name", "")).strip()

    def _counter(self, ev: dict[str, Any], t: int) -> None:
        name = str(ev.get("name"))
        for key, value in (ev.get("args") or {}).items():
            v = _num(value)
            if v is None:
                continue
            ts, vals = self.counters.setdefault((name, str(key)), ([], []))
            ts.append(t)
            vals.append(float(v))
        self._extend(t, t)

    # -- finishing ---------------------------------------------------------------------------------
    def finish(self) -> tuple[list[Track], list[Span], list[Flow], list[CounterSeries], list[Loss], dict[str, Any]]:
        flows: list[Flow] = []
        linked = self.host_corr & self.device_corr
        for fid in sorted(linked):
            flows.append(Flow(fid, "launch", "cuda"))
        for i in self.corr_spans:
            s = self.spans[i]
            corr = s.args.get("correlation_id")
            if corr in linked:
                self.spans[i] = _fast_span(s.name, s.track, s.start_ns, s.dur_ns, s.category, s.args, (corr,))
        unbound = len(self.async_ids - linked)
        if self.fwdbwd:
            by_start: dict[tuple[str, int], int] = {}
            for i, s in enumerate(self.spans):
                if s.category == "cpu_op":
                    by_start.setdefault((s.track, s.start_ns), i)
            bound: set[int] = set()
            for key, ids in self.fwdbwd.items():
                i = by_start.get(key)
                if i is None:
                    unbound += len(ids)
                    continue
                s = self.spans[i]
                self.spans[i] = _fast_span(s.name, s.track, s.start_ns, s.dur_ns, s.category, s.args,
                                           s.flow_ids + tuple(ids))
                bound.update(ids)
            flows += [Flow(fid, "fwdbwd", "fwdbwd") for fid in sorted(bound)]
        # Host thread tracks, named from the trace's metadata.
        tracks: list[Track] = []
        for (pid, tid), track_id in self._host_tracks.items():
            pname = self.process_names.get(pid)
            tname = self.thread_names.get((pid, tid)) or (f"thread {tid}" + (f" ({pname})" if pname else ""))
            tracks.append(Track(id=track_id, name=tname, kind="thread", process=pname, pid=_id_int(pid), tid=_id_int(tid)))
        tracks += list(self.tracks.values())
        counters: list[CounterSeries] = []
        for (key, label), (ts, vals) in self.mem_series.items():
            tid = f"counter:{key}:{label}"
            tracks.append(Track(id=tid, name=f"{key} ({label})", kind="counter"))
            counters.append(CounterSeries(f"{key} ({label})", "bytes", tid, ts, vals))
        for (name, key), (ts, vals) in self.counters.items():
            tid = f"counter:{name}"
            if not any(t.id == tid for t in tracks):
                tracks.append(Track(id=tid, name=name, kind="counter"))
            counters.append(CounterSeries(f"{name}.{key}" if key != name else name, "", tid, ts, vals))
        losses: list[Loss] = []
        if self.malformed:
            losses.append(Loss(self.source, "malformed_events", self.malformed, "events",
                               f"skipped; first: {self.malformed_first}"))
        if self.unsupported:
            n = sum(self.unsupported.values())
            losses.append(Loss(self.source, "unsupported_events", n, "events",
                               "trace event phases not read: " + ", ".join(
                                   f"{k!r} x{v}" for k, v in sorted(self.unsupported.items()))))
        unclosed = sum(len(v) for v in self.open_begins.values())
        if unclosed:
            losses.append(Loss(self.source, "truncated", unclosed, "events", "'B' events never closed by an 'E'"))
        meta: dict[str, Any] = {"kineto_categories": dict(sorted(self.cat_counts.items()))}
        analysed = sum(n for c, n in self.cat_counts.items()
                       if CATEGORY_MAP.get(LEGACY_CATEGORY_MAP.get(c, c), c) in _ANALYSED)
        if self.cat_counts and not analysed:
            found = ", ".join(f"{c!r} x{n}" for c, n in sorted(self.cat_counts.items(), key=lambda kv: -kv[1])[:8])
            meta["analysis_note"] = (
                f"no event category is one omniprof analyses (found {found}): the events are kept as spans, but no "
                f"op table, kernel table or launch flows are built from them. Known categories: "
                f"{', '.join(sorted(CATEGORY_MAP))}, and PyTorch 1.8-1.9's {', '.join(sorted(LEGACY_CATEGORY_MAP))}")
        if unbound:
            meta["unbound_flow_events"] = unbound
        if self.filtered:
            meta["events_filtered_by_level"] = self.filtered
        if self.process_labels:
            meta["process_labels"] = {str(k): v for k, v in self.process_labels.items()}
        return tracks, self.spans, flows, counters, losses, meta


def _norm_id(value: Any) -> Any:
    """A pid/tid as Kineto wrote it, with digit strings as ints: PyTorch 1.8-1.9 wrote an op's tid as
    ``"24472"`` and its launch flow's as ``24472``; both are the same thread."""
    if type(value) is str and value.isdigit():
        return int(value)
    return value


def _id_int(value: Any) -> int | None:
    """An id as a Track field: an integer a result holds (signed 64-bit), else None (the id string
    of the track still names it)."""
    if type(value) is int and -(1 << 63) <= value < 1 << 63:
        return value
    return None


def _stream_of(tid: Any) -> Any:
    """The stream of a device event from its tid: ``7``, or PyTorch 1.8-1.9's ``"stream 7"`` / ``"stream 7 user"``."""
    if type(value := tid) is str:
        m = _STREAM_TID.match(value)
        if m:
            return int(m.group(1))
    return _norm_id(tid)


def _arg(value: Any, shared_lists: dict[tuple, list]) -> Any:
    """A decoded arg as plain JSON; small lists of ints (grid, block) are shared, not copied."""
    t = type(value)
    if t is int or t is str or value is None or t is bool:
        return value
    if t is _Num:
        return float(value)
    if t is list and len(value) <= 4 and all(type(x) is int for x in value):
        key = tuple(value)
        shared = shared_lists.get(key)
        if shared is None:
            if len(shared_lists) < 100_000:
                shared_lists[key] = value
            return value
        return shared
    return json_safe(_plain(value))


#: Per-op ids torch writes: the op's External id (what its kernels' launches and its GPU-side ranges
#: refer to), the autograd sequence number and forward thread (linking a backward op to its forward).
_OP_IDS = (("external_id", "External id"), ("sequence_number", "Sequence number"),
           ("fwd_thread_id", "Fwd thread id"))

_KERNEL_KEYS = (("grid", "grid"), ("block", "block"), ("registers_per_thread", "registers per thread"),
                ("static_shared_memory_bytes", "shared memory"), ("static_shared_memory_bytes", "static shared memory"),
                ("dynamic_shared_memory_bytes", "dynamic shared memory"),
                ("occupancy_pct", "est. achieved occupancy %"), ("blocks_per_sm", "blocks per SM"),
                ("warps_per_sm", "warps per SM"), ("device", "device"), ("stream", "stream"),
                ("context", "context"), ("correlation_id", "correlation"), ("queued", "queued"))


def _kernel_args(a: dict[str, Any], shared_lists: dict[tuple, list]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for ours, theirs in _KERNEL_KEYS:
        v = a.get(theirs)
        if v is not None:
            out[ours] = _arg(v, shared_lists)
    return out


def _copy_args(name: str, a: dict[str, Any], shared_lists: dict[tuple, list]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for ours, theirs in (("bytes", "bytes"), ("device", "device"), ("stream", "stream"),
                         ("correlation_id", "correlation"), ("context", "context")):
        v = a.get(theirs)
        if v is not None:
            out[ours] = _arg(v, shared_lists)
    m = _MEMCPY_KIND.search(name)
    if m:
        out["kind"] = m.group(1)
    bw = _num(a.get("memory bandwidth (GB/s)"))
    if bw is not None:
        out["bandwidth_bytes_per_s"] = float(bw) * 1e9
    return out


# -- op statistics -----------------------------------------------------------------------------------
#: Span categories that nest in the op table, as torch's FunctionEvents do on a thread: ops,
#: annotations, steps and Python functions (torch's key_averages() has a row for each Python function
#: when stacks were recorded, and an op's self time excludes the Python code run inside it).
_NESTED = ("cpu_op", "annotation", "step", "python")
#: Frames torch leaves out of an event's stack (``torch.autograd.profiler_util._filter_stack_entry``).
_STACK_FILTER = (("autograd/__init__", "_make_grads"), ("autograd/__init__", "backward"), ("torch/tensor", "backward"),
                 ("_internal/common_utils", "prof_callable"), ("_internal/common_utils", "prof_func_call"),
                 ("_internal/common_utils", "prof_meth_call"))
_EVALUATE = "autograd::engine::evaluate_function: "


def _keep_frame(frame: str) -> bool:
    return not any(a in frame and b in frame for a, b in _STACK_FILTER)


def call_stacks(spans: Sequence[Span]) -> dict[int, tuple[str, ...]]:
    """The Python stack of each op, annotation, step and Python span (by index in ``spans``),
    innermost frame first, as torch's ``FunctionEvent.stack``.

    Where the trace wrote stacks (``Call stack`` args, kept as ``call_stack``: torch 1.x with
    ``with_stack``, torch 2.x with ``_ExperimentalConfig(verbose=True)``) they are used as written,
    and a span without one has an empty stack. Otherwise (torch 2.x's default) the stack is rebuilt
    from the ``python`` spans: the Python functions running on the span's thread when it started.
    Then, as torch does: frames of autograd's own ``backward`` entry points are left out, and every
    span inside a backward node (a ``cpu_op`` run by ``autograd::engine::evaluate_function: <its
    name>``) takes the stack of the forward op that created the node (same ``sequence_number``,
    found on the node's own thread first; a node without a forward thread id gets an empty stack).
    """
    per_track: dict[str, list[int]] = {}
    written = False
    for i, s in enumerate(spans):
        if s.category in _NESTED:
            per_track.setdefault(s.track, []).append(i)
            written = written or "call_stack" in s.args
    stacks: dict[int, tuple[str, ...]] = {}
    parent: dict[int, int | None] = {}
    order: list[int] = []
    for idx in per_track.values():
        # Parents first: by start, then the longer; a Python call before the op it makes at the same instant.
        idx.sort(key=lambda i: (spans[i].start_ns, -spans[i].end_ns, spans[i].category != "python"))
        py: list[int] = []      # the Python calls open at this instant
        nest: list[int] = []    # torch's nesting: a parent holds the whole child
        for i in idx:
            s = spans[i]
            while py and spans[py[-1]].end_ns <= s.start_ns:
                py.pop()
            while nest and (s.start_ns >= spans[nest[-1]].end_ns or s.end_ns > spans[nest[-1]].end_ns):
                nest.pop()
            parent[i] = nest[-1] if nest else None
            nest.append(i)
            order.append(i)
            if written:
                cs = s.args.get("call_stack")
                frames = tuple(cs) if isinstance(cs, (list, tuple)) else ()
            else:
                frames = tuple(spans[j].name for j in reversed(py))
            stacks[i] = tuple(f for f in frames if isinstance(f, str) and _keep_frame(f))
            if s.category == "python":
                py.append(i)
    # Backward: the node's forward op's stack (torch's EventList._set_backward_stacktraces).
    bw: dict[int, int | None] = {}
    for i in order:  # parents come before their children within a track
        s, p = spans[i], parent[i]
        if s.category == "cpu_op" and p is not None and spans[p].name == _EVALUATE + s.name:
            bw[i] = i
        else:
            bw[i] = bw[p] if p is not None else None
    fwd: dict[tuple[Any, str], tuple[str, ...]] = {}
    for i in sorted(order, key=lambda i: (spans[i].start_ns, -spans[i].end_ns)):
        if bw[i] is None:
            seq = spans[i].args.get("sequence_number", -1)
            fwd.setdefault((seq if type(seq) is int else -1, spans[i].track), stacks[i])
    tracks_of: dict[Any, list[str]] = {}
    for seq, track in fwd:
        tracks_of.setdefault(seq, []).append(track)
    for i in order:
        p = bw[i]
        if p is None:
            continue
        node = spans[p]
        seq = node.args.get("sequence_number", -1)
        if not node.args.get("fwd_thread_id"):
            stacks[i] = ()
        elif (seq, node.track) in fwd:
            stacks[i] = fwd[(seq, node.track)]
        else:
            found = tracks_of.get(seq, [])
            stacks[i] = fwd[(seq, found[0])] if len(found) == 1 else ()
    return stacks


OP_STATS_COLUMNS = opstats.columns(
    "name", "calls", "total_ns", "self_ns", "avg_ns", "device_total_ns", "device_self_ns", "flops",
    "cpu_memory_total_bytes", "cpu_memory_self_bytes", "device_memory_total_bytes", "device_memory_self_bytes")


def op_stats_table(spans: Iterable[Span], memory: Iterable[tuple[str, int, int, bool]] = (),
                   *, has_memory: bool | None = None, group_by_input_shape: bool = False,
                   group_by_stack_n: int = 0) -> Table | None:
    """``op_stats`` like torch's ``key_averages().table()``: one row per op, annotation or Python
    function name (columns: :data:`OP_STATS_COLUMNS`, the vocabulary of :mod:`omniprof.core.opstats`).

    With ``group_by_input_shape`` (torch's ``key_averages(group_by_input_shape=True)``): one row per
    name and input shapes, in a table ``op_stats_by_input_shape`` with an ``input_shapes`` column
    after the name. With ``group_by_stack_n=N`` (torch's ``key_averages(group_by_stack_n=N)``): one
    row per name and top ``N`` frames of its Python stack (:func:`call_stacks`), in a table
    ``op_stats_by_stack`` with a ``stack`` column (JSON, innermost frame first); both together give
    ``op_stats_by_input_shape_and_stack``.

    Spans nest per thread as torch's events do: a span is a child of the innermost open span that
    holds it whole (one that starts inside a span but ends after it is its sibling, as in torch).
    Self time is the span's time minus its direct children's. As in torch, an op whose only child has
    its own name (a dispatcher re-entry such as ``aten::sum`` inside ``aten::sum``) counts once, its
    child folded into it. Device time is the time of the GPU work (kernels, memcpy, memset) whose launch
    (a runtime call with its correlation id) ran inside the op; "self" counts launches made
    directly by the op, not by its children; None when the trace has no GPU work. Memory is the sum of the ``[memory]`` events' bytes
    inside the op (allocations minus frees), CPU and device apart.

    Returns None when there are no op or annotation spans.
    """
    if isinstance(group_by_stack_n, bool) or not isinstance(group_by_stack_n, int) or group_by_stack_n < 0:
        raise InvalidArgumentError(f"'group_by_stack_n' must be an integer >= 0, e.g. 5 (got {group_by_stack_n!r})")
    spans = list(spans)
    stacks = call_stacks(spans) if group_by_stack_n else {}
    device_by_corr: dict[int, int] = {}
    for s in spans:
        if s.category in _DEVICE_WORK:
            c = s.args.get("correlation_id")
            if isinstance(c, int):
                device_by_corr[c] = device_by_corr.get(c, 0) + s.dur_ns
    per_track: dict[str, list[tuple[int, int, int, int, int]]] = {}
    # Entries sort by start, then longer first, so parents precede children that start together.
    # An entry: (start, -dur, kind, span index or -1, value); kind 0 span, 1 launch, 2 CPU memory, 3 device memory.
    for i, s in enumerate(spans):
        if s.category in _NESTED:
            per_track.setdefault(s.track, []).append((s.start_ns, -s.dur_ns, 0, i, 0))
        elif s.category == "runtime" and device_by_corr:
            c = s.args.get("correlation_id")
            d = device_by_corr.get(c, 0) if isinstance(c, int) else 0
            if d:
                per_track.setdefault(s.track, []).append((s.start_ns, 0, 1, -1, d))
    mem_seen = False
    for track, t, nbytes, on_device in memory:
        mem_seen = True
        per_track.setdefault(track, []).append((t, 0, 2 if not on_device else 3, -1, nbytes))
    if not any(e[2] == 0 and spans[e[3]].category != "python" for v in per_track.values() for e in v):
        return None
    if has_memory is None:
        has_memory = mem_seen
    rows: dict[Any, list[Any]] = {}
    for entries in per_track.values():
        entries.sort(key=lambda e: (e[0], e[1], e[2]))
        # An open op: [end_ns, row, child_ns, self_dev, total_dev, self_cpu_mem, total_cpu_mem, self_dev_mem,
        #              total_dev_mem, dur_ns, flops, pending]; ``pending`` holds closed children whose rows
        # are updated when this op closes, because torch folds a same-name only child (an op's dispatcher
        # re-entry, e.g. aten::sum calling aten::sum) into its parent and so must we.
        stack: list[list[Any]] = []

        def add_row(item: list[Any]) -> None:
            _, row, child_ns, sdev, tdev, scm, tcm, sdm, tdm, dur, flops, _ = item
            row[1] += 1
            row[2] += dur
            row[3] += dur - child_ns
            row[5] += tdev
            row[6] += sdev
            if flops is not None:
                row[7] = (row[7] or 0) + flops
            row[8] += tcm
            row[9] += scm
            row[10] += tdm
            row[11] += sdm

        def close(item: list[Any]) -> None:
            pending = item[11]
            if len(pending) == 1 and pending[0][1][0] == item[1][0]:  # same name (whatever the shapes)
                child = pending[0]
                item[2] = child[2]          # the grandchildren's time
                item[3] += child[3]
                item[5] += child[5]
                item[7] += child[7]
                if item[10] is None:
                    item[10] = child[10]
            else:
                for child in pending:
                    add_row(child)
            item[11] = ()
            if stack:
                parent = stack[-1]
                parent[2] += item[9]
                parent[4] += item[4]
                parent[6] += item[6]
                parent[8] += item[8]
                parent[11].append(item)
            else:
                add_row(item)

        for start, negdur, kind, i, value in entries:
            end = start - negdur
            # torch's nesting: the open span must hold this entry whole (an instant: its time).
            while stack and (stack[-1][0] <= start or end > stack[-1][0]):
                close(stack.pop())
            if kind == 0:
                span = spans[i]
                key: Any = span.name
                if group_by_input_shape or group_by_stack_n:
                    key = (span.name,
                           json.dumps(span.args.get("input_shapes", [])) if group_by_input_shape else None,
                           json.dumps(list(stacks.get(i, ())[:group_by_stack_n])) if group_by_stack_n else None)
                row = rows.get(key)
                if row is None:
                    row = rows[key] = [span.name, 0, 0, 0, 0, 0, 0, None, 0, 0, 0, 0]
                f = span.args.get("flops")
                stack.append([span.end_ns, row, 0, 0, 0, 0, 0, 0, 0, span.dur_ns, f if isinstance(f, int) else None,
                              []])
            elif stack:
                top = stack[-1]
                if kind == 1:
                    top[3] += value
                    top[4] += value
                elif kind == 2:
                    top[5] += value
                    top[6] += value
                else:
                    top[7] += value
                    top[8] += value
        while stack:
            close(stack.pop())
    out = []
    rows_keys = []
    for key, row in rows.items():
        name, calls, total, self_ns, _, tdev, sdev, flops, tcm, scm, tdm, sdm = row
        if not calls:
            continue  # a row only ever folded into its parent (a re-dispatch with other shapes)
        has_device = bool(device_by_corr)  # no GPU work in the trace: device columns are unknown, not 0
        out.append((name, calls, total, self_ns, total // calls if calls else 0, tdev if has_device else None,
                    sdev if has_device else None, flops,
                    tcm if has_memory else None, scm if has_memory else None,
                    tdm if has_memory else None, sdm if has_memory else None))
        rows_keys.append(key)
    if group_by_input_shape or group_by_stack_n:
        extra = (("input_shapes",) if group_by_input_shape else ()) + (("stack",) if group_by_stack_n else ())
        out = [(r[0], *(k for k in key[1:] if k is not None), *r[1:]) for r, key in zip(out, rows_keys)]
        n = len(extra)
        out.sort(key=lambda r: (-r[1 + n + 2], *r[: 1 + n]))  # by self time, then name and keys
        suffix = "_and_".join("input_shape" if e == "input_shapes" else e for e in extra)
        how = ", ".join(("group_by_input_shape=True",) * group_by_input_shape +
                        ((f"group_by_stack_n={group_by_stack_n}",) if group_by_stack_n else ()))
        return Table(f"op_stats_by_{suffix}", (OP_STATS_COLUMNS[0], *extra, *OP_STATS_COLUMNS[1:]), out,
                     title=f"Op statistics by {suffix.replace('_', ' ')} (torch key_averages({how}))")
    out.sort(key=lambda r: (-r[2], r[0]))
    return Table("op_stats", OP_STATS_COLUMNS, out, title="Op statistics (torch key_averages)")


def op_table(part: BackendResult, *, group_by_input_shape: bool = False, group_by_stack_n: int = 0) -> Table | None:
    """The op table of a torch part, rebuilt from its spans and ``[memory]`` events.

    ``op_table(part)`` equals the part's ``op_stats`` table; ``group_by_input_shape=True`` gives
    torch's ``key_averages(group_by_input_shape=True)``: one row per op name and input shapes
    (shapes are recorded with ``record_shapes``, i.e. ``host_tracer_level=3``);
    ``group_by_stack_n=N`` torch's ``key_averages(group_by_stack_n=N)``: one row per op name and top
    ``N`` frames of its Python stack (stacks are recorded with ``with_stack``, i.e.
    ``python_tracer_level=1``; without them every op has an empty stack).

    >>> from omniprof.core.results import Span
    >>> spans = [Span("aten::mm", "t", 0, 10, "cpu_op", {"input_shapes": [[2, 3], [3, 4]]}),
    ...          Span("aten::mm", "t", 20, 30, "cpu_op", {"input_shapes": [[8, 3], [3, 4]]})]
    >>> [r[:3] for r in op_table(BackendResult("torch", spans=spans), group_by_input_shape=True).rows]
    [('aten::mm', '[[8, 3], [3, 4]]', 1), ('aten::mm', '[[2, 3], [3, 4]]', 1)]
    >>> spans = [Span("train.py(9): step", "t", 0, 100, "python"), Span("aten::mm", "t", 10, 20, "cpu_op"),
    ...          Span("eval.py(3): check", "t", 200, 100, "python"), Span("aten::mm", "t", 210, 5, "cpu_op")]
    >>> [r[:4] for r in op_table(BackendResult("torch", spans=spans), group_by_stack_n=1).rows
    ...  if r[0] == "aten::mm"]
    [('aten::mm', '["train.py(9): step"]', 1, 20), ('aten::mm', '["eval.py(3): check"]', 1, 5)]
    """
    memory = [(i.track, i.t_ns, i.args["bytes"], i.args.get("device_type", 0) not in (0, None))
              for i in part.instants if i.category == "memory" and isinstance(i.args.get("bytes"), int)]
    had = part.table("op_stats")
    has_memory = bool(memory) or (had is not None and bool(had.rows) and "cpu_memory_self_bytes" in had.columns and
                                  had.rows[0][had.columns.index("cpu_memory_self_bytes")] is not None)
    return op_stats_table(part.spans, memory, has_memory=has_memory, group_by_input_shape=group_by_input_shape,
                          group_by_stack_n=group_by_stack_n)


# -- entry points ----------------------------------------------------------------------------------
def _feed(stream: _JsonStream, builder: _Builder, name: str) -> dict[str, Any]:
    """Stream every event of the trace into ``builder``; the trace's other top-level fields."""
    top: dict[str, Any] = {}
    where = stream.where

    def events() -> None:
        stream.expect("[", "'[' opening the event array")
        if stream.peek() == "]":
            stream.pos += 1
            return
        while True:
            builder.add(stream.value(), where)
            if stream.expect(",]", "',' or ']' after an event") == "]":
                return

    first = stream.peek()
    if first == "":
        raise stream.error("empty file: expected a Kineto trace (a JSON object with 'traceEvents')")
    if first == "[":
        events()
    elif first == "{":
        stream.pos += 1
        seen_events = False
        if stream.peek() == "}":
            stream.pos += 1
        else:
            while True:
                if stream.peek() != '"':
                    stream.expect('"', "a quoted key")
                key = stream.value()
                stream.expect(":", "':' after a key")
                if key == "traceEvents":
                    events()
                    seen_events = True
                else:
                    top[key] = _plain(stream.value())
                if stream.expect(",}", "',' or '}'") == "}":
                    break
        if not seen_events:
            raise TraceReadError(f"{name}: not a Kineto trace: the JSON object has no 'traceEvents' array "
                                 f"(keys: {', '.join(sorted(top)) or 'none'})")
    else:
        raise stream.error(f"not a Kineto trace: expected '{{' or '[', found {first!r}")
    if stream.peek() != "":
        raise stream.error("invalid JSON: extra data after the trace")
    return top


def parse_trace(fh: IO[str], name: str, *, source: str = "torch", flops: Mapping[int, int] | None = None,
                keep: Callable[[str], bool] | None = None, clock: ClockInfo | None = None,
                artifacts: Iterable[Artifact] = ()) -> tuple[BackendResult, dict[str, Any]]:
    """Parse a Kineto trace from a text stream into one :class:`BackendResult`.

    Args:
        fh: the trace as text (a JSON object with ``traceEvents``, or a bare event array).
        name: the file name used in error messages.
        source: the part's backend name.
        flops: FLOPs per op ``External id`` (a live torch session has them; the JSON does not).
        keep: keep only spans whose (our) category passes this test; the rest are counted.
        clock: the part's clock (default: Kineto's own, offset 0).
        artifacts: native files to list in the part.

    Returns:
        The part, and the trace's top-level fields other than ``traceEvents``.

    Raises:
        TraceReadError: the JSON is malformed or truncated; the message names ``name`` and the
            line, column and character offset.
    """
    stream = _JsonStream(fh, name)
    builder = _Builder(source, flops, keep)
    top = _feed(stream, builder, name)
    tracks, spans, flows, counters, losses, meta = builder.finish()
    if stream.control_characters:
        meta["values_with_control_characters"] = stream.control_characters
    table = op_stats_table(spans, builder.mem, has_memory=bool(builder.mem) or bool(top.get("profile_memory")))
    if builder.trace_bounds is not None:
        start_ns, end_ns = builder.trace_bounds
        if builder.t_max is not None:
            end_ns = max(end_ns, builder.t_max)
    else:
        start_ns, end_ns = builder.t_min or 0, builder.t_max or 0
    summaries: dict[str, Any] = {}
    # From the op table, where an op re-dispatched to itself (aten::mul inside aten::mul, both with FLOPs)
    # counts once, as in torch's key_averages(); summing every span would count it twice.
    total_flops = 0
    if table is not None:
        fi = table.columns.index("flops")
        total_flops = sum(r[fi] for r in table.rows if r[fi])
    if total_flops:
        summaries["flops"] = {"total_flops": total_flops,
                              "flops_per_s": total_flops / ((end_ns - start_ns) / 1e9) if end_ns > start_ns else None}
    if counters:
        summaries["memory"] = {f"peak_{c.name.replace(' ', '_').replace('(', '').replace(')', '')}_bytes":
                               int(max(c.values)) for c in counters if c.unit == "bytes" and c.values}
    base = top.get("baseTimeNanoseconds")
    meta.update({"format": "kineto", "trace_name": top.get("traceName", Path(name).name)})
    if isinstance(base, int):
        meta["kineto_base_time_ns"] = base
    devices = top.get("deviceProperties")
    if isinstance(devices, list):
        meta["devices"] = json_safe(devices)
    for key in ("schemaVersion", "trace_id", "host_name", "distributedInfo", "cupti_version", "cuda_runtime_version",
                "cuda_driver_version", "record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules"):
        if key in top:
            meta[key] = json_safe(top[key])
    if builder.pids:
        meta["pid"] = max(builder.pids, key=lambda p: builder.pids[p])
    tables = [table] if table is not None else []
    part = BackendResult(
        backend=source, clock=clock or ClockInfo(name="kineto", offset_ns=0), start_ns=start_ns, end_ns=end_ns,
        tracks=tracks, spans=spans, instants=builder.instants, flows=flows, counters=counters, tables=tables,
        summaries=summaries, losses=losses, artifacts=tuple(artifacts), metadata=meta,
    )
    part = add_kernel_stats(part)
    for loss in losses:
        warnings.warn(f"{name}: {loss.count} {loss.unit} not read ({loss.kind}): {loss.detail}", DataLossWarning,
                      stacklevel=3)
    if "analysis_note" in meta:
        warnings.warn(f"{name}: {meta['analysis_note']}", OmniprofWarning, stacklevel=3)
    return part, top


def read_trace(path: str | os.PathLike[str]) -> ProfileResult:
    """Read a Kineto trace file (``.json`` or ``.json.gz``) into a :class:`ProfileResult`.

    Works on any machine: torch is not imported. Times keep the trace's own clock (offset 0,
    noted in the part's metadata ``clock_note``).

    Raises:
        TraceReadError: missing, unreadable, malformed or truncated file (the message names the
            file and the position).

    .. versionadded:: 0.1
    """
    p = Path(path)
    with _open_text(p) as fh:
        part, top = parse_trace(fh, str(p), artifacts=(Artifact("kineto", str(p), "the Kineto trace read"),))
    note = ("read offline: times are the trace's own Kineto clock (microseconds converted to ns"
            + (f", relative to baseTimeNanoseconds={part.metadata['kineto_base_time_ns']}" if
               "kineto_base_time_ns" in part.metadata else ", Unix epoch") + "), offset 0 to no other clock")
    import attrs

    part = attrs.evolve(part, metadata={**part.metadata, "clock_note": note})
    from omniprof._version import __version__

    md = RunMetadata(
        host=str(top.get("host_name", "")), pid=_id_int(part.metadata.get("pid")) or 0,
        versions={"omniprof": __version__, "kineto_schema": top.get("schemaVersion")},
        devices=tuple(d for d in part.metadata.get("devices", []) if isinstance(d, Mapping)),
        backends=("torch",), start_ns=part.start_ns, end_ns=part.end_ns,
        label=f"Kineto trace {p.name}",
    )
    return ProfileResult(metadata=md, parts=(part,), partial=any(loss.kind == "truncated" for loss in part.losses))



class _Sink:
    """Stands in for the builder's span list: each span goes to ``fn`` and is not kept."""

    __slots__ = ("fn", "n")

    def __init__(self, fn: Callable[[Span], None]) -> None:
        self.fn = fn
        self.n = 0

    def append(self, span: Span) -> None:
        self.n += 1
        self.fn(span)

    def __len__(self) -> int:
        return self.n


class _Discard:
    __slots__ = ()

    def append(self, _: Any) -> None:
        pass

    add = append


def stream_spans(path: str | os.PathLike[str], sink: Callable[[Span], None]) -> dict[str, Any]:
    """Read a Kineto trace, handing each complete span to ``sink`` as it is read and keeping none.

    For a reduction that must not hold a whole trace (:mod:`omniprof.analysis.crossrank` reads
    10^6-event ranks this way): memory stays the size of one JSON chunk plus what ``sink`` keeps.
    The spans are those :func:`read_trace` builds, less their flow ids (launch links are made at
    the end of a read; a span's ``correlation_id`` arg carries the same link). Instants are not
    kept.

    Returns:
        The trace's top-level fields other than ``traceEvents``, plus ``"_bounds_ns"`` (the
        profiler's own session span, else the first to the last event, or None) and ``"_losses"``
        (what was not read, one line each).

    Raises:
        TraceReadError: as :func:`read_trace`.

    .. versionadded:: 0.2
    """
    p = Path(path)
    builder = _Builder("torch")
    builder.spans = _Sink(sink)  # type: ignore[assignment]
    builder.corr_spans = _Discard()  # type: ignore[assignment]
    builder.instants = _Discard()  # type: ignore[assignment]
    builder.mem = _Discard()  # type: ignore[assignment]
    builder.host_corr = builder.device_corr = _Discard()  # type: ignore[assignment]
    with _open_text(p) as fh:
        top = _feed(_JsonStream(fh, str(p)), builder, str(p))
    bounds = builder.trace_bounds
    if bounds is None and builder.t_min is not None:
        bounds = (builder.t_min, builder.t_max or builder.t_min)
    elif bounds is not None and builder.t_max is not None:
        bounds = (bounds[0], max(bounds[1], builder.t_max))
    losses = []
    if builder.malformed:
        losses.append(f"{builder.malformed} malformed events skipped; first: {builder.malformed_first}")
    if builder.unsupported:
        losses.append("trace event phases not read: " + ", ".join(
            f"{k!r} x{v}" for k, v in sorted(builder.unsupported.items())))
    unclosed = sum(len(v) for v in builder.open_begins.values())
    if unclosed:
        losses.append(f"{unclosed} 'B' events never closed by an 'E'")
    return {**top, "_bounds_ns": bounds, "_losses": losses}
