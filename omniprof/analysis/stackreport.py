"""Julia-style reports of stack samples: call tree and flat list, with every ``Profile.print`` option.

Rows are built first (:func:`build_report` -> :class:`GroupReport` of :class:`TreeRow` /
:class:`FlatRow`), text second (:func:`format_report`). Samples are aggregated by
(group, stack) before any tree is built, so the cost is O(samples) for one pass plus
O(distinct stacks x depth): 10^6 samples take well under 2 s (``benchmarks/cpu_sampler.py``).

The rows come from the one call tree (:mod:`omniprof.analysis.calltree`); this module adds Julia's
options and text layout. Every row carries the weighted time (``total_ns``/``self_ns``: a sample's
weight is the time since its thread's previous sample, which also covers coalesced ticks) and the
counts (samples, Julia's "Count"; ``overhead`` is the self count, samples whose leaf is this frame).
The text shows Julia's columns (``Count``; ``Overhead`` in the tree's gutter) with the time and its
percentage of the group's sampled time beside them; ``counts=False`` shows time and % alone.
"""

from __future__ import annotations

import functools
import gc
import os
import shutil
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from omniprof.analysis import calltree
from omniprof.core import validators as v
from omniprof.analysis.calltree import FlatRow, TreeRow
from omniprof.core.results import BackendResult, Frame, ProfileResult
from omniprof.core.units import format_ns as _fmt_ns
from omniprof.errors import InvalidArgumentError

__all__ = ["PrintOptions", "TreeRow", "FlatRow", "GroupReport", "build_report", "format_report", "callers",
           "sampled_part", "frame_where", "print_options", "group_title", "tree_indent", "where_and_name"]

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
    """Options of :func:`omniprof.cpu.print` (Julia's ``Profile.print`` keywords).

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
        recur: ``"off"``, ``"flat"`` (fold recursion: a Python frame already on the path is re-entered
            instead of nested again; native frames are left as they are) or ``"flatc"`` (the same, native
            (C) frames folded too), as Julia's ``:off``/``:flat``/``:flatc``.
        counts: show Julia's sample counts (``Count``, and ``Overhead`` in the tree's gutter), with
            the time and % beside them (default, what ``Profile.print`` shows plus the time);
            ``False``: time and % only (``Self time`` in the gutter).
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
    recur: str = attrs.field(default="off", validator=v.one_of("off", "flat", "flatc"))
    threads: tuple[int, ...] | None = attrs.field(default=None, converter=_int_tuple, validator=_check_ids)
    tasks: tuple[int, ...] | None = attrs.field(default=None, converter=_int_tuple, validator=_check_ids)
    cols: int | None = attrs.field(default=None, validator=v.int_in_range(20, optional=True))
    counts: bool = attrs.field(default=True, validator=v.is_bool)


@attrs.frozen
class GroupReport:
    """The rows of one group. ``path`` is ``(("thread", id, name), ("task", id, name))`` or
    shorter (empty for ``groupby="none"``); ``samples``/``total_ns`` are the group's totals."""

    path: tuple[tuple[str, int | None, str], ...]
    samples: int
    total_ns: int
    tree: tuple[TreeRow, ...] = ()
    flat: tuple[FlatRow, ...] = ()


def print_options(options: dict[str, Any]) -> PrintOptions:
    """:class:`PrintOptions` from ``print``'s keywords (Julia's ``C`` spelled as ``native``);
    unknown ones rejected with the closest name."""
    opts = dict(options)
    if "C" in opts:
        opts["native"] = opts.pop("C")
    try:
        return PrintOptions(**opts)
    except TypeError as e:
        names = [a.name for a in attrs.fields(PrintOptions)] + ["C"]
        from omniprof.core.validators import check_keys

        check_keys(opts, names, what="print option")
        raise InvalidArgumentError(str(e)) from e


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


def _stacks(part: BackendResult, opts: PrintOptions) -> list[calltree.Stack]:
    stacks = calltree.sample_stacks(part)
    if opts.threads is not None or opts.tasks is not None:
        stacks = calltree.only(stacks, threads=opts.threads, tasks=opts.tasks)
    if not opts.native:
        stacks = calltree.drop_native(stacks)
    return calltree.merge_frames(stacks, "line" if opts.combine else "offset")


def _build(part: BackendResult, opts: PrintOptions) -> list[GroupReport]:
    mode = opts.groupby
    kinds: tuple[str, ...] = () if mode == "none" else ((mode,) if isinstance(mode, str) else mode)
    groups: dict[Any, list[calltree.Stack]] = {}
    for st in _stacks(part, opts):
        g = tuple(st.thread_id if k == "thread" else st.task_id for k in kinds) if kinds else None
        groups.setdefault(g, []).append(st)
    thread_names = {t.thread_id: t.name for t in part.threads}
    task_names = {t.task_id: t.name for t in part.tasks}

    def label(kind: str, ident: int | None) -> tuple[str, int | None, str]:
        if kind == "thread":
            return ("thread", ident, thread_names.get(ident, f"thread {ident}") if ident is not None else "")
        return ("task", ident, task_names.get(ident, f"task {ident}") if ident is not None else "(no task)")

    out = []
    for g in sorted(groups, key=lambda g: tuple((x is None, x or 0) for x in g) if g is not None else ()):
        stacks = groups[g]
        path = tuple(label(k, i) for k, i in zip(kinds, g)) if g is not None else ()
        samples = sum(st.count for st in stacks)
        total = sum(st.weight for st in stacks)
        tree: tuple[TreeRow, ...] = ()
        flat: tuple[FlatRow, ...] = ()
        if opts.format == "tree":
            folded = stacks if opts.recur == "off" else calltree.fold_recursion(stacks, native=opts.recur == "flatc")
            root = calltree.build_tree(folded)
            tree = tuple(calltree.tree_rows(root, sort=opts.sortedby, maxdepth=opts.maxdepth, mincount=opts.mincount,
                                            noisefloor=opts.noisefloor))
        else:
            flat = tuple(calltree.flat_rows(stacks, sort=opts.sortedby, mincount=opts.mincount))
        out.append(GroupReport(path, samples, total, tree, flat))
    return out


# -- text ---------------------------------------------------------------------------------------
def frame_where(fr: Frame) -> str:
    """``file:line`` for Python frames, the library for native ones, '' for pseudo-frames."""
    return calltree.frame_where(fr)



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
def tree_indent(depth: int) -> str:
    """A tree line's indentation for ``depth``: spaces with a ``╎`` guide every fourth column."""
    return "".join("╎" if i % 4 == 3 else " " for i in range(depth))


def _tree_cells(row: TreeRow, counts: bool, group_ns: int, count_w: int = 0, time_w: int = 0) -> tuple[str, str]:
    """The gutter and the value column of a tree row: Julia's ``Overhead`` and ``Count`` with the
    time and % beside the count (``count_w``, ``time_w``: the group's widths), or ``Self time``
    and time and %."""
    pct = 100.0 * row.total_ns / group_ns if group_ns > 0 else 0.0
    if counts:
        return ((str(row.self_count) if row.self_count else ""),
                f"{row.count:<{count_w}} {_fmt_ns(row.total_ns):>{time_w}} {pct:5.1f}%")
    return (_fmt_ns(row.self_ns) if row.self_ns else ""), f"{_fmt_ns(row.total_ns)} {pct:5.1f}%"


def _tree_line(row: TreeRow, wo: int, wc: int, cols: int, offsets: bool, cells: tuple[str, str] | None = None) -> str:
    over, value = cells if cells is not None else ((str(row.self_count) if row.self_count else ""), str(row.count))
    head = f"{over:>{wo}}╎"
    avail = cols - len(head)
    max_indent = max(avail // 2 - wc, 0)
    if row.depth <= max_indent:
        ind = tree_indent(row.depth)
    else:
        # Julia's "+n" at the start: the indentation that did not fit, shown as a number.
        marker = f"+{row.depth} "
        shown = max(max_indent - len(marker), 0)
        marker = f"+{row.depth - shown} "
        ind = marker + tree_indent(shown)
    count = f"{value:>{wc}} " if not value.isdigit() else f"{value:<{wc}} "
    where = frame_where(row.frame)
    if offsets and row.frame.offset is not None:
        where += f"@{row.frame.offset}"
    text = where_and_name(where, row.frame.name, avail - len(ind) - len(count))
    return (head + ind + count + text)[:cols]


def where_and_name(where: str, name: str, room: int) -> str:
    """A tree line's ``file:line; function`` in ``room`` characters, the place and the name each
    cut at its own start (the end of a path and of a name tell them apart)."""
    text = f"{where}; {name}" if where else name
    if len(text) <= room:
        return text
    if not where:
        return _ltrunc(name, room)
    room_name = max(min(len(name), room - 2 - min(len(where), max(room // 2, 4))), min(len(name), 4))
    room_where = max(room - 2 - room_name, 0)
    text = f"{_ltrunc(where, room_where)}; {_ltrunc(name, room_name)}"
    return text[:max(room, 0)]


def group_title(g: GroupReport, grand_samples: int) -> list[str]:
    """The lines naming a group (thread, then task), its share of the snapshots on the last."""
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


def _native_cost_lines(over: Mapping[str, Any]) -> list[str]:
    """The native engine's cost, measured: its own thread's CPU time, and what the program's threads
    paid (CPU time in the snapshot signal handler, the drain thread's CPU time under the GIL) as a
    share of the CPU time the program's threads used."""
    engine, handler, drain = (int(over.get(k, 0)) for k in ("sampler_time_ns", "handler_cpu_ns", "drain_cpu_ns"))
    program = int(over.get("process_cpu_ns", 0)) - engine - drain
    line = (f"sampler cost, measured: engine thread {_fmt_ns(engine)} CPU (its own thread, beside the program); "
            f"the program's threads {_fmt_ns(handler)} CPU in its signal handler + {_fmt_ns(drain)} drain under "
            f"the GIL")
    if program > 0:
        line += f" = {100.0 * (handler + drain) / program:.2f}% of their {_fmt_ns(program)} CPU"
    return [line]


def overhead_lines(part: BackendResult) -> list[str]:
    """The sampler's honest-overhead lines, from the part's ``overhead`` summary."""
    over = part.summaries.get("overhead")
    if not over or "samples" not in over:
        return []
    lines = [f"{over.get('samples', 0)} samples from {over.get('ticks', 0)} ticks (engine {over.get('engine', '?')})"]
    if "requested_rate_hz" in over:
        lines[0] += (f": {over.get('achieved_rate_hz', 0):.0f} Hz achieved of "
                     f"{over.get('requested_rate_hz', 0):.0f} Hz requested")
    if "handler_cpu_ns" in over:  # the native engine: each part measured where it runs
        lines += _native_cost_lines(over)
    else:
        line = f"sampler self-time {_fmt_ns(over.get('sampler_time_ns', 0))}"
        if "sampler_overhead_pct" in over:
            line += f" = {over.get('sampler_overhead_pct', 0):.2f}% of the session"
        lines.append(line)
    if "gc_time_ns" in over:
        n = over.get("gc_collections", 0)
        gc_line = (f"garbage collection {_fmt_ns(over['gc_time_ns'])} in {n} collection{'s' if n != 1 else ''} "
                   f"(timed by gc.callbacks)")
        if part.end_ns > part.start_ns:
            gc_line += f" = {100.0 * over['gc_time_ns'] / (part.end_ns - part.start_ns):.2f}% of the session"
        lines.append(gc_line)
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
            lines.extend(x[:cols] for x in group_title(g, grand))
        if opts.format == "tree":
            count_w = max([len(str(r.count)) for r in g.tree] + [1])
            time_w = max([len(_fmt_ns(r.total_ns)) for r in g.tree] + [1])
            cells = [_tree_cells(r, opts.counts, g.total_ns, count_w, time_w) for r in g.tree]
            over_h, value_h = ("Overhead", "Count Time %") if opts.counts else ("Self time", "Time %")
            wo = max([len(over_h)] + [len(c[0]) for c in cells])
            wc = max([len(c[1]) for c in cells] + [1])
            if not gi or g.path:
                lines.append(f"{over_h:>{wo}} ╎ [+additional indent] {value_h} File:Line; Function"[:cols])
                lines.append("=" * min(cols, wo + 52))
            lines.extend(_tree_line(r, wo, wc, cols, not opts.combine, c) for r, c in zip(g.tree, cells))
        else:
            lines.extend(_flat_lines(g.flat, cols, not opts.combine, opts.counts, g.total_ns))
    return lines


def _flat_lines(rows: Sequence[FlatRow], cols: int, offsets: bool, counts: bool = False, group_ns: int = 0
                ) -> list[str]:
    from omniprof.analysis.render import Column, render_table

    def pct(ns: int) -> str:
        return f"{100.0 * ns / group_ns:.1f}%" if group_ns > 0 else ""

    if counts:  # Julia's columns first, the times beside them
        columns = [Column("Count", kind="num"), Column("Overhead", kind="num"), Column("Time", kind="num"),
                   Column("%", kind="num"), Column("Self time", kind="num", drop=1)]
    else:
        columns = [Column("Time", kind="num"), Column("%", kind="num"), Column("Self time", kind="num"),
                   Column("Self %", kind="num", drop=1)]
    columns += [Column("File", min_width=16, cut="start"), Column("Line", kind="num"), Column("Function", min_width=20)]
    cells = []
    for r in rows:
        fr = r.frame
        file = calltree.short_path(fr.file) if fr.file else (fr.module or "")
        line = str(fr.line) + (f"@{fr.offset}" if offsets and fr.offset is not None else "") if fr.line or fr.file else "?"
        head = ([str(r.count), str(r.self_count), _fmt_ns(r.total_ns), pct(r.total_ns), _fmt_ns(r.self_ns)]
                if counts else
                [_fmt_ns(r.total_ns), pct(r.total_ns), _fmt_ns(r.self_ns), pct(r.self_ns)])
        cells.append([*head, file, line, fr.name])
    return render_table(columns, cells, width=cols).splitlines()


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

    acc: dict[Frame | None, int] = {}
    root = Frame(name="<root>", kind="runtime")
    for st in _stacks(part, PrintOptions(native=native)):
        seen = set()
        for i, fr in enumerate(st.frames):
            if match(fr):
                caller = st.frames[i - 1] if i else None
                if caller not in seen:
                    seen.add(caller)
                    acc[caller] = acc.get(caller, 0) + st.count
    out = [(n, k if k is not None else root) for k, n in acc.items()]
    out.sort(key=lambda x: (-x[0], _ffl(x[1])))
    return out


def _ffl(fr: Frame) -> tuple[str, str, int, int]:
    return (fr.file or fr.module or "", fr.name, fr.line, fr.offset or 0)
