"""One result with overlapping, nested and cross-thread spans: every view gives each name the same
self time, the one the nesting rule of docs/architecture.md gives, computed here by hand.

Each writer's output is read back by its real reader where the suite has one (``go tool pprof``
for pprof; speedscope's file format, whose evented profiles speedscope turns into self time by
the frame on top of the stack; the collapsed format, whose weight is the leaf frame's), and the
op tables (torch's and XProf's) and ``omniprof diff`` are read as a user reads them.
"""

from __future__ import annotations

import io
import json

import attrs

import omniprof
from omniprof.analysis.torch_ops import op_stats_table
from omniprof.core.results import BackendResult, ProfileResult, Span, Track
from omniprof.analysis import xla_ops
from omniprof.reporters.collapsed import CollapsedOptions, CollapsedReporter
from tests.unit.reporters.test_pprof import _top

MS = 1_000_000


def _spans(category: str) -> tuple[Span, ...]:
    def s(name: str, track: str, start_ms: int, end_ms: int) -> Span:
        return Span(name, track, start_ms * MS, (end_ms - start_ms) * MS, category)

    return (
        # thread 1: B overlaps A without nesting in it; C is inside both, and B is the innermost open
        s("A", "t1", 0, 10), s("B", "t1", 5, 15), s("C", "t1", 6, 8),
        # thread 1: plain nesting three deep
        s("D", "t1", 20, 40), s("E", "t1", 22, 30), s("F", "t1", 25, 28),
        # thread 2: A again, with a child; nothing nests across threads
        s("A", "t2", 0, 7), s("G", "t2", 1, 3),
    )


#: By hand. t1: A 10 (B is not inside A; C is inside B), B 15-5-2 = 8, C 2, D 20-8 = 12, E 8-3 = 5,
#: F 3. t2: A 7-2 = 5, G 2.
EXPECTED_MS = {"A": 15, "B": 8, "C": 2, "D": 12, "E": 5, "F": 3, "G": 2}


def _result(category: str = "cpu_op") -> ProfileResult:
    part = BackendResult(backend="torch", tracks=(Track("t1", "thread 1"), Track("t2", "thread 2")),
                         spans=_spans(category), start_ns=0, end_ns=40 * MS)
    return ProfileResult(parts=(part,))


def _ms(by_name: dict[str, int]) -> dict[str, float]:
    return {k: v / MS for k, v in by_name.items() if v}


def test_op_tables_and_diff():
    table = op_stats_table(_result().parts[0].spans)
    assert _ms({r["name"]: r["self_ns"] for r in table.records()}) == EXPECTED_MS
    xla = xla_ops.op_stats_rows(_spans("xla_op"))
    assert _ms({r["name"]: r["self_ns"] for r in xla}) == EXPECTED_MS
    r = _result()
    r = attrs.evolve(r, parts=(attrs.evolve(r.parts[0], tables=(table,)),))
    d = omniprof.diff(r, r)
    ops = next(t for t in d.tables if t.name == "op_stats")
    assert _ms({row.key: row.a_ns for row in ops.rows if row.key != "(total)"}) == EXPECTED_MS


def test_pprof_read_by_go_tool_pprof(go_pprof, run_tool, tmp_path):
    path = omniprof.report(_result(), "pprof", tmp_path / "s.pb.gz", options={"source": "spans"})
    flat = {name: self_ns for name, (self_ns, _) in _top(go_pprof, run_tool, path).items()}
    assert _ms(flat) == EXPECTED_MS


def test_collapsed_leaf_weights():
    buf = io.BytesIO()
    CollapsedReporter(CollapsedOptions(source="spans")).report(_result(), buf)
    got: dict[str, int] = {}
    for line in buf.getvalue().decode().splitlines():
        stack, weight = line.rsplit(" ", 1)
        leaf = stack.split(";")[-1]
        got[leaf] = got.get(leaf, 0) + int(weight)
    assert _ms(got) == EXPECTED_MS


def test_speedscope_evented_self_time(speedscope_schema, tmp_path):
    import jsonschema

    from tests.unit.reporters.test_speedscope import check_importable

    path = omniprof.report(_result(), "speedscope", tmp_path / "s.speedscope.json")
    doc = json.loads(path.read_text())
    jsonschema.validate(doc, speedscope_schema)
    check_importable(doc)
    frames = doc["shared"]["frames"]
    got: dict[str, int] = {}
    for prof in doc["profiles"]:
        if prof["type"] != "evented":
            continue
        stack: list[int] = []
        last = prof["startValue"]
        for e in prof["events"]:  # speedscope's self time: the time a frame is on top of the stack
            if stack:
                name = frames[stack[-1]]["name"]
                got[name] = got.get(name, 0) + e["at"] - last
            last = e["at"]
            if e["type"] == "O":
                stack.append(e["frame"])
            else:
                stack.pop()
    assert _ms(got) == EXPECTED_MS
