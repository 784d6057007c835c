"""omniprof.analysis.timeline: placed() reads each part on a time axis (the one place a clock
offset is added), merge() materialises the same reading, time_bounds() covers every event."""

from __future__ import annotations

import pytest

from omniprof.analysis.timeline import merge, placed, time_axis, time_bounds
from omniprof.core.results import (
    Allocation,
    BackendResult,
    ClockInfo,
    CounterSeries,
    Instant,
    ProfileResult,
    RunMetadata,
    Span,
    StackSample,
    Track,
)
from omniprof.errors import InvalidArgumentError


def two_parts() -> ProfileResult:
    host = BackendResult(backend="cpu", start_ns=90, end_ns=400, tracks=(Track("t", "main"),),
                         spans=(Span("late", "t", 300, 10), Span("early", "t", 100, 50)),  # listed as they closed
                         instants=(Instant("i", "t", 120),),
                         counters=(CounterSeries("c", "count", "t", (100, 200), (1.0, 2.0)),),
                         samples=(StackSample(250, 1, 0, 40),))
    dev = BackendResult(backend="gpu", clock=ClockInfo("device", offset_ns=-1_000), start_ns=1_050, end_ns=1_900,
                        tracks=(Track("s", "stream"),),
                        spans=(Span("k", "s", 1_100, 30), Span("k2", "s", 1_100, 60), Span("first", "s", 1_060, 5)))
    return ProfileResult(metadata=RunMetadata(start_ns=80, end_ns=950), parts=(host, dev))


def test_placed_adds_each_parts_clock_offset_by_default():
    """Without an axis, times are the reference clock: t + clock.offset_ns (here -1000 for the device)."""
    host, dev = placed(two_parts())
    assert [(s.name, start, end) for _, s, start, end in host.spans()] == [("early", 100, 150), ("late", 300, 310)]
    # listed out of order: visited sorted by start, longer first on equal starts, with their indices
    assert [(i, s.name, start, end) for i, s, start, end in dev.spans()] == [
        (2, "first", 60, 65), (1, "k2", 100, 160), (0, "k", 100, 130)]
    assert [(i.name, t) for i, t in host.instants()] == [("i", 120)]
    assert list(host.points(two_parts().parts[0].counters[0])) == [(100, 1.0), (200, 2.0)]
    assert [(s.weight_ns, t) for s, t in host.samples()] == [(40, 250)]
    assert (host.bounds, dev.bounds) == ((90, 400), (50, 900))


def test_placed_on_an_axis_uses_its_offsets():
    """On time_axis(result) (0 at the earliest instant: the device session's start, 50), every time moves by -50."""
    r = two_parts()
    axis = time_axis(r)
    assert axis.origin_ns == 50
    host, dev = placed(r, axis)
    assert [(s.name, start) for _, s, start, _ in host.spans()] == [("early", 50), ("late", 250)]
    assert [(s.name, start) for _, s, start, _ in dev.spans()] == [("first", 10), ("k2", 50), ("k", 50)]
    assert dev.bounds == (0, 850)
    with pytest.raises(InvalidArgumentError, match="2 parts"):
        placed(r, time_axis(r, r.parts[:1]))


def test_merge_is_placed_materialised_and_sorted():
    tl = merge(two_parts())
    assert [(s.track, s.name, s.start_ns, s.dur_ns) for s in tl.spans] == [
        ("gpu/s", "first", 60, 5), ("gpu/s", "k2", 100, 60), ("cpu/t", "early", 100, 50), ("gpu/s", "k", 100, 30),
        ("cpu/t", "late", 300, 10)]
    assert [c.t_ns for c in tl.counters] == [(100, 200)]
    assert (tl.start_ns, tl.end_ns, tl.parts) == (50, 900, {"cpu": (90, 400), "gpu": (50, 900)})


def test_time_bounds_cover_every_kind_of_event():
    """A span covers [start, start + max(dur, 0)], a sample (t - max(weight, 0), t]; instants,
    allocations and counter samples their instant; the run's own bounds with include_run."""
    def bounds(**kw):
        return time_bounds(ProfileResult(parts=(BackendResult(backend="x", clock=ClockInfo("c", 5), **kw),)))

    assert bounds(spans=(Span("a", "t", 100, -20), Span("b", "t", 40, 30))) == (45, 105)
    assert bounds(samples=(StackSample(100, 1, 0, 30), StackSample(50, 1, 0, -9))) == (55, 105)
    assert bounds(instants=(Instant("i", "t", 7), Instant("j", "t", 3))) == (8, 12)
    assert bounds(allocations=(Allocation(10, 64, 0), Allocation(2, 64, 0))) == (7, 15)
    assert bounds(counters=(CounterSeries("c", "u", "t", (30, 10), (1.0, 2.0)), CounterSeries("d", "u", "t", (), ()))) \
        == (15, 35)
    assert bounds() is None
    r = ProfileResult(metadata=RunMetadata(start_ns=1, end_ns=2), parts=(BackendResult(backend="x"),))
    assert time_bounds(r) == (1, 2) and time_bounds(r, include_run=False) is None
