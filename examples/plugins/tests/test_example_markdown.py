"""The example `markdown` reporter: omniprof's conformance suite plus its own behaviour."""

from __future__ import annotations

import pytest

pytest.importorskip("omniprof_example_plugins", reason="not installed: pip install -e examples/plugins")

import io

from omniprof.core.results import Table
from omniprof.testing import make_result
from omniprof.testing.conformance import ReporterConformance
from omniprof_example_plugins.markdown import MarkdownOptions, MarkdownReporter, sections, to_markdown


class TestMarkdownConformance(ReporterConformance):
    """Every check omniprof asks of a reporter, run against MarkdownReporter."""

    reporter_cls = MarkdownReporter


def test_sections_hold_functions_tables_summaries_and_counters():
    """The one-of-each result gives a function section led by the hottest function, and the op table."""
    secs = sections(make_result())
    titles = [s.title for s in secs]
    assert titles[0] == "omniprof run"
    assert "cpu: top functions by self time" in titles
    assert "cpu: Op statistics" in titles and "cpu: counters" in titles
    funcs = secs[titles.index("cpu: top functions by self time")]
    assert funcs.rows[0][0] == "helper"  # 5 of 10 samples end in helper
    assert any("samples_dropped" in n for n in secs[0].notes)


def test_max_rows_cuts_and_says_so():
    """max_rows=1 keeps one row per table and notes how many were left out."""
    secs = sections(make_result(), MarkdownOptions(max_rows=1))
    ops = next(s for s in secs if s.title == "cpu: Op statistics")
    assert len(ops.rows) == 1 and ops.notes == ("1 more rows not shown",)


def test_pipes_are_escaped_in_cells():
    """A '|' in a name cannot break the Markdown table."""
    r = make_result()
    part = r.parts[0].__class__(backend="x", tables=(Table("op_stats", ("name", "total_ns"), [("a|b", 1)]),))
    text = to_markdown(sections(r.evolve(parts=(part,))))
    assert "| a\\|b | 1 |" in text


def test_report_writes_utf8_markdown():
    """report() writes Markdown bytes with a level-1 heading first."""
    buf = io.BytesIO()
    MarkdownReporter().report(make_result(), buf)
    assert buf.getvalue().decode("utf-8").startswith("# omniprof run\n")
