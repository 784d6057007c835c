"""XSpace / XPlane protobuf messages, built at run time from the public ``xplane.proto`` schema.

XProf (TensorBoard's profile plugin) reads ``<host>.xplane.pb`` files: one serialised
``tensorflow.profiler.XSpace``. No installed package ships importable Python classes for it (xprof
and jaxlib keep theirs in C++), so this module describes the schema of
``xla/tsl/profiler/protobuf/xplane.proto`` (proto3, package ``tensorflow.profiler``) as a
``FileDescriptorProto`` and lets protobuf's own runtime make the classes. They live in a private
descriptor pool, so they never clash with another copy of the schema loaded in the same process.

Only protobuf is needed; it is imported on first use.

    >>> from omniprof.formats import xspace
    >>> space = xspace.XSpace()
    >>> space.hostnames.append("h")
    >>> xspace.XSpace.FromString(space.SerializeToString()).hostnames[0]
    'h'

Conventions of the schema that XProf relies on (from ``xla/tsl/profiler/utils/xplane_schema``):

* ``XLine.timestamp_ns`` is wall-clock ns since the UNIX epoch; ``XEvent.offset_ps`` is
  picoseconds after it.
* The host plane is ``/host:CPU`` (several planes starting with it are shown as separate host
  processes), devices are ``/device:GPU:<n>`` with ``XPlane.id == n``.
* A line named ``_counters_`` holds counter samples: each event is one sample whose stats are the
  values.
* A stat named ``flow`` (uint64) links events: ``direction | flow_id << 2 | category << 58`` with
  direction 1 = flow in, 2 = flow out, 3 = both.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = [
    "XSpace", "XPlane", "XLine", "XEvent", "XStat", "XEventMetadata", "XStatMetadata",
    "HOST_PLANE_NAME", "GPU_PLANE_PREFIX", "TASK_ENV_PLANE_NAME", "COUNTER_LINE_NAME",
    "FLOW_IN", "FLOW_OUT", "FLOW_IN_OUT", "encode_flow", "decode_flow", "PlaneBuilder",
]

HOST_PLANE_NAME = "/host:CPU"
GPU_PLANE_PREFIX = "/device:GPU:"
TASK_ENV_PLANE_NAME = "Task Environment"
COUNTER_LINE_NAME = "_counters_"

FLOW_IN, FLOW_OUT, FLOW_IN_OUT = 1, 2, 3
_FLOW_ID_MASK = (1 << 56) - 1

_PACKAGE = "tensorflow.profiler"
_MESSAGES = ("XSpace", "XPlane", "XLine", "XEvent", "XStat", "XEventMetadata", "XStatMetadata")


def encode_flow(flow_id: int, direction: int, category: int = 0) -> int:
    """The uint64 value of a ``flow`` stat (56-bit id, 2-bit direction, 6-bit category)."""
    return (direction & 0x3) | ((flow_id & _FLOW_ID_MASK) << 2) | ((category & 0x3F) << 58)


def decode_flow(value: int) -> tuple[int, int, int]:
    """``(flow_id, direction, category)`` of a ``flow`` stat value."""
    return (value >> 2) & _FLOW_ID_MASK, value & 0x3, (value >> 58) & 0x3F


@functools.cache
def _classes() -> dict[str, type]:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fdp = descriptor_pb2.FileDescriptorProto(name="omniprof/xplane.proto", package=_PACKAGE, syntax="proto3")
    F = descriptor_pb2.FieldDescriptorProto
    OPT, REP = F.LABEL_OPTIONAL, F.LABEL_REPEATED

    def message(name: str, fields: list[tuple], oneofs: tuple[str, ...] = ()) -> descriptor_pb2.DescriptorProto:
        msg = fdp.message_type.add(name=name)
        for oneof in oneofs:
            msg.oneof_decl.add(name=oneof)
        for fname, number, ftype, label, *rest in fields:
            field = msg.field.add(name=fname, number=number, type=ftype, label=label)
            type_name = rest[0] if rest else None
            if type_name:
                field.type_name = type_name
            if len(rest) > 1 and rest[1] is not None:
                field.oneof_index = rest[1]
        return msg

    def map_entry(msg: descriptor_pb2.DescriptorProto, entry: str, value_type: str) -> None:
        nested = msg.nested_type.add(name=entry)
        nested.options.map_entry = True
        nested.field.add(name="key", number=1, type=F.TYPE_INT64, label=OPT)
        nested.field.add(name="value", number=2, type=F.TYPE_MESSAGE, label=OPT, type_name=value_type)

    p = f".{_PACKAGE}."
    message("XSpace", [("planes", 1, F.TYPE_MESSAGE, REP, p + "XPlane"), ("errors", 2, F.TYPE_STRING, REP),
                       ("warnings", 3, F.TYPE_STRING, REP), ("hostnames", 4, F.TYPE_STRING, REP)])
    plane = message("XPlane", [
        ("id", 1, F.TYPE_INT64, OPT), ("name", 2, F.TYPE_STRING, OPT),
        ("lines", 3, F.TYPE_MESSAGE, REP, p + "XLine"),
        ("event_metadata", 4, F.TYPE_MESSAGE, REP, p + "XPlane.EventMetadataEntry"),
        ("stat_metadata", 5, F.TYPE_MESSAGE, REP, p + "XPlane.StatMetadataEntry"),
        ("stats", 6, F.TYPE_MESSAGE, REP, p + "XStat")])
    map_entry(plane, "EventMetadataEntry", p + "XEventMetadata")
    map_entry(plane, "StatMetadataEntry", p + "XStatMetadata")
    line = message("XLine", [
        ("id", 1, F.TYPE_INT64, OPT), ("display_id", 10, F.TYPE_INT64, OPT), ("name", 2, F.TYPE_STRING, OPT),
        ("display_name", 11, F.TYPE_STRING, OPT), ("timestamp_ns", 3, F.TYPE_INT64, OPT),
        ("duration_ps", 9, F.TYPE_INT64, OPT), ("events", 4, F.TYPE_MESSAGE, REP, p + "XEvent")])
    for lo, hi in ((5, 9),):
        line.reserved_range.add(start=lo, end=hi)
    message("XEvent", [
        ("metadata_id", 1, F.TYPE_INT64, OPT), ("offset_ps", 2, F.TYPE_INT64, OPT, None, 0),
        ("num_occurrences", 5, F.TYPE_INT64, OPT, None, 0), ("duration_ps", 3, F.TYPE_INT64, OPT),
        ("stats", 4, F.TYPE_MESSAGE, REP, p + "XStat")], oneofs=("data",))
    message("XStat", [
        ("metadata_id", 1, F.TYPE_INT64, OPT), ("double_value", 2, F.TYPE_DOUBLE, OPT, None, 0),
        ("uint64_value", 3, F.TYPE_UINT64, OPT, None, 0), ("int64_value", 4, F.TYPE_INT64, OPT, None, 0),
        ("str_value", 5, F.TYPE_STRING, OPT, None, 0), ("bytes_value", 6, F.TYPE_BYTES, OPT, None, 0),
        ("ref_value", 7, F.TYPE_UINT64, OPT, None, 0)], oneofs=("value",))
    message("XEventMetadata", [
        ("id", 1, F.TYPE_INT64, OPT), ("name", 2, F.TYPE_STRING, OPT), ("display_name", 4, F.TYPE_STRING, OPT),
        ("metadata", 3, F.TYPE_BYTES, OPT), ("stats", 5, F.TYPE_MESSAGE, REP, p + "XStat"),
        ("child_id", 6, F.TYPE_INT64, REP)])
    message("XStatMetadata", [("id", 1, F.TYPE_INT64, OPT), ("name", 2, F.TYPE_STRING, OPT),
                              ("description", 3, F.TYPE_STRING, OPT)])

    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}"))
            for name in _MESSAGES}


def __getattr__(name: str) -> Any:
    if name in _MESSAGES:
        return _classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class PlaneBuilder:
    """Fills one XPlane: event and stat metadata interned by name, lines, events with stats.

    Args:
        plane: an ``XPlane`` message (new or read from a file: existing metadata ids are reused and
            new ids start after the largest one, so events can be added to a plane jax wrote).
    """

    def __init__(self, plane: Any) -> None:
        self.plane = plane
        self._events: dict[str, int] = {m.name: i for i, m in plane.event_metadata.items()}
        self._stats: dict[str, int] = {m.name: i for i, m in plane.stat_metadata.items()}
        self._next_event_id = max(plane.event_metadata.keys(), default=0) + 1
        self._next_stat_id = max(plane.stat_metadata.keys(), default=0) + 1
        self._line_ids = {ln.id for ln in plane.lines}  # checked per new line: a scan was quadratic in threads
        self._next_line_id = max(self._line_ids, default=0) + 1

    def event_metadata_id(self, name: str, display_name: str = "") -> int:
        mid = self._events.get(name)
        if mid is None:
            mid = self._next_event_id
            self._next_event_id += 1
            meta = self.plane.event_metadata[mid]
            meta.id = mid
            meta.name = name
            if display_name and display_name != name:
                meta.display_name = display_name
            self._events[name] = mid
        return mid

    def stat_metadata_id(self, name: str) -> int:
        mid = self._stats.get(name)
        if mid is None:
            mid = self._next_stat_id
            self._next_stat_id += 1
            meta = self.plane.stat_metadata[mid]
            meta.id = mid
            meta.name = name
            self._stats[name] = mid
        return mid

    def add_line(self, name: str, timestamp_ns: int, *, display_name: str = "", line_id: int | None = None) -> Any:
        """A new line starting at ``timestamp_ns`` (wall clock); ids are unique within the plane."""
        if line_id is None or line_id in self._line_ids:
            line_id = self._next_line_id
        self._next_line_id = max(self._next_line_id, line_id + 1)
        self._line_ids.add(line_id)
        line = self.plane.lines.add(id=line_id, display_id=line_id, name=name, timestamp_ns=timestamp_ns)
        if display_name:
            line.display_name = display_name
        return line

    def add_event(self, line: Any, name: str, start_ns: int, dur_ns: int,
                  stats: dict[str, Any] | None = None, *, metadata_id: int | None = None) -> Any:
        """An event at ``start_ns`` lasting ``dur_ns`` on ``line`` (same clock as ``line.timestamp_ns``)."""
        mid = self.event_metadata_id(name) if metadata_id is None else metadata_id
        offset_ps = (start_ns - line.timestamp_ns) * 1000
        duration_ps = dur_ns * 1000 if dur_ns > 0 else 0
        if not stats:
            return line.events.add(metadata_id=mid, offset_ps=offset_ps, duration_ps=duration_ps)
        # One add() with the stats as dicts: protobuf builds the nested messages in C.
        return line.events.add(metadata_id=mid, offset_ps=offset_ps, duration_ps=duration_ps,
                               stats=[self.stat_dict(k, v) for k, v in stats.items()])

    def add_plane_stat(self, key: str, value: Any) -> None:
        self.plane.stats.add(**self.stat_dict(key, value))

    def stat_dict(self, key: str, value: Any) -> dict[str, Any]:
        """An XStat as a dict, its value in the field that fits: int64 (uint64 above its range),
        double, string, bytes; anything else as compact JSON text."""
        mid = self._stats.get(key)
        if mid is None:
            mid = self.stat_metadata_id(key)
        t = type(value)
        if t is int:
            if -(1 << 63) <= value < (1 << 63):
                return {"metadata_id": mid, "int64_value": value}
            if 0 <= value < (1 << 64):
                return {"metadata_id": mid, "uint64_value": value}
            return {"metadata_id": mid, "str_value": str(value)}
        if t is float:
            return {"metadata_id": mid, "double_value": value}
        if t is str:
            return {"metadata_id": mid, "str_value": value}
        if t is bool:
            return {"metadata_id": mid, "int64_value": int(value)}
        if isinstance(value, bytes):
            return {"metadata_id": mid, "bytes_value": value}
        if isinstance(value, bool):
            return {"metadata_id": mid, "int64_value": int(value)}
        if isinstance(value, int):  # subclasses such as IntEnum
            return self.stat_dict(key, int(value))
        if isinstance(value, float):
            return self.stat_dict(key, float(value))
        if isinstance(value, str):
            return self.stat_dict(key, str(value))
        import json

        return {"metadata_id": mid, "str_value": json.dumps(value, separators=(",", ":"), default=str)}

    def set_stat(self, stat: Any, key: str, value: Any) -> None:
        """Fill an existing XStat message (see :meth:`stat_dict`)."""
        for field, v in self.stat_dict(key, value).items():
            setattr(stat, field, v)
