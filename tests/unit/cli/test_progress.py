"""Progress is drawn on a terminal only, only for work that lasts, and never takes stdout over."""

from __future__ import annotations

import io
import sys
import time

from omniprof.cli.progress import progress, shown


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _clean(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("OMNIPROF_NO_PROGRESS", raising=False)


def test_drawn_on_a_terminal_only(monkeypatch):
    _clean(monkeypatch)
    tty, pipe = _Tty(), io.StringIO()
    for stream in (tty, pipe):
        with progress("reading big.json", total=4, stream=stream, delay_s=0) as advance:
            for _ in range(4):
                advance(1)
    assert "reading big.json" in tty.getvalue() and "100%" in tty.getvalue()
    assert pipe.getvalue() == ""


def test_a_library_callback_sets_done_and_total(monkeypatch):
    """task.update(done, total) is the shape of assemble_snapshot's progress callback: the bar
    learns its total from it."""
    _clean(monkeypatch)
    tty = _Tty()
    with progress("assembling x", stream=tty, delay_s=0) as task:
        task.update(30, 120)
        time.sleep(0.25)  # one refresh (10 per second) at 25%
        task.update(120, 120)
    assert "25%" in tty.getvalue() and "assembling x" in tty.getvalue()


def test_quick_work_draws_nothing(monkeypatch):
    """Work that ends before the delay (0.3 s by default) draws nothing: no flicker."""
    _clean(monkeypatch)
    tty = _Tty()
    with progress("reading small.json", stream=tty) as task:
        task(1)
    time.sleep(0.4)  # the timer that would have started it has been cancelled
    assert tty.getvalue() == ""


def test_stdout_is_never_taken_over(monkeypatch):
    """While the bar is on stderr, what is printed to stdout (perhaps a pipe) stays on stdout."""
    _clean(monkeypatch)
    tty, out = _Tty(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    with progress("working", stream=tty, delay_s=0):
        print("a line of the report")
    assert out.getvalue() == "a line of the report\n" and "a line of the report" not in tty.getvalue()


def test_ci_and_switch_turn_it_off(monkeypatch):
    monkeypatch.setenv("CI", "true")
    assert not shown(_Tty())
    monkeypatch.delenv("CI")
    monkeypatch.setenv("OMNIPROF_NO_PROGRESS", "1")
    assert not shown(_Tty())
