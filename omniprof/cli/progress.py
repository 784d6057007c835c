"""Progress on long work (large trace reads, ``collect`` waits): a rich spinner or bar on a
terminal, nothing when the stream is piped, under CI, or with ``OMNIPROF_NO_PROGRESS`` set.

>>> import io
>>> with progress("reading trace.json", stream=io.StringIO()) as advance:
...     advance(1)
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import IO

__all__ = ["progress", "shown"]


def shown(stream: IO[str] | None = None) -> bool:
    """Whether progress is drawn on ``stream`` (default stderr): a terminal, not CI, not switched off."""
    stream = stream if stream is not None else sys.stderr
    if os.environ.get("CI") or os.environ.get("OMNIPROF_NO_PROGRESS"):
        return False
    return bool(getattr(stream, "isatty", lambda: False)())


@contextlib.contextmanager
def progress(description: str, total: float | None = None, *, stream: IO[str] | None = None
             ) -> Iterator[Callable[[float], None]]:
    """Show ``description`` with a spinner (``total`` None) or a bar while the block runs; yields
    ``advance(amount)``. The line is removed when the block ends (the work's own output stays)."""
    stream = stream if stream is not None else sys.stderr
    if not shown(stream):
        yield lambda amount=1.0: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = Console(file=stream, force_jupyter=False, highlight=False)
    columns = [SpinnerColumn(), TextColumn("{task.description}")]
    if total is not None:
        columns.append(BarColumn())
    columns.append(TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda amount=1.0: bar.advance(task, amount)
