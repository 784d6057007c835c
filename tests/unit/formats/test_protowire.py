"""The hand-written protobuf encoder writes the bytes protobuf's own runtime writes for the same
fields (the reference: google.protobuf serialising descriptor.proto and Perfetto messages)."""

import pytest
from google.protobuf import descriptor_pb2 as d

from omniprof.formats import protowire as w


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 2**32, 2**63 - 1, -1, -2**63])
def test_int64_fields_match_protobuf(value):
    """Negative int64 values are ten-byte two's-complement varints, as protobuf writes them."""
    ref = d.UninterpretedOption(negative_int_value=value).SerializeToString()  # field 5, int64
    assert w.f_uint(5, value) == ref


def test_strings_doubles_packed_and_nested_match_protobuf():
    assert w.f_str(1, "täst") == d.FileDescriptorProto(name="täst").SerializeToString()
    assert w.f_double(6, 2.5) == d.UninterpretedOption(double_value=2.5).SerializeToString()
    assert w.f_packed(1, [3, 270, 2**20]) == d.SourceCodeInfo.Location(path=[3, 270, 2**20]).SerializeToString()
    assert w.f_packed(1, []) == d.SourceCodeInfo.Location().SerializeToString() == b""
    inner = w.f_str(1, "Msg")
    assert w.f_bytes(4, inner) == d.FileDescriptorProto(message_type=[d.DescriptorProto(name="Msg")]).SerializeToString()


def test_fixed64_matches_perfetto_flow_ids():
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TrackEvent

    assert w.f_fixed64(47, 2**64 - 5) == TrackEvent(flow_ids=[2**64 - 5]).SerializeToString()
