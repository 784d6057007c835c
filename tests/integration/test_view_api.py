"""``omniprof.view(...)``: the one explicit way, besides ``omniprof view``, to start a viewer from code."""

from __future__ import annotations

import gzip
import json
import urllib.request
from pathlib import Path

import pytest

import omniprof
from omniprof.errors import InvalidArgumentError
from omniprof.testing.trace_processor import open_trace, query_rows
from omniprof.viewers.serve import TraceFileServer


def _work() -> int:
    return sum(i * i for i in range(300_000))


def test_view_of_a_result_serves_a_perfetto_trace_that_perfetto_reads(tmp_path: Path) -> None:
    """A ProfileResult is written as a Perfetto trace and served on 127.0.0.1; the bytes fetched
    from the server load in Perfetto's own trace processor with one sample per sample recorded."""
    with omniprof.Profiler(backend="cpu") as prof:
        _work()
    cpu = prof.result.part("cpu")
    assert cpu.samples
    with omniprof.view(prof.result, port=0) as server:
        assert isinstance(server, TraceFileServer)
        assert server.host == "127.0.0.1" and server.link.startswith("https://ui.perfetto.dev/#!/?url=http://127.0.0.1:")
        with urllib.request.urlopen(server.url, timeout=30) as resp:
            body = resp.read()
    got = tmp_path / "fetched.perfetto-trace"
    got.write_bytes(body)
    with open_trace(got) as tp:
        assert query_rows(tp, "select count(*) as n from perf_sample")[0]["n"] == len(cpu.samples)


def test_view_of_a_file_serves_that_file(tmp_path: Path) -> None:
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": [{"name": "x", "ph": "X", "ts": 1, "dur": 2, "pid": 1, "tid": 1}]}))
    with omniprof.view(trace, port=0) as server:
        with urllib.request.urlopen(server.url, timeout=30) as resp:
            assert resp.read() == trace.read_bytes()


@pytest.mark.slow
def test_view_of_a_logdir_starts_xprof_listing_its_run(tmp_path: Path) -> None:
    """A logdir written by a Profiler gets XProf's UI, whose own /runs route lists the session."""
    pytest.importorskip("xprof")
    from omniprof.viewers.xprof import XProfServer

    with omniprof.Profiler(backend="cpu", logdir=tmp_path) as prof:
        _work()
    omniprof.report(prof.result, "tensorboard", tmp_path)
    with omniprof.view(tmp_path, port=0) as server:
        assert isinstance(server, XProfServer)
        with urllib.request.urlopen(f"{server.url.rstrip('/')}/data/plugin/profile/runs", timeout=120) as resp:
            data = resp.read()
    runs = json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
    assert runs, runs


def test_view_refuses_what_it_cannot_show(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="takes a ProfileResult"):
        omniprof.view(42)
    with pytest.raises(InvalidArgumentError, match="nothing at"):
        omniprof.view(tmp_path / "missing.perfetto-trace")
