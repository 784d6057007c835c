"""The XSpace schema built from xplane.proto, checked against jaxlib's own C++ XSpace parser."""

from __future__ import annotations

import pytest

from omniprof.formats import xspace as xs


def _space() -> object:
    space = xs.XSpace()
    space.hostnames.append("h1")
    plane = space.planes.add(id=0, name=xs.HOST_PLANE_NAME)
    b = xs.PlaneBuilder(plane)
    line = b.add_line("MainThread", 1_000, line_id=77)
    b.add_event(line, "outer", 1_000, 500, {"i": -3, "f": 2.5, "s": "x", "big": 1 << 63, "lst": [1, 2]})
    b.add_event(line, "inner", 1_100, 100)
    b.add_event(line, "outer", 2_000, 10)
    return space


def test_messages_round_trip_through_bytes() -> None:
    """A built XSpace serialises and parses back equal, with metadata interned by name."""
    space = _space()
    back = xs.XSpace.FromString(space.SerializeToString())
    assert back == space
    plane = back.planes[0]
    assert sorted(m.name for m in plane.event_metadata.values()) == ["inner", "outer"]
    line = plane.lines[0]
    assert [e.metadata_id for e in line.events][0] == line.events[2].metadata_id
    assert line.events[1].offset_ps == 100_000 and line.events[1].duration_ps == 100_000


def test_stats_use_the_field_that_fits_the_value() -> None:
    """ints go to int64 (uint64 beyond its range), floats to double, text to str, lists to JSON text."""
    plane = _space().planes[0]
    names = {i: m.name for i, m in plane.stat_metadata.items()}
    stats = {names[s.metadata_id]: (s.WhichOneof("value"), getattr(s, s.WhichOneof("value")))
             for s in plane.lines[0].events[0].stats}
    assert stats == {"i": ("int64_value", -3), "f": ("double_value", 2.5), "s": ("str_value", "x"),
                     "big": ("uint64_value", 1 << 63), "lst": ("str_value", "[1,2]")}


def test_jaxlib_parser_reads_what_we_write() -> None:
    """jaxlib's C++ ProfileData (an independent XSpace reader) sees our planes, lines, events and stats."""
    pd = pytest.importorskip("jax._src.lib", reason="jaxlib not installed")._profile_data
    data = pd.ProfileData.from_serialized_xspace(_space().SerializeToString())
    plane = next(p for p in data.planes if p.name == xs.HOST_PLANE_NAME)
    line = next(iter(plane.lines))
    assert line.name == "MainThread"
    events = list(line.events)
    assert [e.name for e in events] == ["outer", "inner", "outer"]
    assert events[1].duration_ns == pytest.approx(100)
    assert dict(events[0].stats)["s"] == "x"


def test_builder_continues_ids_of_an_existing_plane() -> None:
    """A PlaneBuilder over a plane read from a file reuses its metadata and never reuses a line id."""
    plane = xs.XSpace.FromString(_space().SerializeToString()).planes[0]
    b = xs.PlaneBuilder(plane)
    assert b.event_metadata_id("outer") == next(i for i, m in plane.event_metadata.items() if m.name == "outer")
    assert b.event_metadata_id("new") not in (1, 2)
    line = b.add_line("again", 0, line_id=77)
    assert line.id != 77 and len({ln.id for ln in plane.lines}) == 2


@pytest.mark.parametrize("flow_id,direction", [(0, xs.FLOW_OUT), (5, xs.FLOW_IN), ((1 << 56) - 1, xs.FLOW_IN_OUT)])
def test_flow_encoding_round_trips(flow_id: int, direction: int) -> None:
    """Flow stats pack a 56-bit id over a 2-bit direction, as XProf's XFlow decodes them."""
    value = xs.encode_flow(flow_id, direction)
    assert value & 0x3 == direction and value >> 2 == flow_id
    assert xs.decode_flow(value) == (flow_id, direction, 0)


def test_schema_classes_do_not_touch_the_default_pool() -> None:
    """Our descriptors live in a private pool, so another copy of xplane.proto can still load."""
    from google.protobuf import descriptor_pool

    xs.XSpace()
    with pytest.raises(KeyError):
        descriptor_pool.Default().FindMessageTypeByName("tensorflow.profiler.XSpace")
