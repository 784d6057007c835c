"""The table reporter: every kind of data shown, sized to the terminal; golden files."""

from __future__ import annotations

import io
import os
import re
from pathlib import Path

import pytest

import omniprof
from omniprof.core.results import (
    Artifact,
    BackendResult,
    CounterSeries,
    ErrorRecord,
    Instant,
    ProfileResult,
    Span,
    Table,
)
from omniprof.reporters.table import (
    TableOptions,
    TableReporter,
    allocation_rows,
    counter_rows,
    instant_rows,
    span_rows,
)
from omniprof.testing.conformance import ReporterConformance
from omniprof.testing.fakes import make_result

GOLDEN = Path(__file__).resolve().parents[2] / "golden"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


class TestTableConformance(ReporterConformance):
    reporter_cls = TableReporter


def _partial() -> ProfileResult:
    r = make_result()
    return r.evolve(partial=True, errors=(ErrorRecord("xla", "stop", "RuntimeError", "device lost"),))


def _render(result: ProfileResult, **opts) -> str:
    return TableReporter(TableOptions(color="never", width=100, **opts)).render(result)


@pytest.mark.parametrize("name, result", [("full", make_result()), ("empty", make_result(empty=True)),
                                          ("partial", _partial())], ids=["full", "empty", "partial"])
def test_golden(name, result):
    """The plain-text table of a fixed result matches tests/golden/table_<name>.txt
    (OMNIPROF_UPDATE_GOLDEN=1 rewrites the files after a reviewed change)."""
    text = TableReporter(TableOptions(color="never")).render(result)  # piped: no width, nothing cut
    path = GOLDEN / f"table_{name}.txt"
    if os.environ.get("OMNIPROF_UPDATE_GOLDEN") == "1":
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8")


def test_every_kind_of_data_is_shown():
    """Samples, spans, tables, summaries, counters, instants, flows, allocations, threads, tasks,
    artifacts, losses and errors each appear in the report."""
    text = _render(_partial())
    for needle in ["Call tree", "Flat (by self time", "Spans by total time", "gemm_kernel", "Op statistics",
                   "Flops summary", "Memory summary", "Counters", "gpu_utilization", "Instant events", "Flows: 1",
                   "Allocations: 2 objects", "Threads: 1 (MainThread); tasks: 1", "Artifacts", "/tmp/x.xplane.pb",
                   "3 samples not recorded", "! xla failed at stop: RuntimeError: device lost", "[PARTIAL]"]:
        assert needle in text, needle


def test_rows_are_plain_data():
    """Section rows are built as plain data before formatting."""
    part = make_result().parts[0]
    assert [(r.name, r.count, r.total_ns) for r in span_rows(part)] == [
        ("step 1", 1, 5_000_000), ("gemm_kernel", 1, 1_000_000), ("launch", 1, 100_000)]
    c = counter_rows(part)[0]
    assert (c.points, c.min, c.mean, c.max, c.last) == (2, 10.0, 50.0, 90.0, 90.0)
    assert [(r.name, r.count, r.first_ns) for r in instant_rows(part)] == [("gc", 1, 2_000_000)]
    assert [(r.count, r.size_bytes, r.in_use_bytes) for r in allocation_rows(part)] == [(2, 4224, 4096)]


def test_nan_counter_values_do_not_break_the_table():
    """A counter with NaN values shows statistics of the other values; an all-NaN one shows '-'."""
    part = BackendResult(backend="gpu", counters=(CounterSeries("p", "W", "c", (1, 2, 3), (1.0, float("nan"), 3.0)),
                                                  CounterSeries("q", "W", "c", (1,), (float("nan"),))))
    rows = counter_rows(part)
    assert (rows[0].min, rows[0].max, rows[0].points) == (1.0, 3.0, 3)
    assert rows[1].min is None
    assert "q" in _render(ProfileResult(parts=(part,)))


@pytest.mark.parametrize("width", [20, 40, 60, 80, 120, 200])
def test_numbers_stay_whole_and_names_give_way(width):
    """Numbers are never cut; a long name is elided in the middle (its start and end kept) only when
    it cannot fit, never below 24 characters; from 60 columns up every line fits the width."""
    long = "very_long_function_name_" * 7 + "END"
    r = make_result()
    part = r.parts[0]
    part = part.__class__(**{**{a.name: getattr(part, a.name) for a in part.__attrs_attrs__},
                             "spans": part.spans + (Span(long, "thread:1", 0, 7_000_000, "python"),)})
    text = TableReporter(TableOptions(color="never", width=width)).render(r.evolve(parts=(part,)))
    if width >= 60:
        assert all(len(line) <= width for line in text.splitlines()), text
    row = next(ln for ln in text.splitlines() if "very_long" in ln)
    assert row.split()[:5] == ["7.00", "ms", "1", "7.00", "ms"]  # figures as computed, whole
    name = row[row.index("very_long"):].strip()
    if len(long) + 60 <= width:
        assert name == long
    else:
        assert name.startswith("very_long_f") and name.endswith("END") and "…" in name
        assert len(name) >= 24
    for figure in ("10.00 ms", "100.00 us", "4.1 KiB", "2.000e+12"):
        assert figure in text


def test_piped_output_is_never_cut():
    """Without a width (piped output) the longest name is printed whole."""
    long = "x" * 400
    part = BackendResult(backend="x", spans=(Span(long, "t", 0, 5),))
    text = TableReporter(TableOptions(color="never")).render(ProfileResult(parts=(part,)))
    assert long in text and "…" not in text


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_terminal_gets_rich_tables_sized_to_columns(monkeypatch):
    """On a terminal the report uses rich (colour codes) and the terminal's width (COLUMNS)."""
    monkeypatch.setenv("COLUMNS", "72")
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    out = _Tty()
    omniprof.report(make_result(), "table", out)
    text = out.getvalue()
    assert ANSI.search(text), "no colour codes on a terminal"
    assert all(len(ANSI.sub("", ln)) <= 72 for ln in text.splitlines())
    assert "─" in text  # rich's table rule


def test_no_color_and_plain_streams_get_plain_text(monkeypatch):
    """NO_COLOR or a non-terminal stream gives plain text of the default 120 columns."""
    monkeypatch.setenv("NO_COLOR", "1")
    out = _Tty()
    omniprof.report(make_result(), "table", out)
    assert not ANSI.search(out.getvalue())
    plain = io.StringIO()
    omniprof.report(make_result(), "table", plain)
    assert not ANSI.search(plain.getvalue())


def test_max_rows_limits_every_list():
    """max_rows caps derived tables and span lists, and says how many there were."""
    part = BackendResult(backend="x", spans=tuple(Span(f"s{i}", "t", i, i + 1) for i in range(50)),
                         tables=(Table("op_stats", ("name", "total_ns"), [(f"op{i}", i) for i in range(50)], "Ops"),),
                         instants=tuple(Instant(f"i{i}", "t", i) for i in range(50)))
    text = _render(ProfileResult(parts=(part,)), max_rows=5)
    assert "Ops (top 5 of 50)" in text and "50 names, top 5" in text and "top 5 of 50 names" in text
    assert "s49" in text and "s0 " not in text


def test_artifacts_and_errors_alone():
    """A result with only an artifact and an error still reports both."""
    part = BackendResult(backend="xla", artifacts=(Artifact("xplane", "/p/x.xplane.pb", "XProf trace"),))
    r = ProfileResult(parts=(part,), partial=True, errors=(ErrorRecord("xla", "start", "OSError", "no device"),))
    text = _render(r)
    assert "/p/x.xplane.pb" in text and "XProf trace" in text and "no device" in text


def test_wide_derived_tables_hide_columns_instead_of_cutting_numbers():
    """A kernel_stats table too wide for the terminal leaves out its right-most columns, names
    them, and never cuts a number; headers drop the unit the cells already show."""
    from omniprof.formats.kernels import add_kernel_stats

    r = make_result()
    r = r.evolve(parts=(add_kernel_stats(r.parts[0]),))
    text = _render(r, format="flat")
    block = text.split("Kernel statistics")[1].split("\n\n")[0]
    assert "not shown at this width: " in block and "occupancy %" in block
    header = block.splitlines()[1]
    assert header.split()[:3] == ["kernel_name", "occurrences", "total"]
    assert "\u2026" not in block.splitlines()[3]
    wide = TableReporter(TableOptions(color="never", width=250)).render(r)
    assert "not shown" not in wide and "occupancy %" in wide


def test_an_error_that_says_nothing_is_named_once(capsys):
    """A bare ``raise KeyboardInterrupt`` read "KeyboardInterrupt: KeyboardInterrupt" (the empty
    message was filled with the type's name); an error with a message keeps ``Type: message``."""
    import omniprof

    for exc, line in ((KeyboardInterrupt(), "! workload failed at run: KeyboardInterrupt\n"),
                      (ValueError("bad value\nsecond line"), "! workload failed at run: ValueError: bad value\n")):
        with pytest.raises(type(exc)):
            with omniprof.Profiler(backend="cpu") as p:
                raise exc
        capsys.readouterr()
        omniprof.report(p.result, "table")
        out = capsys.readouterr().out
        assert line in out, out
        assert out.count(type(exc).__name__) == 1, out


def test_metadata_floats_are_shown_to_six_figures(capsys):
    """A float fact printed every digit of its binary value (``postprocess_s=0.28488091500003065``);
    six significant figures are what a reader can use."""
    import attrs

    import omniprof
    from omniprof.testing.fakes import make_result

    result = make_result()
    part = result.parts[0]
    part = attrs.evolve(part, metadata={**part.metadata, "ratio": 0.28488091500003065, "count": 7})
    omniprof.report(attrs.evolve(result, parts=(part, *result.parts[1:])), "table")
    out = capsys.readouterr().out
    assert "ratio=0.284881" in out and "count=7" in out, out
