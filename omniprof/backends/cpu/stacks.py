"""Stack sources: where the sampler's stacks come from, in a cheap raw form.

A stack source is a callable returning ``[(thread_id, raw_stack), ...]``. A *raw stack* is a flat
tuple, **leaf first**, of ``(code_key, offset)`` pairs laid out as ``(k0, o0, k1, o1, ...)``:

* for real Python frames ``code_key`` is ``id(code)`` and ``offset`` the frame's ``f_lasti``
  (its bytecode offset, Julia's "instruction pointer"). Both are ints, so hashing a stack is one C
  loop; code objects are kept alive in a side table (:class:`CodeTable`) so an id is never
  reused while the buffer holds it. Offsets are turned into line numbers only at export
  (``f_lineno`` scans the line table on every read; ``f_lasti`` is a field read).
* synthetic sources used by tests may use any hashable ``code_key`` (``"func@file"`` strings or
  :class:`~omniprof.core.results.Frame` objects) with the line number as ``offset``.

Raw frames are resolved to portable :class:`~omniprof.core.results.Frame` values once, at export,
by :func:`resolve_stack`.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterable
from types import CodeType, FrameType
from typing import Any

from omniprof.core.results import Frame

__all__ = ["RawStack", "StackSource", "CodeTable", "python_stacks", "walk", "walk_python", "resolve_stack",
           "resolve_frame", "StackCut", "NO_CUT", "GC_KEY", "line_of", "FAST_WALK"]

RawStack = tuple[Any, ...]
StackSource = Callable[[], Iterable[tuple[int, RawStack]]]

#: ``code_key`` of the pseudo-frame standing for a garbage collection (offset = generation).
GC_KEY = 0

class StackCut:
    """Where stacks are cut: at these code objects, which are left out with their callers.

    The runner (``omniprof run``) hands its Profiler the frames that hand over to the target
    (``runpy``'s ``_run_code``, the runner's ``call_function``: ``Profiler(launcher_codes=...)``,
    passed to every backend in ``BackendContext.launcher_codes``), so the stacks of that session
    start at the target's ``<module>`` or function. It travels with the session: a Profiler made
    without it (in user code, beside or after a run) cuts nothing. Applied at export, not in the
    hot path. Frames recorded out of process (py-spy's) match by function name and file; py-spy
    shortens files to their path below a ``sys.path`` entry, so a relative file matches the end
    of the code's.
    """

    __slots__ = ("codes", "ids", "names")

    def __init__(self, codes: Iterable[CodeType] = ()) -> None:
        self.codes: tuple[CodeType, ...] = tuple(codes)
        self.ids: frozenset[int] = frozenset(id(c) for c in self.codes)
        #: function name -> the files of the cut's code objects of that name
        self.names: dict[str, tuple[str, ...]] = {}
        for c in self.codes:
            self.names[c.co_name] = (*self.names.get(c.co_name, ()), c.co_filename)

    def __bool__(self) -> bool:
        return bool(self.codes)

    def __repr__(self) -> str:
        return f"StackCut({[c.co_name for c in self.codes]})"

    def hit(self, key: Any) -> bool:
        """Whether a raw frame key (``id(code)``, a code object or a :class:`Frame`) is a cut point."""
        if isinstance(key, int):
            return key in self.ids
        if isinstance(key, CodeType):
            return id(key) in self.ids
        if isinstance(key, Frame):
            return self.hit_frame(key)
        return False

    def hit_frame(self, frame: Frame) -> bool:
        """Whether a frame recorded out of process is one of the cut's code objects."""
        files = self.names.get(frame.name)
        if not files:
            return False
        f = frame.file
        return f in files or (bool(f) and not os.path.isabs(f) and any(x.endswith(os.sep + f) for x in files))


#: No cut: every frame kept.
NO_CUT = StackCut()


class CodeTable:
    """``id(code) -> code`` for every code object seen, so ids stay valid (never reused)."""

    def __init__(self) -> None:
        self.codes: dict[int, CodeType] = {}

    def register(self, frame: FrameType | None) -> None:
        codes = self.codes
        for code in _codes(frame):
            codes.setdefault(id(code), code)

    def clear(self) -> None:
        self.codes.clear()


def walk_python(frame: FrameType | None) -> RawStack:
    """Leaf-first flat ``(id(code), f_lasti, ...)`` tuple of ``frame`` and its callers."""
    out: list[int] = []
    app = out.append
    while frame is not None:
        app(id(frame.f_code))
        app(frame.f_lasti)
        frame = frame.f_back
    return tuple(out)


def _codes_python(frame: FrameType | None) -> list[CodeType]:
    out = []
    while frame is not None:
        out.append(frame.f_code)
        frame = frame.f_back
    return out


try:  # the C walk reads the interpreter's frames in place (CPython 3.11/3.12), ~8x faster
    if os.environ.get("OMNIPROF_NO_FASTWALK"):
        raise ImportError("OMNIPROF_NO_FASTWALK is set")
    from omniprof.backends.cpu import _fastwalk

    walk: Callable[[FrameType | None], RawStack] = _fastwalk.walk
    _codes: Callable[[FrameType | None], list[CodeType]] = _fastwalk.codes
    _fastwalk.walk(sys._getframe())
    FAST_WALK = True
except (ImportError, NotImplementedError):
    walk = walk_python
    _codes = _codes_python
    FAST_WALK = False

#: The C walk keeps the innermost ``WALK_MAX_DEPTH`` frames of a deeper stack (the Python walk
#: keeps all); :func:`walks_truncated` counts the walks it cut.
WALK_MAX_DEPTH: int | None = getattr(_fastwalk, "MAX_DEPTH", None) if FAST_WALK else None


def walks_truncated() -> int:
    """How many stacks the C walk has cut at ``WALK_MAX_DEPTH`` frames in this process so far."""
    return int(_fastwalk.truncated()) if FAST_WALK and hasattr(_fastwalk, "truncated") else 0


def python_stacks(exclude: Callable[[], Iterable[int]] = tuple, main_frame: Callable[[], FrameType | None] | None = None,
                  rescan_every: int = 64) -> StackSource:
    """The real source: ``(thread_id, frame)`` for every Python thread (the sampler walks the frames).

    Args:
        exclude: returns thread ids not to sample (the sampler's own thread).
        main_frame: when sampling from a signal handler, returns the interrupted frame of the main
            thread (its ``_current_frames`` entry would be the handler itself). Then, while the
            ``threading`` module knows only the main thread, ``sys._current_frames()`` is skipped
            (it builds a dict of every thread's frame) except once every ``rescan_every`` ticks, to
            catch threads started outside ``threading`` (their samples are then weighted by the
            time since their previous one, so their time is still accounted).
    """
    main_id = threading.main_thread().ident
    active = threading._active  # type: ignore[attr-defined]
    limbo = threading._limbo  # type: ignore[attr-defined]
    tick = [0]

    def source() -> list[tuple[int, Any]]:
        if main_frame is not None and len(active) == 1 and not limbo:
            tick[0] += 1
            if tick[0] % rescan_every:
                return [(main_id, main_frame())]
        return _all()

    def _all() -> list[tuple[int, Any]]:
        skip = exclude()
        out = []
        for tid, frame in sys._current_frames().items():
            if tid in skip:
                continue
            if main_frame is not None and tid == main_id:
                frame = main_frame()
            out.append((tid, frame))
        return out

    return source


_line_cache: dict[tuple[int, int], tuple[CodeType, int]] = {}


def line_of(code: CodeType, offset: int) -> int:
    """Source line of bytecode ``offset`` in ``code`` (``co_firstlineno`` when unknown)."""
    key = (id(code), offset)
    hit = _line_cache.get(key)
    if hit is not None and hit[0] is code:
        return hit[1]
    line = 0
    for start, end, ln in code.co_lines():
        if start <= offset < end:
            line = ln or 0
            break
    line = line or code.co_firstlineno or 0
    if len(_line_cache) > 200_000:
        _line_cache.clear()
    _line_cache[key] = (code, line)
    return line


def _resolve_one(key: Any, offset: int, codes: dict[int, CodeType], offsets: bool = True) -> Frame | None:
    if key == GC_KEY and not isinstance(key, bool):
        return Frame(name=f"<gc gen {offset}>", kind="gc")
    if isinstance(key, int):
        code = codes.get(key)
        if code is None:
            return Frame(name="<unknown code>", line=0)
        name = getattr(code, "co_qualname", code.co_name)
        return Frame(name=name, file=code.co_filename, line=line_of(code, offset), offset=offset if offsets else None)
    if isinstance(key, Frame):
        return key
    if isinstance(key, str):  # synthetic stacks: ("func", line) or ("func@file", line)
        name, _, file = key.partition("@")
        return Frame(name=name, file=file, line=int(offset or 0))
    return Frame(name=str(key), line=int(offset or 0))


def resolve_stack(raw: RawStack, codes: dict[int, CodeType], memo: dict[tuple[Any, int], Frame],
                  offsets: bool = True, cut: StackCut = NO_CUT) -> list[Frame]:
    """Root-first frames of a raw (leaf-first) stack, cut at ``cut`` (see :class:`StackCut`). With
    ``offsets=False`` frames keep no bytecode offset, so frames on one line are one frame."""
    frames: list[Frame] = []
    ids, names = cut.ids, cut.names
    for i in range(0, len(raw), 2):
        key, off = raw[i], raw[i + 1]
        if ids and isinstance(key, int) and key in ids:
            break
        if names and isinstance(key, Frame) and cut.hit_frame(key):
            break
        mk = (key, off)
        fr = memo.get(mk)
        if fr is None:
            fr = memo[mk] = _resolve_one(key, off, codes, offsets)  # type: ignore[assignment]
        frames.append(fr)  # type: ignore[arg-type]
    frames.reverse()
    return frames


def resolve_frame(raw: Any) -> Frame:
    """A ``(code, line_number)`` pair (or a synthetic ``("func@file", line)``) as a portable
    :class:`Frame`. Kept for other backends that record their own ``(code, line)`` pairs."""
    if isinstance(raw, Frame):
        return raw
    code, line = raw
    if isinstance(code, CodeType):
        name = getattr(code, "co_qualname", code.co_name)
        return Frame(name=name, file=code.co_filename, line=int(line or code.co_firstlineno or 0))
    if isinstance(code, str):
        name, _, file = code.partition("@")
        return Frame(name=name, file=file, line=int(line or 0))
    return Frame(name=str(code), line=int(line or 0))
