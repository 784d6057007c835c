"""Julia-style reports of stack samples: call tree and flat list, with every ``Profile.print`` option.

Rows are built first (:func:`build_report` -> :class:`GroupReport` of :class:`TreeRow` /
:class:`FlatRow`), text second (:func:`format_report`). Samples are aggregated by
(group, stack) before any tree is built, so the cost is O(samples) for one pass plus
O(distinct stacks x depth): 10^6 samples take well under 2 s (``benchmarks/cpu_sampler.py``).

Counts are samples (Julia's "Count"); ``overhead`` is the self count (samples whose leaf is this
frame). Every row also carries the weighted time (``total_ns``/``self_ns``): a sample's weight is
the time since its thread's previous sample, which also covers coalesced ticks.
"""

from __future__ import annotations

import functools
import gc
import math
import os
import shutil
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from operator import attrgetter
from typing import Any

import attrs

from omniprof.core import validators as v
from omniprof.core.results import BackendResult, Frame, ProfileResult
from omniprof.core.units import format_ns as _fmt_ns
from omniprof.errors import InvalidArgumentError

__all__ = ["PrintOptions", "TreeRow", "FlatRow", "GroupReport", "build_report", "format_report", "callers",
           "sampled_part", "frame_where"]

GROUPBYS = ("none", "thread", "task", ("thread", "task"), ("task", "thread"))


def _groupby(value: Any) -> Any:
    if isinstance(value, list):
        value = tuple(value)
    if isinstance(value, tuple) and len(value) == 1:
        value = value[0]
    return value


def _int_tuple(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, (list, tuple, set, frozenset, range)):
        return tuple(value)
    return value


def _check_ids(inst: Any, attribute: Any, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, tuple) or not all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        raise InvalidArgumentError(f"'{attribute.name}' must be an int or a list of ints (got {value!r})")


@attrs.frozen(kw_only=True)
class PrintOptions:
    """Options of :func:`omniprof.sampler.print` (Julia's ``Profile.print`` keywords).

    Attributes:
        format: ``"tree"`` (nesting by indentation) or ``"flat"``.
        native: show native (C) frames (Julia's ``C=true``); they are hidden otherwise.
        combine: merge frames on the same line (True) or keep bytecode offsets apart (False).
        maxdepth: deepest tree level shown (None: all).
        sortedby: ``"filefuncline"`` (default), ``"count"`` or ``"overhead"`` (self count); orders
            flat rows and tree siblings; counts sort largest first.
        groupby: ``"none"``, ``"thread"``, ``"task"``, ``("thread", "task")`` or ``("task", "thread")``.
        noisefloor: hide tree rows with ``n <= noisefloor * sqrt(N)`` (N: the parent's count).
        mincount: hide rows with fewer samples.
        recur: ``"off"`` or ``"flat"`` (fold recursion: a frame already on the path is re-entered).
        threads, tasks: keep only these thread / task ids (None: all).
        cols: line width (None: the terminal's, or 120 when not a terminal).
    """

    format: str = attrs.field(default="tree", validator=v.one_of("tree", "flat"))
    native: bool = attrs.field(default=False, validator=v.is_bool)
    combine: bool = attrs.field(default=True, validator=v.is_bool)
    maxdepth: int | None = attrs.field(default=None, validator=v.int_in_range(1, optional=True))
    sortedby: str = attrs.field(default="filefuncline", validator=v.one_of("filefuncline", "count", "overhead"))
    groupby: Any = attrs.field(default="none", converter=_groupby, validator=v.one_of(*GROUPBYS))
    noisefloor: float = attrs.field(default=0.0, validator=v.number_in_range(0.0))
    mincount: int = attrs.field(default=0, validator=v.int_in_range(0))
    recur: str = attrs.field(default="off", validator=v.one_of("off", "flat"))
    threads: tuple[int, ...] | None = attrs.field(default=None, converter=_int_tuple, validator=_check_ids)
    tasks: tuple[int, ...] | None = attrs.field(default=None, converter=_int_tuple, validator=_check_ids)
    cols: int | None = attrs.field(default=None, validator=v.int_in_range(20, optional=True))


@attrs.frozen
class TreeRow:
    """One call-tree row: ``depth`` (0 = root frames), samples ``count``, ``self_count`` (Julia's
    overhead), weighted times, and the frame (combined by line unless ``combine=False``)."""

    depth: int
    count: int
    self_count: int
    total_ns: int
    self_ns: int
    frame: Frame


@attrs.frozen
class FlatRow:
    """One flat-list row: samples in which the frame appears (once per sample even when it recurs),
    samples in which it is the leaf, and the same as weighted times."""

    frame: Frame
    count: int
    self_count: int
    total_ns: int
    self_ns: int


@attrs.frozen
class GroupReport:
    """The rows of one group. ``path`` is ``(("thread", id, name), ("task", id, name))`` or
    shorter (empty for ``groupby="none"``); ``samples``/``total_ns`` are the group's totals."""

    path: tuple[tuple[str, int | None, str], ...]
    samples: int
    total_ns: int
    tree: tuple[TreeRow, ...] = ()
    flat: tuple[FlatRow, ...] = ()


def sampled_part(result: ProfileResult | BackendResult) -> BackendResult:
    """The part with stack samples: a BackendResult as is, or the first part of a ProfileResult
    that has samples (the ``cpu`` part when there are several)."""
    if isinstance(result, BackendResult):
        return result
    if not isinstance(result, ProfileResult):
        raise InvalidArgumentError(f"expected a ProfileResult or BackendResult (got {type(result).__name__})")
    with_samples = [p for p in result.parts if p.samples]
    for p in with_samples:
        if p.backend == "cpu":
            return p
    if with_samples:
        return with_samples[0]
    return result.parts[0] if result.parts else BackendResult(backend="cpu")


class _Node:
    __slots__ = ("key", "count", "self_count", "total_ns", "self_ns", "children")

    def __init__(self, key: int) -> None:
        self.key = key
        self.count = 0
        self.self_count = 0
        self.total_ns = 0
        self.self_ns = 0
        self.children: dict[int, _Node] = {}


def _canon(part: BackendResult, opts: PrintOptions) -> tuple[list[int], list[Frame]]:
    """Per frame id: its canonical key id (-1: hidden), and the key's representative frame."""
    key_of: list[int] = []
    reps: list[Frame] = []
    index: dict[Any, int] = {}
    for fr in part.frames:
        if fr.kind == "native" and not opts.native:
            key_of.append(-1)
            continue
        k: Any = fr if not opts.combine else (fr.name, fr.file, fr.line, fr.module, fr.kind)
        kid = index.get(k)
        if kid is None:
            kid = index[k] = len(reps)
            reps.append(fr if not opts.combine or fr.offset is None else attrs.evolve(fr, offset=None))
        key_of.append(kid)
    return key_of, reps


_GROUP_FIELDS: dict[Any, tuple[str, ...]] = {
    "none": (), "thread": ("thread_id",), "task": ("task_id",),
    ("thread", "task"): ("thread_id", "task_id"), ("task", "thread"): ("task_id", "thread_id"),
}


def _aggregate(part: BackendResult, opts: PrintOptions) -> dict[tuple[Any, int], list[int]]:
    """``(group key or None, stack_id) -> [samples, weight_ns]``; counting runs in C (Counter)."""
    samples: Any = part.samples
    if opts.threads is not None or opts.tasks is not None:
        threads = set(opts.threads) if opts.threads is not None else None
        tasks = set(opts.tasks) if opts.tasks is not None else None
        samples = [s for s in samples if (threads is None or s.thread_id in threads)
                   and (tasks is None or s.task_id in tasks)]
    fields = _GROUP_FIELDS[opts.groupby]
    getter = attrgetter(*fields, "stack_id")
    counts = Counter(map(getter, samples))
    weights: dict[Any, int] = dict.fromkeys(counts, 0)
    for s, k in zip(samples, map(getter, samples)):
        weights[k] += s.weight_ns
    if not fields:
        return {(None, sid): [c, weights[sid]] for sid, c in counts.items()}
    return {(k[:-1], k[-1]): [c, weights[k]] for k, c in counts.items()}


def _sort_key(opts: PrintOptions, reps: list[Frame]) -> Callable[[Any], Any]:
    if opts.sortedby == "count":
        return lambda n: (-n.count, -n.total_ns, _ffl(reps[n.key]))
    if opts.sortedby == "overhead":
        return lambda n: (-n.self_count, -n.self_ns, _ffl(reps[n.key]))
    return lambda n: (_ffl(reps[n.key]), -n.count)


def _ffl(fr: Frame) -> tuple[str, str, int, int]:
    return (fr.file or fr.module or "", fr.name, fr.line, fr.offset or 0)


def _tree(stacks: Iterable[tuple[tuple[int, ...], int, int]], recur: str) -> _Node:
    root = _Node(-1)
    for ks, c, w in stacks:
        root.count += c
        root.total_ns += w
        node = root
        if recur == "flat":
            path = [root]
            pos: dict[int, int] = {}
            touched = set()
            for k in ks:
                i = pos.get(k)
                if i is not None:
                    node = path[i]
                    for dead in path[i + 1:]:
                        pos.pop(dead.key, None)
                    del path[i + 1:]
                    continue
                child = node.children.get(k)
                if child is None:
                    child = node.children[k] = _Node(k)
                if id(child) not in touched:
                    touched.add(id(child))
                    child.count += c
                    child.total_ns += w
                path.append(child)
                pos[k] = len(path) - 1
                node = child
        else:
            for k in ks:
                child = node.children.get(k)
                if child is None:
                    child = node.children[k] = _Node(k)
                child.count += c
                child.total_ns += w
                node = child
        node.self_count += c
        node.self_ns += w
    return root


def _tree_rows(root: _Node, reps: list[Frame], opts: PrintOptions) -> list[TreeRow]:
    key = _sort_key(opts, reps)
    rows: list[TreeRow] = []
    floor = opts.noisefloor

    def keep(child: _Node, parent: _Node) -> bool:
        if child.count < opts.mincount:
            return False
        return not (floor > 0 and child.count <= floor * math.sqrt(parent.count))

    todo = [(0, c) for c in sorted((c for c in root.children.values() if keep(c, root)), key=key, reverse=True)]
    # sorted(..., reverse=True) then pop() yields ascending order by key.
    while todo:
        depth, node = todo.pop()
        rows.append(TreeRow(depth, node.count, node.self_count, node.total_ns, node.self_ns, reps[node.key]))
        if opts.maxdepth is None or depth + 1 < opts.maxdepth:
            kids = sorted((c for c in node.children.values() if keep(c, node)), key=key, reverse=True)
            todo.extend((depth + 1, c) for c in kids)
    return rows


def _flat_rows(stacks: Iterable[tuple[tuple[int, ...], int, int]], reps: list[Frame], opts: PrintOptions) -> list[FlatRow]:
    acc: dict[int, list[int]] = {}
    for ks, c, w in stacks:
        for k in set(ks):
            a = acc.get(k)
            if a is None:
                a = acc[k] = [0, 0, 0, 0]
            a[0] += c
            a[2] += w
        if ks:
            a = acc[ks[-1]]
            a[1] += c
            a[3] += w
    rows = [FlatRow(reps[k], a[0], a[1], a[2], a[3]) for k, a in acc.items() if a[0] >= opts.mincount]
    if opts.sortedby == "count":
        rows.sort(key=lambda r: (-r.count, -r.total_ns, _ffl(r.frame)))
    elif opts.sortedby == "overhead":
        rows.sort(key=lambda r: (-r.self_count, -r.self_ns, _ffl(r.frame)))
    else:
        rows.sort(key=lambda r: _ffl(r.frame))
    return rows


def build_report(result: ProfileResult | BackendResult, opts: PrintOptions | None = None, **kwargs: Any
                 ) -> list[GroupReport]:
    """Aggregate the samples of ``result`` into one :class:`GroupReport` per group.

    ``kwargs`` are :class:`PrintOptions` fields (used when ``opts`` is None).
    """
    if opts is None:
        opts = PrintOptions(**kwargs)
    # Building creates many small objects while up to millions of samples are alive: pausing the
    # cyclic GC avoids full traversals of them (nothing here makes cycles that need it).
    paused = gc.isenabled()
    gc.disable()
    try:
        return _build(sampled_part(result), opts)
    finally:
        if paused:
            gc.enable()


def _build(part: BackendResult, opts: PrintOptions) -> list[GroupReport]:
    key_of, reps = _canon(part, opts)
    agg = _aggregate(part, opts)
    kstacks: dict[int, tuple[int, ...]] = {}
    groups: dict[Any, list[tuple[tuple[int, ...], int, int]]] = {}
    for (g, sid), (c, w) in agg.items():
        ks = kstacks.get(sid)
        if ks is None:
            ks = kstacks[sid] = tuple(k for k in (key_of[f] for f in part.stacks[sid]) if k >= 0)
        groups.setdefault(g, []).append((ks, c, w))
    thread_names = {t.thread_id: t.name for t in part.threads}
    task_names = {t.task_id: t.name for t in part.tasks}
    mode = opts.groupby
    kinds: tuple[str, ...] = () if mode == "none" else ((mode,) if isinstance(mode, str) else mode)

    def label(kind: str, ident: int | None) -> tuple[str, int | None, str]:
        if kind == "thread":
            return ("thread", ident, thread_names.get(ident, f"thread {ident}") if ident is not None else "")
        return ("task", ident, task_names.get(ident, f"task {ident}") if ident is not None else "(no task)")

    out = []
    for g in sorted(groups, key=lambda g: tuple((x is None, x or 0) for x in g) if g is not None else ()):
        stacks = groups[g]
        path = tuple(label(k, i) for k, i in zip(kinds, g)) if g is not None else ()
        samples = sum(c for _, c, _ in stacks)
        total = sum(w for _, _, w in stacks)
        tree: tuple[TreeRow, ...] = ()
        flat: tuple[FlatRow, ...] = ()
        if opts.format == "tree":
            tree = tuple(_tree_rows(_tree(stacks, opts.recur), reps, opts))
        else:
            flat = tuple(_flat_rows(stacks, reps, opts))
        out.append(GroupReport(path, samples, total, tree, flat))
    return out


# -- text ---------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=65536)
def frame_where(fr: Frame) -> str:
    """``file:line`` for Python frames, the library for native ones, '' for pseudo-frames."""
    if fr.file:
        return f"{_short_path(fr.file)}:{fr.line}"
    if fr.module:
        return fr.module
    return ""


@functools.lru_cache(maxsize=65536)
def _short_path(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path


def _ltrunc(text: str, width: int) -> str:
    """Keep the end of ``text`` within ``width``, marking the cut with a leading '...'."""
    if width <= 0:
        return ""
    if len(text) <= width:
        return text
    if width <= 3:
        return text[-width:]
    return "..." + text[len(text) - (width - 3):]


@functools.lru_cache(maxsize=4096)
def _indent(depth: int) -> str:
    return "".join("╎" if i % 4 == 3 else " " for i in range(depth))


def _tree_line(row: TreeRow, wo: int, wc: int, cols: int, offsets: bool) -> str:
    over = str(row.self_count) if row.self_count else ""
    head = f"{over:>{wo}}╎"
    avail = cols - len(head)
    max_indent = max(avail // 2 - wc, 0)
    if row.depth <= max_indent:
        ind = _indent(row.depth)
    else:
        # Julia's "+n" at the start: the indentation that did not fit, shown as a number.
        marker = f"+{row.depth} "
        shown = max(max_indent - len(marker), 0)
        marker = f"+{row.depth - shown} "
        ind = marker + _indent(shown)
    count = f"{row.count:<{wc}} "
    where = frame_where(row.frame)
    if offsets and row.frame.offset is not None:
        where += f"@{row.frame.offset}"
    name = row.frame.name
    room = avail - len(ind) - len(count)
    text = f"{where}; {name}" if where else name
    if len(text) > room:
        if where:
            room_name = max(min(len(name), room - 2 - min(len(where), max(room // 2, 4))), min(len(name), 4))
            room_where = max(room - 2 - room_name, 0)
            text = f"{_ltrunc(where, room_where)}; {_ltrunc(name, room_name)}"
            text = text[:max(room, 0)] if len(text) > room else text
        else:
            text = _ltrunc(name, room)
    return (head + ind + count + text)[:cols]


def _group_title(g: GroupReport, grand_samples: int) -> list[str]:
    lines = []
    for level, (kind, ident, name) in enumerate(g.path):
        last = level == len(g.path) - 1
        if ident is None:
            what = "No task (outside any asyncio task)" if kind == "task" else "Unknown thread"
        else:
            what = f"{kind.capitalize()} {ident}" + (f" ({name})" if name else "")
        tail = (f"  Total snapshots: {g.samples} ({100.0 * g.samples / max(grand_samples, 1):.1f}%), "
                f"sampled time {_fmt_ns(g.total_ns)}") if last else ""
        lines.append("  " * level + what + tail)
    return lines


def overhead_lines(part: BackendResult) -> list[str]:
    """The sampler's honest-overhead lines, from the part's ``overhead`` summary."""
    over = part.summaries.get("overhead")
    if not over or "samples" not in over:
        return []
    lines = [f"{over.get('samples', 0)} samples from {over.get('ticks', 0)} ticks (engine {over.get('engine', '?')})"]
    if "requested_rate_hz" in over:
        lines[0] += (f": {over.get('achieved_rate_hz', 0):.0f} Hz achieved of "
                     f"{over.get('requested_rate_hz', 0):.0f} Hz requested")
    line = f"sampler self-time {_fmt_ns(over.get('sampler_time_ns', 0))}"
    if "sampler_overhead_pct" in over:
        line += f" = {over.get('sampler_overhead_pct', 0):.2f}% of the session"
    lines.append(line)
    return lines


def format_report(result: ProfileResult | BackendResult, opts: PrintOptions | None = None, *,
                  groups: Sequence[GroupReport] | None = None, header: bool = True, **kwargs: Any) -> list[str]:
    """Text lines of the report (Julia's layout), ``cols`` wide."""
    if opts is None:
        opts = PrintOptions(**kwargs)
    part = sampled_part(result)
    cols = opts.cols or shutil.get_terminal_size((120, 24)).columns
    groups = build_report(part, opts) if groups is None else groups
    paused = gc.isenabled()
    gc.disable()
    try:
        return _format(part, opts, groups, cols, header)
    finally:
        if paused:
            gc.enable()


def _format(part: BackendResult, opts: PrintOptions, groups: Sequence[GroupReport], cols: int, header: bool
            ) -> list[str]:
    lines: list[str] = []
    if header:
        lines.extend(x[:cols] for x in overhead_lines(part))
        for loss in part.losses:
            lines.append(f"! {loss.count} {loss.unit} not recorded ({loss.kind}): {loss.detail}"[:cols])
    if not groups:
        lines.append("No samples collected (profile longer, lower interval_s, or check the backend's losses).")
        return lines
    grand = sum(g.samples for g in groups)
    for gi, g in enumerate(groups):
        if g.path:
            if gi:
                lines.append("")
            lines.extend(x[:cols] for x in _group_title(g, grand))
        if opts.format == "tree":
            wo = max([len("Overhead")] + [len(str(r.self_count)) for r in g.tree])
            wc = max([len(str(r.count)) for r in g.tree] + [1])
            if not gi or g.path:
                lines.append(f"{'Overhead':>{wo}} ╎ [+additional indent] Count File:Line; Function"[:cols])
                lines.append("=" * min(cols, wo + 52))
            lines.extend(_tree_line(r, wo, wc, cols, not opts.combine) for r in g.tree)
        else:
            lines.extend(_flat_lines(g.flat, cols, not opts.combine))
    return lines


def _flat_lines(rows: Sequence[FlatRow], cols: int, offsets: bool) -> list[str]:
    head = ["Count", "Overhead", "Time", "File", "Line", "Function"]
    cells = []
    for r in rows:
        fr = r.frame
        file = _short_path(fr.file) if fr.file else (fr.module or "")
        line = str(fr.line) + (f"@{fr.offset}" if offsets and fr.offset is not None else "") if fr.line or fr.file else "?"
        cells.append([str(r.count), str(r.self_count), _fmt_ns(r.total_ns), file, line, fr.name])
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(head)]
    fixed = widths[0] + widths[1] + widths[2] + widths[4] + 2 * 5
    room = max(cols - fixed, 10)
    if widths[3] + widths[5] > room:
        widths[5] = min(widths[5], max(room // 2, room - widths[3]))
        widths[3] = max(room - widths[5], 4)
    out = []
    for c in [head, *cells]:
        c = [*c[:3], _ltrunc(c[3], widths[3]), c[4], _ltrunc(c[5], widths[5])]
        out.append("  ".join([c[0].rjust(widths[0]), c[1].rjust(widths[1]), c[2].rjust(widths[2]),
                              c[3].ljust(widths[3]), c[4].rjust(widths[4]), c[5]]).rstrip()[:cols])
    return out


# -- callers ------------------------------------------------------------------------------------
def callers(funcname: str, result: ProfileResult | BackendResult, *, filename: str | None = None,
            linerange: range | tuple[int, int] | None = None, native: bool = False) -> list[tuple[int, Frame]]:
    """Who called ``funcname``: ``[(samples, caller frame)]``, most samples first.

    A frame matches when its name is ``funcname`` (or ends with ``.funcname``, for methods), its
    file ends with ``filename`` (when given) and its line lies in ``linerange`` (inclusive
    ``(start, stop)`` or a ``range``). A match at the root is reported with a ``<root>`` caller.
    """
    part = sampled_part(result)
    if isinstance(linerange, tuple):
        if len(linerange) != 2:
            raise InvalidArgumentError(f"'linerange' must be (start, stop) or a range (got {linerange!r})")
        linerange = range(int(linerange[0]), int(linerange[1]) + 1)

    def match(fr: Frame) -> bool:
        if fr.name != funcname and not fr.name.endswith("." + funcname):
            return False
        if filename is not None and not (fr.file == filename or fr.file.endswith(os.sep + filename.lstrip(os.sep))
                                         or fr.file.endswith(filename)):
            return False
        return linerange is None or fr.line in linerange

    opts = PrintOptions(native=native)
    key_of, reps = _canon(part, opts)
    counts: dict[int, int] = {}
    for s in part.samples:
        counts[s.stack_id] = counts.get(s.stack_id, 0) + 1
    acc: dict[Any, int] = {}
    root = Frame(name="<root>", kind="runtime")
    for sid, c in counts.items():
        ks = [k for k in (key_of[f] for f in part.stacks[sid]) if k >= 0]
        seen = set()
        for i, k in enumerate(ks):
            if match(reps[k]):
                caller = ks[i - 1] if i else -1
                if caller not in seen:
                    seen.add(caller)
                    acc[caller] = acc.get(caller, 0) + c
    out = [(n, reps[k] if k >= 0 else root) for k, n in acc.items()]
    out.sort(key=lambda x: (-x[0], _ffl(x[1])))
    return out
