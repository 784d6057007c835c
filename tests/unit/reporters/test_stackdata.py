"""Weighted stacks shared by the profile reporters: sources, span nesting, bad data."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import omniprof
from omniprof.core.results import Allocation, BackendResult, Frame, ProfileResult, Span, StackSample, Track
from omniprof.analysis.stackdata import pick_source, span_lanes, stack_profile
from omniprof.testing.fakes import make_result


def test_auto_source_prefers_samples_then_allocations_then_spans():
    """source='auto' picks samples, else allocations, else spans."""
    full = make_result()
    assert pick_source(full, "auto") == "samples"
    no_samples = full.evolve(parts=(omniprof.core.results.BackendResult(
        backend="m", allocations=full.parts[0].allocations, spans=full.parts[0].spans),))
    assert pick_source(no_samples, "auto") == "allocations"
    only_spans = full.evolve(parts=(BackendResult(backend="x", spans=full.parts[0].spans),))
    assert pick_source(only_spans, "auto") == "spans"
    with pytest.raises(omniprof.InvalidArgumentError, match="'source' must be one of"):
        pick_source(full, "heap")


def test_sample_values_and_period():
    """Samples give (1, weight_ns) per sample and the sampler interval as period."""
    prof = stack_profile(make_result(), "samples")
    assert prof.totals() == (10, 10_000_000)
    assert prof.period == 1_000_000  # median weight: make_result has no sampler summary
    cpu = make_result().parts[0]
    with_interval = make_result().evolve(parts=(
        BackendResult(backend="cpu", frames=cpu.frames, stacks=cpu.stacks, samples=cpu.samples,
                      summaries={"overhead": {"interval_s": 0.0005}}),))
    assert stack_profile(with_interval, "samples").period == 500_000


def test_allocation_values_follow_pprof_heap_types():
    """Allocations give (count, size_bytes, in-use count, in-use bytes)."""
    prof = stack_profile(make_result(), "allocations")
    assert [vt.type for vt in prof.value_types] == ["alloc_objects", "alloc_space", "inuse_objects", "inuse_space"]
    assert prof.totals() == (2, 4224, 1, 4096)


def test_unknown_stack_ids_are_counted_and_warned():
    """A sample whose stack is missing is skipped, counted and warned about."""
    part = BackendResult(backend="cpu", frames=(Frame("f"),), stacks=((0,),),
                         samples=(StackSample(0, 1, 0, 5), StackSample(1, 1, 9, 5)))
    with pytest.warns(omniprof.DataLossWarning, match="1 samples refer to stacks missing"):
        prof = stack_profile(ProfileResult(parts=(part,)), "samples")
    assert prof.skipped == {"samples_with_unknown_stack": 1} and prof.totals() == (1, 5)


def test_lanes_nest_siblings_and_split_overlaps():
    """Nested and back-to-back spans share a lane; a span crossing its parent's end moves lanes, and
    what nests in it (z, inside x by the one nesting rule) is drawn under it there."""
    spans = (Span("p", "t", 0, 100), Span("c1", "t", 10, 20), Span("c2", "t", 30, 70), Span("x", "t", 90, 30),
             Span("z", "t", 100, 0))
    lanes, moved = span_lanes(BackendResult(backend="b", tracks=(Track("t", "T"),), spans=spans))
    assert moved == 2
    assert [[s.name for s in lane.spans] for lane in lanes] == [["p", "c1", "c2"], ["x", "z"]]
    assert lanes[0].depth == (0, 1, 1) and lanes[0].parent == (-1, 0, 0)
    assert lanes[1].depth == (0, 1) and lanes[1].parent == (-1, 0)
    assert [lane.name for lane in lanes] == ["T", "T (overlap 1)"]


def test_span_self_time_excludes_children():
    """A span's record carries its self time: duration less its direct children's."""
    spans = (Span("p", "t", 0, 100), Span("c", "t", 10, 20), Span("g", "t", 12, 5))
    prof = stack_profile(ProfileResult(parts=(BackendResult(backend="b", spans=spans),)), "spans")
    got = {tuple(f.name for f in r.frames): r.values[1] for r in prof.records}
    assert got == {("p",): 80, ("p", "c"): 15, ("p", "c", "g"): 5}


_span = st.builds(lambda s, d, t: (s, d, t), st.integers(0, 1000), st.integers(0, 300), st.sampled_from("ab"))


@settings(max_examples=200, deadline=None)
@given(st.lists(_span, max_size=40))
def test_lanes_are_properly_nested_and_lose_nothing(raw):
    """For any spans, lanes keep every span once, and each lane is properly nested."""
    spans = tuple(Span(f"s{i}", t, s, d) for i, (s, d, t) in enumerate(raw))
    lanes, _ = span_lanes(BackendResult(backend="b", spans=spans))
    placed = sorted(s.name for lane in lanes for s in lane.spans)
    assert placed == sorted(s.name for s in spans)
    for lane in lanes:
        assert all(s.track == lane.track for s in lane.spans)
        for s, p in zip(lane.spans, lane.parent):
            if p >= 0:
                parent = lane.spans[p]
                assert parent.start_ns <= s.start_ns and s.end_ns <= parent.end_ns
        # siblings under one parent never overlap
        kids: dict[int, list[Span]] = {}
        for s, p in zip(lane.spans, lane.parent):
            kids.setdefault(p, []).append(s)
        for group in kids.values():
            for a, b in zip(group, group[1:]):
                assert a.end_ns <= b.start_ns
    # where nothing overlaps without nesting (one lane per track), self times add up to the time
    # covered by the top-level spans
    if all(lane.index == 0 for lane in lanes):
        prof = stack_profile(ProfileResult(parts=(BackendResult(backend="b", spans=spans),)), "spans")
        top = sum(s.dur_ns for lane in lanes for s, p in zip(lane.spans, lane.parent) if p < 0)
        assert prof.totals()[1] == top


def test_parts_are_prefixed_by_backend_when_several():
    """With several parts, thread labels name the backend."""
    a = BackendResult(backend="cpu", frames=(Frame("f"),), stacks=((0,),), samples=(StackSample(0, 1, 0, 5),))
    b = BackendResult(backend="torch", frames=(Frame("g"),), stacks=((0,),), samples=(StackSample(0, 2, 0, 5),))
    prof = stack_profile(ProfileResult(parts=(a, b)), "samples")
    assert [r.thread for r in prof.records] == ["cpu: thread 1", "torch: thread 2"]


def test_allocation_without_thread_is_labelled_by_backend():
    """An allocation with no thread id is labelled with its backend's name."""
    part = BackendResult(backend="mem", frames=(Frame("f"),), stacks=((0,),), allocations=(Allocation(0, 8, 0),))
    assert stack_profile(ProfileResult(parts=(part,)), "allocations").records[0].thread == "mem"


@pytest.mark.parametrize("source", ["samples", "allocations"])
def test_aggregate_sums_records_without_changing_totals(source, cpu_result):
    """aggregate=True merges records of one stack, thread and labels, with the same totals per stack."""
    from collections import Counter

    for result in (make_result(), cpu_result):
        if source == "allocations" and result is cpu_result:
            continue
        one = stack_profile(result, source)
        agg = stack_profile(result, source, aggregate=True)
        assert agg.totals() == one.totals() and agg.period == one.period
        assert len({(r.frames, r.thread, r.labels) for r in agg.records}) == len(agg.records)

        def per_stack(p):
            c: Counter = Counter()
            for r in p.records:
                c[(r.frames, r.thread, r.labels)] += r.values[-1]
            return c

        assert per_stack(agg) == per_stack(one)
