"""Stack sources: where the sampler's stacks come from.

A stack source is a callable returning ``[(thread_id, raw_stack), ...]`` where ``raw_stack`` is a
tuple of hashable raw frames, root first. The real source reads ``sys._current_frames()``; tests
pass synthetic ones. Raw frames are resolved to :class:`~omniprof.core.results.Frame` only once,
at the end, by :func:`resolve_frame`.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable
from types import CodeType, FrameType
from typing import Any

from omniprof.core.results import Frame

__all__ = ["RawStack", "StackSource", "python_stacks", "walk", "resolve_frame"]

RawStack = tuple[Any, ...]
StackSource = Callable[[], Iterable[tuple[int, RawStack]]]


# Code objects at which a walk stops (exclusive): the CLI registers runpy's frame that runs the
# target, so reports start at the target's ``<module>`` instead of omniprof's own launcher frames.
_root_cut: frozenset[CodeType] = frozenset()


def set_root_cut(codes: Iterable[CodeType]) -> None:
    """Stop stack walks at these code objects (they and their callers are left out)."""
    global _root_cut
    _root_cut = frozenset(codes)


def walk(frame: FrameType | None) -> RawStack:
    """Root-first ``(code, lineno)`` pairs of ``frame`` and its callers (up to a root cut)."""
    out = []
    cut = _root_cut
    while frame is not None:
        code = frame.f_code
        if code in cut:
            break
        out.append((code, frame.f_lineno))
        frame = frame.f_back
    out.reverse()
    return tuple(out)


def python_stacks(exclude: Callable[[], Iterable[int]] = tuple, main_frame: Callable[[], FrameType | None] | None = None
                  ) -> StackSource:
    """The real source: every Python thread's stack, from ``sys._current_frames()``.

    Args:
        exclude: returns thread ids not to sample (the sampler's own thread).
        main_frame: when sampling from a signal handler, returns the interrupted frame of the main
            thread (its ``_current_frames`` entry would be the handler itself).
    """
    main_id = threading.main_thread().ident

    def source() -> list[tuple[int, RawStack]]:
        skip = set(exclude())
        frames = sys._current_frames()
        out = []
        for tid, frame in frames.items():
            if tid in skip:
                continue
            if main_frame is not None and tid == main_id:
                frame = main_frame()
            out.append((tid, walk(frame)))
        return out

    return source


def resolve_frame(raw: Any) -> Frame:
    """Turn a raw frame into a portable :class:`Frame` (function, file, line)."""
    if isinstance(raw, Frame):
        return raw
    code, line = raw
    if isinstance(code, CodeType):
        name = getattr(code, "co_qualname", code.co_name)
        module = None
        return Frame(name=name, file=code.co_filename, line=int(line or code.co_firstlineno or 0), module=module)
    if isinstance(code, str):  # synthetic stacks: ("func", line) or ("func@file", line)
        name, _, file = code.partition("@")
        return Frame(name=name, file=file, line=int(line or 0))
    return Frame(name=str(code), line=int(line or 0))
