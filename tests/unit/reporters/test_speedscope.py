"""The speedscope reporter: files valid against speedscope's schema and its importer's rules."""

from __future__ import annotations

import io
import json
from collections import Counter

import attrs
import jsonschema
import pytest

import omniprof
from omniprof.core.results import BackendResult, Frame, ProfileResult, Span, StackSample, Track
from omniprof.reporters.speedscope import SpeedscopeOptions, SpeedscopeReporter, speedscope_document
from omniprof.testing.conformance import ReporterConformance
from omniprof.testing.fakes import make_result


class TestSpeedscopeConformance(ReporterConformance):
    reporter_cls = SpeedscopeReporter


def check_importable(doc: dict) -> None:
    """The rules speedscope's importer enforces beyond the schema: frame indices in range, one
    weight per sample, events in time order, and every close matching the innermost open frame."""
    n = len(doc["shared"]["frames"])
    for prof in doc["profiles"]:
        assert prof["startValue"] <= prof["endValue"], prof["name"]
        if prof["type"] == "sampled":
            assert len(prof["samples"]) == len(prof["weights"])
            assert all(0 <= f < n for s in prof["samples"] for f in s)
            assert all(w >= 0 for w in prof["weights"])
        else:
            stack: list[int] = []
            last = prof["startValue"]
            for e in prof["events"]:
                assert 0 <= e["frame"] < n
                assert e["at"] >= last, f"{prof['name']}: events out of order"
                last = e["at"]
                if e["type"] == "O":
                    stack.append(e["frame"])
                else:
                    assert stack and stack[-1] == e["frame"], f"{prof['name']}: close of a frame not on top"
                    stack.pop()
            assert not stack, f"{prof['name']}: frames left open"
            assert last <= prof["endValue"]


def _doc(result: ProfileResult, **opts) -> dict:
    buf = io.BytesIO()
    SpeedscopeReporter(SpeedscopeOptions(**opts)).report(result, buf)
    return json.loads(buf.getvalue())


@pytest.mark.parametrize("which", ["full", "empty", "real"])
def test_valid_against_published_schema(which, speedscope_schema, cpu_result):
    """The file validates against file-format-schema.json from the speedscope npm package."""
    result = {"full": make_result(), "empty": make_result(empty=True), "real": cpu_result}[which]
    doc = _doc(result)
    jsonschema.validate(doc, speedscope_schema)
    check_importable(doc)


def test_one_sampled_profile_per_thread_with_ns_weights(cpu_result):
    """Samples give one sampled profile per thread whose weights sum to that thread's sampled time."""
    doc = _doc(cpu_result)
    part = cpu_result.part("cpu")
    want = Counter()
    for s in part.samples:
        want[part.thread_name(s.thread_id)] += max(0, s.weight_ns)
    got = {p["name"]: sum(p["weights"]) for p in doc["profiles"] if p["type"] == "sampled"}
    assert got == dict(want)
    assert all(p["unit"] == "nanoseconds" for p in doc["profiles"] if p["type"] == "sampled")


def test_sample_stacks_are_root_first_frames():
    """A sampled stack lists frame indices root first, naming the recorded frames."""
    doc = _doc(make_result())
    frames = doc["shared"]["frames"]
    prof = doc["profiles"][0]
    assert [frames[i]["name"] for i in prof["samples"][1]] == ["main", "work", "helper"]
    assert frames[prof["samples"][3][-1]] == {"name": "memcpy", "file": "libc.so.6"}


def test_consecutive_identical_samples_merge_in_time_order():
    """Back-to-back samples of one stack become one longer sample; the time order is kept."""
    prof = _doc(make_result())["profiles"][0]
    leaf = [len(s) for s in prof["samples"]]
    # make_result's stacks in time order: 0 1 1 2 3 0 1 1 0 0 (depths 2 3 3 2 3 2 3 3 2 2)
    assert leaf == [2, 3, 2, 3, 2, 3, 2]
    assert [w // 1_000_000 for w in prof["weights"]] == [1, 2, 1, 1, 1, 2, 2]


def test_spans_become_evented_profiles_per_track():
    """Spans give an evented profile per track, with times on the file's one axis: 0 is the earliest
    instant of the run, here the start of the first sample's interval (t 1 ms, weight 1 ms: reference
    time 0), 1 ms before the run's start."""
    doc = _doc(make_result(), include_samples=False, include_allocations=False)
    names = [p["name"] for p in doc["profiles"]]
    assert names == ["MainThread", "GPU 0 stream 7"]
    frames = doc["shared"]["frames"]
    ev = [(e["type"], e["at"], frames[e["frame"]]["name"]) for e in doc["profiles"][0]["events"]]
    # make_result's spans, at reference times 1_000_000 + 5 ms and 2_000_000 + 0.1 ms
    assert ev == [("O", 1_000_000, "step 1"), ("O", 2_000_000, "launch"), ("C", 2_100_000, "launch"),
                  ("C", 6_000_000, "step 1")]
    without_samples = make_result()
    without_samples = without_samples.evolve(parts=(attrs.evolve(without_samples.parts[0], samples=()),))
    doc = _doc(without_samples, include_samples=False, include_allocations=False)
    first = [(e["type"], e["at"]) for e in doc["profiles"][0]["events"]][0]
    assert first == ("O", 0)  # no sample before the run's start: 0 is the run's start, where step 1 opens


def test_overlapping_spans_split_into_lanes_without_loss(speedscope_schema):
    """Spans that overlap without nesting move to an overlap lane, with what nests in them; every span
    keeps its times."""
    spans = (Span("a", "t", 0, 100), Span("b", "t", 50, 100), Span("c", "t", 60, 10), Span("d", "t", 120, 50))
    part = BackendResult(backend="x", tracks=(Track("t", "stream"),), spans=spans)
    doc = _doc(ProfileResult(parts=(part,)))
    jsonschema.validate(doc, speedscope_schema)
    check_importable(doc)
    assert [p["name"] for p in doc["profiles"]] == ["stream", "stream (overlap 1)"]
    assert "2 spans moved to overlap lanes" in doc["name"]  # b, and c which nests in b
    frames = doc["shared"]["frames"]
    seen = {}
    for p in doc["profiles"]:
        opened = {}
        for e in p["events"]:
            name = frames[e["frame"]]["name"]
            if e["type"] == "O":
                opened[name] = e["at"]
            else:
                seen[name] = (opened[name], e["at"])
    assert seen == {"a": (0, 100), "b": (50, 150), "c": (60, 70), "d": (120, 170)}


def test_allocations_give_byte_weighted_profiles(speedscope_schema):
    """Allocations give 'allocated' and 'in use at end' profiles in bytes."""
    doc = _doc(make_result(), include_samples=False, include_spans=False)
    jsonschema.validate(doc, speedscope_schema)
    got = {p["name"]: (p["unit"], sum(p["weights"])) for p in doc["profiles"]}
    assert got == {"MainThread: allocated bytes": ("bytes", 4224), "MainThread: in use at end bytes": ("bytes", 4096)}


def test_combine_lines_false_keeps_a_frame_per_line():
    """combine_lines=False keeps one frame per (function, line)."""
    frames = (Frame("f", "a.py", 1), Frame("f", "a.py", 2))
    part = BackendResult(backend="cpu", frames=frames, stacks=((0,), (1,)),
                         samples=(StackSample(1, 1, 0, 5), StackSample(2, 1, 1, 7)))
    r = ProfileResult(parts=(part,))
    assert len(_doc(r)["shared"]["frames"]) == 1
    assert [f.get("line") for f in _doc(r, combine_lines=False)["shared"]["frames"]] == [1, 2]


def test_several_parts_are_named_by_backend(speedscope_schema):
    """With several backends, profile names start with the backend's name."""
    a = BackendResult(backend="cpu", frames=(Frame("f"),), stacks=((0,),), samples=(StackSample(1, 1, 0, 5),))
    b = BackendResult(backend="xla", spans=(Span("op", "dev", 0, 10),), tracks=(Track("dev", "device 0"),))
    doc = _doc(ProfileResult(parts=(a, b)))
    jsonschema.validate(doc, speedscope_schema)
    assert [p["name"] for p in doc["profiles"]] == ["cpu: thread 1", "xla: device 0"]


def test_report_writes_a_file(tmp_path, speedscope_schema):
    """omniprof.report writes profile.speedscope.json in a directory."""
    path = omniprof.report(make_result(), "speedscope", tmp_path)
    assert path.name == "profile.speedscope.json"
    jsonschema.validate(json.loads(path.read_text()), speedscope_schema)


def test_document_is_plain_data():
    """speedscope_document returns JSON-ready plain data (built before formatting)."""
    doc = speedscope_document(make_result())
    assert json.loads(json.dumps(doc)) == doc


# -- the real app ---------------------------------------------------------------------------------------
def test_speedscope_app_rejects_a_broken_file(speedscope_app, tmp_path):
    """The app harness can fail: a file whose events close the wrong frame is refused by speedscope."""
    bad = {"$schema": "https://www.speedscope.app/file-format-schema.json",
           "shared": {"frames": [{"name": "a"}, {"name": "b"}]},
           "profiles": [{"type": "evented", "name": "x", "unit": "nanoseconds", "startValue": 0, "endValue": 9,
                         "events": [{"type": "O", "at": 0, "frame": 0}, {"type": "O", "at": 1, "frame": 1},
                                    {"type": "C", "at": 5, "frame": 0}, {"type": "C", "at": 6, "frame": 1}]}]}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    shown = speedscope_app.load(path)
    assert shown["failed"], shown["console"]


@pytest.mark.slow
@pytest.mark.parametrize("which", ["full", "real", "allocations"])
def test_speedscope_app_opens_our_files(which, speedscope_app, cpu_result, tmp_path):
    """speedscope itself (its npm release, in headless Chromium) imports our file and shows it."""
    result = {"full": make_result(), "real": cpu_result, "allocations": make_result()}[which]
    opts = {"include_samples": False, "include_spans": False} if which == "allocations" else {}
    path = omniprof.report(result, "speedscope", tmp_path / f"{which}.speedscope.json", options=opts)
    doc = json.loads(path.read_text())
    shown = speedscope_app.load(path)
    assert not shown["failed"], shown["console"]
    assert shown["title"] == f"{doc['name']} - speedscope"
    assert "Time Order" in shown["dom"] and doc["profiles"][0]["name"] in shown["dom"]


def _device_before_run() -> ProfileResult:
    """A run (reference clock 10-20 ms) with a device part whose clock offset (-15 ms) puts its
    kernel [2, 5) ms and its samples before the run's start, at reference times -13 ms and on."""
    from omniprof.core.results import ClockInfo, RunMetadata

    host = BackendResult(backend="cpu", start_ns=10_000_000, end_ns=20_000_000, tracks=[Track("t", "main")],
                         spans=[Span("outer", "t", 11_000_000, 4_000_000)])
    dev = BackendResult(backend="dev", clock=ClockInfo("dev", offset_ns=-15_000_000),
                        tracks=[Track("s", "stream 1", kind="stream")], spans=[Span("kernel", "s", 2_000_000, 3_000_000)],
                        frames=[Frame("f", "f.py", 1)], stacks=[(0,)], threads=[],
                        samples=[StackSample(3_000_000, 1, 0, 1_000_000), StackSample(4_500_000, 1, 0, 1_500_000)])
    return ProfileResult(metadata=RunMetadata(start_ns=10_000_000, end_ns=20_000_000), parts=(host, dev))


def test_data_before_the_run_start_keeps_its_place_and_length(speedscope_schema):
    """A part whose clock puts data before the run's start is shifted with everything else, never
    clamped: 0 is the earliest instant (the kernel's start, reference -13 ms), and every profile keeps
    the distances between reference times (host span at -13 + 24 = 11 ms; the samples' intervals
    begin at reference -13 ms too, so their profile starts at 0)."""
    doc = _doc(_device_before_run())
    jsonschema.validate(doc, speedscope_schema)
    check_importable(doc)
    by_name = {p["name"]: p for p in doc["profiles"]}
    assert [(e["type"], e["at"]) for e in by_name["cpu: main"]["events"]] == [("O", 24_000_000), ("C", 28_000_000)]
    assert [(e["type"], e["at"]) for e in by_name["dev: stream 1"]["events"]] == [("O", 0), ("C", 3_000_000)]
    sampled = by_name["dev: thread 1"]
    assert (sampled["startValue"], sampled["endValue"], sampled["weights"]) == (0, 2_500_000, [2_500_000])
    assert all(v >= 0 for p in doc["profiles"] for v in (p["startValue"], p["endValue"]))


def test_speedscope_app_reads_data_before_the_run_start(speedscope_app, tmp_path):
    """speedscope itself opens the shifted file and shows each profile's total as the data's own length
    (kernel 3 ms, host span 4 ms, samples 2.5 ms), not cut at 0."""
    path = omniprof.report(_device_before_run(), "speedscope", tmp_path / "early.speedscope.json")
    shown = speedscope_app.load(path)
    assert not shown["failed"], shown["console"]
    import re

    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", shown["dom"]))
    totals = dict(re.findall(r"\d+ ((?:cpu|dev): [\w ]+?) (\d+\.\d+ms)", text))
    assert totals == {"cpu: main": "4.00ms", "dev: stream 1": "3.00ms", "dev: thread 1": "2.50ms"}, text[-800:]


def test_negative_spans_and_allocations_are_left_out_and_noted(speedscope_schema):
    """A result built in memory with a span of negative length and an allocation of negative size
    (load() refuses both): the file leaves them out, says so, and speedscope's rules hold."""
    from omniprof.core.results import Allocation

    part = BackendResult(backend="cpu", tracks=[Track("t", "main")],
                         spans=[Span("outer", "t", 0, 1_000), Span("neg", "t", 500, -300), Span("inner", "t", 100, 200)],
                         frames=[Frame("f", "f.py", 1)], stacks=[(0,)],
                         allocations=[Allocation(1, 64, 0), Allocation(2, -32, 0)])
    doc = _doc(ProfileResult(parts=(part,)))
    jsonschema.validate(doc, speedscope_schema)
    check_importable(doc)
    names = {doc["shared"]["frames"][e["frame"]]["name"] for p in doc["profiles"] if p["type"] == "evented"
             for e in p["events"]}
    assert names == {"outer", "inner"}
    assert [w for p in doc["profiles"] if p["type"] == "sampled" for w in p["weights"]] == [64]
    assert "2 span(s) or allocation(s) of negative size left out" in doc["name"]
