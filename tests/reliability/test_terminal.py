"""Names from untrusted traces never reach the terminal raw: ``report`` and ``diff`` show control
characters escaped (no screen clear, no title change, no fake table rows)."""

from __future__ import annotations

import json
import re

import omniprof
from omniprof.cli import main
from omniprof.core.results import BackendResult, Frame, ProfileResult, Span, StackSample, Track

HOSTILE = ["\x1b[2J\x1b[Hcleared", "\x1b]0;pwned title\x07", "fake\nrow  100%", "bell\x07\x08\x7f", "rtl\u202eexe.txt",
           "c1\x9b31m"]
# Any C0/C1 control character or bidi override in what is printed.
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _trace(path, scale: int) -> None:
    spans = [Span(name, "t", i * 1000, 500 * scale * (i + 1), category="op") for i, name in enumerate(HOSTILE)]
    frames = [Frame(name, file=f"/src/{name}.py", line=1) for name in HOSTILE]
    samples = [StackSample(i * 1000, 1, i, 1_000_000 * scale * (i + 1)) for i in range(len(HOSTILE))]
    part = BackendResult(backend="cpu", tracks=[Track("t", "thread \x1b[31mred")], spans=spans, frames=frames,
                         stacks=[(i,) for i in range(len(HOSTILE))], samples=samples)
    r = ProfileResult(parts=(part,))
    r.save(path)


def test_report_and_diff_escape_control_characters(tmp_path, capsys, tally):
    _trace(tmp_path / "a.json", 1)
    _trace(tmp_path / "b.json", 3)
    assert main(["report", str(tmp_path / "a.json"), "-r", "table"]) == 0
    report = capsys.readouterr().out
    assert main(["diff", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--min-share-pct", "0"]) == 0
    diff = capsys.readouterr().out
    tally.check("escape sequences in names", "escaped")
    for text in (report, diff):
        assert not RAW.search(text), RAW.search(text)
        assert "\\x1b[2J\\x1b[Hcleared" in text and "fake\\nrow" in text and "rtl\\u202eexe.txt" in text
    # one line per name: the newline in a name made no row of its own
    assert not any(line.startswith("row  100%") for line in (report + diff).splitlines())
    # the JSON report keeps the names exactly
    assert main(["report", str(tmp_path / "a.json"), "-r", "json", "-o", str(tmp_path / "out")]) == 0
    data = json.loads((tmp_path / "out" / "omniprof.result.json").read_text(encoding="utf-8"))
    assert [s["name"] for s in data["parts"][0]["spans"]] == HOSTILE
    assert omniprof.load(tmp_path / "out" / "omniprof.result.json") == omniprof.load(tmp_path / "a.json")
