"""Reporters on hostile values: names that are not valid Unicode (an undecodable file name),
times outside 64 bits, a boolean pid, NaN in args. Each output is either valid (read back with the
real reader: go tool pprof, flamegraph.pl, speedscope's schema, Perfetto's trace processor,
Python's strict JSON parser) or refused with one line and nothing written.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import omniprof
from omniprof.core.results import BackendResult, CounterSeries, Frame, Instant, ProfileResult, Span, StackSample, Track
from omniprof.errors import ReporterError

ROOT = Path(__file__).resolve().parents[3]


def _strict_json(data: bytes) -> object:
    def no_constant(name: str) -> object:
        raise AssertionError(f"non-standard JSON constant {name}")

    return json.loads(data.decode("utf-8"), parse_constant=no_constant)


def test_undecodable_script_name_runs_and_every_report_reads_back(tmp_path, go_pprof, run_tool, flamegraph_pl):
    """``omniprof run $'caf\\xe9.py'``: the run works like any other (no traceback, exit 0), the saved
    result keeps the exact name (it reads back to the same bytes), and every report is valid for its
    real reader, with the byte shown as ``\\xe9``."""
    script = os.fsencode(tmp_path) + b"/caf\xe9.py"
    with open(script, "wb") as fh:
        fh.write(b"def spin():\n    return sum(i * i for i in range(3_000_000))\nspin()\nprint('done')\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LC_ALL": "C.UTF-8"}
    p = subprocess.run([sys.executable, "-m", "omniprof", "run", "--logdir", "L", "-r",
                        "table,json,pprof,collapsed,speedscope,chrome,perfetto", "-o", "out", script],
                       cwd=tmp_path, env=env, capture_output=True, timeout=120)
    err = p.stderr.decode("utf-8", "replace")
    assert p.returncode == 0 and p.stdout.startswith(b"done\n"), err
    assert "Traceback" not in err and "error" not in err, err
    assert "caf\\xe9.py" in p.stdout.decode("utf-8")  # the table shows the byte, escaped
    saved = next((tmp_path / "L").glob("plugins/profile/*/omniprof.result.json"))
    r = omniprof.load(saved)
    files = {os.fsencode(f.file) for f in r.part("cpu").frames}
    assert script in files
    out = tmp_path / "out"
    assert omniprof.load(out / "omniprof.result.json") == r
    top = run_tool(go_pprof, "-top", "-nodecount=1000", str(out / "profile.pb.gz")).stdout.decode()
    assert "spin" in top
    folded = (out / "profile.collapsed").read_text(encoding="utf-8")
    assert "caf\\xe9.py" in folded
    svg = run_tool(flamegraph_pl, str(out / "profile.collapsed")).stdout.decode("utf-8")
    assert "spin" in svg
    speedscope = _strict_json((out / "profile.speedscope.json").read_bytes())
    assert any("caf\\xe9.py" in (f.get("file") or "") for f in speedscope["shared"]["frames"])
    chrome = _strict_json(gzip.decompress((out / "trace.json.gz").read_bytes()))
    assert chrome["traceEvents"]
    from omniprof.testing.trace_processor import import_problems, open_trace, query_rows

    for name in ("trace.json.gz", "trace.perfetto-trace"):
        with open_trace(out / name) as tp:
            assert import_problems(tp) == []
            n = query_rows(tp, "select count(*) as n from slice")[0]["n"] + query_rows(
                tp, "select count(*) as n from perf_sample")[0]["n"] + query_rows(
                tp, "select count(*) as n from cpu_profile_stack_sample")[0]["n"]
            assert n > 0, name


def _result(t_ns: int, *, offset_ns: int = 0) -> ProfileResult:
    from omniprof.core.results import ClockInfo

    part = BackendResult(backend="cpu", clock=ClockInfo(offset_ns=offset_ns), tracks=[Track("t", "t")],
                         spans=[Span("a", "t", t_ns, 5)], frames=[Frame("f")], stacks=[(0,)],
                         samples=[StackSample(t_ns, 1, 0, 5)])
    return ProfileResult(parts=(part,))


@pytest.mark.parametrize("reporter", ["perfetto", "chrome", "pprof"])
@pytest.mark.parametrize("t_ns,offset_ns", [(2**64, 0), (2**63, 0), (2**63 - 10, 100), (2**84, 0)])
def test_times_beyond_64_bits_refused_nothing_written(tmp_path, reporter, t_ns, offset_ns):
    """A time no trace format can hold (>= 2^63 ns with the clock offset): one line naming the field
    and the value, and no file (before: pprof wrote an invalid varint, perfetto wrapped or raised
    IndexError)."""
    with pytest.raises(ReporterError) as e:
        omniprof.report(_result(t_ns, offset_ns=offset_ns), reporter, tmp_path / "x")
    msg = str(e.value)
    assert "\n" not in msg and str(t_ns + offset_ns) in msg and "64-bit" in msg
    assert list(tmp_path.iterdir()) == []


_BIG = 2**63


@pytest.mark.parametrize("field,part", [
    ("start_ns/end_ns", dict(start_ns=0, end_ns=_BIG)),
    ("spans' start_ns", dict(spans=[Span("a", "t", -_BIG - 1, 5)])),
    ("spans' end (start_ns + dur_ns)", dict(spans=[Span("a", "t", _BIG - 5, 5)])),
    ("instants' t_ns", dict(instants=[Instant("i", "t", _BIG)])),
    ("samples' t_ns", dict(samples=[StackSample(_BIG, 1, 0, 5)])),
    ("samples' weight_ns", dict(samples=[StackSample(10, 1, 0, _BIG)])),
    ("counters' t_ns", dict(counters=[CounterSeries("c", "", "t", (1, _BIG), (1.0, 2.0))])),
], ids=lambda x: x if isinstance(x, str) else "")
def test_every_time_field_is_checked(tmp_path, field, part):
    """Each kind of time (and weight) is checked against the 64-bit bound, named in the message,
    and one under the bound in the same field is written."""
    base = dict(backend="cpu", tracks=[Track("t", "t")], frames=[Frame("f")], stacks=[(0,)])
    with pytest.raises(ReporterError, match=re.escape(f"has {field} = ")):
        omniprof.report(ProfileResult(parts=(BackendResult(**base, **part),)), "perfetto", tmp_path / "x")
    assert list(tmp_path.iterdir()) == []
    ok = ProfileResult(parts=(BackendResult(**base, spans=[Span("a", "t", _BIG - 6, 5)],
                                            samples=[StackSample(_BIG - 1, 1, 0, _BIG - 1)]),))
    assert omniprof.report(ok, "perfetto", tmp_path / "ok.pftrace").stat().st_size > 0


def test_largest_valid_time_still_written(tmp_path, go_pprof, run_tool):
    """The bound is exact: 2^62 ns is written and go tool pprof reads it."""
    path = omniprof.report(_result(2**62), "pprof", tmp_path / "p.pb.gz")
    assert "Type: cpu" in run_tool(go_pprof, "-raw", str(path)).stdout.decode() or path.stat().st_size > 0
    run_tool(go_pprof, "-top", str(path))


def test_chrome_json_strict_with_bool_pid_nan_args_and_surrogates(tmp_path):
    """A track with ``pid=True``, NaN in args, lone surrogates and an escape sequence in names: the
    Chrome trace is strict JSON (no ``True``, no ``NaN``), valid UTF-8, and Perfetto imports it
    with the names shown."""
    part = BackendResult(backend="cpu", tracks=[Track("t", "t\udce9\x1b[2J", pid=True, tid=True)],
                         spans=[Span("a\ud800", "t", 1000, 5000, args={"x": float("nan"), "y\udce9": 1})])
    path = omniprof.report(ProfileResult(parts=(part,)), "chrome", tmp_path / "trace.json.gz")
    data = _strict_json(gzip.decompress(path.read_bytes()))
    spans = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert [(e["name"], e["pid"], e["tid"], e["args"]) for e in spans] == [("a\\ud800", 1, 1, {"x": "nan", "y\\xe9": 1})]
    from omniprof.testing.trace_processor import import_problems, open_trace, query_rows

    with open_trace(path) as tp:
        assert import_problems(tp) == []
        names = [r["name"] for r in query_rows(tp, "select name from slice")]
        assert len(names) == 1 and names[0].startswith("a\\") and names[0].endswith("ud800")  # Perfetto keeps escapes


@pytest.mark.parametrize("depth", [63, 64, 100, 400])
def test_deeply_nested_args_keep_the_perfetto_trace_readable(tmp_path, depth):
    """Args nested ``depth`` levels (a hostile trace's value): Perfetto's own protobuf classes parse
    the trace (a 100-deep value made them refuse the whole file: upb's 100-level limit), the
    trace processor imports it, and the value is all there -- nested annotations down to level
    64, the rest as its JSON text."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace

    value: object = "leaf"
    for i in range(depth):
        value = {f"k{i}": value} if i % 2 else [value]
    part = BackendResult(backend="cpu", tracks=[Track("t", "T")], spans=[Span("s", "t", 1000, 5000, args={"v": value})])
    path = omniprof.report(ProfileResult(parts=(part,)), "perfetto", tmp_path / "trace.perfetto-trace")
    trace = Trace()
    trace.ParseFromString(path.read_bytes())
    ann = next(a for p in trace.packet if p.HasField("track_event") for a in p.track_event.debug_annotations)
    levels, node = 0, ann
    while node.dict_entries or node.array_values:
        node = node.dict_entries[0] if node.dict_entries else node.array_values[0]
        levels += 1
    rest = json.loads(node.legacy_json_value) if node.legacy_json_value else node.string_value
    assert levels == min(depth, 64)
    for i in range(depth - 1 - levels, -1, -1):  # what the JSON text holds, outermost first
        rest = rest[f"k{i}"] if i % 2 else rest[0]
    assert rest == "leaf"
    from omniprof.testing.trace_processor import import_problems, open_trace

    with open_trace(path) as tp:
        assert import_problems(tp) == []


def test_profiler_exit_saves_code_from_an_undecodable_file_name(tmp_path):
    """The library: code whose file name is not UTF-8 (``caf\\udce9.py``, as Python names a
    ``caf\\xe9.py`` file) profiled with a logdir; ``Profiler.__exit__`` returns normally (it raised
    UnicodeEncodeError while saving), and the saved result keeps the exact name."""
    name = os.fsdecode(b"caf\xe9.py")
    code = compile("def spin():\n    return sum(i * i for i in range(3_000_000))\nspin()\n", name, "exec")
    with omniprof.Profiler(backend="cpu", logdir=tmp_path, backend_options={"cpu": {"engine": "signal"}}) as prof:
        exec(code, {})
    saved = next(tmp_path.glob("plugins/profile/*/omniprof.result.json"))
    r = omniprof.load(saved)
    assert r == prof.result
    assert name in {f.file for f in r.part("cpu").frames}
