"""The tensorboard reporter: conversion to XPlanes, the logdir layout, unique runs, errors.

XProf itself reading these files is tested in tests/integration/test_xprof_viewer.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import omniprof
from omniprof.formats import xspace as xs
from omniprof.core.fileio import OutputError
from omniprof.core.results import (
    Artifact,
    BackendResult,
    ClockInfo,
    CounterSeries,
    Flow,
    ProfileResult,
    RunMetadata,
    Span,
    Track,
)
from omniprof.errors import InvalidArgumentError
from omniprof.reporters.tensorboard import (
    EventData,
    TensorBoardOptions,
    TensorBoardReporter,
    _pack,
    build_timeline,
    kernel_details,
    to_xspace,
    write_logdir,
)
from omniprof.testing.conformance import ReporterConformance
from omniprof.testing.fakes import make_result


class TestTensorBoardConformance(ReporterConformance):
    reporter_cls = TensorBoardReporter


def _lines(timeline, plane_name):
    plane = next(p for p in timeline.planes if p.name == plane_name)
    return {ln.name: ln for ln in plane.lines}


def torch_like_result() -> ProfileResult:
    """A result shaped like the torch backend's (docs/results.md): ops, launches, kernels, memcpy, NVML."""
    meta = RunMetadata(host="gpu-box", pid=7, start_unix_ns=1_750_000_000_000_000_000, start_ns=5_000, end_ns=90_000)
    part = BackendResult(
        backend="torch", clock=ClockInfo(offset_ns=1_000), start_ns=4_000, end_ns=89_000,
        tracks=(Track("thread:11", "python3 11", "thread", "python3", pid=7, tid=11),
                Track("device:0:stream:7", "stream 7", "stream", "GPU 0", device=0, stream=7),
                Track("device:1:stream:13", "stream 13", "stream", "GPU 1", device=1, stream=13),
                Track("counter:power", "power", "counter", device=0)),
        spans=(Span("aten::linear", "thread:11", 10_000, 40_000, "cpu_op", {"input_shapes": [[8, 4], [4, 4]]}),
               Span("aten::addmm", "thread:11", 12_000, 30_000, "cpu_op", {"flops": 256}),
               Span("cudaLaunchKernel", "thread:11", 15_000, 5_000, "runtime", {"correlation_id": 3}, flow_ids=(3,)),
               Span("cudaMemcpyAsync", "thread:11", 25_000, 2_000, "runtime", {"correlation_id": 4}, flow_ids=(4,)),
               Span("sgemm_64x64", "device:0:stream:7", 30_000, 8_000, "kernel",
                    {"grid": [4, 1, 1], "block": [128, 1, 1], "registers_per_thread": 96,
                     "dynamic_shared_memory_bytes": 512, "occupancy_pct": 25.0, "correlation_id": 3}, flow_ids=(3,)),
               Span("Memcpy DtoD", "device:1:stream:13", 40_000, 1_000, "memcpy", {"bytes": 4096, "kind": "DtoD"},
                    flow_ids=(4,))),
        flows=(Flow(3, "launch", "cuda"), Flow(4, "launch", "cuda")),
        counters=(CounterSeries("power", "W", "counter:power", (20_000, 60_000), (100.0, 250.0)),),
    )
    return ProfileResult(metadata=meta, parts=(part,))


def test_fake_result_maps_tracks_to_host_and_device_planes() -> None:
    """Thread tracks land on /host:CPU, the stream track on /device:GPU:0 with its stream id as line id."""
    tl = build_timeline(make_result())
    assert [p.name for p in tl.planes] == ["/host:CPU", "/device:GPU:0"]
    host = _lines(tl, "/host:CPU")
    assert [e.name for e in host["MainThread"].events] == ["step 1", "launch", "gc"]
    assert host["MainThread"].line_id == 4242
    gpu = _lines(tl, "/device:GPU:0")
    assert gpu["GPU 0 stream 7"].line_id == 7
    assert [e.name for e in gpu["GPU 0 stream 7"].events] == ["gemm_kernel"]


def test_line_ids_are_the_tracks_stream_field_not_their_ids() -> None:
    """A stream's XLine id is ``Track.stream``: a track named without a number still gets its stream,
    and a number in a name that is no stream (``stream 9`` with ``stream=None``) is not taken for one."""
    part = BackendResult(backend="b", tracks=(Track("q", "copy queue", "stream", device=2, stream=5),
                                              Track("r", "stream 9", "stream", device=2)),
                         spans=(Span("k", "q", 10, 5, "kernel"), Span("m", "r", 10, 5, "memcpy")))
    gpu = _lines(build_timeline(ProfileResult(parts=(part,))), "/device:GPU:2")
    assert (gpu["copy queue"].line_id, gpu["stream 9"].line_id) == (5, None)


def test_a_version_1_result_keeps_its_stream_lines(tmp_path: Path) -> None:
    """A result saved before Track.stream existed (schema version 1, streams only in ids) loads with
    each stream filled from its id, so its XLines keep their stream ids."""
    import json

    data = make_result().to_dict()
    data["schema_version"] = 1
    for part in data["parts"]:
        for track in part["tracks"]:
            del track["stream"]
            track["device"] = None
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(data))
    old = omniprof.load(path)
    assert old.schema_version == 2 and old.parts[0].tracks[1].stream == 7 and old.parts[0].tracks[1].device == 0
    assert _lines(build_timeline(old), "/device:GPU:0")["GPU 0 stream 7"].line_id == 7


def test_times_are_ns_from_the_earliest_event() -> None:
    """Event times are relative (none negative); the wall-clock start moves back to the earliest event."""
    result = make_result()
    tl = build_timeline(result)
    step = _lines(tl, "/host:CPU")["MainThread"].events[0]
    # the first sample's interval starts 1 ms before the run start
    assert step.start_ns == 1_000_000 and step.dur_ns == 5_000_000
    assert tl.start_unix_ns == result.metadata.start_unix_ns - 1_000_000
    assert all(e.start_ns >= 0 for p in tl.planes for ln in p.lines for e in ln.events)


def test_part_clock_offset_is_applied() -> None:
    """A part's clock offset shifts its events onto the run's timeline."""
    tl = build_timeline(torch_like_result())
    ops = _lines(tl, "/host:CPU")["python3 11"].events
    # earliest instant: part start 4_000 + offset 1_000 = 5_000 (== run start)
    assert ops[0].name == "aten::linear" and ops[0].start_ns == 10_000 + 1_000 - 5_000


def test_kernel_spans_carry_xprof_kernel_details() -> None:
    """Kernel spans get the kernel_details stat XProf's kernel_stats tool parses; args stay as stats."""
    gemm = _lines(build_timeline(make_result()), "/device:GPU:0")["GPU 0 stream 7"].events[0]
    assert gemm.stats["kernel_details"] == ("regs:64 static_shared:4096 dynamic_shared:0 grid:128,1,1 "
                                            "block:256,1,1 occ_pct:50")
    assert gemm.stats["grid"] == "[128,1,1]" and gemm.stats["category"] == "kernel"
    assert kernel_details({"grid": [1, 1, 1]}) is None


def test_flows_link_launch_to_kernel() -> None:
    """The earlier span of a flow is its source (out), the later its destination (in), same id."""
    tl = build_timeline(torch_like_result())
    launch = next(e for e in _lines(tl, "/host:CPU")["python3 11"].events if e.name == "cudaLaunchKernel")
    kernel = _lines(tl, "/device:GPU:0")["stream 7"].events[0]
    out_id, out_dir, _ = xs.decode_flow(launch.stats["flow"])
    in_id, in_dir, _ = xs.decode_flow(kernel.stats["flow"])
    assert out_id == in_id and (out_dir, in_dir) == (xs.FLOW_OUT, xs.FLOW_IN)
    memcpy_launch = next(e for e in _lines(tl, "/host:CPU")["python3 11"].events if e.name == "cudaMemcpyAsync")
    assert xs.decode_flow(memcpy_launch.stats["flow"])[0] != out_id


def test_devices_get_their_own_planes_and_counters_follow_their_device() -> None:
    """GPU 1's stream is on /device:GPU:1; a device counter is on that device's _counters_ line."""
    tl = build_timeline(torch_like_result())
    assert [p.name for p in tl.planes] == ["/host:CPU", "/device:GPU:0", "/device:GPU:1"]
    assert [p.plane_id for p in tl.planes][1:] == [0, 1]
    power = _lines(tl, "/device:GPU:0")[xs.COUNTER_LINE_NAME].events
    assert [(e.name, dict(e.stats)) for e in power] == [("power", {"W": 100.0}), ("power", {"W": 250.0})]
    assert "_counters_" not in _lines(tl, "/host:CPU")


def test_samples_become_a_nested_flame_line() -> None:
    """Consecutive samples sharing a stack prefix merge into one event per frame, nested by depth."""
    events = _lines(build_timeline(make_result()), "/host:CPU")["MainThread (sampled stacks)"].events
    got = [(e.name, e.start_ns, e.dur_ns, e.stats["samples"]) for e in events]
    assert got[:4] == [("main", 0, 10_000_000, 10), ("work", 0, 3_000_000, 3), ("helper", 1_000_000, 2_000_000, 2),
                       ("helper", 3_000_000, 1_000_000, 1)]
    assert ("memcpy", 4_000_000, 1_000_000, 1) in got
    assert sum(1 for e in events if e.name == "main") == 1


def test_options_switch_samples_and_counters_off() -> None:
    """include_samples / include_counters leave those lines out."""
    tl = build_timeline(make_result(), TensorBoardOptions(include_samples=False, include_counters=False))
    names = {ln.name for p in tl.planes for ln in p.lines}
    assert "MainThread (sampled stacks)" not in names and xs.COUNTER_LINE_NAME not in names


def test_overlapping_spans_split_into_rows_that_only_nest() -> None:
    """Partially overlapping spans go to a second row; nested ones stay on the first."""
    rows = _pack([EventData("a", 0, 10), EventData("b", 2, 3), EventData("c", 5, 10), EventData("d", 20, 1)])
    assert [[e.name for e in r] for r in rows] == [["a", "b", "d"], ["c"]]


def test_several_parts_are_labelled_by_backend() -> None:
    """With two parts, line names say which backend they came from."""
    r = make_result()
    both = r.evolve(parts=(r.parts[0], torch_like_result().parts[0]))
    names = {ln.name for ln in build_timeline(both).planes[0].lines}
    assert {"[cpu] MainThread", "[torch] python3 11", "[cpu] MainThread (sampled stacks)"} <= names


def test_reserved_stat_names_in_args_are_renamed() -> None:
    """A span arg called 'flow' cannot be mistaken for XProf's flow stat."""
    r = ProfileResult(parts=(BackendResult("cpu", tracks=(Track("t", "t"),),
                                           spans=(Span("s", "t", 0, 5, args={"flow": 1, "_c": 2}),)),))
    stats = build_timeline(r).planes[0].lines[0].events[0].stats
    assert stats == {"arg_flow": 1, "arg_c": 2}


def test_xspace_has_task_environment_and_hostname() -> None:
    """The file carries the wall-clock start and end (Task Environment plane) and the host name."""
    tl = build_timeline(make_result())
    space = to_xspace(tl)
    assert list(space.hostnames) == ["testhost"]
    env = next(p for p in space.planes if p.name == xs.TASK_ENV_PLANE_NAME)
    names = {i: m.name for i, m in env.stat_metadata.items()}
    values = {names[s.metadata_id]: s.int64_value for s in env.stats}
    assert values == {"profile_start_time": tl.start_unix_ns, "profile_stop_time": tl.end_unix_ns}
    host = next(p for p in space.planes if p.name == xs.HOST_PLANE_NAME)
    main = next(ln for ln in host.lines if ln.name == "MainThread")
    step = main.events[0]
    assert main.timestamp_ns + step.offset_ps // 1000 == 1_000_000 and step.duration_ps == 5_000_000_000


def test_each_report_is_a_new_run_and_never_overwrites(tmp_path: Path) -> None:
    """Two reports into one logdir make two run directories; the first file is unchanged."""
    first = write_logdir(make_result(), tmp_path)
    data = first.read_bytes()
    second = write_logdir(make_result(), tmp_path)
    assert first.parent != second.parent and first.read_bytes() == data
    assert first.relative_to(tmp_path).parts[:2] == ("plugins", "profile")
    assert first.name == "testhost.xplane.pb"
    assert not [p for p in first.parent.iterdir() if p.name.startswith(".")]  # no temp file left


def test_report_into_an_existing_logdir_adds_a_run(tmp_path: Path) -> None:
    """omniprof.report uses an existing directory as the logdir (no 'logdir-1' beside it)."""
    logdir = tmp_path / "logs"
    assert omniprof.report(make_result(), "tensorboard", logdir) == logdir
    assert omniprof.report(make_result(), "tensorboard", logdir) == logdir
    assert len(list(logdir.glob("plugins/profile/*/*.xplane.pb"))) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["logs"]


def test_run_prefix_and_host_options_name_the_files(tmp_path: Path) -> None:
    """run_prefix starts the run directory's name; host names the .xplane.pb file."""
    out = write_logdir(make_result(), tmp_path, TensorBoardOptions(run_prefix="exp1", host="node-3"))
    assert out.parent.name.startswith("exp1_") and out.name == "node-3.xplane.pb"


@pytest.mark.parametrize("bad", [{"run_prefix": "../up"}, {"host": "a/b"}, {"include_samples": "yes"}])
def test_bad_options_are_rejected(bad: dict) -> None:
    """Path-like run prefixes or host names and non-bool switches raise InvalidArgumentError."""
    with pytest.raises(InvalidArgumentError, match=next(iter(bad))):
        TensorBoardOptions(**bad)


def test_unwritable_logdir_is_a_one_line_error(tmp_path: Path) -> None:
    """A logdir under a regular file fails with OutputError naming the path and the reason."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(OutputError) as err:
        write_logdir(make_result(), blocker / "logs")
    assert "not a directory" in str(err.value) and "\n" not in str(err.value)


def test_read_only_logdir_is_a_one_line_error(tmp_path: Path) -> None:
    """A logdir without write permission fails with 'permission denied', leaving nothing behind.
    The writer runs in a child without root's power over permissions (tests.tools), so this runs
    as root too."""
    import subprocess
    import sys

    from tests.tools import ROOT, without_root_powers

    logdir = tmp_path / "logs"
    logdir.mkdir()
    logdir.chmod(0o500)
    code = ("import sys\nfrom omniprof.core.fileio import OutputError\nfrom omniprof.testing.fakes import make_result\n"
            "from omniprof.reporters.tensorboard import write_logdir\n"
            "try:\n    write_logdir(make_result(), sys.argv[1])\nexcept OutputError as e:\n    print('OutputError |', e)\n")
    try:
        proc = subprocess.run(without_root_powers([sys.executable, "-c", code, str(logdir)]), capture_output=True,
                              text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
        line = proc.stdout.strip()
        assert line.startswith("OutputError |") and "permission denied" in line and "\n" not in line, \
            (proc.stdout, proc.stderr)
        assert str(logdir) in line
        assert list(logdir.iterdir()) == []
    finally:
        logdir.chmod(0o700)


def test_native_xplane_is_copied_byte_for_byte(tmp_path: Path) -> None:
    """A result whose only part carries an xplane file is written as that file, unchanged."""
    src = tmp_path / "jaxhost.xplane.pb"
    native = to_xspace(build_timeline(make_result()))
    src.write_bytes(native.SerializeToString())
    r = ProfileResult(metadata=RunMetadata(host="other"),
                      parts=(BackendResult("xla", spans=(Span("converted", "t", 0, 1),),
                                           artifacts=(Artifact("xplane", str(src)),)),))
    out = write_logdir(r, tmp_path / "logs")
    assert out.read_bytes() == src.read_bytes() and out.name == "jaxhost.xplane.pb"
    converted = write_logdir(r, tmp_path / "logs", TensorBoardOptions(use_native_xplane=False))
    assert converted.read_bytes() != src.read_bytes() and converted.name == "other.xplane.pb"


def test_native_xplane_already_in_the_logdir_is_not_duplicated(tmp_path: Path) -> None:
    """jax's xplane in a run of the same logdir (the Profiler's session dir) is not copied to a second run."""
    session = tmp_path / "logs" / "plugins" / "profile" / "run1"
    session.mkdir(parents=True)
    src = session / "vm.xplane.pb"
    src.write_bytes(to_xspace(build_timeline(make_result(empty=True))).SerializeToString())
    r = ProfileResult(parts=(BackendResult("xla", artifacts=(Artifact("xplane", str(src)),)),))
    assert write_logdir(r, tmp_path / "logs") == src
    assert [p.name for p in session.parent.iterdir()] == ["run1"]


def test_result_losses_and_errors_are_noted_in_the_xspace(tmp_path: Path) -> None:
    """Losses, errors and a partial session recorded in the result travel in XSpace.warnings."""
    from omniprof.core.results import ErrorRecord

    r = make_result().evolve(partial=True, errors=(ErrorRecord("torch", "stop", "RuntimeError", "boom"),))
    warnings = list(xs.XSpace.FromString(write_logdir(r, tmp_path).read_bytes()).warnings)
    assert "cpu: 3 samples not recorded (samples_dropped): buffer full" in warnings
    assert "torch failed during stop: RuntimeError: boom" in warnings
    assert any("partial" in w for w in warnings)


def test_missing_native_xplane_is_converted_and_noted(tmp_path: Path) -> None:
    """A vanished xplane artifact: the part's spans are converted and the XSpace says why."""
    out = write_logdir(make_result(), tmp_path)  # its artifact /tmp/x.xplane.pb does not exist
    space = xs.XSpace.FromString(out.read_bytes())
    assert any("x.xplane.pb not found" in w for w in space.warnings)
    host = next(p for p in space.planes if p.name == xs.HOST_PLANE_NAME)
    assert "MainThread" in {ln.name for ln in host.lines}


def test_corrupt_native_xplane_is_converted_and_noted(tmp_path: Path) -> None:
    """An artifact that is not an XSpace is not copied; the result is converted instead."""
    bad = tmp_path / "bad.xplane.pb"
    bad.write_bytes(b"\xff\xff\xff not protobuf")
    r = ProfileResult(parts=(BackendResult("xla", tracks=(Track("t", "T"),), spans=(Span("op", "t", 0, 5),),
                                           artifacts=(Artifact("xplane", str(bad)),)),))
    space = xs.XSpace.FromString(write_logdir(r, tmp_path / "logs").read_bytes())
    assert any("not a valid XSpace" in w for w in space.warnings)
    assert space.planes[1].lines[0].name == "T"


def test_other_parts_merge_into_a_native_xplane(tmp_path: Path) -> None:
    """A native (run-relative) xplane plus a converted part: one file, our lines on its /host:CPU plane,
    times shifted by the difference of the two wall-clock starts."""
    jax_start = 1_700_000_000_000_000_000
    native = xs.XSpace()
    host = xs.PlaneBuilder(native.planes.add(id=0, name=xs.HOST_PLANE_NAME))
    host.add_event(host.add_line("python", 100), "jit_step", 100, 50)
    env = xs.PlaneBuilder(native.planes.add(id=1, name=xs.TASK_ENV_PLANE_NAME))
    env.add_plane_stat("profile_start_time", jax_start)
    src = tmp_path / "vm.xplane.pb"
    src.write_bytes(native.SerializeToString())
    meta = RunMetadata(host="vm", start_unix_ns=jax_start + 2_000, start_ns=0)
    r = ProfileResult(metadata=meta, parts=(
        BackendResult("xla", artifacts=(Artifact("xplane", str(src)),)),
        BackendResult("cpu", tracks=(Track("thread:1", "MainThread"),), spans=(Span("mine", "thread:1", 0, 10),))))
    space = xs.XSpace.FromString(write_logdir(r, tmp_path / "logs").read_bytes())
    host_planes = [p for p in space.planes if p.name == xs.HOST_PLANE_NAME]
    assert len(host_planes) == 1
    lines = {ln.name: ln for ln in host_planes[0].lines}
    assert set(lines) == {"python", "[cpu] MainThread"}
    mine = lines["[cpu] MainThread"]
    assert mine.timestamp_ns + mine.events[0].offset_ps // 1000 == 2_000


def test_empty_result_writes_a_valid_file(tmp_path: Path) -> None:
    """An empty result still gives a parseable XSpace with the host plane and Task Environment."""
    out = write_logdir(make_result(empty=True), tmp_path)
    names = [p.name for p in xs.XSpace.FromString(out.read_bytes()).planes]
    assert xs.HOST_PLANE_NAME in names and xs.TASK_ENV_PLANE_NAME in names


def test_real_cpu_backend_result_converts(tmp_path: Path) -> None:
    """A real cpu-backend session: annotations on the thread line, sampled frames of the workload."""

    def busy_loop_for_tb() -> int:
        total = 0
        for i in range(400_000):
            total += i * i
        return total

    with omniprof.Profiler(backend="cpu") as prof:
        with omniprof.annotate("tb-region"):
            busy_loop_for_tb()
    tl = build_timeline(prof.result)
    names = {e.name for p in tl.planes for ln in p.lines for e in ln.events}
    assert "tb-region" in names
    if prof.result.part("cpu").samples:  # a loaded machine may deliver few samples, never zero frames
        assert any("busy_loop_for_tb" in n for n in names)
    space = xs.XSpace.FromString(write_logdir(prof.result, tmp_path).read_bytes())
    assert space.planes


def test_spans_on_undeclared_tracks_are_kept() -> None:
    """A span whose track is not declared still gets a line, named by its track id."""
    r = ProfileResult(parts=(BackendResult("cpu", spans=(Span("orphan", "thread:99", 0, 5),)),))
    lines = _lines(build_timeline(r), "/host:CPU")
    assert [e.name for e in lines["thread:99"].events] == ["orphan"]


def test_many_threads_get_one_line_each_with_unique_ids(tmp_path: Path) -> None:
    """500 threads of one span each: 500 host lines, ids unique, each read back by the XPlane
    reader with its span (PlaneBuilder.add_line used to scan every line for each new one)."""
    from omniprof.core.readers import read_any

    n = 500
    part = BackendResult(backend="cpu", tracks=[Track(f"thread:{i}", f"worker {i}", tid=i) for i in range(n)],
                         spans=[Span("work", f"thread:{i}", 1_000 + i, 5_000, category="annotation") for i in range(n)])
    r = ProfileResult(metadata=RunMetadata(backends=("cpu",), start_unix_ns=1_700_000_000_000_000_000), parts=(part,))
    space = to_xspace(build_timeline(r))
    host = next(p for p in space.planes if p.name == xs.HOST_PLANE_NAME)
    assert len(host.lines) == n and len({ln.id for ln in host.lines}) == n
    back = read_any(write_logdir(r, tmp_path))
    names = {t.name for p in back.parts for t in p.tracks}
    assert {f"worker {i}" for i in range(n)} <= names
    assert sum(1 for p in back.parts for s in p.spans if s.name == "work") == n


def test_plane_builder_gives_a_taken_line_id_a_new_one() -> None:
    """A line id already in the plane (one jax wrote) is never reused."""
    plane = xs.XPlane()
    plane.lines.add(id=7, name="jax's")
    builder = xs.PlaneBuilder(plane)
    a = builder.add_line("a", 0, line_id=7)
    b = builder.add_line("b", 0, line_id=9)
    c = builder.add_line("c", 0, line_id=9)
    assert [ln.id for ln in plane.lines] == [7, 8, 9, 10] and (a.id, b.id, c.id) == (8, 9, 10)
