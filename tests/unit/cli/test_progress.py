"""Progress is drawn on a terminal only."""

from __future__ import annotations

import io

from omniprof.cli.progress import progress, shown


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_drawn_on_a_terminal_only(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("OMNIPROF_NO_PROGRESS", raising=False)
    tty, pipe = _Tty(), io.StringIO()
    for stream in (tty, pipe):
        with progress("reading big.json", total=4, stream=stream) as advance:
            for _ in range(4):
                advance(1)
    assert "reading big.json" in tty.getvalue()
    assert pipe.getvalue() == ""


def test_ci_and_switch_turn_it_off(monkeypatch):
    monkeypatch.setenv("CI", "true")
    assert not shown(_Tty())
    monkeypatch.delenv("CI")
    monkeypatch.setenv("OMNIPROF_NO_PROGRESS", "1")
    assert not shown(_Tty())
