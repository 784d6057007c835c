"""What decides how a session may stop: the thread that stops it, and whether the program failed."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from omniprof.core.results import ErrorRecord
from omniprof.errors import ProfilerStateError

__all__ = ["check_stop_thread", "workload_failed"]


def check_stop_thread(classes: Mapping[str, Any], started: threading.Thread) -> None:
    """Refuse a stop from another thread than ``started`` when a backend cannot be stopped there
    (``Backend.stop_any_thread`` False: torch's profiler crashed the process, issue 31 F3)."""
    bound = [n for n, c in classes.items() if not getattr(c, "stop_any_thread", True)]
    if bound and threading.current_thread() is not started:
        raise ProfilerStateError(f"backend {bound[0]!r} must be stopped from the thread that started it "
                                 f"({started.name!r}); call stop() there (the session is still recording)")


def workload_failed(errors: Sequence[ErrorRecord]) -> bool:
    """Whether the profiled program raised in this window (recorded by ``Profiler.__exit__``): a
    distributed rank then waits on no other rank at stop (issue 31 F8)."""
    return any(e.source == "workload" for e in errors)
