"""One call tree for every stack report: weighted stacks, small pure filters, tree and flat rows.

Every report of stack-shaped data (the ``table`` reporter, ``omniprof.cpu.print``, allocation
reports, ``diff``) goes through the same three steps:

1. :func:`sample_stacks` / :func:`allocation_stacks`: the part's samples (or allocations)
   aggregated by (thread, task, stack) into :class:`Stack` records: root-first frames, a count and
   a weight (ns for samples, bytes or objects for allocations). O(samples), in C (``Counter``).
2. Filters, each ``list[Stack] -> list[Stack]`` with no side effects, in the style of
   pyinstrument's processors: :func:`drop_native`, :func:`merge_frames` (by function, by line or
   by bytecode offset), :func:`cut_own_frames`, :func:`hide_idle`, :func:`fold_recursion`,
   :func:`only`. Filters work on distinct stacks, never on single samples.
3. Aggregation: :func:`build_tree` then :func:`tree_rows`, or :func:`flat_rows`; :func:`by_thread`
   groups stacks per thread (busy first, idle threads marked).

One label rule for frames (:func:`frame_label`, :func:`frame_where`, :func:`short_path`).

>>> from omniprof.core.results import Frame
>>> m, f = Frame("main", "app.py", 3), Frame("f", "app.py", 9)
>>> stacks = [Stack((m, f, f, f), 2, 20), Stack((m,), 1, 10)]
>>> [(r.depth, r.frame.name, r.total_ns) for r in tree_rows(build_tree(fold_recursion(stacks)))]
[(0, 'main', 30), (1, 'f', 20)]
"""

from __future__ import annotations

import functools
import math
import os
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

from omniprof.core.results import BackendResult, Frame

__all__ = [
    "Stack", "Node", "TreeRow", "FlatRow", "ThreadGroup", "sample_stacks", "allocation_stacks", "drop_native",
    "merge_frames", "cut_own_frames", "hide_idle", "fold_recursion", "only", "is_idle", "build_tree",
    "tree_rows", "flat_rows", "flat_profile", "report_stacks", "by_thread", "frame_label", "frame_where", "short_path", "SORTS",
]

SORTS = ("time", "count", "overhead", "self_time", "filefuncline")


@attrs.frozen
class Stack:
    """One distinct stack and what it weighs.

    Attributes:
        frames: root first.
        count: how many samples (or allocations) had this stack.
        weight: their summed weight (ns for samples; bytes or objects for allocations).
        thread_id, task_id: where they were taken (None when unknown or not grouped).
    """

    frames: tuple[Frame, ...]
    count: int
    weight: int
    thread_id: int | None = None
    task_id: int | None = None


@attrs.frozen
class TreeRow:
    """One call-tree row: ``depth`` (0 = root frames), ``count``/``self_count`` (samples in which
    the node is on the path / the leaf), the same as weights (``total_ns``/``self_ns`` for samples)
    and the frame."""

    depth: int
    count: int
    self_count: int
    total_ns: int
    self_ns: int
    frame: Frame
    idle: bool = False


@attrs.frozen
class FlatRow:
    """One flat row: samples in which the frame appears (once per sample, even when it recurs),
    samples in which it is the leaf, and the same as weights."""

    frame: Frame
    count: int
    self_count: int
    total_ns: int
    self_ns: int
    idle: bool = False


# -- labels ---------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _prefixes() -> tuple[str, ...]:
    """The library directories, longest first (read on first use: sysconfig is not imported with
    this module)."""
    import sysconfig

    out = []
    for key in ("purelib", "platlib", "stdlib", "platstdlib"):
        try:
            p = sysconfig.get_paths().get(key)
        except Exception:  # pragma: no cover - broken sysconfig
            p = None
        if p:
            out.append(os.path.normpath(p) + os.sep)
    return tuple(sorted(set(out), key=len, reverse=True))


def short_path(path: str) -> str:
    """A source path as people want to read it: relative to ``site-packages``
    (``torch/nn/module.py``) or the standard library (``threading.py``) when there, else relative to
    the working directory when under it, as given otherwise.

    >>> short_path("")
    ''
    """
    if not path or not os.path.isabs(path):
        return path
    try:
        cwd = os.getcwd()
    except OSError:  # the program deleted its working directory: paths are shown as they are
        cwd = ""
    return _short_path(path, cwd)


@functools.lru_cache(maxsize=65536)
def _short_path(path: str, cwd: str) -> str:
    norm = os.path.normpath(path)
    marker = os.sep + "site-packages" + os.sep
    if marker in norm:  # an installed package, even in a venv inside the project
        return norm.rsplit(marker, 1)[1]
    for prefix in _prefixes():
        if norm.startswith(prefix):
            return norm[len(prefix):]
    if not cwd:
        return path
    try:
        rel = os.path.relpath(path, cwd)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path


def frame_where(frame: Frame, *, line: bool = True) -> str:
    """``file:line`` (or ``file`` without ``line``) for Python frames, the library for native
    ones, '' for pseudo-frames."""
    if frame.file:
        where = short_path(frame.file)
        return f"{where}:{frame.line}" if line and frame.line else where
    return frame.module or ""


def frame_label(frame: Frame, *, line: bool = True) -> str:
    """``name  file:line``: the one way every report names a frame."""
    where = frame_where(frame, line=line)
    name = frame.name or "?"
    return f"{name}  {where}" if where else name


# -- stacks ---------------------------------------------------------------------------------------
def sample_stacks(part: BackendResult) -> list[Stack]:
    """The part's stack samples as distinct (thread, task, stack) records, in the order each
    first occurs; samples whose ``stack_id`` is out of range are left out (counted by
    :func:`unknown_stack_samples`). A negative weight (invalid from a backend: no report can show
    negative time) counts as 0."""
    counts: Counter[tuple[int, int | None, int]] = Counter()
    weights: dict[tuple[int, int | None, int], int] = {}
    for s in part.samples:
        k = (s.thread_id, s.task_id, s.stack_id)
        counts[k] += 1
        w = s.weight_ns
        weights[k] = weights.get(k, 0) + (w if w > 0 else 0)
    return _records(part, ((k, c, weights[k]) for k, c in counts.items()))


def allocation_stacks(part: BackendResult, by: str = "bytes", *, alive_only: bool = False) -> list[Stack]:
    """The part's allocations as distinct stacks weighted by ``"bytes"`` (``size_bytes * count``,
    what each sampled allocation stands for) or ``"count"``; ``Stack.count`` is the allocation count.
    ``alive_only``: only the allocations still alive at the end (what is in use)."""
    if by not in ("bytes", "count"):
        from omniprof.errors import InvalidArgumentError

        raise InvalidArgumentError(f"'by' must be one of bytes, count (got {by!r})")
    acc: dict[tuple[int | None, None, int], list[int]] = {}
    for a in part.allocations:
        if alive_only and not a.alive_at_end:
            continue
        k = (a.thread_id, None, a.stack_id)
        v = acc.setdefault(k, [0, 0])
        v[0] += a.count
        v[1] += a.size_bytes * a.count if by == "bytes" else a.count
    return _records(part, ((k, v[0], v[1]) for k, v in acc.items()))


def unknown_stack_samples(part: BackendResult) -> int:
    """How many samples refer to a stack the part does not have."""
    n = len(part.stacks)
    return sum(1 for s in part.samples if not 0 <= s.stack_id < n)


def _records(part: BackendResult, items: Iterable[tuple[tuple[Any, Any, int], int, int]]) -> list[Stack]:
    cache: dict[int, tuple[Frame, ...]] = {}
    frames = part.frames
    n = len(part.stacks)
    out = []
    for (tid, task, sid), c, w in items:
        if not 0 <= sid < n:
            continue
        fr = cache.get(sid)
        if fr is None:
            fr = cache[sid] = tuple(frames[i] for i in part.stacks[sid])
        out.append(Stack(fr, c, w, tid, task))
    return out


# -- filters (pure: list[Stack] -> list[Stack]) ---------------------------------------------------
def _map_frames(stacks: Sequence[Stack], fn: Callable[[tuple[Frame, ...]], tuple[Frame, ...] | None]) -> list[Stack]:
    cache: dict[tuple[Frame, ...], tuple[Frame, ...] | None] = {}
    out = []
    for s in stacks:
        if s.frames in cache:
            new = cache[s.frames]
        else:
            new = cache[s.frames] = fn(s.frames)
        if new is None:
            continue
        out.append(s if new is s.frames else attrs.evolve(s, frames=new))
    return out


def drop_native(stacks: Sequence[Stack]) -> list[Stack]:
    """Native (C) frames removed (Julia's ``C=false``); stacks left empty are kept (they still
    count toward the total, with no frame to show)."""
    def fn(fr: tuple[Frame, ...]) -> tuple[Frame, ...]:
        if not any(f.kind == "native" for f in fr):
            return fr
        return tuple(f for f in fr if f.kind != "native")
    return _map_frames(stacks, fn)


@functools.lru_cache(maxsize=65536)
def _merged(frame: Frame, by: str) -> Frame:
    if by == "function":
        if frame.line == 0 and frame.offset is None:
            return frame
        return attrs.evolve(frame, line=0, offset=None) if frame.kind != "native" else attrs.evolve(frame, offset=None)
    if by == "line":
        return frame if frame.offset is None else attrs.evolve(frame, offset=None)
    return frame


def merge_frames(stacks: Sequence[Stack], by: str = "line") -> list[Stack]:
    """Frames made equal at the chosen grain: ``"function"`` (line and offset dropped),
    ``"line"`` (offset dropped) or ``"offset"`` (kept apart, Julia's ``combine=false``)."""
    if by not in ("function", "line", "offset"):
        from omniprof.errors import InvalidArgumentError

        raise InvalidArgumentError(f"'by' must be one of function, line, offset (got {by!r})")
    if by == "offset":
        return list(stacks)
    return _map_frames(stacks, lambda fr: tuple(_merged(f, by) for f in fr))


def _own_dirs() -> tuple[str, ...]:
    import omniprof

    return (os.path.dirname(os.path.abspath(omniprof.__file__)) + os.sep,)


@functools.lru_cache(maxsize=65536)
def _is_own(frame: Frame) -> bool:
    f = frame.file
    if not f:
        return False
    if f == "<frozen runpy>" or (os.path.basename(f) == "runpy.py" and frame.kind == "py"):
        return True
    if os.path.basename(f) == "omniprof" and frame.name == "<module>":
        return True  # the ``omniprof`` console script
    if not os.path.isabs(f):
        try:
            f = os.path.abspath(f)
        except OSError:  # a relative name, and the program deleted its working directory: not ours
            return False
    return f.startswith(_own_dirs())


_LAUNCHERS = frozenset({"_run_code", "call_function"})  # where omniprof's runner hands over to the user's code


def cut_own_frames(stacks: Sequence[Stack]) -> list[Stack]:
    """omniprof's own frames (engine, peek thread, CLI runner) and ``runpy``'s removed, so a
    report shows only the user's code. A stack rooted in the launcher keeps only what runs below
    the hand-over to the user's code (``runpy._run_code``, the runner's ``call_function``); one
    that never got there (the launcher's own imports and set-up) is dropped, as is a stack made
    only of omniprof's frames."""
    def fn(fr: tuple[Frame, ...]) -> tuple[Frame, ...] | None:
        if not any(_is_own(f) for f in fr):
            return fr
        if _is_own(fr[0]):
            hand_over = max((i for i, f in enumerate(fr) if _is_own(f) and f.name in _LAUNCHERS), default=-1)
            if hand_over < 0:
                return None
            fr = fr[hand_over + 1:]
        kept = tuple(f for f in fr if not _is_own(f))
        return kept or None
    return _map_frames(stacks, fn)


# Where a thread waits instead of running. Native leaves (with native frames recorded) are exact;
# the Python ones are the standard library's blocking waits.
_IDLE_NATIVE = frozenset({
    "clock_nanosleep", "nanosleep", "__nanosleep", "usleep", "time_sleep", "select", "__select", "poll", "__poll",
    "ppoll", "epoll_wait", "epoll_pwait", "kevent", "pthread_cond_wait", "pthread_cond_timedwait",
    "___pthread_cond_wait", "___pthread_cond_timedwait", "__pthread_cond_wait", "sem_wait", "sem_timedwait",
    "sem_clockwait", "do_futex_wait", "futex_wait", "__futex_abstimed_wait_common", "syscall", "pthread_join",
    "PyThread_acquire_lock_timed", "lock_PyThread_acquire_lock", "accept", "accept4", "__libc_accept", "wait4",
    "waitpid", "sigwait", "sigtimedwait", "pause",
})
_IDLE_PY = frozenset({
    ("threading.py", "Thread._wait_for_tstate_lock"), ("threading.py", "Condition.wait"),
    ("threading.py", "Thread.join"), ("threading.py", "Event.wait"), ("threading.py", "Semaphore.acquire"),
    ("threading.py", "Barrier.wait"), ("selectors.py", "EpollSelector.select"),
    ("selectors.py", "PollSelector.select"), ("selectors.py", "SelectSelector.select"),
    ("selectors.py", "KqueueSelector.select"), ("selectors.py", "DevpollSelector.select"),
    ("selectors.py", "_PollLikeSelector.select"), ("queue.py", "Queue.get"), ("subprocess.py", "Popen._wait"),
    ("subprocess.py", "Popen._try_wait"), ("subprocess.py", "Popen.communicate"), ("socket.py", "socket.accept"),
    ("connection.py", "wait"), ("popen_fork.py", "Popen.poll"),
})


# Blocking waits of common libraries, by the end of their file's path.
_IDLE_PY_SUFFIX = (
    ("zmq/sugar/__init__.py", "device"), ("zmq/sugar/poll.py", "Poller.poll"), ("zmq/sugar/socket.py", "Socket.recv"),
    ("zmq/sugar/socket.py", "Socket.recv_multipart"), ("zmq/green/poll.py", "GreenPoller.poll"),
)


@functools.lru_cache(maxsize=65536)
def _idle_frame(frame: Frame) -> bool:
    if frame.kind == "idle":
        return True
    if frame.kind == "native":
        return frame.name in _IDLE_NATIVE
    if (os.path.basename(frame.file), frame.name) in _IDLE_PY:
        return True
    path = frame.file.replace(os.sep, "/")
    return any(frame.name == name and path.endswith(suffix) for suffix, name in _IDLE_PY_SUFFIX)


def is_idle(frames: Sequence[Frame]) -> bool:
    """Whether a stack is a thread waiting (sleep, lock, join, select, queue get, ...): its leaf is a
    frame of kind ``"idle"`` (a backend's own mark), a known blocking native call, or, when no
    native frames were recorded, a known blocking wait of the standard library."""
    for f in reversed(frames):
        if _idle_frame(f):
            return True
        if f.kind != "native":
            return False
    return False


def hide_idle(stacks: Sequence[Stack]) -> list[Stack]:
    """Stacks of waiting threads (:func:`is_idle`) removed."""
    return [s for s in stacks if not is_idle(s.frames)]


def fold_recursion(stacks: Sequence[Stack], *, native: bool = False) -> list[Stack]:
    """Recursion folded (Julia's ``recur=:flat``): re-entering a frame already on the path goes
    back to it instead of nesting deeper, so ``f -> g -> f -> g -> h`` becomes ``f -> g -> h``.

    Native (C) frames are not folded (kept where they are, as Julia's ``:flat`` keeps C frames)
    unless ``native`` (Julia's ``:flatc``, C frames folded too)."""
    def fn(fr: tuple[Frame, ...]) -> tuple[Frame, ...]:
        if len(set(fr)) == len(fr):
            return fr
        path: list[Frame] = []
        pos: dict[Frame, int] = {}
        for f in fr:
            foldable = native or f.kind != "native"
            i = pos.get(f) if foldable else None
            if i is not None:
                for dead in path[i + 1:]:
                    pos.pop(dead, None)
                del path[i + 1:]
                continue
            if foldable:
                pos[f] = len(path)
            path.append(f)
        return tuple(path)
    return _map_frames(stacks, fn)


def only(stacks: Sequence[Stack], *, threads: Iterable[int] | None = None,
         tasks: Iterable[int] | None = None) -> list[Stack]:
    """Only the stacks of these thread / task ids (None: all)."""
    th = set(threads) if threads is not None else None
    ta = set(tasks) if tasks is not None else None
    return [s for s in stacks if (th is None or s.thread_id in th) and (ta is None or s.task_id in ta)]


# -- aggregation ----------------------------------------------------------------------------------
class Node:
    """A call-tree node: the frame, counts and weights on the path (``count``, ``total``) and as
    the leaf (``self_count``, ``self``), children by frame."""

    __slots__ = ("frame", "count", "self_count", "total", "self", "idle", "children")

    def __init__(self, frame: Frame | None) -> None:
        self.frame = frame
        self.count = 0
        self.self_count = 0
        self.total = 0
        self.self = 0
        self.idle = 0
        self.children: dict[Frame, Node] = {}


def build_tree(stacks: Iterable[Stack]) -> Node:
    """The call tree of ``stacks`` (root: a node with no frame holding the totals). A frame that
    occurs twice on a path is counted once per sample for that path's ancestors (fold recursion
    first to merge such nodes)."""
    root = Node(None)
    for s in stacks:
        c, w = s.count, s.weight
        root.count += c
        root.total += w
        node = root
        for f in s.frames:
            child = node.children.get(f)
            if child is None:
                child = node.children[f] = Node(f)
            child.count += c
            child.total += w
            node = child
        node.self_count += c
        node.self += w
        if is_idle(s.frames):
            node.idle += w
    return root


def _sort_key(sort: str) -> Callable[[Any], Any]:
    def ffl(f: Frame) -> tuple[str, str, int, int]:
        return (f.file or f.module or "", f.name, f.line, f.offset or 0)
    if sort == "time":
        return lambda n: (-n.total, -n.count, ffl(n.frame))
    if sort == "count":
        return lambda n: (-n.count, -n.total, ffl(n.frame))
    if sort in ("overhead", "self_time"):
        first, second = ("self_count", "self") if sort == "overhead" else ("self", "self_count")
        return lambda n: (-getattr(n, first), -getattr(n, second), ffl(n.frame))
    return lambda n: (ffl(n.frame), -n.count)


def tree_rows(root: Node, *, sort: str = "time", maxdepth: int | None = None, min_share: float = 0.0,
              mincount: int = 0, noisefloor: float = 0.0) -> list[TreeRow]:
    """Depth-first rows of the tree. ``min_share``: hide nodes (and their subtrees) under this
    fraction of the root's weight; ``mincount``: under this count; ``noisefloor``: with
    ``count <= noisefloor * sqrt(parent count)`` (Julia's)."""
    key = _sort_key(sort)
    floor_w = min_share * root.total

    def keep(child: Node, parent: Node) -> bool:
        if child.count < mincount or (min_share > 0 and child.total < floor_w):
            return False
        return not (noisefloor > 0 and child.count <= noisefloor * math.sqrt(parent.count))

    rows: list[TreeRow] = []
    todo = [(0, c) for c in sorted((c for c in root.children.values() if keep(c, root)), key=key, reverse=True)]
    while todo:
        depth, node = todo.pop()
        rows.append(TreeRow(depth, node.count, node.self_count, node.total, node.self, node.frame,  # type: ignore[arg-type]
                            idle=bool(node.self) and node.idle >= node.self))
        if maxdepth is None or depth + 1 < maxdepth:
            kids = sorted((c for c in node.children.values() if keep(c, node)), key=key, reverse=True)
            todo.extend((depth + 1, c) for c in kids)
    return rows


def flat_rows(stacks: Iterable[Stack], *, sort: str = "self_time", key: Callable[[Frame], Any] | None = None,
              mincount: int = 0) -> list[FlatRow]:
    """One row per frame (or per ``key(frame)``): a frame that recurs counts once per sample."""
    acc: dict[Any, list[int]] = {}
    first: dict[Any, Frame] = {}
    keyf = key or (lambda f: f)
    for s in stacks:
        c, w = s.count, s.weight
        seen = set()
        for f in s.frames:
            k = keyf(f)
            if k in seen:
                continue
            seen.add(k)
            a = acc.get(k)
            if a is None:
                a = acc[k] = [0, 0, 0, 0, 0]
                first[k] = f
            a[0] += c
            a[2] += w
        if s.frames:
            a = acc[keyf(s.frames[-1])]
            a[1] += c
            a[3] += w
            if is_idle(s.frames):
                a[4] += w
    rows = [FlatRow(first[k], a[0], a[1], a[2], a[3], idle=bool(a[3]) and a[4] >= a[3])
            for k, a in acc.items() if a[0] >= mincount]
    ffl = lambda r: (r.frame.file or r.frame.module or "", r.frame.name, r.frame.line, r.frame.offset or 0)  # noqa: E731
    if sort == "count":
        rows.sort(key=lambda r: (-r.count, -r.total_ns, ffl(r)))
    elif sort == "overhead":
        rows.sort(key=lambda r: (-r.self_count, -r.self_ns, ffl(r)))
    elif sort == "self_time":
        rows.sort(key=lambda r: (-r.self_ns, -r.total_ns, ffl(r)))
    elif sort == "time":
        rows.sort(key=lambda r: (-r.total_ns, -r.self_ns, ffl(r)))
    else:
        rows.sort(key=ffl)
    return rows


def flat_profile(part: BackendResult, *, key: Callable[[Frame], Any] | None = None) -> list[FlatRow]:
    """The part's samples as flat rows by self time (every frame as recorded; ``key`` merges
    frames, e.g. ``lambda f: (f.name, f.file)`` for one row per function)."""
    return flat_rows(sample_stacks(part), key=key)


def report_stacks(part: BackendResult, *, native: bool = True, own: bool = False, lines: bool = False,
                  idle: str = "hide") -> tuple[list[Stack], int]:
    """The part's sample stacks through the reports' default filters: native frames dropped
    unless ``native``; omniprof's own frames cut unless ``own``; merged per function (per line
    with ``lines``); idle stacks left out when ``idle="hide"``. Returns the stacks and the idle
    weight left out."""
    stacks = sample_stacks(part)
    if not native:
        stacks = drop_native(stacks)
    if not own:
        stacks = cut_own_frames(stacks)
    stacks = merge_frames(stacks, "line" if lines else "function")
    idle_w = 0
    if idle == "hide":
        kept = hide_idle(stacks)
        idle_w = sum(s.weight for s in stacks) - sum(s.weight for s in kept)
        stacks = kept
    return stacks, idle_w


@attrs.frozen
class ThreadGroup:
    """The stacks of one thread: ``busy`` and ``idle`` weights (see :func:`is_idle`); ``idle_only``
    when it never ran (every stack a wait)."""

    thread_id: int | None
    name: str
    stacks: tuple[Stack, ...]
    busy: int
    idle: int

    @property
    def idle_only(self) -> bool:
        return self.busy == 0


def by_thread(part: BackendResult, stacks: Iterable[Stack]) -> list[ThreadGroup]:
    """Stacks grouped per thread, busiest first (then by name); a thread whose every sample is a
    wait comes last (:attr:`ThreadGroup.idle_only`)."""
    names = {t.thread_id: t.name for t in part.threads}
    groups: dict[int | None, list[Stack]] = {}
    for s in stacks:
        groups.setdefault(s.thread_id, []).append(s)
    out = []
    for tid, ss in groups.items():
        idle = sum(s.weight for s in ss if is_idle(s.frames))
        busy = sum(s.weight for s in ss) - idle
        name = names.get(tid, f"thread {tid}") if tid is not None else "unknown thread"
        out.append(ThreadGroup(tid, name, tuple(ss), busy, idle))
    out.sort(key=lambda g: (g.busy == 0, -g.busy, -g.idle, g.name))
    return out
