"""The ``xla`` backend on the real jax + xprof (CPU): options, layout, result, annotations, Perfetto."""

from __future__ import annotations

import gzip
import json
import os
import threading
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("jax")
pytest.importorskip("xprof")

import omniprof  # noqa: E402
from omniprof.backends.xla.backend import XlaBackend, jax_profile_options  # noqa: E402
from omniprof.formats.xplane import OMNIPROF_MARK, read_xplane, run_tool, xplane_files  # noqa: E402
from omniprof.core import annotations  # noqa: E402
from omniprof.core.results import ProfileResult  # noqa: E402
from omniprof.errors import InvalidArgumentError  # noqa: E402
from omniprof.testing.conformance import BackendConformance  # noqa: E402

from .xla_helpers import workload, write_gpu_xplane  # noqa: E402

FAST = {"xla": {"record_tool_data": False}}


def _profile(options=None, logdir=None, backend_options=None, body=None):
    f, x = workload()
    with omniprof.Profiler(backend="xla", options=options, logdir=logdir,
                           backend_options=backend_options if backend_options is not None else FAST) as prof:
        if body is not None:
            body(prof)
        else:
            f(x, x).block_until_ready()
    return prof


def _cats(part):
    out: dict[str, int] = {}
    for s in part.spans:
        out[s.category] = out.get(s.category, 0) + 1
    return out


class TestXlaConformance(BackendConformance):
    backend_cls = XlaBackend

    def backend_options(self):
        return XlaBackend.Options(record_tool_data=False)


# -- options ----------------------------------------------------------------------------------
def test_every_option_reaches_jax():
    """Levels and advanced_configuration are set on jax's ProfileOptions, python level explicitly."""
    import jax

    opts = omniprof.ProfileOptions(host_tracer_level=3, python_tracer_level=0,
                                   advanced_configuration={"gpu_max_activity_api_events": 4_000_000,
                                                           "gpu_enable_nvtx_tracking": True})
    j = jax_profile_options(opts, jax)
    assert (j.host_tracer_level, j.python_tracer_level) == (3, 0)
    assert j.advanced_configuration == {"gpu_max_activity_api_events": 4_000_000, "gpu_enable_nvtx_tracking": True}


def test_device_level_zero_traces_tpu_host_only_and_refuses_contradiction():
    """device_tracer_level=0 sets tpu_trace_mode=TRACE_ONLY_HOST; an explicit device-tracing mode is an error."""
    import jax

    j = jax_profile_options(omniprof.ProfileOptions(device_tracer_level=0), jax)
    assert j.advanced_configuration["tpu_trace_mode"] == "TRACE_ONLY_HOST"
    bad = omniprof.ProfileOptions(device_tracer_level=0, advanced_configuration={"tpu_trace_mode": "TRACE_COMPUTE"})
    with pytest.raises(InvalidArgumentError, match="tpu_trace_mode"):
        jax_profile_options(bad, jax)


def test_bad_values_rejected_before_jax():
    """Values jax would accept silently are refused with the key, value and allowed values."""
    with pytest.raises(InvalidArgumentError, match="'host_tracer_level' must be one of 0, 1, 2, 3 \\(got 7\\)"):
        omniprof.Profiler(backend="xla", options={"host_tracer_level": 7})
    with pytest.raises(InvalidArgumentError, match="gpu_max_activity_api_events"):
        omniprof.Profiler(backend="xla", options={"advanced_configuration": {"gpu_max_activity_api_event": 1}})
    with pytest.raises(InvalidArgumentError, match="perfetto_port"):
        omniprof.Profiler(backend="xla", backend_options={"xla": {"perfetto_port": 70000}})


def test_host_level_zero_records_nothing_and_two_records_ops():
    """host_tracer_level=0 leaves the trace empty; level 2 records XLA ops with hlo_op/hlo_module."""
    off = _profile(omniprof.ProfileOptions(host_tracer_level=0)).result.part("xla")
    on = _profile(omniprof.ProfileOptions(host_tracer_level=2)).result.part("xla")
    assert off.spans == ()
    ops = [s for s in on.spans if s.category == "xla_op"]
    assert ops and all(s.args["hlo_module"] and s.args["hlo_op"] for s in ops)


def test_device_level_zero_leaves_device_activity_out():
    """device_tracer_level=0: no XLA op or module spans, and the count left out is in the metadata."""
    part = _profile(omniprof.ProfileOptions(device_tracer_level=0)).result.part("xla")
    assert not {"xla_op", "xla_module", "kernel"} & set(_cats(part))
    assert part.metadata["device_events_left_out"] > 0
    assert part.metadata["device_activity_included"] is False
    full = _profile(omniprof.ProfileOptions(device_tracer_level=1)).result.part("xla")
    assert {"xla_op", "xla_module"} <= set(_cats(full))


def _hlo_events(xplane_path) -> int:
    """Events in a saved xplane that carry an ``hlo_op`` stat (XLA ops the device ran), read by jaxlib."""
    from jax.profiler import ProfileData

    data = ProfileData.from_file(str(xplane_path))
    n = 0
    for plane in data.planes:
        for line in plane.lines:
            for ev in line.events:
                if any(name == "hlo_op" for name, _ in ev.stats):
                    n += 1
    return n


def test_device_level_zero_leaves_device_activity_out_of_the_saved_xplane():
    """device_tracer_level=0 also holds for the native file XProf shows: no XLA op events in it."""
    part0 = _profile(omniprof.ProfileOptions(device_tracer_level=0)).result.part("xla")
    part1 = _profile(omniprof.ProfileOptions(device_tracer_level=1)).result.part("xla")
    path0 = next(a.path for a in part0.artifacts if a.kind == "xplane")
    path1 = next(a.path for a in part1.artifacts if a.kind == "xplane")
    assert _hlo_events(path1) > 0
    assert _hlo_events(path0) == 0
    from jax.profiler import ProfileData

    assert ProfileData.from_file(path0).find_plane_with_name("/host:CPU") is not None  # host activity stays


def test_python_tracer_level_one_records_python_calls():
    """python_tracer_level=1 adds Python call spans; 0 (passed explicitly, jax's default is 1) adds none."""

    def helper_traced_by_python_tracer():
        return sum(range(50))

    def body(prof):
        helper_traced_by_python_tracer()

    on = _profile(omniprof.ProfileOptions(python_tracer_level=1), body=body).result.part("xla")
    off = _profile(omniprof.ProfileOptions(python_tracer_level=0), body=body).result.part("xla")
    assert any("helper_traced_by_python_tracer" in s.name and s.category == "python" for s in on.spans)
    assert "python" not in _cats(off)


# -- layout -----------------------------------------------------------------------------------
def test_logdir_layout_and_no_run_lost_within_one_second(tmp_path):
    """Each session writes <logdir>/plugins/profile/<run>/<host>.xplane.pb; two in one second keep both."""
    t0 = time.time()
    a = _profile(logdir=tmp_path)
    b = _profile(logdir=tmp_path)
    assert a.session_dir != b.session_dir
    files = sorted(tmp_path.glob("plugins/profile/*/*.xplane.pb"))
    assert len(files) == 2, files
    for prof in (a, b):
        art = [x for x in prof.result.part("xla").artifacts if x.kind == "xplane"]
        assert Path(art[0].path).parent == prof.session_dir and Path(art[0].path).is_file()
        assert (prof.session_dir / "omniprof.result.json").is_file()
    assert time.time() - t0 < 60


def test_without_logdir_the_xplane_lands_in_a_temp_dir():
    """No logdir: the artifact path still points at a readable xplane."""
    prof = _profile()
    path = Path(next(a.path for a in prof.result.part("xla").artifacts if a.kind == "xplane"))
    assert path.is_file() and path.name.endswith(".xplane.pb")
    assert read_xplane(path).part("xla").spans


# -- result -----------------------------------------------------------------------------------
def test_result_has_annotations_steps_ops_modules_on_the_run_timeline():
    """Annotations (with args), steps, XLA ops and modules land in the result, inside the session, JSON-exact."""
    f, x = workload()

    @omniprof.annotate_function
    def train_step():
        return f(x, x).block_until_ready()

    def body(prof):
        with omniprof.annotate("load_batch", batch=3):
            f(x, x).block_until_ready()
        for _ in range(2):
            train_step()
            prof.step()
        with omniprof.StepTraceAnnotation("train", step_num=9):
            train_step()

    prof = _profile(body=body)
    r = prof.result
    part = r.part("xla")
    by_name = {s.name: s for s in part.spans if s.category == "annotation"}
    assert by_name["load_batch"].args == {"batch": 3}
    assert OMNIPROF_MARK not in by_name["load_batch"].args
    assert any(n.endswith("train_step") for n in by_name)
    steps = [s for s in part.spans if s.category == "step"]
    assert {s.args.get("step_num") for s in steps} >= {1, 2, 9}
    cats = _cats(part)
    assert cats.get("xla_op", 0) >= 4 and cats.get("xla_module", 0) >= 4
    md = r.metadata
    for s in part.spans:
        if s.category in ("annotation", "step", "xla_op"):
            assert md.start_ns - 5_000_000 <= s.start_ns <= md.end_ns + 5_000_000
    tracks = {t.id for t in part.tracks}
    assert all(s.track in tracks for s in part.spans)
    assert ProfileResult.from_dict(json.loads(r.to_json())) == r


def test_op_table_computed_from_ops_on_cpu():
    """On CPU (xprof's framework_op_stats is IDLE-only) the op table comes from the XLA op spans."""
    part = _profile(backend_options={}).result.part("xla")
    table = part.table("op_stats")
    assert table is not None and table.rows
    ops = {s.args["hlo_op"] for s in part.spans if s.category == "xla_op"}
    assert set(table.column("name")) == ops
    assert abs(sum(table.column("self_share_pct")) - 100.0) < 0.5
    assert part.summaries["xprof_run_environment"]["device_type"] == "CPU"


def test_report_reads_logdir_and_xplane(tmp_path, capsys):
    """`omniprof report LOGDIR` and `report <host>.xplane.pb` read the trace and print the op table."""
    from omniprof.cli import main

    _profile(logdir=tmp_path)
    assert main(["report", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "Framework op statistics" in out
    (xplane,) = xplane_files(tmp_path)
    assert main(["report", str(xplane), "-r", "json", "-o", str(tmp_path / "out")]) == 0


# -- GPU path through a synthetic trace and the real tools -----------------------------------
def test_gpu_trace_kernels_from_xprof_kernel_stats(tmp_path):
    """A GPU xspace gives kernel spans with launch args and xprof's kernel table in our columns."""
    path = write_gpu_xplane(tmp_path / "run" / "gpuhost.xplane.pb")
    part = read_xplane(path).part("xla")
    k = [s for s in part.spans if s.category == "kernel"]
    launch = next(s for s in part.spans if s.name == "cuLaunchKernel")
    assert launch.flow_ids == (42,) and [f.flow_id for f in part.flows] == [42]
    assert [s.flow_ids for s in k] == [(42,), ()]
    assert len(k) == 2 and k[0].args["block"] == [64, 1, 1] and k[0].args["static_shared_memory_bytes"] == 2048
    (row,) = part.table("kernel_stats").records()
    assert row["kernel_name"] == "gemm_fusion_dot_1" and row["occurrences"] == 2
    assert row["total_ns"] == 4000 and row["block_dim"] == "64,1,1" and row["occupancy_pct"] == 100.0
    (stream,) = [t for t in part.tracks if t.kind == "stream"]
    assert (stream.device, stream.stream) == (0, 7)  # the "Stream #7(Compute)" line of /device:GPU:0


def test_tool_results_never_stale(tmp_path):
    """Replacing the trace changes the tool's answer; no cache file is left beside the trace."""
    path = tmp_path / "run" / "h.xplane.pb"
    write_gpu_xplane(path, "kernel_a")
    first = run_tool([path], "kernel_stats")
    write_gpu_xplane(path, "kernel_b")
    second = run_tool([path], "kernel_stats")
    assert b"kernel_a" in first and b"kernel_b" in second and b"kernel_a" not in second
    assert sorted(p.name for p in path.parent.iterdir()) == ["h.xplane.pb"]


# -- annotations ------------------------------------------------------------------------------
def test_annotations_are_no_ops_without_a_profiler():
    """With no profiler running nothing is registered, so annotate costs a tuple check."""
    assert annotations.active_sinks() == ()
    with omniprof.annotate("idle"):
        pass


# -- Perfetto ---------------------------------------------------------------------------------
def _perfetto_events(path: Path) -> list[dict]:
    data = json.loads(gzip.decompress(path.read_bytes()))
    return data["traceEvents"]


def test_create_perfetto_trace_writes_chrome_json_beside_xplane(tmp_path):
    """create_perfetto_trace=True writes perfetto_trace.json.gz with well-formed trace events."""
    prof = _profile(logdir=tmp_path, backend_options={"xla": {"create_perfetto_trace": True, "record_tool_data": False}})
    path = prof.session_dir / "perfetto_trace.json.gz"
    assert path.is_file()
    events = _perfetto_events(path)
    complete = [e for e in events if e.get("ph") == "X"]
    assert complete and all({"ts", "dur", "pid", "tid", "name"} <= e.keys() for e in complete)
    assert any(e.get("ph") == "M" and e.get("name") == "process_name" for e in events)
    names = {e["name"] for e in complete}
    ops = {s.name for s in prof.result.part("xla").spans if s.category == "xla_op"}
    assert ops <= names


def _link_from(text: str) -> str:
    line = next(ln for ln in text.splitlines() if ln.startswith("Open URL in browser: "))
    return line.split("url=", 1)[1]


def test_perfetto_link_served_to_a_real_client_non_blocking(tmp_path, capsys):
    """create_perfetto_link with perfetto_wait=False: once the result is saved, the link goes to
    stderr as a plain line and the file is served with CORS for ui.perfetto.dev, then the server stops."""
    opts = {"xla": {"create_perfetto_link": True, "perfetto_port": 0, "perfetto_wait": False,
                    "perfetto_timeout_s": 30.0, "record_tool_data": False}}
    f, x = workload()
    with omniprof.Profiler(backend="xla", logdir=tmp_path, backend_options=opts) as prof:
        f(x, x).block_until_ready()
    url = _link_from(capsys.readouterr().err)
    assert url.startswith("http://127.0.0.1:") and url.endswith("/perfetto_trace.json.gz")
    req = urllib.request.Request(url, headers={"Origin": "https://ui.perfetto.dev"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        body = resp.read()
        assert resp.headers["Access-Control-Allow-Origin"] == "https://ui.perfetto.dev"
    assert body == (prof.session_dir / "perfetto_trace.json.gz").read_bytes()
    watchers = [t for t in threading.enumerate() if t.name == "omniprof-perfetto-watch"]
    for t in watchers:
        t.join(10)
    assert not any(t.is_alive() for t in watchers)


class _Clicker:
    """A stream that, seeing the link line, fetches the URL from another thread (a browser)."""

    def __init__(self):
        self.text = ""
        self.seen = []

    def write(self, text):
        self.text += text
        if "Open URL in browser: " in text:
            url = _link_from(text)
            threading.Thread(target=lambda: self.seen.append(urllib.request.urlopen(url, timeout=10).read()),
                             name="test-client", daemon=True).start()

    def flush(self):
        pass


def test_perfetto_link_blocks_until_fetched(tmp_path):
    """wait=True: returns once a client fetched the trace."""
    from omniprof.viewers.serve import serve_perfetto_link

    path = tmp_path / "perfetto_trace.json.gz"
    path.write_bytes(gzip.compress(b'{"traceEvents": []}'))
    clicker = _Clicker()
    server = serve_perfetto_link(path, port=0, wait=True, timeout_s=20, stream=clicker)
    assert server.fetch_count == 1
    for _ in range(100):
        if clicker.seen:
            break
        time.sleep(0.05)
    assert clicker.seen == [path.read_bytes()]


def test_perfetto_link_timeout_warns(tmp_path):
    """Nobody opens the link: after the timeout a warning names the file, and the call returns."""
    from omniprof.viewers.serve import PerfettoLinkWarning, serve_perfetto_link

    path = tmp_path / "perfetto_trace.json.gz"
    path.write_bytes(gzip.compress(b'{"traceEvents": []}'))
    with pytest.warns(PerfettoLinkWarning, match=f"not opened within 0.2 s; saved: {path}"):
        serve_perfetto_link(path, port=0, wait=True, timeout_s=0.2, announce=lambda text: None)


# -- CLI and import cost ------------------------------------------------------------------------
def test_cli_run_with_xla_backend(tmp_path, capsys):
    """`omniprof run -b xla script.py` traces the script and prints the op table."""
    from omniprof.cli import main

    script = tmp_path / "work.py"
    script.write_text("import jax, jax.numpy as jnp\nf = jax.jit(lambda x: jnp.tanh(x @ x))\n"
                      "x = jnp.ones((32, 32))\nfor _ in range(3):\n    f(x).block_until_ready()\n")
    assert main(["run", "-b", "xla", "--logdir", str(tmp_path / "logs"), str(script)]) == 0
    assert "Framework op statistics" in capsys.readouterr().out
    assert list((tmp_path / "logs").glob("plugins/profile/*/*.xplane.pb"))


def test_import_omniprof_and_backend_package_import_no_jax():
    """`import omniprof` and the backend package import neither jax nor xprof; omniprof.jax.time resolves lazily."""
    import subprocess
    import sys

    code = ("import sys, omniprof, omniprof.backends.xla\n"
            "assert 'jax' not in sys.modules and 'xprof' not in sys.modules, 'heavy import'\n"
            "assert callable(omniprof.jax.timed) and callable(omniprof.jax.start_server)\n")
    root = Path(__file__).resolve().parents[3]
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=root)
    assert proc.returncode == 0, proc.stderr


def test_refuses_to_start_while_jax_traces(tmp_path):
    """A running jax.profiler.start_trace is reported at start with the fix, not as a failed stop."""
    import jax

    from omniprof.errors import BackendError

    jax.profiler.start_trace(str(tmp_path))
    try:
        with pytest.raises(BackendError, match="stop_trace"):
            omniprof.Profiler(backend="xla", backend_options=FAST).start()
    finally:
        jax.profiler.stop_trace()


def test_crashing_workload_leaves_readable_trace(tmp_path):
    """The workload raises: the xplane is still written and read, and the result is marked partial."""
    f, x = workload()
    prof = omniprof.Profiler(backend="xla", logdir=tmp_path, backend_options=FAST)
    with pytest.raises(ZeroDivisionError):
        with prof:
            f(x, x).block_until_ready()
            1 / 0
    r = prof.result
    assert r.partial and r.errors[0].type == "ZeroDivisionError"
    assert any(s.category == "xla_op" for s in r.part("xla").spans)
    assert list(tmp_path.glob("plugins/profile/*/*.xplane.pb"))


def test_memory_profile_summary_from_xprof_message():
    """xprof's MemoryProfile JSON (built with its own protobuf class) maps to a per-allocator summary."""
    from google.protobuf import json_format
    from xprof.protobuf import memory_profile_pb2

    from omniprof.formats.xplane import memory_profile_summaries

    msg = memory_profile_pb2.MemoryProfile()
    prof = msg.memory_profile_per_allocator["GPU_0_bfc"]
    prof.profile_summary.peak_bytes_usage_lifetime = 64 << 20
    prof.profile_summary.memory_capacity = 23 << 30
    prof.profile_summary.peak_stats_time_ps = 49_753_650_000
    prof.profile_summary.peak_stats.peak_bytes_in_use = 30_750
    prof.profile_summary.peak_stats.fragmentation = 0.514931
    out = memory_profile_summaries(json_format.MessageToJson(msg))
    s = out["memory_profile:GPU_0_bfc"]
    assert s["peak_bytes_usage_lifetime"] == 64 << 20 and s["memory_capacity_bytes"] == 23 << 30
    assert s["peak_bytes_in_use"] == 30_750 and s["fragmentation"] == pytest.approx(0.514931)
    assert s["peak_stats_time_ns"] == 49_753_650


def test_schedule_gives_one_trace_per_active_window(tmp_path):
    """wait=1 warmup=1 active=2 repeat=2 over 8 steps: two results, each its own run dir and xplane."""
    f, x = workload()
    prof = omniprof.Profiler(backend="xla", logdir=tmp_path, backend_options=FAST,
                             schedule=omniprof.schedule(wait=1, warmup=1, active=2, repeat=2))
    with prof:
        for _ in range(8):
            f(x, x).block_until_ready()
            prof.step()
    assert len(prof.results) == 2
    dirs = {Path(next(a.path for a in r.part("xla").artifacts if a.kind == "xplane")).parent for r in prof.results}
    assert len(dirs) == 2
    for r in prof.results:
        assert sum(1 for s in r.part("xla").spans if s.category == "xla_module") == 2


def test_undecodable_stats_are_counted_and_warned(tmp_path):
    """An event stat jaxlib cannot decode is counted as a Loss and warned about, never dropped silently."""
    from omniprof.formats.xprof_runtime import import_profiler_bindings
    from omniprof.errors import DataLossWarning

    _, pd = import_profiler_bindings()
    text = '''
    planes { id: 1 name: "/host:CPU"
      lines { id: 1 name: "python" timestamp_ns: 1000
        events { metadata_id: 1 offset_ps: 1000000 duration_ps: 2000000
          stats { metadata_id: 1 bytes_value: "\\xb9\\xff" } }
      }
      event_metadata { key: 1 value { id: 1 name: "op" } }
      stat_metadata { key: 1 value { id: 1 name: "blob" } }
    }'''
    path = tmp_path / "h.xplane.pb"
    path.write_bytes(pd.ProfileData.text_proto_to_serialized_xspace(text))
    with pytest.warns(DataLossWarning, match="undecodable_stats"):
        r = read_xplane(path)
    (loss,) = r.losses
    assert loss.kind == "undecodable_stats" and loss.count == 1
    assert [s.name for s in r.part("xla").spans] == ["op"]


def test_without_logdir_the_xplane_lives_until_the_process_exits(tmp_path):
    """Without a logdir the xplane goes to a directory of the backend's own: there while the process
    runs (reporters read it after the session), gone once it exits (no omniprof-xla-* left behind)."""
    import subprocess
    import sys

    code = ("import jax.numpy as jnp, omniprof\n"
            "with omniprof.Profiler(backend='xla') as prof:\n"
            "    jnp.ones(64).sum().block_until_ready()\n"
            "xplane = next(a.path for a in prof.result.part('xla').artifacts if a.path.endswith('.xplane.pb'))\n"
            "import os; assert os.path.getsize(xplane) > 0\n"
            "print(xplane)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, check=True,
                         env={**os.environ, "TMPDIR": str(tmp_path)})
    xplane = Path(out.stdout.strip().splitlines()[-1])
    assert xplane.parent.name.startswith("omniprof-xla-") and xplane.parent.parent == tmp_path
    assert not xplane.parent.exists()
