"""``omniprof view``: serves a trace for ui.perfetto.dev on 127.0.0.1 and stops as asked."""

from __future__ import annotations

import subprocess
import sys
import urllib.request

import pytest

import omniprof
from omniprof.cli import main
from omniprof.viewers.serve import PERFETTO_ORIGIN
from omniprof.testing.fakes import make_result


@pytest.fixture
def trace(tmp_path):
    return omniprof.report(make_result(), "perfetto", tmp_path)


def test_view_perfetto_serves_the_file_once_then_exits(trace):
    """The printed link's URL serves the exact file with CORS for ui.perfetto.dev; --once then exits 0."""
    proc = subprocess.Popen([sys.executable, "-m", "omniprof", "view", "--perfetto", str(trace), "--port", "0",
                             "--once", "--timeout-s", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("Open in Perfetto: https://ui.perfetto.dev/#!/?url=http://127.0.0.1:")
        url = line.split("url=", 1)[1].strip()
        assert url.endswith("/trace.perfetto-trace")
        req = urllib.request.Request(url, headers={"Origin": PERFETTO_ORIGIN})
        with urllib.request.urlopen(req, timeout=30) as resp:
            body = resp.read()
            assert resp.headers["Access-Control-Allow-Origin"] == PERFETTO_ORIGIN
        assert body == trace.read_bytes()
        assert proc.wait(timeout=30) == 0
        assert "fetched" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_view_once_times_out_with_a_clear_error(trace, capsys):
    """--once with nobody fetching stops after --timeout-s with exit status 1 and says why."""
    assert main(["view", "--perfetto", str(trace), "--port", "0", "--once", "--timeout-s", "0.3"]) == 1
    err = capsys.readouterr().err
    assert "nobody fetched the trace within 0.3 s" in err


def test_view_serves_until_timeout(trace, capsys):
    """Without --once the server runs until --timeout-s, then exits 0; it binds 127.0.0.1 by default."""
    assert main(["view", "--perfetto", str(trace), "--port", "0", "--timeout-s", "0.3"]) == 0
    out = capsys.readouterr()
    assert "url=http://127.0.0.1:" in out.out


def test_view_perfetto_rejects_a_missing_file(tmp_path, capsys):
    """A path that is not a file is a usage error (exit 2) naming it."""
    assert main(["view", "--perfetto", str(tmp_path / "nope.perfetto-trace")]) == 2
    assert "nope.perfetto-trace" in capsys.readouterr().err
