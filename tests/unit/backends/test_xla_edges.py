"""The xla backend at the edges (issue 18): nothing lost to a viewer, a port or a signal; nothing
hidden; nothing recorded twice. Real jax on CPU, real sockets and child processes on 127.0.0.1."""

from __future__ import annotations

import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

pytest.importorskip("jax")
pytest.importorskip("xprof")

import omniprof  # noqa: E402
from omniprof.backends.xla import remote  # noqa: E402
from omniprof.cli import main  # noqa: E402
from omniprof.viewers.serve import PerfettoLinkWarning  # noqa: E402
from omniprof.errors import BackendError, InvalidArgumentError  # noqa: E402

from .xla_helpers import workload  # noqa: E402
from tests.tools import free_port

ROOT = Path(__file__).resolve().parents[3]
FAST = {"record_tool_data": False}


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    env.pop("OMNIPROF_VERBOSE", None)
    env.update(extra)
    return env


@pytest.fixture
def held_port():
    """A port another socket holds (bound and listening on 127.0.0.1)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    yield s.getsockname()[1]
    s.close()


def _xplane_stats(path: Path) -> tuple[dict, list[tuple[str, str, dict]]]:
    """(metadata plane stats, [(plane, event name, stats)]) of a saved xplane, read by jaxlib."""
    from jax._src.lib import _profile_data

    pd = _profile_data.ProfileData.from_serialized_xspace(path.read_bytes())
    meta = pd.find_plane_with_name("/host:metadata")
    md = dict(meta.stats) if meta is not None else {}
    events = [(p.name, e.name, dict(e.stats)) for p in pd.planes if p.name != "/host:metadata"
              for line in p.lines for e in line.events]
    return md, events


# -- nothing lost to a viewer, a port or a signal ------------------------------------------------
def test_busy_perfetto_port_keeps_the_whole_result(tmp_path, held_port):
    """The link's port is held by another socket: the result keeps its part (saved too), and a
    warning names the port's holder and every saved file."""
    f, x = workload()
    opts = {"xla": {**FAST, "create_perfetto_link": True, "perfetto_port": held_port}}
    with pytest.warns(PerfettoLinkWarning) as caught:
        with omniprof.Profiler(backend="xla", logdir=tmp_path, backend_options=opts) as prof:
            f(x, x).block_until_ready()
    assert [p.backend for p in prof.result.parts] == ["xla"]
    saved = omniprof.load(prof.session_dir / "omniprof.result.json")
    assert [p.backend for p in saved.parts] == ["xla"] and saved.parts[0].spans
    text = str(caught[0].message)
    assert f"127.0.0.1:{held_port}" in text and f"pid {os.getpid()}" in text
    for name in ("perfetto_trace.json.gz", "omniprof.result.json", ".xplane.pb"):
        assert name in text
    assert "port=0" not in text


CHILD_LINK = textwrap.dedent("""
    import logging, sys
    logging.basicConfig(level=logging.ERROR)
    import jax, jax.numpy as jnp, omniprof
    f = jax.jit(lambda x: x @ x); x = jnp.ones((32, 32)); f(x).block_until_ready()
    opts = {"xla": {"record_tool_data": False, "create_perfetto_link": True, "perfetto_port": 0,
                    "perfetto_timeout_s": 120}}
    with omniprof.Profiler(backend="xla", logdir=sys.argv[1], backend_options=opts) as prof:
        f(x).block_until_ready()
    print("AFTER", len(prof.result.parts), prof.session_dir, flush=True)
""")


def _start_link_child(tmp_path: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-c", CHILD_LINK, str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=_env(), text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        if line.startswith("Open URL in browser: "):
            return proc, line.split("url=", 1)[1].strip()
    proc.kill()
    raise AssertionError("no link line on stderr: " + proc.communicate()[1])


def test_link_reaches_stderr_with_logging_at_error_and_a_fetch_ends_the_wait(tmp_path):
    """With logging at ERROR the link is still printed (a plain stderr line, as jax prints it);
    the child blocks until the trace is fetched, then goes on."""
    import urllib.request

    proc, url = _start_link_child(tmp_path)
    try:
        body = urllib.request.urlopen(url, timeout=30).read()
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out.startswith("AFTER 1 ")
    run_dir = Path(out.split()[2])
    assert body == (run_dir / "perfetto_trace.json.gz").read_bytes()


def test_ctrl_c_while_waiting_for_the_link_ends_the_wait_and_keeps_everything(tmp_path):
    """SIGINT to a child blocked on the link: the wait ends, the program goes on, the result
    (with its part) and the trace files are on disk."""
    proc, _url = _start_link_child(tmp_path)
    try:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "stopped waiting for the Perfetto link (Ctrl-C); nothing is lost" in err
    assert out.startswith("AFTER 1 ")
    run_dir = Path(out.split()[2])
    saved = omniprof.load(run_dir / "omniprof.result.json")
    assert [p.backend for p in saved.parts] == ["xla"] and saved.parts[0].spans
    assert (run_dir / "perfetto_trace.json.gz").is_file() and list(run_dir.glob("*.xplane.pb"))


def test_without_logdir_no_temporary_directory_is_left_behind(tmp_path):
    """Without logdir the files live in a temporary directory while the process runs (reporters
    read them) and are removed when it exits."""
    script = textwrap.dedent("""
        import os, jax, jax.numpy as jnp, omniprof
        f = jax.jit(lambda x: x @ x); x = jnp.ones((16, 16)); f(x).block_until_ready()
        with omniprof.Profiler(backend="xla", backend_options={"xla": {"record_tool_data": False}}) as prof:
            f(x).block_until_ready()
        part = prof.result.part("xla")
        xplane = [a.path for a in part.artifacts if a.kind == "xplane"][0]
        print(xplane, os.path.isfile(xplane), "removed when this process exits" in part.metadata["temporary_dir_note"])
    """)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    done = subprocess.run([sys.executable, "-c", script], env=_env(TMPDIR=str(tmp)), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    xplane, existed, noted = done.stdout.split()
    assert existed == "True" and noted == "True" and xplane.startswith(str(tmp))
    assert list(tmp.iterdir()) == []


# -- nothing recorded twice, nothing leaked into the files ---------------------------------------
def test_start_server_and_a_local_profiler_record_each_annotation_once(tmp_path):
    """One sink per process: with a profiler server running, a local xla session still records
    one range per annotation (two sinks recorded two), and no _omniprof mark reaches the file."""
    f, x = workload()
    omniprof.jax.start_server(free_port(), all_interfaces_ok=True)
    try:
        with omniprof.Profiler(backend="xla", logdir=tmp_path, backend_options={"xla": FAST}) as prof:
            with omniprof.annotate("once_only", k=1):
                f(x, x).block_until_ready()
    finally:
        omniprof.jax.stop_server()
    spans = [s for s in prof.result.part("xla").spans if s.name == "once_only"]
    assert len(spans) == 1 and spans[0].category == "annotation" and spans[0].args == {"k": 1}
    xplane = next(prof.session_dir.glob("*.xplane.pb"))
    assert b"_omniprof" not in xplane.read_bytes()
    _, events = _xplane_stats(xplane)
    assert [st for _, name, st in events if name == "once_only"] == [{"k": 1}]


def test_annotations_carry_no_omniprof_arg_into_the_saved_xplane(tmp_path):
    """XProf shows every stat of an event: omniprof's ranges carry only the user's args."""
    f, x = workload()
    with omniprof.Profiler(backend="xla", logdir=tmp_path, backend_options={"xla": FAST}) as prof:
        with omniprof.annotate("mine", batch=3):
            f(x, x).block_until_ready()
    _, events = _xplane_stats(next(prof.session_dir.glob("*.xplane.pb")))
    assert [st for _, name, st in events if name == "mine"] == [{"batch": 3}]
    assert [s.category for s in prof.result.part("xla").spans if s.name == "mine"] == ["annotation"]


def test_jax_trace_annotation_ranges_are_annotations(tmp_path):
    """jax.profiler.TraceAnnotation ranges are the user's annotations, not XLA runtime; jax's own
    internal ranges stay runtime; jax's class is back once the session ends."""
    import jax

    original = jax.profiler.TraceAnnotation
    f, x = workload()
    with omniprof.Profiler(backend="xla", logdir=tmp_path, backend_options={"xla": FAST}) as prof:
        with jax.profiler.TraceAnnotation("jax_range", step=2):
            f(x, x).block_until_ready()
    assert jax.profiler.TraceAnnotation is original
    part = prof.result.part("xla")
    assert [(s.category, s.args) for s in part.spans if s.name == "jax_range"] == [("annotation", {"step": 2})]
    assert {s.category for s in part.spans if s.name.startswith("PjitFunction(")} == {"runtime"}


def test_xplane_has_jax_versions_and_trace_json_beside_it(tmp_path):
    """As jax.profiler writes them: jax/jaxlib versions in the xplane's metadata plane, and
    <host>.trace.json.gz (Chrome JSON) beside the xplane."""
    import jax
    from jax._src.lib import version as jaxlib_version

    f, x = workload()
    with omniprof.Profiler(backend="xla", logdir=tmp_path, backend_options={"xla": FAST}) as prof:
        f(x, x).block_until_ready()
    xplane = next(prof.session_dir.glob("*.xplane.pb"))
    md, _ = _xplane_stats(xplane)
    assert md["jax_version"] == jax.__version__
    assert md["jaxlib_version"] == ".".join(map(str, jaxlib_version))
    trace = prof.session_dir / xplane.name.replace(".xplane.pb", ".trace.json.gz")
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    ops = {s.name for s in prof.result.part("xla").spans if s.category == "xla_op"}
    assert ops and ops <= {e.get("name") for e in events}
    assert any(a.kind == "trace_json" and a.path == str(trace) for a in prof.result.part("xla").artifacts)


def test_users_own_jax_start_trace_is_refused_up_front(tmp_path):
    """XLA runs one profiler session per process: jax.profiler.start_trace inside our session
    fails at once (not with ALREADY_EXISTS at its end), and our session's result is intact."""
    import jax

    f, x = workload()
    with omniprof.Profiler(backend="xla", logdir=tmp_path, backend_options={"xla": FAST}) as prof:
        with pytest.raises(RuntimeError, match="already been started"):
            jax.profiler.start_trace(str(tmp_path / "jax"))
        with pytest.raises(RuntimeError, match="omniprof's xla backend holds XLA's profiler session"):
            jax.profiler.stop_trace()
        f(x, x).block_until_ready()
    assert any(s.category == "xla_op" for s in prof.result.part("xla").spans)
    jax.profiler.start_trace(str(tmp_path / "jax"))  # free again afterwards
    f(x, x).block_until_ready()
    jax.profiler.stop_trace()
    assert list((tmp_path / "jax").glob("plugins/profile/*/*.xplane.pb"))


# -- servers that cannot bind say so -------------------------------------------------------------
def test_start_server_on_a_held_port_is_refused_naming_the_holder(held_port):
    with pytest.raises(BackendError, match=rf"port {held_port} is already in use by pid {os.getpid()}.*"
                                           r"choose a free port"):
        omniprof.jax.start_server(held_port, all_interfaces_ok=True)
    assert remote.server_port() is None


def test_doctor_says_the_profiler_server_listens_on_every_interface():
    from omniprof.backends.xla.backend import XlaBackend

    row = next(c for c in XlaBackend.capabilities() if c.feature.startswith("remote capture"))
    assert "EVERY network interface" in row.detail and "127.0.0.1 unless" not in row.detail


# -- options ---------------------------------------------------------------------------------------
def test_option_conflict_found_at_prepare_exits_2(tmp_path, capsys):
    script = tmp_path / "s.py"
    script.write_text("pass\n")
    code = main(["run", "--no-config", "-b", "xla", "-O", "device_tracer_level=0", "-O",
                 "advanced_configuration.tpu_trace_mode=TRACE_COMPUTE", "-r", "json", "-o", str(tmp_path), str(script)])
    assert code == 2
    assert "tpu_trace_mode" in capsys.readouterr().err


def test_profile_options_typo_names_the_nearest_field():
    with pytest.raises(InvalidArgumentError, match="'host_tracer'; did you mean 'host_tracer_level'"):
        omniprof.ProfileOptions(host_tracer=1)


def test_pm_sample_counters_are_stripped():
    opts = omniprof.ProfileOptions(advanced_configuration={"gpu_pm_sample_counters": " a.b , c.d "})
    assert opts.advanced_configuration["gpu_pm_sample_counters"] == "a.b,c.d"
    assert omniprof.ProfileOptions(advanced_configuration={"gpu_pm_sample_counters": " "}).advanced_configuration[
        "gpu_pm_sample_counters"] == ""


def test_host_levels_on_cpu_as_documented(tmp_path):
    """docs/backends/xla.md: on CPU level 1 already records XLA's execution events and ops (not
    only annotations); 3 records nothing that 2 does not."""
    f, x = workload()

    def names(level: int) -> set[str]:
        with omniprof.Profiler(backend="xla", options={"host_tracer_level": level},
                               backend_options={"xla": FAST}) as prof:
            for _ in range(3):
                with omniprof.annotate("ann"):
                    f(x, x).block_until_ready()
        return {s.name for s in prof.result.part("xla").spans} | {i.name for i in prof.result.part("xla").instants}

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        one, two, three = names(1), names(2), names(3)
    assert "ann" in one and any(n.startswith("PjitFunction(") for n in one)
    assert any(n.startswith("CommonPjRtLoadedExecutable::") for n in one)
    assert three <= two | {"PythonRefManager::CollectGarbage", "CommonPjRtBuffer::Await"}


def test_report_of_a_saved_xplane_names_the_traced_pid(tmp_path, capsys):
    """The report header of a read-back trace names the process that was traced (was pid 0)."""
    f, x = workload()
    with omniprof.Profiler(backend="xla", logdir=tmp_path, backend_options={"xla": FAST}) as prof:
        f(x, x).block_until_ready()
    xplane = next(prof.session_dir.glob("*.xplane.pb"))
    assert main(["report", str(xplane), "-r", "table"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert f"pid {os.getpid()}" in header


def test_write_trace_json_false_skips_the_chrome_json(tmp_path):
    f, x = workload()
    with omniprof.Profiler(backend="xla", logdir=tmp_path,
                           backend_options={"xla": {**FAST, "write_trace_json": False}}) as prof:
        f(x, x).block_until_ready()
    assert sorted(p.name.split(".", 1)[1] for p in prof.session_dir.iterdir()) == ["result.json", "xplane.pb"]
    assert not [a for a in prof.result.part("xla").artifacts if a.kind == "trace_json"]
