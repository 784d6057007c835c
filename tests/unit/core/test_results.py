"""ProfileResult: exact round trips, JSON Schema validity, clear errors on bad files."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import jsonschema
import pytest

import omniprof
from omniprof.core.results import BackendResult, CounterSeries, ProfileResult, Span, json_safe
from omniprof.core.schema import result_schema
from omniprof.errors import InvalidArgumentError, TraceReadError
from omniprof.testing import make_result

SCHEMA_PATH = Path(__file__).resolve().parents[3] / "docs" / "schema" / "profile-result.schema.json"


def test_committed_schema_matches_classes():
    """docs/schema/profile-result.schema.json is the schema derived from the result classes."""
    assert json.loads(SCHEMA_PATH.read_text()) == result_schema()


@pytest.mark.parametrize("empty", [True, False])
def test_dict_round_trip_exact(empty):
    """to_dict/from_dict round-trips every kind of data exactly."""
    r = make_result(empty=empty)
    assert ProfileResult.from_dict(json.loads(r.to_json())) == r


@pytest.mark.parametrize("name", ["r.json", "r.json.gz"])
def test_save_load_round_trip(tmp_path, name):
    """save() then load() gives an equal result, plain or gzipped."""
    r = make_result()
    path = r.save(tmp_path / name)
    assert omniprof.load(path) == r
    if name.endswith(".gz"):
        assert path.read_bytes()[:2] == b"\x1f\x8b"


def test_real_result_validates_against_schema():
    """A real cpu-backend result validates against the JSON Schema."""
    with omniprof.Profiler(backend="cpu") as prof:
        sum(i * i for i in range(300_000))
    jsonschema.validate(json.loads(prof.result.to_json()), json.loads(SCHEMA_PATH.read_text()))


def test_fake_full_result_validates_against_schema():
    """The one-of-each result validates against the schema, and a corrupted one does not."""
    schema = json.loads(SCHEMA_PATH.read_text())
    data = json.loads(make_result().to_json())
    jsonschema.validate(data, schema)
    data["parts"][0]["samples"][0]["t_ns"] = "soon"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, schema)


def test_args_are_normalised_to_json():
    """Span args with tuples and non-finite floats are stored as JSON-safe values."""
    s = Span("k", "t", 0, 1, args={"grid": (1, 2, 3), "x": float("nan")})
    assert s.args == {"grid": [1, 2, 3], "x": "nan"}
    assert json_safe({1: (float("inf"),)}) == {"1": ["inf"]}


def test_counter_series_lengths_must_match():
    """A counter series with more timestamps than values is rejected."""
    with pytest.raises(InvalidArgumentError, match="2 timestamps but 1 values"):
        CounterSeries("c", "u", "t", (1, 2), (1.0,))


@pytest.mark.parametrize("content,fragment", [
    (b"", "invalid JSON at line 1 column 1"),
    (b'{"schema_version": 1, "parts": [', "invalid JSON"),
    (b"[1, 2]", "must be a JSON object"),
    (b'{"schema_version": 99}', "unsupported result schema_version 99"),
    (b'{"schema_version": 1, "parts": [{"backend": "cpu", "samples": [{"t_ns": "x"}]}]}', "malformed result"),
    (b'{"schema_version": 1, "bogus": 1}', "unknown field(s) ['bogus']"),
    (b"\xff\xfe\x00", "not UTF-8"),
    (b"\x1f\x8b\x08\x00garbage", "corrupt or truncated gzip"),
])
def test_load_bad_files_raise_trace_read_error(tmp_path, content, fragment):
    """Bad result files raise TraceReadError naming the file and the problem."""
    p = tmp_path / "bad.json"
    p.write_bytes(content)
    with pytest.raises(TraceReadError) as e:
        omniprof.load(p)
    assert fragment in str(e.value)
    assert str(p) in str(e.value)


def test_load_truncated_gzip(tmp_path):
    """A truncated gzipped result gives a clear error, not a traceback from gzip."""
    p = make_result().save(tmp_path / "r.json.gz")
    p.write_bytes(p.read_bytes()[:-20])
    with pytest.raises(TraceReadError, match="gzip"):
        omniprof.load(p)


def test_load_missing_file(tmp_path):
    """A missing file is a TraceReadError naming it."""
    with pytest.raises(TraceReadError, match="no such file or directory: .*nope.json"):
        omniprof.load(tmp_path / "nope.json")


def test_save_is_atomic_on_failure(tmp_path, monkeypatch):
    """If writing fails midway, the previous file stays intact and no temp file is left."""
    r = make_result()
    target = tmp_path / "r.json"
    target.write_text("previous")

    def boom(self, *a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("os.fsync", lambda fd: boom(None))
    with pytest.raises(OSError, match="the disk is full"):
        r.save(target)
    assert target.read_text() == "previous"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_part_lookup_names_available_parts():
    """result.part() of a missing backend names the parts there are."""
    r = ProfileResult(parts=(BackendResult(backend="cpu"),))
    with pytest.raises(KeyError, match="parts: cpu"):
        r.part("xla")


def test_gzip_save_is_deterministic(tmp_path):
    """Saving the same result twice gives identical bytes (no timestamps in gzip headers)."""
    r = make_result()
    a = r.save(tmp_path / "a.json.gz").read_bytes()
    b = r.save(tmp_path / "b.json.gz").read_bytes()
    assert a == b and gzip.decompress(a)
