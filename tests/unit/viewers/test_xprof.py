"""`omniprof view LOGDIR` (XProf) answers only what reads its logdir, and only to loopback names.

One real `omniprof view LOGDIR --port 0` is started in a subprocess, as a user starts it, and real
HTTP requests are sent to it: a foreign ``Host`` (DNS rebinding) gets 421, XProf's capture route is
refused and dials nothing (a listening socket on 127.0.0.1 it is pointed at must see no connection),
requests that point XProf at other directories or write caches are refused, and the UI and its data
still answer local requests.
"""

from __future__ import annotations

import gzip
import http.client
import json
import os
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from omniprof.reporters.tensorboard import TensorBoardOptions, write_logdir
from omniprof.testing.fakes import make_result
from tests.tools import stop_process

pytest.importorskip("xprof", reason="XProf is not installed (pip install 'omniprof[tensorboard]')")
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
PREFIX = "/data/plugin/profile"


@pytest.fixture(scope="module")
def viewer(tmp_path_factory: pytest.TempPathFactory):
    """`omniprof view LOGDIR --port 0` over a logdir with one run; yields (port, run name, logdir)."""
    root = tmp_path_factory.mktemp("xprofguard")
    logdir = root / "logs"
    run = write_logdir(make_result(), logdir, TensorBoardOptions(run_prefix="guard")).parent.name
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "omniprof", "view", str(logdir), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=root)
    lines: list[str] = []
    try:
        url = None
        deadline = time.monotonic() + 180  # a bound on waiting for the banner, not an assertion on time
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            if select.select([proc.stderr], [], [], 1.0)[0]:
                line = proc.stderr.readline().decode()
                lines.append(line)
                if " at http://" in line:
                    url = line.split(" at ", 1)[1].split()[0]
        assert url, f"XProf did not start: {''.join(lines)}"
        yield {"port": int(url.rstrip("/").rsplit(":", 1)[1]), "run": run, "logdir": logdir, "proc": proc}
    finally:
        stop_process(proc)


def _request(viewer: dict, path: str, host: str | None = None, method: str = "GET") -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", viewer["port"], timeout=120)
    try:
        conn.request(method, path, headers={"Host": host or f"127.0.0.1:{viewer['port']}"})
        resp = conn.getresponse()
        body = resp.read()
        return resp.status, gzip.decompress(body) if body[:2] == b"\x1f\x8b" else body
    finally:
        conn.close()


def test_foreign_host_is_refused_and_local_names_are_served(viewer: dict) -> None:
    """DNS rebinding: `Host: evil.example` gets 421 and no data on every route (before: 200 with the
    run list); localhost, 127.0.0.1 and [::1] names, with or without the port, are served."""
    for path in (f"{PREFIX}/runs", "/", f"{PREFIX}/data?run={viewer['run']}&tag=trace_viewer&host=testhost"):
        for host in ("evil.example", f"evil.example:{viewer['port']}", "127.0.0.1.evil.example"):
            status, body = _request(viewer, path, host)
            assert (status, body) == (421, b""), (path, host, status, body[:200])
    for host in (f"127.0.0.1:{viewer['port']}", f"localhost:{viewer['port']}", "localhost", f"[::1]:{viewer['port']}"):
        status, body = _request(viewer, f"{PREFIX}/runs", host)
        assert status == 200 and viewer["run"] in json.loads(body), (host, status, body[:200])


def test_capture_route_is_refused_and_dials_nothing(viewer: dict) -> None:
    """`capture_profile?service_addr=127.0.0.1:PORT` (what a plain <img src> on any web page sends):
    403, and the listening socket it names sees no connection (before: XProf dialled it and wrote a
    capture into the logdir). With a foreign Host it is 421 before anything else."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.setblocking(False)
        target = f"127.0.0.1:{listener.getsockname()[1]}"
        before = sorted(p.relative_to(viewer["logdir"]) for p in viewer["logdir"].rglob("*"))
        for path in (f"{PREFIX}/capture_profile?service_addr={target}&duration=1000",
                     f"{PREFIX}/capture_profile/?service_addr=grpc://{target}&duration=1000",
                     f"/capture_profile?service_addr={target}"):
            status, body = _request(viewer, path)
            assert status == 403 and b"switched off" in body, (path, status, body[:300])
        assert _request(viewer, f"{PREFIX}/capture_profile?service_addr={target}", "evil.example")[0] == 421
        # The capture call is synchronous in XProf's request handler: a dial would have been
        # accepted by the kernel before the answer came back.
        with pytest.raises(BlockingIOError):
            listener.accept()[0].close()
    assert sorted(p.relative_to(viewer["logdir"]) for p in viewer["logdir"].rglob("*")) == before


def test_requests_that_leave_the_logdir_or_write_are_refused(viewer: dict, tmp_path: Path) -> None:
    """`session_path` / `run_path` (point XProf at any directory, or a gs:// URL), a `run` that climbs
    out of the logdir, and `generate_cache` (POST: writes caches) are refused; the other directory
    is not read or written."""
    other = tmp_path / "other"
    write_logdir(make_result(), other, TensorBoardOptions(run_prefix="elsewhere"))
    session = next(other.glob("plugins/profile/*"))
    before = sorted(p.name for p in session.iterdir())
    rel = os.path.relpath(other, viewer["logdir"])
    refused = [
        (f"{PREFIX}/runs?session_path={session}", "GET"),
        (f"{PREFIX}/runs?run_path={other}", "GET"),
        (f"{PREFIX}/data?run={session.name}&tag=trace_viewer&host=testhost&use_saved_result=false"
         f"&session_path={session}", "GET"),
        (f"{PREFIX}/run_tools?run={rel}/{session.name}", "GET"),
        (f"{PREFIX}/data?run={rel}/{session.name}&tag=trace_viewer&host=testhost&use_saved_result=false", "GET"),
        (f"{PREFIX}/generate_cache?session_path={session}", "POST"),
    ]
    for path, method in refused:
        status, body = _request(viewer, path, method=method)
        assert status in (403, 405), (path, status, body[:300])
    assert sorted(p.name for p in session.iterdir()) == before


def test_local_ui_and_data_still_work(viewer: dict) -> None:
    """The UI page, its config (capture button hidden), the run's tools and its trace viewer data
    answer a local request as before."""
    status, body = _request(viewer, "/")
    assert status == 200 and b"<html" in body.lower()
    status, body = _request(viewer, f"{PREFIX}/config")
    assert status == 200 and json.loads(body)["hideCaptureProfileButton"] is True
    status, body = _request(viewer, f"{PREFIX}/run_tools?run={viewer['run']}")
    assert status == 200 and "trace_viewer" in " ".join(json.loads(body))
    status, body = _request(viewer, f"{PREFIX}/data?run={viewer['run']}&tag=trace_viewer&host=testhost")
    assert status == 200, body[:300]
    assert viewer["proc"].poll() is None
