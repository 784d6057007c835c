"""Reporter ``tensorboard``: a result in the XProf logdir layout.

Every report adds one new run, never overwriting another::

    LOGDIR/plugins/profile/<YYYY_MM_DD_HH_MM_SS_mmm>/<host>.xplane.pb

XProf (TensorBoard's profile plugin, ``pip install xprof``) opens it: ``omniprof view LOGDIR`` or
:func:`omniprof.viewers.xprof.serve_logdir`. The file is one ``XSpace``:

* A part that carries jax's own ``xplane`` artifact (the ``xla`` backend) is written as jax wrote it,
  so every XProf tool (HLO op stats, memory viewer, graph viewer) works. A result with only that
  part is a byte-for-byte copy; other parts of the same result are added to its planes.
* Every other part is converted: host tracks become lines of the ``/host:CPU`` plane, device and
  stream tracks lines of ``/device:GPU:<n>`` planes, counter series samples on each plane's
  ``_counters_`` line (XProf's trace viewer draws them as counter tracks), span args become event
  stats, flows become XProf ``flow`` stats (arrows from a CPU launch to its kernel), instants are
  zero-length events, and stack samples become a flame-chart line per thread. Kernel spans carry a
  ``kernel_details`` stat, so XProf's kernel_stats tool lists them.

Times: XProf adds ``XLine.timestamp_ns`` (as ps) to event offsets in signed 64-bit picoseconds, so
wall-clock ns since 1970 would overflow. Like jax, lines are timed from the profile start, whose
wall-clock time is in the ``Task Environment`` plane (``profile_start_time``).

The conversion builds plain data first (:func:`build_timeline`) and protobuf second.
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from omniprof._version import __version__
from omniprof.analysis.timeline import PlacedPart, nest_lanes, placed, time_axis
from omniprof.core import validators as v
from omniprof.core.fileio import atomic_write_bytes, hostname, unique_run_dir
from omniprof.core.results import BackendResult, ProfileResult, Span, Track
from omniprof.errors import InvalidArgumentError
from omniprof.formats import xspace as xs
from omniprof.plugin import Reporter

__all__ = [
    "TensorBoardReporter", "TensorBoardOptions", "build_timeline", "to_xspace", "write_logdir",
    "Timeline", "PlaneData", "LineData", "EventData", "xplane_files",
]

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# Stats XProf gives a meaning of its own; span args of the same name are renamed so they stay args.
_RESERVED_STATS = frozenset({"flow", "group_id", "is_async", "step_name", "_pt", "_p", "_ct", "_c", "_r", "_a"})
_DEVICE_KINDS = frozenset({"device", "stream"})
_WALL_CLOCK_MIN_NS = 10**17  # 1973: a line timestamp above this is wall-clock, below it is run-relative


def _safe_name(inst: Any, attribute: Any, value: Any) -> None:
    if value and not _SAFE_NAME.match(value):
        raise InvalidArgumentError(
            f"{attribute.name!r} must be letters, digits, '.', '_' or '-' and start with a letter or digit "
            f"(got {value!r})")


@attrs.frozen(kw_only=True)
class TensorBoardOptions:
    """Options of the ``tensorboard`` reporter.

    Attributes:
        run_prefix: put before the run directory's timestamp (``myexp_2026_...``).
        host: the ``<host>`` of ``<host>.xplane.pb`` (default: the result's host name).
        include_samples: draw stack samples as a flame-chart line per thread.
        include_counters: write counter series.
        use_native_xplane: when a part carries jax's own ``xplane`` artifact, write it instead of
            converting that part's spans (XProf's HLO tools need it).
    """

    run_prefix: str = attrs.field(default="", validator=[v.is_str, _safe_name])
    host: str | None = attrs.field(default=None, validator=attrs.validators.optional([v.is_str, _safe_name]))
    include_samples: bool = attrs.field(default=True, validator=v.is_bool)
    include_counters: bool = attrs.field(default=True, validator=v.is_bool)
    use_native_xplane: bool = attrs.field(default=True, validator=v.is_bool)


# -- plain data -------------------------------------------------------------------------------------
@attrs.frozen
class EventData:
    """One event: ``start_ns`` is ns after the timeline's start; ``stats`` are its args.

    ``static`` holds args shared by every event with the same name and static args (a sampled
    frame's file and line): they are stored once, in the event's XEventMetadata.
    """

    name: str
    start_ns: int
    dur_ns: int
    stats: Mapping[str, Any] = attrs.field(factory=dict)
    static: Mapping[str, Any] = attrs.field(factory=dict)
    #: the event metadata's name when XProf must parse one other than ``name`` (shown as ``name``)
    xprof_name: str = ""


@attrs.frozen
class LineData:
    """One timeline row. ``line_id`` is XProf's row id (a thread or stream id where known)."""

    name: str
    line_id: int | None
    events: tuple[EventData, ...]
    display_name: str = ""


@attrs.frozen
class PlaneData:
    """One XPlane: ``/host:CPU`` or ``/device:GPU:<id>``."""

    name: str
    plane_id: int
    lines: tuple[LineData, ...]


@attrs.frozen
class Timeline:
    """Everything converted, before protobuf. ``start_unix_ns``/``end_unix_ns`` bound it on the wall clock."""

    host: str
    planes: tuple[PlaneData, ...]
    start_unix_ns: int
    end_unix_ns: int
    metadata: Mapping[str, Any] = attrs.field(factory=dict)
    notes: tuple[str, ...] = ()


def _stat_items(args: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in args.items():
        key = str(key)
        if key in _RESERVED_STATS or key.startswith("_"):
            key = f"arg{key}" if key.startswith("_") else f"arg_{key}"
        out[key] = value if isinstance(value, (bool, int, float, str)) or value is None else \
            json.dumps(value, separators=(",", ":"), default=str)
        if out[key] is None:
            out[key] = "null"
    return out


def _triple(value: Any) -> str | None:
    if isinstance(value, (list, tuple)) and value:
        dims = [int(x) for x in value if isinstance(x, (int, float)) and not isinstance(x, bool)]
        if len(dims) == len(value):
            return ",".join(str(d) for d in (dims + [1, 1])[:3])
    return None


def kernel_details(args: Mapping[str, Any]) -> str | None:
    """XProf's ``kernel_details`` text for a kernel span's args, or None without grid and block.

    >>> kernel_details({"grid": [128, 1, 1], "block": [256], "registers_per_thread": 64})
    'regs:64 static_shared:0 dynamic_shared:0 grid:128,1,1 block:256,1,1'
    """
    grid, block = _triple(args.get("grid")), _triple(args.get("block"))
    if grid is None or block is None:
        return None

    def num(key: str) -> int:
        value = args.get(key, 0)
        return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0

    text = (f"regs:{num('registers_per_thread')} static_shared:{num('static_shared_memory_bytes')} "
            f"dynamic_shared:{num('dynamic_shared_memory_bytes')} grid:{grid} block:{block}")
    occ = args.get("occupancy_pct")
    if isinstance(occ, (int, float)) and not isinstance(occ, bool):
        text += f" occ_pct:{float(occ):g}"
    return text


def _device_of(track: Track) -> int | None:
    """The ``/device:GPU:<n>`` plane of a track: its ``device``; 0 for a device or stream track
    that does not know its device (a CUDA context's sync track); None for host tracks."""
    if track.device is not None:
        return int(track.device)
    return 0 if track.kind in _DEVICE_KINDS else None


def _pack(events: list[EventData]) -> list[list[EventData]]:
    """Split events into rows where each row only nests (XProf lines must not partially overlap):
    :func:`omniprof.analysis.timeline.nest_lanes`, each row in start order, parents first."""
    placed = nest_lanes([(ev.start_ns, ev.start_ns + ev.dur_ns) for ev in events])
    order = sorted(range(len(events)), key=lambda i: (events[i].start_ns, -events[i].dur_ns, i))
    rows: list[list[EventData]] = [[] for _ in range(max((lane for lane, _, _ in placed), default=-1) + 1)]
    for i in order:
        rows[placed[i][0]].append(events[i])
    return rows


def _sampled_events(part: BackendResult, conv: PlacedPart) -> dict[int, list[EventData]]:
    """Stack samples as nested frame events per thread: a sample stands for (t - weight, t]."""
    by_thread: dict[int, list[Any]] = defaultdict(list)
    for s in part.samples:
        by_thread[s.thread_id].append(s)
    statics: dict[int, tuple[str, dict[str, Any]]] = {}
    for fid, frame in enumerate(part.frames):
        static: dict[str, Any] = {}
        if frame.file:
            static["file"] = frame.file
            static["line"] = frame.line
        if frame.module:
            static["module"] = frame.module
        statics[fid] = (frame.name, static)
    out: dict[int, list[EventData]] = {}
    for tid, samples in by_thread.items():
        samples.sort(key=lambda s: s.t_ns)
        events: list[EventData] = []
        open_: list[tuple[int, int]] = []  # (frame index, start)
        counts: list[int] = []
        prev_end: int | None = None

        def close(down_to: int, at: int) -> None:
            while len(open_) > down_to:
                fid, start = open_.pop()
                name, static = statics.get(fid) or (f"frame {fid}", {})
                events.append(EventData(name, start, max(at - start, 0), {"samples": counts.pop()}, static))

        for s in samples:
            end = conv.at(s.t_ns)
            start = end - max(s.weight_ns, 0)
            if prev_end is not None:
                if start > prev_end:
                    close(0, prev_end)
                start = max(start, prev_end)
            stack = part.stacks[s.stack_id] if 0 <= s.stack_id < len(part.stacks) else ()
            common = 0
            while common < len(open_) and common < len(stack) and open_[common][0] == stack[common]:
                common += 1
            close(common, start)
            for i in range(common):
                counts[i] += 1
            for fid in stack[common:]:
                open_.append((fid, start))
                counts.append(1)
            prev_end = max(end, start)
        if prev_end is not None:
            close(0, prev_end)
        out[tid] = events
    return out


def build_timeline(result: ProfileResult, options: TensorBoardOptions | None = None,
                   *, parts: Sequence[BackendResult] | None = None) -> Timeline:
    """Convert ``parts`` (default: all) of ``result`` to planes, lines and events (plain data).

    Times are ns after the earliest of the run start and every event, so none is negative
    (:func:`omniprof.analysis.timeline.time_axis`).
    """
    opts = options or TensorBoardOptions()
    parts = tuple(result.parts if parts is None else parts)
    meta = result.metadata
    axis = time_axis(result, parts)  # each part's clock offset, and 0 at the earliest instant
    start_unix = meta.start_unix_ns + (axis.origin_ns - meta.start_ns) if meta.start_unix_ns else 0
    end_unix = start_unix + axis.end_ns if meta.start_unix_ns else 0
    several = len(result.parts) > 1  # lines say which backend drew them (also beside a native xplane)

    # plane key: None = the host plane, n = /device:GPU:n
    planes: dict[int | None, list[LineData]] = defaultdict(list)
    counters: dict[int | None, list[EventData]] = defaultdict(list)

    # Flow ids are unique per part only: number them across the result.
    flow_ids: dict[tuple[int, int], int] = {}
    flow_members: dict[int, list[tuple[int, int, int]]] = defaultdict(list)  # new id -> [(start, part, span)]

    on_axis = placed(result, axis, parts)
    for pi, part in enumerate(parts):
        conv = on_axis[pi]
        for si, sp in enumerate(part.spans):
            for fid in sp.flow_ids:
                new = flow_ids.setdefault((pi, fid), len(flow_ids) + 1)
                flow_members[new].append((conv.at(sp.start_ns), pi, si))
    flow_dir: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)  # span key -> [(id, direction)]
    for new, members in flow_members.items():
        if len(members) < 2:
            continue
        members.sort()
        for k, (_, pi, si) in enumerate(members):
            direction = xs.FLOW_OUT if k == 0 else (xs.FLOW_IN if k == len(members) - 1 else xs.FLOW_IN_OUT)
            flow_dir[(pi, si)].append((new, direction))

    for pi, part in enumerate(parts):
        conv = on_axis[pi]
        tracks = {t.id: t for t in part.tracks}
        processes = {t.process for t in part.tracks if t.process and _device_of(t) is None}
        events_by_track: dict[str, list[EventData]] = defaultdict(list)
        redispatched = _redispatched_ops(part)
        for si, sp in enumerate(part.spans):
            events_by_track[sp.track].append(_span_event(sp, conv, flow_dir.get((pi, si), ()),
                                                         framework_op=si not in redispatched))
        for ins in part.instants:
            stats = _stat_items(ins.args)
            if ins.category:
                stats.setdefault("category", ins.category)
            events_by_track[ins.track].append(EventData(ins.name, conv.at(ins.t_ns), 0, stats))

        def label(track: Track | None, track_id: str) -> str:
            name = track.name if track is not None else track_id
            if track is not None and len(processes) > 1 and track.process:
                name = f"{track.process}: {name}"
            return f"[{part.backend}] {name}" if several else name

        order = [t.id for t in part.tracks] + sorted(set(events_by_track) - set(tracks))
        for track_id in order:
            events = events_by_track.get(track_id)
            if not events:
                continue
            track = tracks.get(track_id)
            device = _device_of(track) if track is not None else None
            line_id = (track.stream if device is not None else track.tid) if track is not None else None
            name = label(track, track_id)
            rows = _pack(events)
            for r, row in enumerate(rows):
                planes[device].append(LineData(
                    name if r == 0 else f"{name} ({r + 1})", line_id if r == 0 else None, tuple(row)))

        if opts.include_samples and part.samples:
            for tid, events in sorted(_sampled_events(part, conv).items()):
                if events:
                    base = f"{part.thread_name(tid)} (sampled stacks)"
                    name = f"[{part.backend}] {base}" if several else base
                    planes[None].append(LineData(name, None, tuple(sorted(events, key=lambda e: (e.start_ns, -e.dur_ns)))))

        if opts.include_counters:
            for series in part.counters:
                track = tracks.get(series.track)
                device = _device_of(track) if track is not None else None
                stat = series.unit or "value"
                cname = f"[{part.backend}] {series.name}" if several else series.name
                counters[device].extend(EventData(cname, conv.at(t), 0, {stat: float(val)})
                                        for t, val in zip(series.t_ns, series.values))

    out_planes: list[PlaneData] = []
    for key in sorted(set(planes) | set(counters) | {None}, key=lambda k: -1 if k is None else k):
        lines = list(planes.get(key, ()))
        if counters.get(key):
            lines.append(LineData(xs.COUNTER_LINE_NAME, None, tuple(sorted(counters[key], key=lambda e: e.start_ns))))
        name = xs.HOST_PLANE_NAME if key is None else f"{xs.GPU_PLANE_PREFIX}{key}"
        out_planes.append(PlaneData(name, 0 if key is None else key, tuple(lines)))
    host = opts.host or _file_host(meta.host)
    metadata = {"omniprof_version": __version__, "backends": ",".join(p.backend for p in parts),
                "python": meta.python, "platform": meta.platform, "pid": meta.pid, "label": meta.label}
    return Timeline(host, tuple(out_planes), start_unix, end_unix, metadata)


def _redispatched_ops(part: BackendResult) -> set[int]:
    """Indices of ``cpu_op`` spans directly inside a span of the same name on the same track: an op's
    dispatcher re-entry (``aten::sum`` in ``aten::sum``), which torch's op table folds into its
    parent. They are not marked as framework ops for XProf, so its op statistics count the op once."""
    out: set[int] = set()
    by_track: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for i, sp in enumerate(part.spans):
        if sp.category in ("cpu_op", "annotation", "step"):
            by_track[sp.track].append((sp.start_ns, -sp.dur_ns, i))
    for entries in by_track.values():
        entries.sort()
        stack: list[tuple[int, str]] = []  # (end_ns, name)
        for start, negdur, i in entries:
            while stack and stack[-1][0] <= start:
                stack.pop()
            sp = part.spans[i]
            if stack and sp.category == "cpu_op" and stack[-1][1] == sp.name:
                out.add(i)
            stack.append((start - negdur, sp.name))
    return out


def _span_event(sp: Span, conv: PlacedPart, flows: Sequence[tuple[int, int]], *, framework_op: bool = True) -> EventData:
    stats = _stat_items(sp.args)
    if sp.category:
        stats.setdefault("category", sp.category)
    if sp.category == "kernel":
        details = kernel_details(sp.args)
        if details is not None:
            stats["kernel_details"] = details
    xprof_name = _framework_op_name(sp.name) if sp.category == "cpu_op" and framework_op else ""
    if flows:
        # XProf keeps one flow stat per event; a span in several flows keeps the first and lists all.
        fid, direction = flows[0]
        stats["flow"] = xs.encode_flow(fid, direction)
        if len(flows) > 1:
            stats["flow_ids"] = ",".join(str(f) for f, _ in flows)
    return EventData(sp.name, conv.at(sp.start_ns), max(sp.dur_ns, 0), stats, xprof_name=xprof_name)


_FRAMEWORK_OP = re.compile(r"^([a-z_][a-z0-9_]*)::([A-Za-z_][A-Za-z0-9_.]*)$")


def _framework_op_name(name: str) -> str:
    """The name XProf's op statistics recognise for a framework op: ``aten::addmm`` -> ``addmm:aten``.

    XProf counts a host event as a framework op only when its metadata name parses as
    ``<op name>:<op type>`` (TensorFlow's ``MatMul:MatMul``, JAX's ``dot_general:dot_general``);
    torch's ``namespace::op`` does not, so the op becomes ``op:namespace`` (shown as the op name,
    the namespace as its type) and keeps its own name as the display name. Names of any other
    shape (user ranges, ``autograd::engine::evaluate_function: ...``) stay as they are: XProf
    leaves them out of op statistics, as it does TensorFlow's user TraceMe ranges.
    """
    m = _FRAMEWORK_OP.match(name)
    return f"{m.group(2)}:{m.group(1)}" if m else ""


def _file_host(name: str) -> str:
    host = re.sub(r"[^A-Za-z0-9._-]", "_", name or "").strip("._-")
    return host or hostname().split(".")[0] or "localhost"


# -- protobuf ---------------------------------------------------------------------------------------
def _fill(space: Any, timeline: Timeline, shift_ns: int) -> None:
    """Add the timeline's planes to ``space`` (merging into planes of the same name), times + ``shift_ns``."""
    by_name = {p.name: p for p in space.planes}
    for pd in timeline.planes:
        plane = by_name.get(pd.name)
        if plane is None:
            plane = space.planes.add(id=pd.plane_id, name=pd.name)
            by_name[pd.name] = plane
        builder = xs.PlaneBuilder(plane)
        static_ids: dict[tuple[str, tuple[tuple[str, Any], ...]], int] = {}
        for ld in pd.lines:
            if not ld.events:
                continue
            t0 = min(e.start_ns for e in ld.events) + shift_ns
            line = builder.add_line(ld.name, t0, display_name=ld.display_name, line_id=ld.line_id)
            for e in ld.events:
                mid = None
                if e.xprof_name:
                    mid = builder.event_metadata_id(e.xprof_name, display_name=e.name)
                elif e.static:
                    key = (e.name, tuple(e.static.items()))
                    mid = static_ids.get(key)
                    if mid is None:
                        mid = static_ids[key] = _static_metadata(builder, e.name, e.static)
                builder.add_event(line, e.name, e.start_ns + shift_ns, e.dur_ns, e.stats, metadata_id=mid)
            line.duration_ps = (max(e.start_ns + e.dur_ns for e in ld.events) + shift_ns - t0) * 1000


def _static_metadata(builder: xs.PlaneBuilder, name: str, static: Mapping[str, Any]) -> int:
    """Event metadata named uniquely (``name file:line``), shown as ``name``, holding the static args."""
    where = f"{static['file']}:{static.get('line', 0)}" if "file" in static else str(static.get("module", ""))
    mid = builder.event_metadata_id(f"{name} {where}".rstrip(), display_name=name)
    meta = builder.plane.event_metadata[mid]
    if not meta.stats:
        for key, value in static.items():
            meta.stats.add(**builder.stat_dict(key, value))
    return mid


def to_xspace(timeline: Timeline, base: Any | None = None) -> Any:
    """The XSpace message of ``timeline``; with ``base`` (an XSpace jax wrote), merged into it."""
    if base is None:
        space = xs.XSpace()
        space.hostnames.append(timeline.host)
        meta = xs.PlaneBuilder(space.planes.add(id=len(space.planes), name="/host:metadata"))
        for key, value in timeline.metadata.items():
            meta.add_plane_stat(key, value)
        _fill(space, timeline, 0)
        env = xs.PlaneBuilder(space.planes.add(id=len(space.planes), name=xs.TASK_ENV_PLANE_NAME))
        env.add_plane_stat("profile_start_time", timeline.start_unix_ns)
        env.add_plane_stat("profile_stop_time", timeline.end_unix_ns)
        for note in timeline.notes:
            space.warnings.append(note)
        return space
    space = base
    jax_start = _profile_start(space)
    host = next((p for p in space.planes if p.name == xs.HOST_PLANE_NAME), None)
    relative = host is not None and any(0 <= ln.timestamp_ns < _WALL_CLOCK_MIN_NS for ln in host.lines)
    if relative and jax_start and timeline.start_unix_ns:
        shift = timeline.start_unix_ns - jax_start
    elif relative:
        shift = 0
    else:
        shift = timeline.start_unix_ns
    _fill(space, timeline, shift)
    for note in timeline.notes:
        space.warnings.append(note)
    return space


def _profile_start(space: Any) -> int:
    for plane in space.planes:
        if plane.name == xs.TASK_ENV_PLANE_NAME:
            names = {i: m.name for i, m in plane.stat_metadata.items()}
            for st in plane.stats:
                if names.get(st.metadata_id) == "profile_start_time":
                    return int(getattr(st, st.WhichOneof("value") or "int64_value") or 0)
    return 0


# -- writing ----------------------------------------------------------------------------------------
def _native_xplanes(result: ProfileResult) -> tuple[dict[int, Path], list[str]]:
    """Parts whose ``xplane`` artifact is readable, by index; notes about those that are not."""
    found: dict[int, Path] = {}
    notes: list[str] = []
    for i, part in enumerate(result.parts):
        for art in part.artifacts:
            if art.kind != "xplane" or not art.path:
                continue
            path = Path(art.path)
            if path.is_file():
                found.setdefault(i, path)
            else:
                notes.append(f"omniprof: {part.backend} xplane artifact {art.path} not found; "
                             f"its spans were converted instead")
    return found, notes


def _result_notes(result: ProfileResult) -> list[str]:
    """What the result itself says was lost or failed, for ``XSpace.warnings``."""
    notes = [f"{loss.source}: {loss.count} {loss.unit} not recorded ({loss.kind}){': ' + loss.detail if loss.detail else ''}"
             for loss in result.losses]
    notes += [f"{err.source} failed during {err.phase}: {err.what}" for err in result.errors]
    if result.partial:
        notes.append("the profiling session did not end normally; this trace is partial")
    return notes


def _unfilled_views(result: ProfileResult) -> list[str]:
    """Which XProf views a torch (Kineto) part leaves empty, and why; shown in XProf's overview
    page under diagnostics (``XSpace.warnings``)."""
    if not any(s.category == "cpu_op" for p in result.parts if p.backend != "xla" for s in p.spans):
        return []
    has_memory = any(i.category == "memory" for p in result.parts for i in p.instants)
    notes = [
        "omniprof: torch ops fill XProf's framework_op_stats (host ops, type 'aten' etc.), trace_viewer and "
        "kernel_stats. Not filled, and why: overview_page step-time graph and input_pipeline_analyzer (XProf "
        "finds steps only from TensorFlow/JAX step markers; torch's ProfilerStep#N ranges are on the trace viewer "
        "and in omniprof's op_stats); op_profile, memory_viewer and graph_viewer (built from XLA HLO, which eager "
        "torch does not produce)",
    ]
    notes.append("omniprof: memory_profile not filled: XProf reads TensorFlow allocator events only; " + (
        "torch's allocations are on the trace viewer as '[memory]' events and memory_allocated counters"
        if has_memory else "this torch run recorded no memory events (record_memory / host_tracer_level=3)"))
    return notes


def xplane_files(logdir: str | os.PathLike[str]) -> list[Path]:
    """Every ``plugins/profile/<run>/*.xplane.pb`` under ``logdir`` (sorted)."""
    return sorted(Path(logdir).glob("plugins/profile/*/*.xplane.pb"))


def write_logdir(result: ProfileResult, logdir: str | os.PathLike[str],
                 options: TensorBoardOptions | None = None) -> Path:
    """Write ``result`` as a new run under ``logdir``; returns the ``.xplane.pb`` path.

    A result whose only content is jax's xplane, already a run of this logdir (the Profiler's
    session directory), is not copied again: that run's file is returned.

    Raises:
        OutputError: the directory or file cannot be written (disk full, read-only, permission).
    """
    opts = options or TensorBoardOptions()
    logdir = Path(logdir)
    natives, notes = _native_xplanes(result) if opts.use_native_xplane else ({}, [])
    notes += _result_notes(result) + _unfilled_views(result)
    base_bytes: bytes | None = None
    base_index: int | None = None
    for idx, path in natives.items():
        try:
            raw = path.read_bytes()
            xs.XSpace.FromString(raw)
        except OSError as e:
            notes.append(f"omniprof: cannot read xplane artifact {path}: {e.strerror or e}; converted instead")
            continue
        except Exception as e:  # protobuf DecodeError: not an XSpace
            notes.append(f"omniprof: {path} is not a valid XSpace ({e}); converted instead")
            continue
        base_bytes, base_index = raw, idx
        break
    others = [p for i, p in enumerate(result.parts) if i != base_index]
    host = opts.host or _file_host(result.metadata.host)
    if base_bytes is not None:
        src = natives[base_index]  # type: ignore[index]
        if opts.host is None and src.name.endswith(".xplane.pb"):
            host = src.name[: -len(".xplane.pb")]  # jax's own host name, as in its XSpace
        if not others and not notes:
            profile_dir = (logdir / "plugins" / "profile").resolve()
            if src.resolve().parent.parent == profile_dir:
                return src  # already a run of this logdir (the Profiler's session): no duplicate run
            data = base_bytes
        else:
            timeline = attrs.evolve(build_timeline(result, opts, parts=others), notes=tuple(notes))
            data = to_xspace(timeline, xs.XSpace.FromString(base_bytes)).SerializeToString()
    else:
        timeline = attrs.evolve(build_timeline(result, opts), notes=tuple(notes))
        data = to_xspace(timeline).SerializeToString()
    run_dir = unique_run_dir(logdir / "plugins" / "profile", opts.run_prefix or None)
    out = run_dir / f"{_file_host(host)}.xplane.pb"
    atomic_write_bytes(out, data)
    return out


class TensorBoardReporter(Reporter):
    """Writes the result as a new XProf run under the directory it is given (the logdir).

    ``last_path`` is the ``.xplane.pb`` written by the latest :meth:`report`.
    """

    name = "tensorboard"
    output = "dir"
    default_filename = "omniprof-logdir"
    summary = "XProf/TensorBoard logdir (plugins/profile/<run>/<host>.xplane.pb); open with omniprof view"
    Options = TensorBoardOptions

    def __init__(self, options: Any = None) -> None:
        super().__init__(options)
        self.last_path: Path | None = None

    def report(self, result: ProfileResult, dest: Path) -> None:  # type: ignore[override]
        self.last_path = write_logdir(result, dest, self.options)
