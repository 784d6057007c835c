"""An independent reader of profile.proto for tests: message classes built with the protobuf
runtime from a descriptor written here from google/pprof's proto/profile.proto field table."""

from __future__ import annotations

import gzip

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
# message -> [(name, number, type, label, type_name)]
_SPEC = {
    "Profile": [("sample_type", 1, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "ValueType"),
                ("sample", 2, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "Sample"),
                ("mapping", 3, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "Mapping"),
                ("location", 4, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "Location"),
                ("function", 5, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "Function"),
                ("string_table", 6, _F.TYPE_STRING, _F.LABEL_REPEATED, None),
                ("drop_frames", 7, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None),
                ("keep_frames", 8, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None),
                ("time_nanos", 9, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None),
                ("duration_nanos", 10, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None),
                ("period_type", 11, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, "ValueType"),
                ("period", 12, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None),
                ("comment", 13, _F.TYPE_INT64, _F.LABEL_REPEATED, None),
                ("default_sample_type", 14, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None)],
    "ValueType": [("type", 1, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None),
                  ("unit", 2, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None)],
    "Sample": [("location_id", 1, _F.TYPE_UINT64, _F.LABEL_REPEATED, None),
               ("value", 2, _F.TYPE_INT64, _F.LABEL_REPEATED, None),
               ("label", 3, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "Label")],
    "Label": [("key", 1, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None), ("str", 2, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None),
              ("num", 3, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None),
              ("num_unit", 4, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None)],
    "Mapping": [("id", 1, _F.TYPE_UINT64, _F.LABEL_OPTIONAL, None),
                ("memory_start", 2, _F.TYPE_UINT64, _F.LABEL_OPTIONAL, None),
                ("memory_limit", 3, _F.TYPE_UINT64, _F.LABEL_OPTIONAL, None),
                ("file_offset", 4, _F.TYPE_UINT64, _F.LABEL_OPTIONAL, None),
                ("filename", 5, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None),
                ("build_id", 6, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None),
                ("has_functions", 7, _F.TYPE_BOOL, _F.LABEL_OPTIONAL, None),
                ("has_filenames", 8, _F.TYPE_BOOL, _F.LABEL_OPTIONAL, None),
                ("has_line_numbers", 9, _F.TYPE_BOOL, _F.LABEL_OPTIONAL, None),
                ("has_inline_frames", 10, _F.TYPE_BOOL, _F.LABEL_OPTIONAL, None)],
    "Location": [("id", 1, _F.TYPE_UINT64, _F.LABEL_OPTIONAL, None),
                 ("mapping_id", 2, _F.TYPE_UINT64, _F.LABEL_OPTIONAL, None),
                 ("address", 3, _F.TYPE_UINT64, _F.LABEL_OPTIONAL, None),
                 ("line", 4, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "Line"),
                 ("is_folded", 5, _F.TYPE_BOOL, _F.LABEL_OPTIONAL, None)],
    "Line": [("function_id", 1, _F.TYPE_UINT64, _F.LABEL_OPTIONAL, None),
             ("line", 2, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None)],
    "Function": [("id", 1, _F.TYPE_UINT64, _F.LABEL_OPTIONAL, None), ("name", 2, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None),
                 ("system_name", 3, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None),
                 ("filename", 4, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None),
                 ("start_line", 5, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None)],
}


def _profile_class() -> type:
    fd = descriptor_pb2.FileDescriptorProto(name="omniprof_test_profile.proto", package="omniprof_test.pprof",
                                            syntax="proto3")
    for msg, fields in _SPEC.items():
        m = fd.message_type.add(name=msg)
        for name, number, typ, label, type_name in fields:
            f = m.field.add(name=name, number=number, type=typ, label=label)
            if type_name:
                f.type_name = f".omniprof_test.pprof.{type_name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("omniprof_test.pprof.Profile"))


Profile = _profile_class()


def decode(data: bytes):
    """Parse a (possibly gzipped) profile.proto; raises on malformed wire data."""
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    msg = Profile()
    msg.ParseFromString(data)
    return msg
