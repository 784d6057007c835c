"""Read Kineto traces (``*.pt.trace.json[.gz]``, what ``torch.profiler`` writes) into results.

This module never imports torch: a GPU trace recorded on a cluster reads on a laptop. It is the
reader's front: :mod:`omniprof.formats.kineto_json` streams the JSON (one event at a time from a
bounded buffer; times converted to integer ns exactly from their decimal text) and
:mod:`omniprof.formats.kineto_build` turns each event into result objects as it goes by
(the mapping is in ``docs/readers.md``). Peak memory is therefore the result itself plus one
buffer, not the whole JSON tree (``benchmarks/kineto_reader.py`` measures it on 10^6 events).

What is read here is the trace's events, not their analysis: the op table (torch's
``key_averages()``), the kernel tables and the FLOPs summary are built from the spans by
:func:`omniprof.analysis.torch_ops.with_tables`, which the Kineto reader plugin and the torch
backend call after reading.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import IO, Any

from omniprof.core.results import Artifact, BackendResult, ClockInfo, ProfileResult, RunMetadata, Span, json_safe
from omniprof.errors import DataLossWarning, OmniprofWarning
from omniprof.formats.kineto_build import CATEGORY_MAP, FWDBWD_FLOW_BASE, LEGACY_CATEGORY_MAP, Builder, _id_int
from omniprof.formats.kineto_json import JsonStream, feed, open_text, us_text_to_ns

__all__ = ["read_trace", "parse_trace", "stream_spans", "CATEGORY_MAP", "LEGACY_CATEGORY_MAP",
           "FWDBWD_FLOW_BASE", "us_text_to_ns"]

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
    stream = JsonStream(fh, name)
    builder = Builder(source, flops, keep)
    top = feed(stream, builder, name)
    tracks, spans, flows, counters, losses, meta = builder.finish()
    if stream.control_characters:
        meta["values_with_control_characters"] = stream.control_characters
    if builder.trace_bounds is not None:
        start_ns, end_ns = builder.trace_bounds
        if builder.t_max is not None:
            end_ns = max(end_ns, builder.t_max)
    else:
        start_ns, end_ns = builder.t_min or 0, builder.t_max or 0
    summaries: dict[str, Any] = {}
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
    part = BackendResult(
        backend=source, clock=clock or ClockInfo(name="kineto", offset_ns=0), start_ns=start_ns, end_ns=end_ns,
        tracks=tracks, spans=spans, instants=builder.instants, flows=flows, counters=counters,
        summaries=summaries, losses=losses, artifacts=tuple(artifacts), metadata=meta,
    )
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
    with open_text(p) as fh:
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
    builder = Builder("torch")
    builder.spans = _Sink(sink)  # type: ignore[assignment]
    builder.corr_spans = _Discard()  # type: ignore[assignment]
    builder.instants = _Discard()  # type: ignore[assignment]
    builder.mem = _Discard()  # type: ignore[assignment]
    builder.host_corr = builder.device_corr = _Discard()  # type: ignore[assignment]
    with open_text(p) as fh:
        top = feed(JsonStream(fh, str(p)), builder, str(p))
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

