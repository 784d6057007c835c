"""Every ```python block in docs/ and README.md runs, page by page, in a fresh namespace.

A block preceded by the line ``<!-- no-run -->`` is skipped (use sparingly: for code that needs a
GPU or a remote host). Blocks of one page share a namespace, in order, so a page reads as a session.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([*ROOT.joinpath("docs").rglob("*.md"), ROOT / "README.md"])
BLOCK = re.compile(r"(?P<pre><!-- no-run -->\s*\n)?```python\n(?P<code>.*?)```", re.S)


def _blocks(page: Path) -> list[str]:
    return [m.group("code") for m in BLOCK.finditer(page.read_text(encoding="utf-8")) if not m.group("pre")]


@pytest.mark.parametrize("page", [p for p in PAGES if _blocks(p)], ids=lambda p: str(p.relative_to(ROOT)))
def test_doc_examples_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The page's Python examples run without error (in a temporary working directory)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMNIPROF_DOCS_TEST", "1")
    ns: dict[str, object] = {"__name__": "__docs__"}
    for i, code in enumerate(_blocks(page)):
        try:
            exec(compile(code, f"{page.name}[block {i}]", "exec"), ns)
        except Exception as e:  # pragma: no cover - failure path
            said = "".join(f"\n{what}:\n{text}" for what in ("stdout", "stderr")
                           if isinstance(text := getattr(e, what, None), str) and text)  # a subprocess's own words
            pytest.fail(f"{page.relative_to(ROOT)} block {i} failed: {type(e).__name__}: {e}{said}\n{code}")


def test_readme_quickstart_has_two_commands() -> None:
    """The README's quick start is exactly two commands (.ci/run runs them)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("<!-- quickstart:begin -->")[1].split("<!-- quickstart:end -->")[0]
    lines = [ln for ln in block.strip().splitlines() if not ln.startswith("```")]
    assert len(lines) == 2
    assert "torch==2.13.0" in lines[0] and "omniprof run examples/" in lines[0]
    assert "pytest" in lines[1]
