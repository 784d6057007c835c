"""Hostile inputs to ``omniprof report`` and ``omniprof.load``: each is either read, or refused
with one line that names the cause (and the bound hit); never a traceback, a hang, a crash or an
empty profile. Files that would exhaust memory run in a child process under a memory limit."""

from __future__ import annotations

import gzip
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

import omniprof
from omniprof.cli import main
from omniprof.errors import TraceReadError

ROOT = Path(__file__).resolve().parents[2]


def _report(capsys, path, *extra: str) -> tuple[int, str, str]:
    rc = main(["report", str(path), "-r", "json", "-o", str(Path(path).parent / "out"), *extra])
    out, err = capsys.readouterr()
    return rc, out, err


def _one_error_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("omniprof: error: ") and "Traceback" not in err, err
    return lines[0]


def _limited(args: list[str], cwd: Path, mem_bytes: int, **kw) -> subprocess.CompletedProcess[str]:
    """``python -m omniprof ARGS`` with its address space limited to ``mem_bytes``."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "omniprof", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120, preexec_fn=limit, **kw)


@pytest.fixture(scope="module")
def result_json(tmp_path_factory) -> dict:
    with omniprof.Profiler(backend="cpu") as prof:
        sum(i * i for i in range(200_000))
    return prof.result.to_dict()


# -- sizes and bounds -------------------------------------------------------------------------------
def test_xplane_of_2_gib_is_a_clean_error_checked_before_reading(tmp_path, tally):
    """A sparse .xplane.pb of exactly 2 GiB: one line naming protobuf's 2 GiB - 1 bound, under a
    3 GiB address-space limit (nothing is read: before, the parser crashed with SIGSEGV at 2.2 GB RSS)."""
    big = tmp_path / "vm.xplane.pb"
    with open(big, "wb") as fh:
        fh.truncate(1 << 31)
    p = _limited(["report", str(big), "-r", "json", "-o", "out"], tmp_path, 3 << 30)
    tally.check("2 GiB sparse xplane", "refused")
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    line = _one_error_line(p.stderr)
    assert "2,147,483,648 bytes" in line and "2 GiB - 1" in line


def test_xplane_of_zeros_one_byte_under_the_bound_is_refused_at_its_first_byte(tmp_path, tally):
    """A sparse .xplane.pb of 2 GiB - 1 (under the size bound) holds zeros, which start no protobuf
    field: one line naming the first byte, under the same 3 GiB address-space limit (it was read
    whole and handed to the parser first: 46 s and 4.9 GB RSS before the same verdict)."""
    big = tmp_path / "vm.xplane.pb"
    with open(big, "wb") as fh:
        fh.truncate((1 << 31) - 1)
    p = _limited(["report", str(big), "-r", "json", "-o", "out"], tmp_path, 3 << 30)
    tally.check("2 GiB - 1 of zeros as xplane", "refused")
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    line = _one_error_line(p.stderr)
    assert "not an XSpace protobuf" in line and "0x00" in line


def test_gzip_bomb_stops_at_the_ratio_bound_in_constant_memory(tmp_path, tally):
    """1.9 MB of gzip that expands to 2 GiB: refused at the decompression ratio bound (named, with
    the variable that raises it) by a process limited to 1 GiB of address space."""
    member = gzip.compress(b"0" * (1 << 20), compresslevel=9)
    bomb = tmp_path / "bomb.result.json.gz"
    with open(bomb, "wb") as fh:
        fh.write(gzip.compress(b'{"schema_version": 1, "label": "'))
        for _ in range(2048):
            fh.write(member)
        fh.write(gzip.compress(b'"}'))
    p = _limited(["report", str(bomb), "-r", "json", "-o", "out"], tmp_path, 1 << 30)
    tally.check("gzip bomb under 1 GiB", "refused")
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    line = _one_error_line(p.stderr)
    assert "gzip bomb" in line and "OMNIPROF_MAX_GZIP_RATIO" in line


def test_input_size_bound_named(tmp_path, monkeypatch, capsys, result_json, tally):
    """Past OMNIPROF_MAX_INPUT_BYTES (plain or gzipped): refused, the bound and its variable named."""
    path = tmp_path / "r.result.json.gz"
    path.write_bytes(gzip.compress(json.dumps(result_json).encode()))
    monkeypatch.setenv("OMNIPROF_MAX_INPUT_BYTES", "1000")
    rc, _, err = _report(capsys, path)
    tally.check("input size bound", "refused")
    assert rc == 2 and "OMNIPROF_MAX_INPUT_BYTES" in _one_error_line(err)
    monkeypatch.delenv("OMNIPROF_MAX_INPUT_BYTES")
    assert omniprof.load(path).parts[0].backend == "cpu"  # the same file reads without the bound


# -- malformed values: one line each ---------------------------------------------------------------
def _kineto(args: dict, **event) -> dict:
    ev = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 2, "args": args, **event}
    return {"schemaVersion": 1, "traceEvents": [ev]}


def _deep(n: int) -> object:
    v: object = 1
    for _ in range(n):
        v = {"k": v}
    return v


CASES = {
    "int of 5000 digits in a result": ("r.result.json", lambda r: json.dumps(r).replace(
        '"schema_version": ', '"label": ' + "9" * 5000 + ', "schema_version": ', 1), "4,300 digits"),
    "int of 5000 digits in a Kineto trace": ("k.json", lambda r: json.dumps(_kineto({})).replace('"ts": 1', '"ts": '
                                                                                                + "9" * 5000),
                                             "4,300 digits"),
    "Infinity in stacks": ("i.result.json", lambda r: json.dumps({**r, "parts": [
        {**r["parts"][0], "stacks": [[float("inf")], *r["parts"][0]["stacks"][1:]]}]}), "must be an integer (got inf)"),
    "time beyond int64 in a result": ("t.result.json", lambda r: json.dumps({**r, "parts": [
        {**r["parts"][0], "start_ns": 2**64}]}), "64-bit"),
    "600-deep args in a Kineto trace": ("d.json", lambda r: json.dumps(_kineto({"x": _deep(600)})), None),
    "600-deep metadata in a result": ("d.result.json", lambda r: json.dumps({**r, "parts": [
        {**r["parts"][0], "metadata": {"deep": _deep(600)}}]}), None),
    # the two that gave a RecursionError traceback before the readers were bounded:
    "600-deep args of an unknown category in a Kineto trace": (
        "u.json", lambda r: json.dumps(_kineto(_deep(600), cat="weird")), "nested too deeply"),
    "600-deep top-level key in a Kineto trace": (
        "t.json", lambda r: json.dumps({**_kineto({}), "deviceProperties": _deep(600)}), "nested too deeply"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_values_one_line_or_read(tmp_path, capsys, result_json, case, tally):
    """Each file is read (and reported) or refused with exactly one line naming the file."""
    name, make, expect = CASES[case]
    path = tmp_path / name
    path.write_text(make(result_json))
    rc, _, err = _report(capsys, path)
    tally.check("malformed value", "read" if rc == 0 else "refused")
    if expect is None and rc == 0:
        assert "Traceback" not in err
        return
    line = _one_error_line(err)
    assert rc == 2 and name in line
    assert expect is None or expect in line.lower() or expect in line, line


def test_non_numeric_kernel_grid_reads_and_is_shown(tmp_path, capsys, tally):
    """A kernel whose ``grid`` is ``["a", "b"]`` and shared memory ``"lots"``: the trace reads; the
    kernel table shows the grid as given."""
    path = tmp_path / "g.json"
    path.write_text(json.dumps(_kineto({"grid": ["a", "b"], "block": [64, 1, 1],
                                        "static_shared_memory_bytes": "lots"})))
    rc = main(["report", str(path), "-r", "table"])
    out, err = capsys.readouterr()
    tally.check("non-numeric kernel grid", "read")
    assert rc == 0 and "Traceback" not in err, err
    row = next(x for x in out.splitlines() if x.startswith("k ") and "a,b" in x)
    assert "64,1,1" in row


def test_string_times_in_xplane_one_line(tmp_path, capsys, tally):
    """An XSpace whose profile start time is a string: one line, not a traceback."""
    pytest.importorskip("jax")
    from omniprof.formats.xprof_runtime import import_profiler_bindings

    _, pd = import_profiler_bindings()
    text = '''
    planes { id: 1 name: "Task Environment"
      stats { metadata_id: 1 str_value: "yesterday" }
      stat_metadata { key: 1 value { id: 1 name: "profile_start_time" } } }
    planes { id: 2 name: "/host:CPU"
      lines { id: 1 name: "python" timestamp_ns: 1000 events { metadata_id: 1 offset_ps: 1000 duration_ps: 5000 } }
      event_metadata { key: 1 value { id: 1 name: "f" } } }
    '''
    path = tmp_path / "s.xplane.pb"
    path.write_bytes(pd.ProfileData.text_proto_to_serialized_xspace(text))
    rc, _, err = _report(capsys, path)
    tally.check("string time in xplane", "read" if rc == 0 else "refused")
    if rc != 0:
        assert "s.xplane.pb" in _one_error_line(err)


@pytest.mark.parametrize("what", ["perfetto", "pprof", "empty message"])
def test_other_protobufs_are_not_empty_profiles(tmp_path, capsys, what, tally):
    """A Perfetto trace, a pprof profile or a 2-byte protobuf renamed ``.xplane.pb``: refused as not
    an XSpace (before: an empty profile, exit 0)."""
    pytest.importorskip("jax")
    from omniprof.testing.fakes import make_result

    path = tmp_path / "x.xplane.pb"
    if what == "empty message":
        path.write_bytes(b"\x08\x01")
    else:
        src = omniprof.report(make_result(), "perfetto" if what == "perfetto" else "pprof", tmp_path / "src",
                              options={} if what == "perfetto" else {"compress": False})
        path.write_bytes(Path(src).read_bytes())
    rc, _, err = _report(capsys, path)
    tally.check("other protobuf as xplane", "refused")
    assert rc == 2
    line = _one_error_line(err)
    assert "x.xplane.pb" in line and ("not an XSpace" in line or "not a readable XSpace" in line)


# -- what the path is -------------------------------------------------------------------------------
def test_paths_that_are_not_files(tmp_path, capsys, tally):
    """A symlink loop, a dangling link, /dev/zero and a socket: each has its own message."""
    import socket

    (tmp_path / "a.json").symlink_to(tmp_path / "b.json")
    (tmp_path / "b.json").symlink_to(tmp_path / "a.json")
    (tmp_path / "gone.json").symlink_to(tmp_path / "nothing.json")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "s.sock"))
    try:
        for path, words in ((tmp_path / "a.json", "symbolic link loop"), (tmp_path / "gone.json", "does not exist"),
                            (Path("/dev/zero"), "character device"), (tmp_path / "s.sock", "a socket"),
                            (tmp_path / "none.json", "no such file")):
            rc, _, err = _report(capsys, path)
            tally.check("path that is not a file", "refused")
            assert rc == 2 and words in _one_error_line(err), (path, err)
    finally:
        sock.close()


def _cli(cmd: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """A shell command line with ``OMNIPROF`` standing for ``python -m omniprof`` (in a child process
    with a timeout: a hang fails the test instead of stopping the campaign)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(["bash", "-c", cmd.replace("OMNIPROF", f'"{sys.executable}" -m omniprof')], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=timeout)


def test_named_pipe_without_writer_times_out(tmp_path, tally):
    """A FIFO nobody writes: refused after the wait of 10 s (before: ``report`` hung forever)."""
    os.mkfifo(tmp_path / "p.json")
    p = _cli("OMNIPROF report p.json -r json -o out", tmp_path)
    tally.check("FIFO without writer", "refused")
    assert p.returncode == 2 and "nothing was written to it within 10 s" in _one_error_line(p.stderr)


def test_named_pipe_with_writer_is_read(tmp_path, result_json, tally):
    """A FIFO written by another process (a gzipped result): read as the file would be (before: the
    format was detected from a first read, and the second open waited forever for a writer)."""
    os.mkfifo(tmp_path / "p.result.json.gz")
    (tmp_path / "r.gz").write_bytes(gzip.compress(json.dumps(result_json).encode()))
    p = _cli("(cat r.gz > p.result.json.gz &) ; OMNIPROF report p.result.json.gz -r json -o out", tmp_path)
    tally.check("FIFO with writer", "read")
    assert p.returncode == 0, p.stderr
    assert omniprof.load(tmp_path / "out" / "omniprof.result.json") == omniprof.ProfileResult.from_dict(result_json)


@pytest.mark.parametrize("how", ["/dev/stdin", "process substitution"])
def test_stdin_and_process_substitution(tmp_path, result_json, how, tally):
    """``cat r.json | omniprof report /dev/stdin`` and ``omniprof report <(cat r.json)``: read (before:
    "invalid JSON"), the result equal to the file's. A pipe: ``< r.json`` would make /dev/stdin
    the file itself, which read before too."""
    (tmp_path / "r.json").write_text(json.dumps(result_json))
    p = _cli("cat r.json | OMNIPROF report /dev/stdin -r json -o out" if how == "/dev/stdin"
             else "OMNIPROF report <(cat r.json) -r json -o out", tmp_path)
    tally.check(f"report {how}", "read" if p.returncode == 0 else "refused")
    assert p.returncode == 0, p.stderr
    assert omniprof.load(tmp_path / "out" / "omniprof.result.json") == omniprof.ProfileResult.from_dict(result_json)


def test_load_api_raises_trace_read_error(tmp_path, result_json):
    """``omniprof.load`` (the library) raises TraceReadError for the same inputs as the CLI."""
    path = tmp_path / "r.result.json"
    path.write_text(json.dumps(result_json).replace('"schema_version": ', '"label": ' + "9" * 5000
                                                      + ', "schema_version": ', 1))
    with pytest.raises(TraceReadError, match="4,300 digits"):
        omniprof.load(path)
    with pytest.raises(TraceReadError, match="character device"):
        omniprof.load("/dev/zero")


def test_bare_xplane_file_name_keeps_the_xprof_tables(tmp_path, monkeypatch, capsys, tally):
    """``omniprof report vm.xplane.pb`` from its own directory: the same tables as with the full path
    (before: every xprof tool failed with NOT_FOUND and four tables were lost)."""
    pytest.importorskip("jax")
    from tests.unit.backends.xla_helpers import write_gpu_xplane

    write_gpu_xplane(tmp_path / "vm.xplane.pb")
    from omniprof.core.readers import read_any

    full = read_any(tmp_path / "vm.xplane.pb")
    monkeypatch.chdir(tmp_path)
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bare = read_any("vm.xplane.pb")
    tally.check("bare xplane name", "tables kept")
    assert not [w for w in caught if "tool_failed" in str(w.message)]
    names = lambda r: sorted(t.name for t in r.parts[0].tables)  # noqa: E731
    assert names(bare) == names(full) and names(full)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("spans", {"name": "s", "track": "t", "start_ns": 10, "dur_ns": -5, "category": "", "args": {}, "flow_ids": []},
     "spans[0].dur_ns is -5, but a duration cannot be negative"),
    ("allocations", {"t_ns": 1, "size_bytes": -64, "stack_id": 0, "thread_id": None, "alive_at_end": False, "count": 1,
                     "type": None, "domain": None}, "allocations[0].size_bytes is -64, but a size cannot be negative"),
])
def test_negative_durations_and_sizes_refused_in_one_line(tmp_path, field, value, message):
    """A result file with a negative span duration or allocation size (speedscope refuses such
    files) is refused by omniprof report with one line naming the value; nothing is written."""
    good = omniprof.ProfileResult(parts=(omniprof.core.results.BackendResult(
        backend="cpu", frames=[omniprof.core.results.Frame("f", "f.py", 1)], stacks=[(0,)]),))
    data = good.to_dict()
    data["parts"][0][field] = [value]
    path = tmp_path / "neg.json"
    path.write_text(json.dumps(data))
    proc = subprocess.run([sys.executable, "-m", "omniprof", "report", str(path), "-r", "speedscope", "-o",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not list((tmp_path / "out").glob("*")) if (tmp_path / "out").exists() else True


def test_gzip_of_2m_spans_expanding_160_times_is_refused_in_bounded_memory(tmp_path, tally):
    """A 1.2 MB gzip of a result with 2 M spans (it expands 160 times, to 200 MB; its objects would
    take gigabytes): refused at the ratio bound (100) in one line, by a process limited to 1 GiB of
    address space. The old bound (200) let it through: 1.19 GB for such a file in the audit."""
    path = tmp_path / "spans.result.json.gz"
    with gzip.open(path, "wb", compresslevel=9) as gz:
        gz.write(b'{"schema_version": 2, "parts": [{"backend": "cpu", "spans": [')
        for start in range(0, 2_000_000, 200_000):
            rows = ",".join(f'{{"name": "s", "track": "t", "start_ns": {i % 50}, "dur_ns": 1, "category": "", '
                            f'"args": {{}}, "flow_ids": []}}' for i in range(start, start + 200_000))
            gz.write((("," if start else "") + rows).encode())
        gz.write(b"]}]}")
    with gzip.open(path) as f:
        ratio = sum(len(c) for c in iter(lambda: f.read(1 << 24), b"")) / path.stat().st_size
    assert 120 < ratio < 200  # between the new bound and the old one
    p = _limited(["report", str(path), "-r", "json", "-o", "out"], tmp_path, 1 << 30)
    tally.check("2 M spans gzipped 160x under 1 GiB", "refused")
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    line = _one_error_line(p.stderr)
    assert "expands more than 100 times" in line and "OMNIPROF_MAX_GZIP_RATIO" in line
