"""The json reporter: every kind of data a result holds, reloaded exactly."""

from __future__ import annotations

import gzip
import io
import json
import math

import attrs
import pytest

import omniprof
from omniprof.core.results import BackendResult, CounterSeries, ProfileResult
from omniprof.reporters.json import JsonOptions, JsonReporter
from omniprof.testing.conformance import ReporterConformance
from omniprof.testing.fakes import make_result


class TestJsonConformance(ReporterConformance):
    reporter_cls = JsonReporter


def _json(result: ProfileResult, **opts) -> bytes:
    buf = io.BytesIO()
    JsonReporter(JsonOptions(**opts)).report(result, buf)
    return buf.getvalue()


def test_every_field_of_every_kind_is_written():
    """Every attribute of the result and of every kind of record appears in the JSON."""
    data = json.loads(_json(make_result()))
    part = data["parts"][0]
    for field in attrs.fields(BackendResult):
        assert field.name in part, field.name
    kinds = ["tracks", "spans", "instants", "flows", "frames", "stacks", "threads", "tasks", "samples",
             "allocations", "counters", "tables", "losses", "artifacts"]
    assert all(part[k] for k in kinds), [k for k in kinds if not part[k]]
    assert set(part["summaries"]) == {"flops", "memory"}
    assert part["allocations"][0] == {"t_ns": 2_000_000, "size_bytes": 4096, "stack_id": 1, "thread_id": 1,
                                      "alive_at_end": True, "count": 1, "type": "bytearray", "domain": "obj"}


@pytest.mark.parametrize("which", ["full", "empty", "real"])
def test_reloads_exactly(which, cpu_result, tmp_path):
    """omniprof.load of the json report gives back an equal result (plain and gzipped)."""
    result = {"full": make_result(), "empty": make_result(empty=True), "real": cpu_result}[which]
    path = omniprof.report(result, "json", tmp_path / "r.json")
    assert omniprof.load(path) == result
    gz = omniprof.report(result, "json", tmp_path / "r.json.gz", options={"compress": True})
    assert gzip.decompress(gz.read_bytes())[:1] == b"{" and omniprof.load(gz) == result


def test_indent_option_pretty_prints():
    """indent=2 gives multi-line JSON with the same content."""
    compact, pretty = _json(make_result()), _json(make_result(), indent=2)
    assert b"\n" not in compact and b'\n  "metadata"' in pretty
    assert json.loads(compact) == json.loads(pretty)


def test_non_finite_counter_values_are_written_and_read_back():
    """NaN and infinite counter values (a sensor with no reading) are written as "nan"/"inf" and
    read back as floats, instead of failing the report."""
    part = BackendResult(backend="gpu", counters=(CounterSeries("power", "W", "gpu:0", (1, 2, 3),
                                                                (1.5, float("nan"), float("-inf"))),))
    data = _json(ProfileResult(parts=(part,)))
    assert json.loads(data)["parts"][0]["counters"][0]["values"] == [1.5, "nan", "-inf"]
    back = ProfileResult.from_dict(json.loads(data)).parts[0].counters[0].values
    assert back[0] == 1.5 and math.isnan(back[1]) and back[2] == float("-inf")
