"""The result builder of the Kineto reader: decoded trace events to spans, instants, flows, counters.

Mapping (see ``docs/readers.md`` for the full table):

* ``cpu_op`` -> ``cpu_op`` spans (``input_shapes``, ``input_dtypes``, ``flops``);
  ``user_annotation`` / ``gpu_user_annotation`` -> ``annotation``, ``ProfilerStep#N`` -> ``step``;
  ``cuda_runtime`` / ``cuda_driver`` (and xpu/privateuse1) -> ``runtime``; ``kernel`` -> ``kernel``
  with the launch parameters of docs/results.md; ``gpu_memcpy`` / ``gpu_memset`` -> ``memcpy`` /
  ``memset``; ``cuda_sync`` -> ``sync``; ``python_function`` -> ``python``; other categories keep
  their own name.
* ``[memory]`` instants -> ``memory_allocated`` / ``memory_reserved`` counter series per device.
* A CPU launch and its GPU work share ``flow_ids`` (the CUDA correlation id) with a
  ``Flow(id, "launch", "cuda")``; forward/backward links (``fwdbwd``) become flows too.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from omniprof.core.results import CounterSeries, Flow, Instant, Loss, Span, Track, json_safe
from omniprof.formats.kineto_json import _num, _Num, _plain, us_text_to_ns

__all__ = ["CATEGORY_MAP", "LEGACY_CATEGORY_MAP", "FWDBWD_FLOW_BASE", "Builder"]

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

#: Forward/backward flow ids are shifted by this so they never collide with CUDA correlation ids.
FWDBWD_FLOW_BASE = 1 << 40

_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_PROFILER_MARKERS = frozenset({"Iteration Start: PyTorch Profiler", "Record Window End"})
_MEMORY_ARGS = (("bytes", "Bytes"), ("addr", "Addr"), ("total_allocated_bytes", "Total Allocated"),
                ("total_reserved_bytes", "Total Reserved"), ("device_type", "Device Type"), ("device_id", "Device Id"))
_MEMCPY_KIND = re.compile(r"\b([HDPA]to[HDPA])\b")


def _t64(ns: int) -> int:
    """``ns`` if a result can hold it (signed 64 bits); else ValueError (the event is counted as
    malformed: a time of -10**20 us made a result that could not be saved)."""
    if not -(1 << 63) <= ns < 1 << 63:
        raise ValueError(f"time {ns} ns is beyond 64 bits")
    return ns



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


class Builder:
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
                             if v is not None}
                if not on_device:  # a range's inputs (c10d's nccl:all_reduce records them): torch groups by them
                    span_args.update(self._shapes(name, args))
                span_args = span_args or _EMPTY
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

    def _shapes(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        """An op's or range's recorded inputs (shapes, dtypes, strides, concrete values, FLOPs), shared
        between the events of one signature."""
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
        return cached

    def _op_args(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        cached = self._shapes(name, args)
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
