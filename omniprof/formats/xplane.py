"""Read XProf traces (``<host>.xplane.pb``) into the result schema.

The xplane is read with jaxlib's own reader (``jax.profiler.ProfileData``); derived tables come from
xprof's tools (``xspace_to_tool_data``) where they have data. On CPU traces xprof's
``framework_op_stats`` holds only an IDLE row, so the op table is computed here from the XLA op
events (``hlo_op``/``hlo_module`` stats). xprof caches tool results beside the trace; we always
ask with ``use_saved_result=False`` and remove the cache files our call created, so a result is
never served stale.

Span categories (docs/results.md): ``annotation`` (omniprof/jax TraceAnnotation), ``step``,
``xla_module``, ``xla_op``, ``kernel``, ``memcpy``/``memset`` (device streams), ``python`` (Python
tracer), ``runtime`` (everything else XLA/PjRt records on host threads).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from omniprof.formats.kernels import KERNEL_STATS_COLUMNS, kernel_stats_table
from omniprof.core import opstats
from omniprof.core.results import (
    Artifact,
    BackendResult,
    ClockInfo,
    Flow,
    Instant,
    Loss,
    ProfileResult,
    RunMetadata,
    Span,
    Table,
    Track,
)
from omniprof.errors import DataLossWarning, OmniprofWarning, TraceReadError

__all__ = ["OMNIPROF_MARK", "XPlaneContent", "read_xspace", "tool_tables", "read_xplane",
           "xplane_files", "OP_STATS_COLUMNS"]

#: Builds the op table from ``xla_op`` spans and per-op costs (:func:`omniprof.analysis.xla_ops.op_stats_table`).
OpTable = Callable[[Sequence[Span], "Mapping[str, Mapping[str, float]] | None"], Table]

#: Stat key put on every annotation omniprof emits, so readers tell user ranges from XLA's own.
OMNIPROF_MARK = "_omniprof"

#: The op table's columns, in the vocabulary of :mod:`omniprof.core.opstats` (XLA's names: operation,
#: type, host_or_device, occurrences, total_self, device_pct, memory_bw, flop_rate).
OP_STATS_COLUMNS = opstats.columns("name", "op_type", "runs_on", "hlo_module", "calls", "total_ns", "self_ns",
                                   "avg_self_ns", "self_share_pct", "flops_per_s", "memory_bandwidth_bytes_per_s",
                                   "bound_by")

_DEVICE_PLANE = re.compile(r"^/device:(?P<kind>[A-Z]+):(?P<idx>\d+)")
_STREAM_LINE = re.compile(r"^Stream #(\d+)")
_KERNEL_DETAIL = re.compile(r"(\w+):([^\s]+)")
_STEP_KEYS = ("step_num", "_r")
_HOST_PLANE = "/host:CPU"


@attrs.define
class XPlaneContent:
    """What one xspace holds, in schema terms (times in ns since ``profile_start_unix_ns``)."""

    host: str
    profile_start_unix_ns: int = 0
    profile_stop_unix_ns: int = 0
    tracks: list[Track] = attrs.Factory(list)
    spans: list[Span] = attrs.Factory(list)
    instants: list[Instant] = attrs.Factory(list)
    losses: list[Loss] = attrs.Factory(list)
    devices: list[dict[str, Any]] = attrs.Factory(list)
    flows: list[Flow] = attrs.Factory(list)
    removed_device_events: int = 0


def _stats(obj: Any, counter: list[int]) -> dict[str, Any]:
    """An event's or plane's stats; binary stats jaxlib cannot decode end the list and are counted."""
    try:
        out: dict[Any, Any] = dict(obj.stats)  # the common case, in C
    except UnicodeDecodeError:
        out = {}
        it = iter(obj.stats)
        while True:
            try:
                k, v = next(it)
            except StopIteration:
                break
            except UnicodeDecodeError:
                counter[0] += 1
                break
            out[k] = v
    if None in out:  # a stat whose metadata the file lacks (a damaged xplane): counted, left out
        counter[0] += 1
        del out[None]
    return out


def _ns(x: float) -> int:
    return int(x + 0.5) if x >= 0 else -int(-x + 0.5)


def _classify(name: str, stats: Mapping[str, Any], plane_kind: str, line_name: str,
              annotation_names: frozenset[str] = frozenset()) -> str:
    if OMNIPROF_MARK in stats or (plane_kind == "host" and name in annotation_names and "hlo_op" not in stats):
        return "step" if "step_num" in stats else "annotation"
    if "step_num" in stats and "_r" in stats:
        return "step"
    if plane_kind == "device":
        low = line_name.lower()
        if low.startswith("xla modules"):
            return "xla_module"
        if low.startswith("xla ops"):
            return "xla_op"
        if low.startswith("steps"):
            return "step"
        lname = name.lower()
        if "memcpy" in lname or "memcpy_details" in stats:
            return "memcpy"
        if "memset" in lname:
            return "memset"
        return "kernel"
    if "hlo_op" in stats:
        return "xla_op"
    if name.startswith("$"):
        return "python"
    return "runtime"


def _kernel_args(stats: Mapping[str, Any]) -> dict[str, Any]:
    """Map XLA's ``kernel_details`` stat ("regs:32 static_shared:0 grid:1,1,1 block:64,1,1 occ_pct:50")
    onto the kernel args convention of docs/results.md."""
    args: dict[str, Any] = {}
    details = stats.get("kernel_details")
    if isinstance(details, str):
        kv = dict(_KERNEL_DETAIL.findall(details))
        for src, dst in (("regs", "registers_per_thread"), ("static_shared", "static_shared_memory_bytes"),
                         ("dynamic_shared", "dynamic_shared_memory_bytes")):
            with contextlib.suppress(KeyError, ValueError):
                args[dst] = int(kv[src])
        for src in ("grid", "block"):
            with contextlib.suppress(KeyError, ValueError):
                args[src] = [int(x) for x in kv[src].split(",")]
        with contextlib.suppress(KeyError, ValueError):
            args["occupancy_pct"] = float(kv["occ_pct"])
    if "correlation_id" in stats:
        args["correlation_id"] = stats["correlation_id"]
    return args


def _is_device_activity(plane_kind: str, category: str, name: str, stats: Mapping[str, Any]) -> bool:
    """What ``device_tracer_level=0`` leaves out: device planes, and on CPU the XLA ops the CPU
    device executes (their op events and the executor's ``end: <op>`` markers)."""
    if plane_kind == "device":
        return True
    return category == "xla_op" or "device_ordinal" in stats or name.startswith("end: ")


def read_xspace(profile_data: Any, *, host: str, track_prefix: str = "", include_device: bool = True,
                time_shift_ns: int | None = None, flow_offset: int = 0,
                annotation_names: Iterable[str] = ()) -> XPlaneContent:
    """Convert one xspace (a ``jax.profiler.ProfileData``) into tracks, spans and instants.

    Args:
        profile_data: the xspace, read by jaxlib.
        host: the host (or address) it came from; tracks' ``process``.
        track_prefix: prefix of track ids (several hosts in one part stay apart).
        include_device: False leaves device activity out (``device_tracer_level=0``).
        time_shift_ns: added to every time; default puts times on "ns since profile start".
        flow_offset: added to flow ids (keeps several hosts' correlation ids apart).
        annotation_names: names of the ranges omniprof's annotations opened (host events with these
            names are ``annotation`` spans; files written before marks were stripped carry
            ``_omniprof`` on each instead).
    """
    content = XPlaneContent(host=host)
    ann_names = frozenset(annotation_names)
    undecodable = [0]
    env = profile_data.find_plane_with_name("Task Environment")
    if env is not None:
        st = _stats(env, [0])  # profile_options is binary; it ends the list after the times we need
        content.profile_start_unix_ns = int(st.get("profile_start_time", 0) or 0)
        content.profile_stop_unix_ns = int(st.get("profile_stop_time", 0) or 0)
    shift = 0 if time_shift_ns is None else time_shift_ns
    seen_devices: set[int] = set()
    for p_index, plane in enumerate(profile_data.planes):
        pname = plane.name
        m = _DEVICE_PLANE.match(pname)
        if m:
            plane_kind, device = "device", int(m.group("idx"))
        elif pname.startswith("/host:") and pname != "/host:metadata":
            plane_kind, device = "host", None
        else:
            continue
        if plane_kind == "device" and not include_device:
            content.removed_device_events += sum(1 for line in plane.lines for _ in line.events)
            continue
        if device is not None and device not in seen_devices:
            seen_devices.add(device)
            content.devices.append({"index": device, "kind": m.group("kind") if m else "", "plane": pname})
        for l_index, line in enumerate(plane.lines):
            if plane_kind == "device":
                tid = f"{track_prefix}device:{device}:line:{l_index}"
                # XLA's GPU tracer names a stream's line "Stream #<id>(...)"; its derived lines
                # (XLA Ops, XLA Modules, Steps) are no stream
                sm = _STREAM_LINE.match(line.name)
                stream = int(sm.group(1)) if sm else None
                track = Track(id=tid, name=f"{pname} {line.name}", kind="stream", process=host, device=device,
                              stream=stream)
            else:
                tid = f"{track_prefix}host:{p_index}:thread:{l_index}"
                track = Track(id=tid, name=line.name, kind="thread", process=host)
            used = False
            for ev in line.events:
                name = ev.name
                stats = _stats(ev, undecodable)
                cat = _classify(name, stats, plane_kind, line.name, ann_names)
                if not include_device and _is_device_activity(plane_kind, cat, name, stats):
                    content.removed_device_events += 1
                    continue
                start = _ns(ev.start_ns) + shift
                dur = _ns(ev.duration_ns)
                # Underscored stats are XLA's bookkeeping (flow ids, source file) and our mark.
                args = {k: v for k, v in stats.items() if not k.startswith("_")}
                if cat == "xla_op":
                    args.setdefault("hlo_op", name)
                if cat == "kernel":
                    args.update(_kernel_args(stats))
                    args.pop("kernel_details", None)
                    if device is not None:
                        args.setdefault("device", device)
                used = True
                if dur <= 0 and cat == "runtime":
                    content.instants.append(Instant(name=name, track=tid, t_ns=start, category=cat, args=args))
                else:
                    content.spans.append(Span(name=name, track=tid, start_ns=start, dur_ns=max(dur, 0),
                                              category=cat, args=args))
            if used:
                content.tracks.append(track)
    content.spans.extend(_derived_modules(content.spans))
    content.spans, content.flows = _link_launches(content.spans, track_prefix, flow_offset)
    if undecodable[0]:
        content.losses.append(Loss(source="xla", kind="undecodable_stats", count=undecodable[0], unit="events",
                                   detail=f"{host}: event statistics jaxlib could not decode (binary values)"))
    return content


def _link_launches(spans: list[Span], track_prefix: str, offset: int = 0) -> tuple[list[Span], list[Flow]]:
    """A host launch and the device work it started share XLA's ``correlation_id``: give both that
    flow id (offset per host in multi-host reads) and one ``Flow(id, "launch", "cuda")``."""
    host_ids: set[int] = set()
    dev_ids: set[int] = set()
    for s in spans:
        cid = s.args.get("correlation_id")
        if isinstance(cid, int) and not isinstance(cid, bool):
            (dev_ids if ":line:" in s.track and s.track.startswith(f"{track_prefix}device:") else host_ids).add(cid)
    linked = host_ids & dev_ids
    if not linked:
        return spans, []
    out = [attrs.evolve(s, flow_ids=(s.args["correlation_id"] + offset,))
           if s.args.get("correlation_id") in linked else s for s in spans]
    return out, [Flow(flow_id=c + offset, name="launch", category="cuda") for c in sorted(linked)]


def _derived_modules(spans: Sequence[Span]) -> list[Span]:
    """On CPU traces XLA records ops but no module-level event: one ``xla_module`` span per
    execution (hlo_module, run_id), from its first op's start to its last op's end, on the track
    of its first op. Marked ``derived``."""
    if any(s.category == "xla_module" for s in spans):
        return []
    groups: dict[tuple[str, Any], list[Span]] = {}
    for s in spans:
        if s.category == "xla_op" and "hlo_module" in s.args:
            groups.setdefault((s.args["hlo_module"], s.args.get("run_id")), []).append(s)
    out = []
    for (module, run_id), ops in groups.items():
        ops.sort(key=lambda s: s.start_ns)
        start = ops[0].start_ns
        end = max(s.end_ns for s in ops)
        args: dict[str, Any] = {"hlo_module": module, "derived": True, "ops": len(ops)}
        if run_id is not None:
            args["run_id"] = run_id
        if "program_id" in ops[0].args:
            args["program_id"] = ops[0].args["program_id"]
        out.append(Span(name=str(module), track=ops[0].track, start_ns=start, dur_ns=end - start,
                        category="xla_module", args=args))
    return out


# -- op statistics ---------------------------------------------------------------------------
# -- xprof tools -----------------------------------------------------------------------------
def _gviz_rows(table: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Rows of a Google-visualization DataTable (xprof's JSON) as dicts keyed by column id."""
    ids = [c.get("id") for c in table.get("cols", [])]
    out = []
    for r in table.get("rows", []) or []:
        cells = r.get("c", [])
        out.append({k: (c or {}).get("v") if isinstance(c, Mapping) else c for k, c in zip(ids, cells)})
    return out


def _tables_of(data: Any) -> list[Mapping[str, Any]]:
    if isinstance(data, (bytes, bytearray)):
        data = data.decode("utf-8", "replace")
    if isinstance(data, str):
        data = json.loads(data) if data.strip() else None
    if isinstance(data, Mapping):
        return [data]
    if isinstance(data, list):
        return [t for t in data if isinstance(t, Mapping)]
    return []


def run_tool(paths: Sequence[Path], tool: str, verbose: bool = False) -> Any:
    """xprof tool data for the xplane files, never from a saved (possibly stale) result."""
    from omniprof.formats.xprof_runtime import import_xprof_convert

    convert = import_xprof_convert(verbose)
    dirs = {p.parent for p in paths}
    before = {d: set(os.listdir(d)) for d in dirs}
    try:
        data, _ = convert.xspace_to_tool_data([str(p) for p in paths], tool, {"use_saved_result": False})
    finally:
        # The call caches its intermediate result beside the trace; remove what we created so no
        # later reader (ours or the XProf UI) can be served a result older than the trace.
        for d in dirs:
            for name in set(os.listdir(d)) - before[d]:
                if not name.endswith(".xplane.pb"):
                    with contextlib.suppress(OSError):
                        (d / name).unlink()
    return data


def _float(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def kernel_rows_from_tool(data: Any) -> list[dict[str, Any]]:
    """xprof ``kernel_stats`` rows mapped onto :data:`KERNEL_STATS_COLUMNS` (us -> ns)."""
    rows = []
    for t in _tables_of(data):
        for r in _gviz_rows(t):
            if not r.get("kernel_name"):
                continue

            def ns(key: str, r: Mapping[str, Any] = r) -> int:
                return int(round((_float(r.get(key)) or 0.0) * 1000))

            rows.append({
                "kernel_name": r["kernel_name"], "occurrences": int(_float(r.get("occurrences")) or 0),
                "total_ns": ns("total_duration_us"), "avg_ns": ns("avg_duration_us"), "min_ns": ns("min_duration_us"),
                "max_ns": ns("max_duration_us"),
                "static_shared_memory_bytes": int(_float(r.get("shmem_bytes")) or 0),
                "block_dim": str(r.get("block_dim") or ""), "grid_dim": str(r.get("grid_dim") or ""),
                "tensor_core": bool(r.get("is_kernel_using_tensor_core")),
                "occupancy_pct": _float(r.get("occupancy_pct")),
            })
    rows.sort(key=lambda r: (-r["total_ns"], r["kernel_name"]))
    return rows


def op_rows_from_tool(data: Any) -> list[dict[str, Any]]:
    """xprof ``framework_op_stats`` rows mapped onto :data:`OP_STATS_COLUMNS`; the IDLE row dropped.

    xprof's units: times in us, ``measured_flop_rate`` in GFLOP/s, ``measured_memory_bw`` in GB/s.
    """
    rows = []
    tables = _tables_of(data)
    for r in _gviz_rows(tables[0]) if tables else []:
        if r.get("type") == "IDLE" or r.get("operation") == "IDLE":
            continue
        occ = int(_float(r.get("occurrences")) or 0)
        total_self = int(round((_float(r.get("total_self_time")) or 0.0) * 1000))
        flop = _float(r.get("measured_flop_rate"))
        bw = _float(r.get("measured_memory_bw"))
        rows.append({
            "name": r.get("operation"), "op_type": r.get("type"), "runs_on": r.get("host_or_device"),
            "calls": occ, "total_ns": int(round((_float(r.get("total_time")) or 0.0) * 1000)),
            "self_ns": total_self, "avg_self_ns": int(round((_float(r.get("avg_self_time")) or 0.0) * 1000)),
            "self_share_pct": _float(r.get("device_total_self_time_percent")),
            "memory_bandwidth_bytes_per_s": bw * 1e9 if bw is not None else None,
            "flops_per_s": flop * 1e9 if flop is not None else None,
            "bound_by": r.get("bound_by"), "hlo_module": "",
        })
    return rows


def tool_tables(paths: Sequence[Path], spans: Sequence[Span], *, verbose: bool = False,
                costs: Mapping[str, Mapping[str, float]] | None = None,
                op_table: OpTable | None = None) -> tuple[list[Table], dict[str, dict[str, Any]], list[Loss]]:
    """Derived tables and summaries for a trace: xprof's where it has data, ours otherwise.

    ``op_table`` builds the op table from the ``xla_op`` spans where xprof has no rows (a reader
    never computes an analysis itself: the caller passes :func:`omniprof.analysis.xla_ops.op_stats_table`);
    without it no such table is added."""
    tables: list[Table] = []
    summaries: dict[str, dict[str, Any]] = {}
    losses: list[Loss] = []

    def tool(name: str) -> Any:
        try:
            return run_tool(paths, name, verbose)
        except Exception as e:  # xprof failed on this trace: say so, keep going with our own tables
            losses.append(Loss(source="xla", kind="tool_failed", count=1, unit="tools",
                               detail=f"xprof tool {name!r}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))
            return None

    # Kernels: xprof's kernel_stats (GPU traces), else ours from kernel spans.
    krows = kernel_rows_from_tool(tool("kernel_stats")) if any(s.category == "kernel" for s in spans) else []
    if krows:
        tables.append(Table("kernel_stats", KERNEL_STATS_COLUMNS,
                            [tuple(r[c] for c in KERNEL_STATS_COLUMNS) for r in krows], title="Kernel statistics"))
    elif any(s.category == "kernel" for s in spans):
        tables.append(kernel_stats_table(spans))
    # Ops: xprof's framework_op_stats where it has real rows (GPU/TPU), ours from xla_op spans otherwise.
    orows = op_rows_from_tool(tool("framework_op_stats")) if paths else []
    if orows:
        tables.append(Table("op_stats", OP_STATS_COLUMNS, [tuple(r[c] for c in OP_STATS_COLUMNS) for r in orows],
                            title="Framework op statistics (xprof)"))
    elif op_table is not None and any(s.category == "xla_op" for s in spans):
        tables.append(op_table(spans, costs))
    if paths:
        ov = _tables_of(tool("overview_page"))
        env: dict[str, Any] = {}
        for t in ov:
            p = t.get("p")
            if isinstance(p, Mapping) and ("device_type" in p or "host_count" in p):
                env.update({k: v for k, v in p.items() if isinstance(v, (str, int, float, bool))})
        if env:
            summaries["xprof_run_environment"] = env
        if len(paths) == 1:  # xprof's memory_profile reads one host at a time
            summaries.update(memory_profile_summaries(tool("memory_profile")))
        roof = _tables_of(tool("roofline_model"))
        # Rows of whole programs with no measured time are xprof's placeholders on CPU traces.
        rrows = [r for r in (_gviz_rows(roof[0]) if roof else [])
                 if r.get("category") != "Program" and (_float(r.get("total_self_time")) or 0) > 0]
        if rrows:
            cols = opstats.ROOFLINE_COLUMNS  # the op-table vocabulary (xprof: operation, category, occurrences, ...)

            def scaled(r: Mapping[str, Any], key: str, factor: float) -> float | None:
                x = _float(r.get(key))
                return x * factor if x is not None else None

            # xprof's units (us, GFLOP/s, GB/s) converted to ours (ns, FLOP/s, bytes/s).
            tables.append(Table("roofline", cols, [
                (r.get("operation"), r.get("category"), _int(r.get("occurrences")),
                 _int(scaled(r, "total_self_time", 1e3)), scaled(r, "measured_flop_rate", 1e9),
                 scaled(r, "measured_memory_bw", 1e9), _float(r.get("operational_intensity")), r.get("bound_by"))
                for r in rrows], title="Roofline (xprof)"))
    return tables, summaries, losses


def memory_profile_summaries(data: Any) -> dict[str, dict[str, Any]]:
    """xprof ``memory_profile`` JSON (a MemoryProfile message) to one summary per allocator."""
    out: dict[str, dict[str, Any]] = {}
    tables = _tables_of(data)
    per = (tables[0].get("memoryProfilePerAllocator") or {}) if tables else {}
    for alloc, prof in per.items():
        summary = (prof or {}).get("profileSummary") or {}
        peak = summary.get("peakStats") or {}
        flat = {"peak_bytes_usage_lifetime": _int(summary.get("peakBytesUsageLifetime")),
                "memory_capacity_bytes": _int(summary.get("memoryCapacity")),
                "peak_bytes_in_use": _int(peak.get("peakBytesInUse")),
                "heap_allocated_bytes": _int(peak.get("heapAllocatedBytes")),
                "stack_reserved_bytes": _int(peak.get("stackReservedBytes")),
                "free_memory_bytes": _int(peak.get("freeMemoryBytes")),
                "fragmentation": _float(peak.get("fragmentation")),
                "peak_stats_time_ns": (_int(summary.get("peakStatsTimePs")) or 0) // 1000
                if summary.get("peakStatsTimePs") is not None else None}
        out[f"memory_profile:{alloc}"] = {k: v for k, v in flat.items() if v is not None}
    return out


def _int(v: Any) -> int | None:
    f = _float(v)
    return int(f) if f is not None else None


# -- offline reading -------------------------------------------------------------------------
def xplane_files(path: str | os.PathLike[str]) -> list[Path]:
    """The xplane files of ``path``: one file, a run directory, or a logdir (its newest run).

    Absolute: xprof's tools look for a file's run directory, and a bare name has none."""
    p = Path(os.path.abspath(path))
    if p.is_file():
        if not p.name.endswith(".xplane.pb"):
            raise TraceReadError(f"{p}: not an .xplane.pb file")
        return [p]
    if not p.is_dir():
        raise TraceReadError(f"no such file or directory: {str(p)!r}")
    files = sorted(p.glob("*.xplane.pb"))
    if files:
        return files
    root = p / "plugins" / "profile" if (p / "plugins" / "profile").is_dir() else p
    runs = sorted((d for d in root.iterdir() if d.is_dir() and any(d.glob("*.xplane.pb"))),
                  key=lambda d: (d.stat().st_mtime, d.name))
    if not runs:
        raise TraceReadError(f"{p}: no .xplane.pb found (expected a file, a run directory, or an XProf logdir "
                             f"with plugins/profile/<run>/<host>.xplane.pb)")
    return sorted(runs[-1].glob("*.xplane.pb"))


def host_of(path: Path) -> str:
    return path.name[: -len(".xplane.pb")] if path.name.endswith(".xplane.pb") else path.stem


#: The largest protobuf message (2^31 - 1 bytes, protobuf's own limit).
MAX_XSPACE_BYTES = (1 << 31) - 1


def _check_first_byte(path: Path, head: bytes) -> None:
    """A protobuf message starts with a field key: field number >= 1 and wire type 0-5. A first
    byte that is no key (field 0, or wire type 6 or 7: zeros, text, most other formats) is no
    protobuf at all."""
    if head and (head[0] >> 3 == 0 or head[0] & 7 > 5):
        raise TraceReadError(f"{path}: not an XSpace protobuf (its first byte, 0x{head[0]:02x}, starts no protobuf "
                             f"field: a damaged or zero-filled file, or another format named .xplane.pb)")


def load_profile_data(path: Path) -> Any:
    from omniprof.formats.xprof_runtime import import_profiler_bindings

    from omniprof.core.inputs import check_input, read_input

    size = check_input(path).st_size
    if size > MAX_XSPACE_BYTES:
        # Checked before anything is read: the protobuf parser cannot hold a message this large
        # (it crashed the process at 2 GiB).
        raise TraceReadError(f"{path}: {size:,} bytes, more than the {MAX_XSPACE_BYTES:,} (2 GiB - 1) a protobuf "
                             f"message can hold: no tool can parse it whole. Profile a shorter window, or fewer "
                             f"steps, so that XLA writes a smaller XSpace")
    if stat.S_ISREG(check_input(path).st_mode):
        # The first byte, before the whole file is read and parsed (a 2 GiB file of zeros took
        # 46 s and 4.9 GB of memory to be called unreadable).
        with open(path, "rb") as f:
            _check_first_byte(path, f.read(1))
    _, pdmod = import_profiler_bindings()
    data = read_input(path, limit=MAX_XSPACE_BYTES, decompress=False)
    _check_first_byte(path, data[:1])
    if not data:
        raise TraceReadError(f"{path}: empty file (0 bytes), not a trace. jax writes an empty .xplane.pb and reports "
                             f"success when the trace exceeds protobuf's 2 GB limit; profile a shorter window")
    try:
        pd = pdmod.ProfileData.from_serialized_xspace(data)
    except Exception as e:
        raise TraceReadError(f"{path}: not a readable XSpace protobuf ({type(e).__name__}: {e})") from e
    planes = list(pd.planes)
    if not any(p.name for p in planes):
        # Any protobuf parses as some XSpace (unknown fields are skipped): a Perfetto trace gives
        # unnamed planes, most others none. XLA names every plane it writes (/host:CPU, ...).
        raise TraceReadError(f"{path}: not an XSpace: {len(planes)} plane(s), none named (another protobuf, such as "
                             f"a Perfetto trace or a pprof profile, renamed .xplane.pb?)")
    return pd


def part_from_files(paths: Sequence[Path], *, include_device: bool = True, verbose: bool = False,
                    time_base_unix_ns: int | None = None, ref_offset_ns: int = 0,
                    costs: Mapping[str, Mapping[str, float]] | None = None,
                    with_tools: bool = True, annotation_names: Iterable[str] = (),
                    op_table: OpTable | None = None) -> tuple[BackendResult, int]:
    """One BackendResult from one or several hosts' xplanes, on one timeline.

    Times are ns since ``time_base_unix_ns`` (default: the earliest profile start) plus
    ``ref_offset_ns``. Returns the part and the time base used.
    """
    datas = [(p, load_profile_data(p)) for p in paths]
    starts = []
    pids: dict[str, int] = {}
    versions: dict[str, str] = {}
    for path, pd in datas:
        env = pd.find_plane_with_name("Task Environment")
        st = _stats(env, [0]) if env is not None else {}
        starts.append(int(st.get("profile_start_time", 0) or 0))
        meta = pd.find_plane_with_name("/host:metadata")
        mst = _stats(meta, [0]) if meta is not None else {}
        if isinstance(mst.get("process_id"), int):
            pids[host_of(path)] = int(mst["process_id"])
        versions.update({k: str(v) for k, v in mst.items() if isinstance(k, str) and k.endswith("_version")})
    base = time_base_unix_ns if time_base_unix_ns is not None else min((s for s in starts if s), default=0)
    tracks: list[Track] = []
    spans: list[Span] = []
    instants: list[Instant] = []
    flows: list[Flow] = []
    losses: list[Loss] = []
    devices: list[dict[str, Any]] = []
    removed = 0
    stop = 0
    multi = len(datas) > 1
    for index, ((path, pd), start) in enumerate(zip(datas, starts)):
        host = host_of(path)
        shift = (start - base if start else 0) + ref_offset_ns
        c = read_xspace(pd, host=host, track_prefix=f"{host}/" if multi else "", include_device=include_device,
                        time_shift_ns=shift, flow_offset=index << 40, annotation_names=annotation_names)
        tracks += c.tracks
        spans += c.spans
        instants += c.instants
        flows += c.flows
        losses += c.losses
        devices += [{**d, "host": host} for d in c.devices]
        removed += c.removed_device_events
        stop = max(stop, (c.profile_stop_unix_ns - base + ref_offset_ns) if c.profile_stop_unix_ns else 0)
    tables: list[Table] = []
    summaries: dict[str, dict[str, Any]] = {}
    if with_tools:
        tables, summaries, tool_losses = tool_tables(list(paths), spans, verbose=verbose, costs=costs,
                                                     op_table=op_table)
        losses += tool_losses
    spans.sort(key=lambda s: (s.start_ns, -s.dur_ns))
    for loss in losses:
        warnings.warn(f"xla: {loss.count} {loss.unit} not fully recorded ({loss.kind}): {loss.detail}",
                      DataLossWarning if loss.kind != "tool_failed" else OmniprofWarning, stacklevel=3)
    part = BackendResult(
        backend="xla", clock=ClockInfo(name="xplane", offset_ns=0), start_ns=ref_offset_ns, end_ns=stop,
        tracks=tracks, spans=spans, instants=instants, flows=flows, tables=tables, summaries=summaries, losses=losses,
        artifacts=[Artifact(kind="xplane", path=str(p), description=f"XSpace of host {host_of(p)}") for p in paths],
        metadata={"hosts": [host_of(p) for p in paths], "devices": devices, "device_activity_included": include_device,
                  "device_events_left_out": removed, "profile_start_unix_ns": base, "pids": pids,
                  "versions": versions},
    )
    return part, base


def read_xplane(path: Path, *, op_table: OpTable | None = None) -> ProfileResult:
    """``omniprof report``'s reader for ``.xplane.pb`` files, run directories and XProf logdirs
    (``op_table``: as :func:`tool_tables`)."""
    files = xplane_files(path)
    part, base = part_from_files(files, op_table=op_table)
    pids = list((part.metadata.get("pids") or {}).values())
    md = RunMetadata(host=",".join(host_of(p) for p in files), pid=pids[0] if len(pids) == 1 else 0, backends=("xla",),
                     versions=dict(part.metadata.get("versions") or {}), start_unix_ns=base, start_ns=0,
                     end_ns=part.end_ns, label=f"read from {path}")
    return ProfileResult(metadata=md, parts=(part,))
