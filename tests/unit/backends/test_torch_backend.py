"""The ``torch`` backend on real torch.profiler (CPU here): levels, options, steps, annotations, quiet."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import omniprof
from omniprof.plugin import BackendContext
from omniprof.backends.torch import TorchBackend, TorchOptions
from omniprof.readers import KinetoReader

read_trace = KinetoReader().read  # what `omniprof report` reads: the events, then the op and kernel tables
from omniprof.errors import BackendOptionWarning, InvalidArgumentError
from omniprof.testing.conformance import BackendConformance

torch = pytest.importorskip("torch")

NO_DEVICE = {"device_tracer_level": 0}


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)), torch.randn(8, 16)


def _train_step(model, x):
    loss = model(x).sum()
    loss.backward()


def _profile(steps: int = 1, backend_options=None, **levels):
    model, x = _model()
    opts = omniprof.ProfileOptions(**{**NO_DEVICE, **levels})
    with omniprof.Profiler(backend="torch", options=opts,
                           backend_options={"torch": backend_options} if backend_options else None) as prof:
        for _ in range(steps):
            with omniprof.annotate("train_step"):
                _train_step(model, x)
    return prof.result.part("torch")


class TestTorchConformance(BackendConformance):
    """The shared backend conformance suite, run on the torch backend."""

    backend_cls = TorchBackend

    def _make(self, tmp_path: Path | None = None):
        return TorchBackend(None, context=BackendContext(session_dir=tmp_path,
                                                         profile_options=omniprof.ProfileOptions(**NO_DEVICE)))

    def workload(self) -> None:
        _train_step(*_model())


def test_schedule_eight_steps_two_results_with_torch_step_markers():
    """8 step()s with wait=1 warmup=1 active=2 give 2 results, each with torch's ProfilerStep#N markers."""
    model, x = _model()
    results = []
    prof = omniprof.Profiler(backend="torch", options=omniprof.ProfileOptions(**NO_DEVICE),
                             schedule=omniprof.schedule(wait=1, warmup=1, active=2), on_result=results.append)
    prof.start()
    for _ in range(8):
        _train_step(model, x)
        prof.step()
    prof.stop()
    assert len(results) == 2
    steps = [[(s.name, s.args["step_num"]) for s in r.part("torch").spans if s.category == "step"] for r in results]
    assert steps == [[("ProfilerStep#2", 2), ("ProfilerStep#3", 3)], [("ProfilerStep#6", 6), ("ProfilerStep#7", 7)]]
    for r in results:
        addmm = next(row for row in r.part("torch").table("op_stats").records() if row["name"] == "aten::addmm")
        assert addmm["calls"] == 4  # 2 recorded steps x 2 Linear layers


def test_step_markers_without_schedule_start_at_first_step():
    """Without a schedule, a session has no step markers until step() is called (plain torch has none)."""
    model, x = _model()
    assert not [s for s in _profile().spans if s.category == "step"]
    with omniprof.Profiler(backend="torch", options=omniprof.ProfileOptions(**NO_DEVICE)) as prof:
        for _ in range(3):
            _train_step(model, x)
            prof.step()
    steps = [s.args["step_num"] for s in prof.result.part("torch").spans if s.category == "step"]
    assert steps == [1, 2, 3]


def test_schedule_marks_step_zero():
    """With a schedule recording from step 0, step 0 carries its ProfilerStep#0 marker too."""
    model, x = _model()
    results = []
    prof = omniprof.Profiler(backend="torch", options=omniprof.ProfileOptions(**NO_DEVICE),
                             schedule=omniprof.schedule(active=2, repeat=1), on_result=results.append)
    prof.start()
    for _ in range(3):
        _train_step(model, x)
        prof.step()
    prof.stop()
    assert [[s.name for s in r.part("torch").spans if s.category == "step"] for r in results] == [
        ["ProfilerStep#0", "ProfilerStep#1"]]


def test_annotations_become_record_function_ranges(tmp_path):
    """omniprof.annotate ranges are torch record_function ranges: in the result and in the Kineto JSON."""
    model, x = _model()
    with omniprof.Profiler(backend="torch", options=omniprof.ProfileOptions(**NO_DEVICE), logdir=tmp_path) as prof:
        with omniprof.annotate("load_batch", size=8):
            _train_step(model, x)
    part = prof.result.part("torch")
    ann = [s for s in part.spans if s.category == "annotation"]
    assert [s.name for s in ann] == ["load_batch"]
    ops_inside = [s for s in part.spans if s.category == "cpu_op" and ann[0].start_ns <= s.start_ns < ann[0].end_ns]
    assert any(s.name == "aten::addmm" for s in ops_inside)
    native = json.loads(Path(part.artifacts[0].path).read_text())
    assert any(e.get("cat") == "user_annotation" and e.get("name") == "load_batch" for e in native["traceEvents"])


def test_annotation_outside_recording_is_a_no_op():
    """An annotation while no torch session records reaches nothing (no sink left)."""
    with omniprof.annotate("idle"):
        pass
    assert omniprof.core.annotations.active_sinks() == ()


def test_host_level_1_records_annotations_only():
    """host_tracer_level=1 keeps annotations and steps, no ops."""
    part = _profile(host_tracer_level=1)
    assert {s.category for s in part.spans} == {"annotation"}
    assert part.metadata["torch_options"]["activities"][0].startswith("{")


def test_host_level_2_records_ops_without_shapes():
    """The default level records CPU ops, without input shapes or FLOPs."""
    part = _profile()
    ops = [s for s in part.spans if s.category == "cpu_op"]
    assert any(s.name == "aten::addmm" for s in ops)
    assert not any("input_shapes" in s.args or "flops" in s.args for s in ops)
    table = part.table("op_stats")
    assert table.column("cpu_memory_self_bytes")[0] is None
    assert set(table.column("device_total_ns")) == {None}  # no GPU work: unknown, not zero


def test_host_level_3_records_shapes_flops_and_memory():
    """host_tracer_level=3 records shapes, FLOPs (matching torch's formula) and memory events."""
    part = _profile(host_tracer_level=3)
    addmm = [s for s in part.spans if s.name == "aten::addmm"]
    assert addmm[0].args["input_shapes"] == [[32], [8, 16], [16, 32], [], []]
    assert addmm[0].args["flops"] == 2 * 8 * 16 * 32
    assert part.summaries["flops"]["total_flops"] >= 2 * (2 * 8 * 16 * 32)
    assert any(c.name == "memory_allocated (cpu)" and c.unit == "bytes" for c in part.counters)
    row = next(r for r in part.table("op_stats").records() if r["name"] == "aten::addmm")
    assert row["flops"] == 2 * 8 * 16 * 32 + 2 * 8 * 32 * 4
    assert row["cpu_memory_total_bytes"] is not None


def test_backend_options_override_levels():
    """record_shapes/record_flops=False at level 3 drop shapes; record_flops=True at level 2 adds FLOPs."""
    part = _profile(host_tracer_level=3, backend_options={"record_shapes": False, "record_flops": False})
    assert not any("input_shapes" in s.args or "flops" in s.args for s in part.spans)
    assert any(c.name == "memory_allocated (cpu)" for c in part.counters)
    part = _profile(backend_options={"record_flops": True})
    assert any(s.args.get("flops") for s in part.spans if s.name == "aten::addmm")


def test_python_level_records_python_calls():
    """python_tracer_level=1 records Python calls (torch with_stack) as python spans."""
    part = _profile(python_tracer_level=1)
    py = [s for s in part.spans if s.category == "python"]
    assert any("_train_step" in s.name for s in py)


def test_forward_backward_flows():
    """Autograd's forward/backward links arrive as flows between cpu_op spans."""
    part = _profile()
    fwdbwd = [f for f in part.flows if f.category == "fwdbwd"]
    assert fwdbwd
    linked = [s for s in part.spans if s.flow_ids]
    assert {s.category for s in linked} == {"cpu_op"} and len(linked) >= 2 * len(fwdbwd)


def test_device_level_without_device_warns():
    """device_tracer_level=1 on a machine without a torch device gives a visible warning."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    with pytest.warns(BackendOptionWarning, match="device_tracer_level=1") as rec:
        part = _profile(device_tracer_level=1)
    assert part.metadata["torch_options"]["devices"] == []
    assert rec[0].filename == __file__  # attributed to the user's line that started profiling


def test_default_run_on_a_cpu_only_machine_is_quiet():
    """Default options (device level 1 by default, not asked for) on a machine without a torch
    device: no warning at all, host activity recorded, the metadata says no device was seen."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    import warnings

    model, x = _model()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with omniprof.Profiler(backend="torch") as prof:
            _train_step(model, x)
    part = prof.result.part("torch")
    assert part.metadata["torch_options"]["devices"] == []
    assert any(s.category == "cpu_op" for s in part.spans)


def test_device_activities_follow_available_devices():
    """CUDA activity is asked for exactly when torch supports it and a CUDA device is present."""
    from types import SimpleNamespace

    from torch.profiler import ProfilerActivity

    from omniprof.backends.torch.backend import _device_activities

    def fake(cuda: bool):
        return SimpleNamespace(cuda=SimpleNamespace(is_available=lambda: cuda))

    supported = {ProfilerActivity.CPU, ProfilerActivity.CUDA}
    assert _device_activities(fake(True), ProfilerActivity, supported) == ([ProfilerActivity.CUDA], ["CUDA"])
    assert _device_activities(fake(False), ProfilerActivity, supported) == ([], [])
    assert _device_activities(fake(True), ProfilerActivity, {ProfilerActivity.CPU}) == ([], [])


def test_device_buffer_full_is_a_counted_loss(monkeypatch):
    """When Kineto reports device collection stopped early, the part has a buffer_full loss and a warning."""
    from omniprof.backends.torch import backend as backend_mod
    from omniprof.errors import DataLossWarning

    monkeypatch.setattr(backend_mod, "_device_activities", lambda torch, act, supported: ([], ["CUDA"]))
    monkeypatch.setattr(torch.autograd, "_is_kineto_stopped", lambda: True)
    with pytest.warns(DataLossWarning, match="buffer full"):
        part = _profile(device_tracer_level=1)
    assert [(loss.kind, loss.count) for loss in part.losses] == [("buffer_full", 1)]


def test_nothing_to_record_warns_and_gives_empty_part():
    """host_tracer_level=0 with no device activity warns and records nothing."""
    with pytest.warns(BackendOptionWarning, match="nothing will be recorded"):
        part = _profile(host_tracer_level=0)
    assert part.spans == () and part.metadata["recorded"] is False


def test_shapes_and_python_at_level_1_warn():
    """Shapes or Python frames at host_tracer_level=1 (no ops recorded) warn that they have no effect."""
    with pytest.warns(BackendOptionWarning, match="record_shapes need CPU ops"):
        _profile(host_tracer_level=1, backend_options={"record_shapes": True})
    with pytest.warns(BackendOptionWarning, match="python_tracer_level=1 need CPU ops"):
        part = _profile(host_tracer_level=1, python_tracer_level=1)
    assert part.metadata["torch_options"]["with_stack"] is False


def test_shapes_off_with_flops_on_warns():
    """record_shapes=False with FLOPs on cannot be honoured (torch needs shapes): a warning says so."""
    with pytest.warns(BackendOptionWarning, match="record_shapes=False cannot be honoured"):
        part = _profile(host_tracer_level=3, backend_options={"record_shapes": False})
    assert part.metadata["torch_options"]["record_shapes"] is True


def test_advanced_configuration_is_not_silently_ignored():
    """GPU advanced_configuration keys, which torch does not use, give a warning naming them."""
    with pytest.warns(BackendOptionWarning, match="does not use advanced_configuration gpu_max_activity_api_events"):
        _profile(advanced_configuration={"gpu_max_activity_api_events": 1024})


def test_options_are_validated():
    """Backend options are validated: wrong types and unknown keys raise InvalidArgumentError."""
    with pytest.raises(InvalidArgumentError, match="'record_shapes' must be a bool"):
        TorchOptions(record_shapes="yes")
    with pytest.raises(InvalidArgumentError, match="did you mean 'record_shapes'"):
        omniprof.Profiler(backend="torch", backend_options={"torch": {"record_shape": True}})


def test_clock_lines_up_with_the_run():
    """Spans mapped through the part's clock offset fall inside the run's start/end (loose bands)."""
    model, x = _model()
    with omniprof.Profiler(backend="torch", options=omniprof.ProfileOptions(**NO_DEVICE)) as prof:
        _train_step(model, x)
    r = prof.result
    part = r.part("torch")
    ops = [s for s in part.spans if s.category == "cpu_op"]
    first = min(s.start_ns for s in ops) + part.clock.offset_ns
    last = max(s.end_ns for s in ops) + part.clock.offset_ns
    slack = 50_000_000
    assert r.metadata.start_ns - slack <= first <= last <= r.metadata.end_ns + slack
    # torch's own trace start (Unix ns) is the Kineto clock plus baseTimeNanoseconds.
    trace_start = part.start_ns + part.metadata.get("kineto_base_time_ns", 0)
    assert abs(trace_start - part.metadata["kineto_trace_start_unix_ns"]) < 1_000_000


def test_logdir_keeps_kineto_trace_that_reads_back(tmp_path):
    """With a logdir the native Kineto JSON is kept as an artifact and reads back the same spans."""
    model, x = _model()
    with omniprof.Profiler(backend="torch", options=omniprof.ProfileOptions(**NO_DEVICE), logdir=tmp_path) as prof:
        _train_step(model, x)
    part = prof.result.part("torch")
    art = Path(part.artifacts[0].path)
    assert art.parent == prof.session_dir and art.name.endswith(".pt.trace.json")
    offline = read_trace(art).parts[0]
    assert len(offline.spans) == len(part.spans)
    assert omniprof.load(prof.session_dir / "omniprof.result.json") == prof.result


def test_no_logdir_leaves_no_trace_file(tmp_path, monkeypatch):
    """Without a logdir the temporary Kineto JSON is removed after reading."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    part = _profile()
    assert part.artifacts == ()
    assert list(tmp_path.iterdir()) == []


def test_crashed_workload_still_gives_a_result():
    """A workload that raises leaves a partial result with the torch part."""
    model, x = _model()
    prof = omniprof.Profiler(backend="torch", options=omniprof.ProfileOptions(**NO_DEVICE))
    with pytest.raises(ZeroDivisionError), prof:
        _train_step(model, x)
        1 / 0
    assert prof.result.partial and any(s.name == "aten::addmm" for s in prof.result.part("torch").spans)


def test_result_round_trips_and_reports():
    """A live torch result round-trips through JSON and renders as a table with the op table."""
    part = _profile(host_tracer_level=3)
    r = omniprof.ProfileResult(parts=(part,))
    assert omniprof.ProfileResult.from_dict(json.loads(r.to_json())) == r
    import io

    buf = io.StringIO()
    omniprof.report(r, "table", buf)
    assert "Op statistics" in buf.getvalue() and "aten::addmm" in buf.getvalue()


_SCRIPT = """
import os, torch, omniprof
m = torch.nn.Linear(8, 8)

def run(verbose):
    with omniprof.Profiler(backend="torch", options=omniprof.ProfileOptions(device_tracer_level=0),
                           verbose=verbose) as prof:
        m(torch.randn(4, 8)).sum().backward()
    return len(prof.result.part("torch").metadata.get("native_log", []))

run(True)
os.write(2, b"=== quiet from here\\n")
print(run(False))
"""


def test_quiet_by_default_verbose_shows_kineto():
    """Nothing reaches stderr by default (Kineto's lines go to metadata); verbose lets them through."""
    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=120, check=True)
    loud, _, quiet = out.stderr.partition("=== quiet from here\n")
    assert "profiler_start" in loud
    assert quiet == ""
    assert int(out.stdout.strip()) >= 1  # the captured Kineto lines are kept in the result


def test_op_stats_match_torch_key_averages(tmp_path):
    """Reading torch's own exported trace gives the op table torch's key_averages() gives."""
    from torch.profiler import ProfilerActivity, profile, record_function

    model, x = _model()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True) as p:
        for _ in range(3):
            with record_function("step"):
                _train_step(model, x)
    trace = tmp_path / "t.pt.trace.json"
    p.export_chrome_trace(str(trace))
    theirs = {e.key: e for e in p.key_averages()}
    ours = {r["name"]: r for r in read_trace(trace).parts[0].table("op_stats").records()}
    assert set(ours) == set(theirs)
    for key, e in theirs.items():
        row = ours[key]
        assert row["calls"] == e.count, key
        assert abs(row["total_ns"] / 1000 - e.cpu_time_total) <= 2, key   # torch keeps microseconds
        assert abs(row["self_ns"] / 1000 - e.self_cpu_time_total) <= 2, key
        assert row["cpu_memory_total_bytes"] == e.cpu_memory_usage, key
        assert row["cpu_memory_self_bytes"] == e.self_cpu_memory_usage, key
