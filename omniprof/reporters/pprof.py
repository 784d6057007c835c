"""Reporter ``pprof``: a gzipped ``profile.proto``, read by ``go tool pprof`` and every pprof UI.

The file follows google/pprof's ``proto/profile.proto``: a string table whose entry 0 is ``""``,
sample types, samples (location ids leaf first, one value per sample type, string labels),
locations (one per function and line), functions (one per name and file), mappings (one per
module), period, time and duration, and comments. It is encoded here by hand (protobuf's wire
format is a few lines of varints), so no generated code or protobuf runtime is needed.

Sample types by source:

* samples: ``samples/count``, ``wall/nanoseconds`` (default), with ``thread`` and ``task`` labels;
* spans: ``spans/count``, ``time/nanoseconds`` (self time of nested spans);
* allocations: ``alloc_objects/count``, ``alloc_space/bytes``, ``inuse_objects/count``,
  ``inuse_space/bytes`` (default, as Go's heap profiles).

Losses of the result are written as comments (``go tool pprof -comments``).
"""

from __future__ import annotations

import gzip
from typing import IO

import attrs

from omniprof.analysis.stackdata import SOURCES, StackNode, StackProfile, stack_profile
from omniprof.core import validators as v
from omniprof.core.reporter import check_times
from omniprof.core.results import Frame, ProfileResult
from omniprof.formats.protowire import f_bytes, f_packed, f_uint, varint
from omniprof.plugin import Reporter

__all__ = ["PprofReporter", "PprofOptions", "encode_profile"]


@attrs.frozen(kw_only=True)
class PprofOptions:
    """Options of the ``pprof`` reporter.

    Attributes:
        source: ``"auto"`` (samples, else allocations, else spans), ``"samples"``, ``"spans"`` or
            ``"allocations"``.
        include_lines: keep line numbers (one location per function and line). False merges
            each function into one location.
        thread_labels: label every sample with its ``thread`` (``-tagfocus``, ``-tagshow``).
        compress: gzip the output (pprof reads both; the convention is gzipped).
    """

    source: str = attrs.field(default="auto", validator=v.one_of(*SOURCES))
    include_lines: bool = attrs.field(default=True, validator=v.is_bool)
    thread_labels: bool = attrs.field(default=True, validator=v.is_bool)
    compress: bool = attrs.field(default=True, validator=v.is_bool)


# -- protobuf wire format: omniprof.formats.protowire ---------------------------------------------
def _int(field: int, n: int, out: bytearray) -> None:
    if n:  # proto3: zero is the default and is not written
        out += f_uint(field, n)


def _bytes(field: int, data: bytes | bytearray, out: bytearray) -> None:
    out += f_bytes(field, data)


def _packed(field: int, values: list[int], out: bytearray) -> None:
    out += f_packed(field, values)


class _Strings:
    def __init__(self) -> None:
        self.index: dict[str, int] = {"": 0}

    def __call__(self, s: str) -> int:
        i = self.index.get(s)
        if i is None:
            i = self.index[s] = len(self.index)
        return i


def encode_profile(profile: StackProfile, result: ProfileResult, opts: PprofOptions = PprofOptions()) -> bytes:
    """The profile.proto message (not gzipped) for ``profile``."""
    strings = _Strings()
    mappings: dict[str, int] = {}
    functions: dict[tuple[str, str], int] = {}
    function_msgs: list[bytes] = []
    locations: dict[tuple[int, int, int], int] = {}
    location_msgs: list[bytes] = []

    def mapping_id(frame: Frame) -> int:
        name = frame.module if frame.kind == "native" and frame.module else (
            "[spans]" if frame.kind == "span" else "[python]")
        mid = mappings.get(name)
        if mid is None:
            mid = mappings[name] = len(mappings) + 1
        return mid

    def location_id(frame: Frame) -> int:
        fkey = (frame.name, frame.file or frame.module or "")
        fid = functions.get(fkey)
        if fid is None:
            fid = functions[fkey] = len(functions) + 1
            msg = bytearray()
            _int(1, fid, msg)
            _int(2, strings(frame.name or "?"), msg)
            # No system_name: pprof then takes the name as already demangled and shows it as is.
            # With system_name == name it "simplifies" it, cutting <...> and (...), so Python's
            # <module>, <genexpr>, <lambda> would all become one nameless node.
            _int(4, strings(fkey[1]), msg)
            function_msgs.append(bytes(msg))
        line = frame.line if opts.include_lines else 0
        mid = mapping_id(frame)
        lkey = (fid, line, mid)
        lid = locations.get(lkey)
        if lid is None:
            lid = locations[lkey] = len(locations) + 1
            msg = bytearray()
            _int(1, lid, msg)
            _int(2, mid, msg)
            line_msg = bytearray()
            _int(1, fid, line_msg)
            _int(2, line, line_msg)
            _bytes(4, line_msg, msg)
            location_msgs.append(bytes(msg))
        return lid

    frame_ids: dict[Frame, int] = {}
    # Each stack node's location ids (pprof: leaf first) as packed varints: the node's own id, then
    # its parent's list, made once per node of the profile's prefix tree. Deep nesting then costs
    # one copy of bytes per record, never a Python step per frame (which was quadratic).
    packed: dict[StackNode, bytes] = {}

    def location_ids(node: StackNode) -> bytes:
        ids = packed.get(node)
        if ids is not None:
            return ids
        chain = []  # the nodes not done yet, leaf first: ids are given in that order, as pprof reads them
        top: StackNode | None = node
        while top is not None and top.frame is not None and top not in packed:
            f = top.frame
            if f not in frame_ids:
                frame_ids[f] = location_id(f)
            chain.append(top)
            top = top.parent
        ids = packed.get(top, b"") if top is not None else b""
        for n in reversed(chain):
            ids = packed[n] = varint(frame_ids[n.frame]) + ids  # type: ignore[index]
        return ids

    # Aggregate identical (stack, labels): pprof sums them anyway; the file gets smaller.
    merged: dict[tuple[bytes, tuple[tuple[str, str], ...]], list[int]] = {}
    for rec in profile.records:
        key = (location_ids(rec.node), ((("thread", rec.thread),) if opts.thread_labels else ()) + rec.labels)
        acc = merged.get(key)
        if acc is None:
            merged[key] = list(rec.values)
        else:
            for i, val in enumerate(rec.values):
                acc[i] += val

    out = bytearray()
    for vt in profile.value_types:
        msg = bytearray()
        _int(1, strings(vt.type), msg)
        _int(2, strings(vt.unit), msg)
        _bytes(1, msg, out)
    for (ids, labels), values in merged.items():
        msg = bytearray()
        if ids:
            _bytes(1, ids, msg)  # the packed location ids
        _packed(2, values, msg)
        for k, val in labels:
            lab = bytearray()
            _int(1, strings(k), lab)
            _int(2, strings(val), lab)
            _bytes(3, lab, msg)
        _bytes(2, msg, out)
    for name, mid in mappings.items():
        msg = bytearray()
        _int(1, mid, msg)
        _int(5, strings(name), msg)
        for field in (7, 8, 9):  # has_functions, has_filenames, has_line_numbers: already symbolized
            _int(field, 1, msg)
        _bytes(3, msg, out)
    for m in location_msgs:
        _bytes(4, m, out)
    for m in function_msgs:
        _bytes(5, m, out)
    md = result.metadata
    version = str(md.versions.get("omniprof") or "")  # free-form metadata: a number must not break the report
    comments = [" ".join(x for x in ("omniprof", version, profile.source, "of", ", ".join(md.backends) or "-") if x)]
    comments += [f"not recorded: {loss.source}: {loss.count} {loss.unit} ({loss.kind}) {loss.detail}".rstrip()
                 for loss in result.losses]
    comments += [f"adjusted: {k}={n}" for k, n in profile.adjustments.items()]
    comments += [f"left out: {k}={n}" for k, n in profile.skipped.items()]
    comment_ids = [strings(c) for c in comments]
    default_type = strings(profile.value_types[profile.default_index].type)
    period_type = profile.value_types[1] if len(profile.value_types) > 1 else profile.value_types[0]
    pt_type, pt_unit = strings(period_type.type), strings(period_type.unit)
    # The string table must be complete before it is written: every index is taken above.
    for s in strings.index:
        _bytes(6, s.encode("utf-8"), out)
    _int(9, md.start_unix_ns, out)
    if md.end_ns > md.start_ns:
        _int(10, md.end_ns - md.start_ns, out)
    pt = bytearray()
    _int(1, pt_type, pt)
    _int(2, pt_unit, pt)
    _bytes(11, pt, out)
    _int(12, profile.period, out)
    _packed(13, comment_ids, out)
    _int(14, default_type, out)
    return bytes(out)


class PprofReporter(Reporter):
    """profile.proto for ``go tool pprof`` (and pprof's web UI, Pyroscope, Parca, ...)."""

    name = "pprof"
    output = "file"
    default_filename = "profile.pb.gz"
    summary = "gzipped profile.proto for go tool pprof (CPU samples, span self time, allocations)"
    Options = PprofOptions

    def profile(self, result: ProfileResult) -> StackProfile:
        return stack_profile(result, self.options.source, aggregate=True)

    def report(self, result: ProfileResult, dest: IO[bytes]) -> None:  # type: ignore[override]
        check_times(result, self.name)
        data = encode_profile(self.profile(result), result, self.options)
        dest.write(gzip.compress(data, compresslevel=6, mtime=0) if self.options.compress else data)
