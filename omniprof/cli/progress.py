"""Progress on long work (large trace reads in ``report`` and ``diff``, heap-snapshot assembly,
file reports such as the XProf conversion, XProf's start, ``collect`` waits): a rich spinner or
bar on a terminal, nothing when the stream is piped, under CI, or with ``OMNIPROF_NO_PROGRESS`` set.

The one helper of the CLI. The library layers never draw: a function with long work takes a
``progress`` callback, ``progress(done, total)``, and the CLI passes the bar's :meth:`Task.update`.
Work that ends within ``delay_s`` (0.3 s) draws nothing at all, so quick commands do not flicker.

>>> import io
>>> with progress("reading trace.json", stream=io.StringIO()) as task:
...     task(1)
...     task.update(5, 10)
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from typing import IO, Any

__all__ = ["progress", "shown", "Task", "DELAY_S"]

#: Work shorter than this draws nothing.
DELAY_S = 0.3


def shown(stream: IO[str] | None = None) -> bool:
    """Whether progress is drawn on ``stream`` (default stderr): a terminal, not CI, not switched off."""
    stream = stream if stream is not None else sys.stderr
    if os.environ.get("CI") or os.environ.get("OMNIPROF_NO_PROGRESS"):
        return False
    try:
        return bool(getattr(stream, "isatty", lambda: False)())
    except (OSError, ValueError):  # a closed stream
        return False


class Task:
    """What :func:`progress` yields. ``task(amount)`` advances by ``amount``; ``task.update(done,
    total)`` sets both (the shape of the library's ``progress`` callbacks). Does nothing when
    progress is not drawn."""

    def __init__(self, bar: Any = None, task_id: Any = None) -> None:
        self._bar = bar
        self._id = task_id

    def __call__(self, amount: float = 1.0) -> None:
        if self._bar is not None:
            self._bar.advance(self._id, amount)

    def update(self, done: float, total: float | None = None) -> None:
        if self._bar is not None:
            if total is not None:
                self._bar.update(self._id, completed=done, total=total)
            else:
                self._bar.update(self._id, completed=done)


@contextlib.contextmanager
def progress(description: str, total: float | None = None, *, stream: IO[str] | None = None,
             delay_s: float | None = None) -> Iterator[Task]:
    """Show ``description`` with a spinner (no total yet) or a bar (a total, given here or by
    :meth:`Task.update`) while the block runs, once it has run ``delay_s`` (default
    :data:`DELAY_S`); yields a :class:`Task`. The line is removed when the block ends (the work's
    own output stays)."""
    stream = stream if stream is not None else sys.stderr
    delay_s = DELAY_S if delay_s is None else delay_s
    if not shown(stream):
        yield Task()
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TaskProgressColumn, TextColumn, TimeElapsedColumn

    console = Console(file=stream, force_jupyter=False, highlight=False)
    columns = [SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn(), TaskProgressColumn(),
               TimeElapsedColumn()]
    # stderr written during the block prints above the bar; stdout is never taken over (it may be
    # a pipe while stderr is the terminal).
    bar = Progress(*columns, console=console, transient=True, redirect_stdout=False, redirect_stderr=True)
    task_id = bar.add_task(description, total=total)
    lock = threading.Lock()
    state = {"started": False, "done": False}

    def start() -> None:
        with lock:
            if not state["done"]:
                bar.start()
                state["started"] = True

    timer = threading.Timer(delay_s, start)
    timer.daemon = True
    if delay_s <= 0:
        start()
    else:
        timer.start()
    try:
        yield Task(bar, task_id)
    finally:
        timer.cancel()
        with lock:
            state["done"] = True
            if state["started"]:
                bar.stop()
