"""Remote capture through XLA's profiler service: real child processes on 127.0.0.1."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("jax")
pytest.importorskip("xprof")

import omniprof  # noqa: E402
from omniprof.backends.xla import remote  # noqa: E402
from omniprof.cli import main  # noqa: E402
from omniprof.errors import BackendError, InvalidArgumentError, ProfilerStateError  # noqa: E402
from tests.tools import free_port

ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent("""
    import sys, time
    import omniprof
    import jax, jax.numpy as jnp
    port = int(sys.argv[1])
    omniprof.jax.start_server(port, all_interfaces_ok=True)
    f = jax.jit(lambda x: jnp.sin(x) @ x)
    x = jnp.ones((64, 64))
    f(x).block_until_ready()
    print("READY", flush=True)
    deadline = time.time() + float(sys.argv[2])
    while time.time() < deadline:
        with omniprof.annotate("child_work", port=port):
            f(x).block_until_ready()
        time.sleep(0.002)
    omniprof.jax.stop_server()
    print("CHILD_DONE", file=sys.stderr, flush=True)
""")


@pytest.fixture
def children():
    """Start N child processes each serving the profiler on a free port; kill them afterwards."""
    procs: list[subprocess.Popen] = []

    def start(n: int, seconds: float = 30.0) -> list[int]:
        ports = [free_port() for _ in range(n)]
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        # As a user's process starts: this test process may have set XLA's log level for itself.
        env.pop("TF_CPP_MIN_LOG_LEVEL", None)
        env.pop("OMNIPROF_VERBOSE", None)
        for p in ports:
            procs.append(subprocess.Popen([sys.executable, "-c", CHILD, str(p), str(seconds)], stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, env=env, text=True))
        for proc in procs:
            line = proc.stdout.readline()
            assert line.strip() == "READY", proc.stderr.read()
        return ports

    start.procs = procs
    yield start
    for proc in procs:
        proc.kill()
        proc.wait(10)


@pytest.mark.slow
def test_collect_two_processes_into_one_run(children, tmp_path):
    """Two processes captured at once: one run dir, one xplane per process, one result with both."""
    ports = children(2)
    addrs = [f"127.0.0.1:{p}" for p in ports]
    got = remote.collect(",".join(addrs), 300, tmp_path, perfetto_trace=True)
    assert got.run_dir.parent == tmp_path / "plugins" / "profile"
    assert sorted(f.name for f in got.files) == sorted(f"127.0.0.1_{p}.xplane.pb" for p in ports)
    assert list(got.run_dir.glob("*.xplane.pb")) and (got.run_dir / "omniprof.result.json").is_file()
    part = got.result.part("xla")
    assert {t.process for t in part.tracks} == {f"127.0.0.1_{p}" for p in ports}
    ann = [s for s in part.spans if s.category == "annotation" and s.name == "child_work"]
    assert {s.args["port"] for s in ann} == set(ports)
    assert any(s.category == "xla_op" for s in part.spans)
    assert got.perfetto_trace is not None and got.perfetto_trace.is_file()
    assert omniprof.load(got.run_dir / "omniprof.result.json") == got.result


def test_collect_relative_logdir_from_another_directory(children, tmp_path, monkeypatch, capsys):
    """A relative --logdir is the collecting command's, not the profiled process's: the server
    writes the capture into the directory the request names, so a relative one was taken from the
    server's working directory (the repository here): "returned no trace file", and a stray
    .omniprof-capture-* directory left there."""
    (port,) = children(1)
    before = set(ROOT.glob("rel-logdir*"))
    monkeypatch.chdir(tmp_path)
    code = main(["collect", f"127.0.0.1:{port}", "--duration-ms", "200", "--logdir", "rel-logdir",
                 "--no-perfetto-link"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert len(list((tmp_path / "rel-logdir").glob("plugins/profile/*/*.xplane.pb"))) == 1
    assert set(ROOT.glob("rel-logdir*")) == before  # nothing in the server's working directory


@pytest.mark.slow
def test_cli_collect_one_process(children, tmp_path, capsys):
    """`omniprof collect ADDR --duration-ms N --logdir DIR --no-perfetto-link` captures and says where."""
    (port,) = children(1)
    code = main(["collect", f"127.0.0.1:{port}", "--duration-ms", "200", "--logdir", str(tmp_path),
                 "--no-perfetto-link", "-r", "table"])
    assert code == 0
    err = capsys.readouterr().err
    assert "captured 1 host(s)" in err and f"127.0.0.1_{port}.xplane.pb" in err
    assert len(list(tmp_path.glob("plugins/profile/*/*.xplane.pb"))) == 1


def test_collect_without_server_fails_clearly(tmp_path):
    """No server at the address: BackendError naming the address and how to start one."""
    port = free_port()
    with pytest.raises(BackendError, match=f"nothing listens at 127.0.0.1:{port}.*omniprof.jax.start_server"):
        remote.collect(f"127.0.0.1:{port}", 50, tmp_path, num_tracing_attempts=1)
    assert not list(tmp_path.glob("plugins/profile/*"))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".omniprof-capture")]


def test_cli_collect_without_server_exit_code(tmp_path, capsys):
    """The CLI turns that failure into exit code 1 and one clear line that names our --attempts
    (XLA's client text recommends its own --num_tracing_attempts)."""
    port = free_port()
    assert main(["collect", f"127.0.0.1:{port}", "--duration-ms", "50", "--logdir", str(tmp_path),
                 "--no-perfetto-link", "--attempts", "1"]) == 1
    err = capsys.readouterr().err
    assert "nothing listens at" in err and "--attempts" in err
    assert "num_tracing_attempts" not in err


@pytest.mark.slow
def test_cli_collect_busy_perfetto_port_keeps_the_capture_and_reports(children, tmp_path, capsys):
    """--perfetto-port held by another socket: the capture is saved, -r table still prints (its
    header names the captured pid), a warning names the saved files and the port's holder, exit 0."""
    (port,) = children(1)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        busy = held.getsockname()[1]
        code = main(["collect", f"127.0.0.1:{port}", "--duration-ms", "200", "--logdir", str(tmp_path),
                     "--perfetto-port", str(busy), "-r", "table"])
    out, err = capsys.readouterr()
    assert code == 0, err
    child_pid = children.procs[0].pid
    assert f"pid {child_pid}" in out.splitlines()[0]
    (run_dir,) = tmp_path.glob("plugins/profile/*")
    assert f"the Perfetto link was not served: cannot serve the trace on 127.0.0.1:{busy}" in err
    assert f"pid {os.getpid()}" in err
    for f in ("perfetto_trace.json.gz", "omniprof.result.json", f"127.0.0.1_{port}.xplane.pb"):
        assert str(run_dir / f) in err
    assert "port=0" not in err and "port 0" not in err


@pytest.mark.slow
def test_collect_device_level_zero_strips_the_saved_xplane(children, tmp_path):
    """-O device_tracer_level=0: the saved xplane holds no device activity (as the local backend's),
    and no omniprof mark."""
    from jax._src.lib import _profile_data

    (port,) = children(1)
    got = remote.collect(f"127.0.0.1:{port}", 200, tmp_path, options={"device_tracer_level": 0},
                         perfetto_trace=False)
    data = got.files[0].read_bytes()
    assert b"_omniprof" not in data
    pd = _profile_data.ProfileData.from_serialized_xspace(data)
    stats = [dict(e.stats) for p in pd.planes for line in p.lines for e in line.events]
    assert stats and not [s for s in stats if "hlo_op" in s or "device_ordinal" in s]
    part = got.result.part("xla")
    assert part.metadata["device_events_left_out"] > 0
    assert not [s for s in part.spans if s.category == "xla_op"]
    assert {s.category for s in part.spans if s.name == "child_work"} == {"annotation"}


@pytest.mark.slow
def test_captured_process_stays_quiet(children, tmp_path):
    """XLA's 'Profiling is late by N nanoseconds' does not reach the captured process's stderr,
    while what the program itself writes there still does."""
    (port,) = children(1, seconds=4.0)
    remote.collect(f"127.0.0.1:{port}", 200, tmp_path, perfetto_trace=False)
    proc = children.procs[0]
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Profiling is late" not in err
    assert err.strip().endswith("CHILD_DONE")


def test_start_server_refuses_a_port_another_process_serves(children):
    """gRPC's port reuse would let two processes share a port; the second start is refused,
    naming the process that serves it."""
    (port,) = children(1)
    child_pid = children.procs[0].pid
    with pytest.raises(BackendError, match=rf"port {port} is already in use by pid {child_pid}"):
        omniprof.jax.start_server(port, all_interfaces_ok=True)
    assert remote.server_port() is None


def test_addresses_validated():
    """Addresses must be HOST:PORT with a valid port, each once."""
    assert remote.parse_addresses("grpc://127.0.0.1:9999, [::1]:80") == ["127.0.0.1:9999", "[::1]:80"]
    for bad in ("", "localhost", "127.0.0.1:0", "127.0.0.1:99999", "a:1,a:1"):
        with pytest.raises(InvalidArgumentError):
            remote.parse_addresses(bad)


def test_start_server_warns_about_every_interface_and_stops():
    """start_server warns that the server listens on every interface; stop_server ends it; state errors are clear."""
    port = free_port()
    with pytest.warns(remote.ExposedServerWarning, match="EVERY network interface.*ssh -L"):
        omniprof.jax.start_server(port)
    try:
        assert remote.server_port() == port
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        with pytest.raises(ProfilerStateError, match="already running"):
            omniprof.jax.start_server(free_port(), all_interfaces_ok=True)
    finally:
        omniprof.jax.stop_server()
    assert remote.server_port() is None
    with pytest.raises(ProfilerStateError, match="no profiler server"):
        omniprof.jax.stop_server()


def test_quiet_by_default_verbose_shows_native_logs(tmp_path):
    """A trace plus xprof's tools prints nothing by default; OMNIPROF_VERBOSE=1 lets absl's lines through."""
    script = textwrap.dedent(f"""
        import omniprof, jax, jax.numpy as jnp
        f = jax.jit(lambda x: x @ x); x = jnp.ones((8, 8))
        with omniprof.Profiler(backend="xla", logdir={str(tmp_path)!r}):
            f(x).block_until_ready()
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    quiet = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr.strip() == "" and quiet.stdout.strip() == ""
    loud = subprocess.run([sys.executable, "-c", script], env={**env, "OMNIPROF_VERBOSE": "1"}, capture_output=True,
                          text=True, timeout=120)
    assert loud.returncode == 0
    assert "I0000" in loud.stderr or "xplane_to_tools_data" in loud.stderr
