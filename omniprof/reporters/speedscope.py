"""Reporter ``speedscope``: one JSON file for https://www.speedscope.app (or ``npx speedscope``).

The file follows speedscope's published file-format schema (``file-format-schema.json`` in the
``speedscope`` npm package). One file holds several profiles, listed in speedscope's profile menu:

* a ``sampled`` profile per thread from stack samples (weights in nanoseconds, in time order);
* an ``evented`` profile per track from spans: open/close events, properly nested. Spans that
  overlap without nesting go to an extra lane (``GPU 0 stream 7 (overlap 1)``), never cut; how
  many moved is in the file's ``name``;
* with allocations, ``sampled`` profiles weighted in bytes: everything allocated, and what was
  still alive at the end.

Every profile of one file shares one time axis (:func:`omniprof.analysis.timeline.time_axis`):
0 is the earliest of the run's start (``RunMetadata.start_ns``) and every time in the result, each
part's clock offset applied, so data a device clock puts before the run's start keeps its place
and length instead of being cut at 0.
"""

from __future__ import annotations

import json
from typing import IO, Any

import attrs

from omniprof.analysis.stackdata import StackNode, span_lanes, stack_profile
from omniprof.analysis.timeline import placed, time_axis
from omniprof.core import validators as v
from omniprof.core.results import Frame, ProfileResult
from omniprof.plugin import Reporter

__all__ = ["SpeedscopeReporter", "SpeedscopeOptions", "speedscope_document", "SCHEMA_URL"]

SCHEMA_URL = "https://www.speedscope.app/file-format-schema.json"


@attrs.frozen(kw_only=True)
class SpeedscopeOptions:
    """Options of the ``speedscope`` reporter.

    Attributes:
        include_samples: a sampled profile per thread from stack samples.
        include_spans: an evented profile per track (lane) from spans.
        include_allocations: sampled profiles in bytes from allocations.
        combine_lines: one frame per function; False keeps a frame per function and line.
        indent: JSON indentation (None: compact).
    """

    include_samples: bool = attrs.field(default=True, validator=v.is_bool)
    include_spans: bool = attrs.field(default=True, validator=v.is_bool)
    include_allocations: bool = attrs.field(default=True, validator=v.is_bool)
    combine_lines: bool = attrs.field(default=True, validator=v.is_bool)
    indent: int | None = attrs.field(default=None, validator=v.int_in_range(0, 16, optional=True))


class _Frames:
    """speedscope's shared frame table."""

    def __init__(self, combine_lines: bool) -> None:
        self.combine_lines = combine_lines
        self.index: dict[tuple[str, str, int], int] = {}
        self.frames: list[dict[str, Any]] = []

    def __call__(self, frame: Frame) -> int:
        file = frame.file or (frame.module if frame.kind not in ("span",) else "") or ""
        line = 0 if self.combine_lines else frame.line
        key = (frame.name, file, line)
        i = self.index.get(key)
        if i is None:
            i = self.index[key] = len(self.frames)
            entry: dict[str, Any] = {"name": frame.name or "?"}
            if file:
                entry["file"] = file
            if line:
                entry["line"] = line
            self.frames.append(entry)
        return i


def _sampled(name: str, unit: str, stacks: list[list[int]], weights: list[int], start: int) -> dict[str, Any]:
    return {"type": "sampled", "name": name, "unit": unit, "startValue": start,
            "endValue": start + sum(weights), "samples": stacks, "weights": weights}


def speedscope_document(result: ProfileResult, opts: SpeedscopeOptions = SpeedscopeOptions()) -> dict[str, Any]:
    """The speedscope file as plain data."""
    frames = _Frames(opts.combine_lines)
    profiles: list[dict[str, Any]] = []
    notes: list[str] = []
    axis = time_axis(result)  # the records of stack_profile() are on the same axis

    if opts.include_samples and any(p.samples for p in result.parts):
        prof = stack_profile(result, "samples")
        notes += [f"{k.replace('_', ' ')}: {n}" for k, n in prof.adjustments.items()]
        by_thread: dict[str, tuple[list[list[int]], list[int], list[int]]] = {}
        indices: dict[StackNode, list[int]] = {}  # stack node -> frame indices
        for rec in prof.records:
            stacks, weights, starts = by_thread.setdefault(rec.thread, ([], [], []))
            # records of one stack share one node: map it to frame indices once
            hit = indices.get(rec.node)
            if hit is None:
                hit = indices[rec.node] = [frames(f) for f in rec.frames]
            if stacks and stacks[-1] is hit:
                weights[-1] += rec.values[1]  # same stack again: one longer sample, same picture
                continue
            stacks.append(hit)
            weights.append(rec.values[1])
            starts.append((rec.t_ns or 0) - rec.values[1])
        for thread, (stacks, weights, starts) in by_thread.items():
            profiles.append(_sampled(thread, "nanoseconds", stacks, weights, min(starts)))

    negative = 0  # spans and allocations with a negative amount: left out (speedscope refuses the file)
    if opts.include_spans:
        moved_total = 0
        multi = len(result.parts) > 1
        for pp in placed(result, axis):
            part = pp.part
            lanes, moved = span_lanes(part)
            moved_total += moved
            for lane in lanes:
                if not any(s.dur_ns >= 0 for s in lane.spans):
                    negative += len(lane.spans)
                    continue
                events: list[dict[str, Any]] = []
                open_: list[int] = []  # indices into lane.spans
                for i, s in enumerate(lane.spans):
                    if s.dur_ns < 0:
                        negative += 1
                        continue
                    while open_ and lane.spans[open_[-1]].end_ns <= s.start_ns:
                        j = open_.pop()
                        events.append({"type": "C", "at": pp.at(lane.spans[j].end_ns),
                                       "frame": frames(_span_frame(lane.spans[j]))})
                    events.append({"type": "O", "at": pp.at(s.start_ns), "frame": frames(_span_frame(s))})
                    open_.append(i)
                while open_:
                    j = open_.pop()
                    events.append({"type": "C", "at": pp.at(lane.spans[j].end_ns),
                                   "frame": frames(_span_frame(lane.spans[j]))})
                name = f"{part.backend}: {lane.name}" if multi else lane.name
                profiles.append({"type": "evented", "name": name, "unit": "nanoseconds",
                                 "startValue": events[0]["at"], "endValue": max(e["at"] for e in events),
                                 "events": events})
        if moved_total:
            notes.append(f"{moved_total} spans moved to overlap lanes (overlapping spans and what nests in them)")

    if opts.include_allocations and any(p.allocations for p in result.parts):
        prof = stack_profile(result, "allocations")
        for label, index in (("allocated", 1), ("in use at end", 3)):
            by_thread2: dict[str, tuple[list[list[int]], list[int]]] = {}
            for rec in prof.records:
                if rec.values[index] < 0:
                    negative += index == 1  # counted once, not per profile
                elif rec.values[index]:
                    stacks, weights = by_thread2.setdefault(rec.thread, ([], []))
                    stacks.append([frames(f) for f in rec.frames])
                    weights.append(rec.values[index])
            for thread, (stacks, weights) in by_thread2.items():
                profiles.append(_sampled(f"{thread}: {label} bytes", "bytes", stacks, weights, 0))

    if negative:
        notes.append(f"{negative} span(s) or allocation(s) of negative size left out")
    md = result.metadata
    losses = sum(1 for _ in result.losses)
    if losses:
        notes.append(f"{losses} loss record(s) in the result: see omniprof report -r table")
    title = f"omniprof {', '.join(md.backends) or '-'}" + (f" {md.label}" if md.label else "")
    if notes:
        title += " (" + "; ".join(notes) + ")"
    return {
        "$schema": SCHEMA_URL,
        "shared": {"frames": frames.frames},
        "profiles": profiles,
        "name": title,
        "activeProfileIndex": 0,
        "exporter": f"omniprof {md.versions.get('omniprof', '')}".rstrip(),
    }


def _span_frame(s: Any) -> Frame:
    return Frame(name=s.name, file="", line=0, module=s.category or None, kind="span")


class SpeedscopeReporter(Reporter):
    """speedscope JSON: samples per thread, spans per track, allocations in bytes."""

    name = "speedscope"
    output = "file"
    default_filename = "profile.speedscope.json"
    summary = "speedscope JSON: sampled profiles per thread, evented profiles per track, allocations"
    Options = SpeedscopeOptions

    def document(self, result: ProfileResult) -> dict[str, Any]:
        return speedscope_document(result, self.options)

    def report(self, result: ProfileResult, dest: IO[bytes]) -> None:  # type: ignore[override]
        text = json.dumps(self.document(result), indent=self.options.indent, ensure_ascii=False, allow_nan=False)
        dest.write(text.encode("utf-8"))
