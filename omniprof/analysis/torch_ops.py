"""torch's op statistics from a Kineto part's spans: the op table (``key_averages()``) and stacks.

This is analysis of what :mod:`omniprof.formats.kineto` reads: :func:`with_tables` adds the op
table, the kernel tables and the FLOPs summary to a torch part (the Kineto reader plugin and the
torch backend call it after reading); :func:`op_table` rebuilds the op table grouped by input shape
or stack.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from omniprof.analysis.kernels import add_kernel_stats
from omniprof.core import opstats
from omniprof.core.results import BackendResult, ProfileResult, Span, Table
from omniprof.errors import InvalidArgumentError

__all__ = ["OP_STATS_COLUMNS", "op_stats_table", "op_table", "call_stacks", "with_tables"]

_DEVICE_WORK = frozenset({"kernel", "memcpy", "memset"})


# -- op statistics -----------------------------------------------------------------------------------
#: Span categories that nest in the op table, as torch's FunctionEvents do on a thread: ops,
#: annotations, steps and Python functions (torch's key_averages() has a row for each Python function
#: when stacks were recorded, and an op's self time excludes the Python code run inside it).
_NESTED = ("cpu_op", "annotation", "step", "python")
#: Frames torch leaves out of an event's stack (``torch.autograd.profiler_util._filter_stack_entry``).
_STACK_FILTER = (("autograd/__init__", "_make_grads"), ("autograd/__init__", "backward"), ("torch/tensor", "backward"),
                 ("_internal/common_utils", "prof_callable"), ("_internal/common_utils", "prof_func_call"),
                 ("_internal/common_utils", "prof_meth_call"))
_EVALUATE = "autograd::engine::evaluate_function: "


def _keep_frame(frame: str) -> bool:
    return not any(a in frame and b in frame for a, b in _STACK_FILTER)


def call_stacks(spans: Sequence[Span]) -> dict[int, tuple[str, ...]]:
    """The Python stack of each op, annotation, step and Python span (by index in ``spans``),
    innermost frame first, as torch's ``FunctionEvent.stack``.

    Where the trace wrote stacks (``Call stack`` args, kept as ``call_stack``: torch 1.x with
    ``with_stack``, torch 2.x with ``_ExperimentalConfig(verbose=True)``) they are used as written,
    and a span without one has an empty stack. Otherwise (torch 2.x's default) the stack is rebuilt
    from the ``python`` spans: the Python functions running on the span's thread when it started.
    Then, as torch does: frames of autograd's own ``backward`` entry points are left out, and every
    span inside a backward node (a ``cpu_op`` run by ``autograd::engine::evaluate_function: <its
    name>``) takes the stack of the forward op that created the node (same ``sequence_number``,
    found on the node's own thread first; a node without a forward thread id gets an empty stack).
    """
    per_track: dict[str, list[int]] = {}
    written = False
    for i, s in enumerate(spans):
        if s.category in _NESTED:
            per_track.setdefault(s.track, []).append(i)
            written = written or "call_stack" in s.args
    stacks: dict[int, tuple[str, ...]] = {}
    parent: dict[int, int | None] = {}
    order: list[int] = []
    for idx in per_track.values():
        # Parents first: by start, then the longer; a Python call before the op it makes at the same instant.
        idx.sort(key=lambda i: (spans[i].start_ns, -spans[i].end_ns, spans[i].category != "python"))
        py: list[int] = []      # the Python calls open at this instant
        nest: list[int] = []    # torch's nesting: a parent holds the whole child
        for i in idx:
            s = spans[i]
            while py and spans[py[-1]].end_ns <= s.start_ns:
                py.pop()
            while nest and (s.start_ns >= spans[nest[-1]].end_ns or s.end_ns > spans[nest[-1]].end_ns):
                nest.pop()
            parent[i] = nest[-1] if nest else None
            nest.append(i)
            order.append(i)
            if written:
                cs = s.args.get("call_stack")
                frames = tuple(cs) if isinstance(cs, (list, tuple)) else ()
            else:
                frames = tuple(spans[j].name for j in reversed(py))
            stacks[i] = tuple(f for f in frames if isinstance(f, str) and _keep_frame(f))
            if s.category == "python":
                py.append(i)
    # Backward: the node's forward op's stack (torch's EventList._set_backward_stacktraces).
    bw: dict[int, int | None] = {}
    for i in order:  # parents come before their children within a track
        s, p = spans[i], parent[i]
        if s.category == "cpu_op" and p is not None and spans[p].name == _EVALUATE + s.name:
            bw[i] = i
        else:
            bw[i] = bw[p] if p is not None else None
    fwd: dict[tuple[Any, str], tuple[str, ...]] = {}
    for i in sorted(order, key=lambda i: (spans[i].start_ns, -spans[i].end_ns)):
        if bw[i] is None:
            seq = spans[i].args.get("sequence_number", -1)
            fwd.setdefault((seq if type(seq) is int else -1, spans[i].track), stacks[i])
    tracks_of: dict[Any, list[str]] = {}
    for seq, track in fwd:
        tracks_of.setdefault(seq, []).append(track)
    for i in order:
        p = bw[i]
        if p is None:
            continue
        node = spans[p]
        seq = node.args.get("sequence_number", -1)
        if not node.args.get("fwd_thread_id"):
            stacks[i] = ()
        elif (seq, node.track) in fwd:
            stacks[i] = fwd[(seq, node.track)]
        else:
            found = tracks_of.get(seq, [])
            stacks[i] = fwd[(seq, found[0])] if len(found) == 1 else ()
    return stacks


OP_STATS_COLUMNS = opstats.columns(
    "name", "calls", "total_ns", "self_ns", "avg_ns", "device_total_ns", "device_self_ns", "flops",
    "cpu_memory_total_bytes", "cpu_memory_self_bytes", "device_memory_total_bytes", "device_memory_self_bytes")


def op_stats_table(spans: Iterable[Span], memory: Iterable[tuple[str, int, int, bool]] = (),
                   *, has_memory: bool | None = None, group_by_input_shape: bool = False,
                   group_by_stack_n: int = 0) -> Table | None:
    """``op_stats`` like torch's ``key_averages().table()``: one row per op, annotation or Python
    function name (columns: :data:`OP_STATS_COLUMNS`, the vocabulary of :mod:`omniprof.core.opstats`).

    With ``group_by_input_shape`` (torch's ``key_averages(group_by_input_shape=True)``): one row per
    name and input shapes, in a table ``op_stats_by_input_shape`` with an ``input_shapes`` column
    after the name. With ``group_by_stack_n=N`` (torch's ``key_averages(group_by_stack_n=N)``): one
    row per name and top ``N`` frames of its Python stack (:func:`call_stacks`), in a table
    ``op_stats_by_stack`` with a ``stack`` column (JSON, innermost frame first); both together give
    ``op_stats_by_input_shape_and_stack``.

    Spans nest per thread as torch's events do: a span is a child of the innermost open span that
    holds it whole (one that starts inside a span but ends after it is its sibling, as in torch).
    Self time is the span's time minus its direct children's. As in torch, an op whose only child has
    its own name (a dispatcher re-entry such as ``aten::sum`` inside ``aten::sum``) counts once, its
    child folded into it. Device time is the time of the GPU work (kernels, memcpy, memset) whose launch
    (a runtime call with its correlation id) ran inside the op; "self" counts launches made
    directly by the op, not by its children; None when the trace has no GPU work. Memory is the sum of the ``[memory]`` events' bytes
    inside the op (allocations minus frees), CPU and device apart.

    Returns None when there are no op or annotation spans.
    """
    if isinstance(group_by_stack_n, bool) or not isinstance(group_by_stack_n, int) or group_by_stack_n < 0:
        raise InvalidArgumentError(f"'group_by_stack_n' must be an integer >= 0, e.g. 5 (got {group_by_stack_n!r})")
    spans = list(spans)
    stacks = call_stacks(spans) if group_by_stack_n else {}
    device_by_corr: dict[int, int] = {}
    for s in spans:
        if s.category in _DEVICE_WORK:
            c = s.args.get("correlation_id")
            if isinstance(c, int):
                device_by_corr[c] = device_by_corr.get(c, 0) + s.dur_ns
    per_track: dict[str, list[tuple[int, int, int, int, int]]] = {}
    # Entries sort by start, then longer first, so parents precede children that start together.
    # An entry: (start, -dur, kind, span index or -1, value); kind 0 span, 1 launch, 2 CPU memory, 3 device memory.
    for i, s in enumerate(spans):
        if s.category in _NESTED:
            per_track.setdefault(s.track, []).append((s.start_ns, -s.dur_ns, 0, i, 0))
        elif s.category == "runtime" and device_by_corr:
            c = s.args.get("correlation_id")
            d = device_by_corr.get(c, 0) if isinstance(c, int) else 0
            if d:
                per_track.setdefault(s.track, []).append((s.start_ns, 0, 1, -1, d))
    mem_seen = False
    for track, t, nbytes, on_device in memory:
        mem_seen = True
        per_track.setdefault(track, []).append((t, 0, 2 if not on_device else 3, -1, nbytes))
    if not any(e[2] == 0 and spans[e[3]].category != "python" for v in per_track.values() for e in v):
        return None
    if has_memory is None:
        has_memory = mem_seen
    rows: dict[Any, list[Any]] = {}
    for entries in per_track.values():
        entries.sort(key=lambda e: (e[0], e[1], e[2]))
        # An open op: [end_ns, row, child_ns, self_dev, total_dev, self_cpu_mem, total_cpu_mem, self_dev_mem,
        #              total_dev_mem, dur_ns, flops, pending]; ``pending`` holds closed children whose rows
        # are updated when this op closes, because torch folds a same-name only child (an op's dispatcher
        # re-entry, e.g. aten::sum calling aten::sum) into its parent and so must we.
        stack: list[list[Any]] = []

        def add_row(item: list[Any]) -> None:
            _, row, child_ns, sdev, tdev, scm, tcm, sdm, tdm, dur, flops, _ = item
            row[1] += 1
            row[2] += dur
            row[3] += dur - child_ns
            row[5] += tdev
            row[6] += sdev
            if flops is not None:
                row[7] = (row[7] or 0) + flops
            row[8] += tcm
            row[9] += scm
            row[10] += tdm
            row[11] += sdm

        def close(item: list[Any]) -> None:
            pending = item[11]
            if len(pending) == 1 and pending[0][1][0] == item[1][0]:  # same name (whatever the shapes)
                child = pending[0]
                item[2] = child[2]          # the grandchildren's time
                item[3] += child[3]
                item[5] += child[5]
                item[7] += child[7]
                if item[10] is None:
                    item[10] = child[10]
            else:
                for child in pending:
                    add_row(child)
            item[11] = ()
            if stack:
                parent = stack[-1]
                parent[2] += item[9]
                parent[4] += item[4]
                parent[6] += item[6]
                parent[8] += item[8]
                parent[11].append(item)
            else:
                add_row(item)

        for start, negdur, kind, i, value in entries:
            end = start - negdur
            # torch's nesting: the open span must hold this entry whole (an instant: its time).
            while stack and (stack[-1][0] <= start or end > stack[-1][0]):
                close(stack.pop())
            if kind == 0:
                span = spans[i]
                key: Any = span.name
                if group_by_input_shape or group_by_stack_n:
                    key = (span.name,
                           json.dumps(span.args.get("input_shapes", [])) if group_by_input_shape else None,
                           json.dumps(list(stacks.get(i, ())[:group_by_stack_n])) if group_by_stack_n else None)
                row = rows.get(key)
                if row is None:
                    row = rows[key] = [span.name, 0, 0, 0, 0, 0, 0, None, 0, 0, 0, 0]
                f = span.args.get("flops")
                stack.append([span.end_ns, row, 0, 0, 0, 0, 0, 0, 0, span.dur_ns, f if isinstance(f, int) else None,
                              []])
            elif stack:
                top = stack[-1]
                if kind == 1:
                    top[3] += value
                    top[4] += value
                elif kind == 2:
                    top[5] += value
                    top[6] += value
                else:
                    top[7] += value
                    top[8] += value
        while stack:
            close(stack.pop())
    out = []
    rows_keys = []
    for key, row in rows.items():
        name, calls, total, self_ns, _, tdev, sdev, flops, tcm, scm, tdm, sdm = row
        if not calls:
            continue  # a row only ever folded into its parent (a re-dispatch with other shapes)
        has_device = bool(device_by_corr)  # no GPU work in the trace: device columns are unknown, not 0
        out.append((name, calls, total, self_ns, total // calls if calls else 0, tdev if has_device else None,
                    sdev if has_device else None, flops,
                    tcm if has_memory else None, scm if has_memory else None,
                    tdm if has_memory else None, sdm if has_memory else None))
        rows_keys.append(key)
    if group_by_input_shape or group_by_stack_n:
        extra = (("input_shapes",) if group_by_input_shape else ()) + (("stack",) if group_by_stack_n else ())
        out = [(r[0], *(k for k in key[1:] if k is not None), *r[1:]) for r, key in zip(out, rows_keys)]
        n = len(extra)
        out.sort(key=lambda r: (-r[1 + n + 2], *r[: 1 + n]))  # by self time, then name and keys
        suffix = "_and_".join("input_shape" if e == "input_shapes" else e for e in extra)
        how = ", ".join(("group_by_input_shape=True",) * group_by_input_shape +
                        ((f"group_by_stack_n={group_by_stack_n}",) if group_by_stack_n else ()))
        return Table(f"op_stats_by_{suffix}", (OP_STATS_COLUMNS[0], *extra, *OP_STATS_COLUMNS[1:]), out,
                     title=f"Op statistics by {suffix.replace('_', ' ')} (torch key_averages({how}))")
    out.sort(key=lambda r: (-r[2], r[0]))
    return Table("op_stats", OP_STATS_COLUMNS, out, title="Op statistics (torch key_averages)")


def op_table(part: BackendResult, *, group_by_input_shape: bool = False, group_by_stack_n: int = 0) -> Table | None:
    """The op table of a torch part, rebuilt from its spans and ``[memory]`` events.

    ``op_table(part)`` equals the part's ``op_stats`` table; ``group_by_input_shape=True`` gives
    torch's ``key_averages(group_by_input_shape=True)``: one row per op name and input shapes
    (shapes are recorded with ``record_shapes``, i.e. ``host_tracer_level=3``);
    ``group_by_stack_n=N`` torch's ``key_averages(group_by_stack_n=N)``: one row per op name and top
    ``N`` frames of its Python stack (stacks are recorded with ``with_stack``, i.e.
    ``python_tracer_level=1``; without them every op has an empty stack).

    >>> from omniprof.core.results import Span
    >>> spans = [Span("aten::mm", "t", 0, 10, "cpu_op", {"input_shapes": [[2, 3], [3, 4]]}),
    ...          Span("aten::mm", "t", 20, 30, "cpu_op", {"input_shapes": [[8, 3], [3, 4]]})]
    >>> [r[:3] for r in op_table(BackendResult("torch", spans=spans), group_by_input_shape=True).rows]
    [('aten::mm', '[[8, 3], [3, 4]]', 1), ('aten::mm', '[[2, 3], [3, 4]]', 1)]
    >>> spans = [Span("train.py(9): step", "t", 0, 100, "python"), Span("aten::mm", "t", 10, 20, "cpu_op"),
    ...          Span("eval.py(3): check", "t", 200, 100, "python"), Span("aten::mm", "t", 210, 5, "cpu_op")]
    >>> [r[:4] for r in op_table(BackendResult("torch", spans=spans), group_by_stack_n=1).rows
    ...  if r[0] == "aten::mm"]
    [('aten::mm', '["train.py(9): step"]', 1, 20), ('aten::mm', '["eval.py(3): check"]', 1, 5)]
    """
    memory = _memory(part)
    had = part.table("op_stats")
    has_memory = bool(memory) or (had is not None and bool(had.rows) and "cpu_memory_self_bytes" in had.columns and
                                  had.rows[0][had.columns.index("cpu_memory_self_bytes")] is not None)
    return op_stats_table(part.spans, memory, has_memory=has_memory, group_by_input_shape=group_by_input_shape,
                          group_by_stack_n=group_by_stack_n)


def _memory(part: BackendResult) -> list[tuple[str, int, int, bool]]:
    """The part's ``[memory]`` events as (track, time, bytes, on a device)."""
    return [(i.track, i.t_ns, i.args["bytes"], i.args.get("device_type", 0) not in (0, None))
            for i in part.instants if i.category == "memory" and isinstance(i.args.get("bytes"), int)]


def _part_with_tables(part: BackendResult) -> BackendResult:
    memory = _memory(part)
    table = op_stats_table(part.spans, memory, has_memory=bool(memory) or bool(part.metadata.get("profile_memory")))
    summaries = dict(part.summaries)
    # From the op table, where an op re-dispatched to itself (aten::mul inside aten::mul, both with FLOPs)
    # counts once, as in torch's key_averages(); summing every span would count it twice.
    total_flops = 0
    if table is not None:
        fi = table.columns.index("flops")
        total_flops = sum(r[fi] for r in table.rows if r[fi])
    if total_flops:
        wall_ns = part.end_ns - part.start_ns
        summaries = {"flops": {"total_flops": total_flops, "flops_per_s": total_flops / (wall_ns / 1e9) if wall_ns > 0 else None},
                     **summaries}
    tables = tuple(t for t in part.tables if t.name != "op_stats")
    part = attrs.evolve(part, tables=((table,) if table is not None else ()) + tables, summaries=summaries)
    return add_kernel_stats(part)


def with_tables(result: ProfileResult | BackendResult) -> Any:
    """``result`` (a :class:`ProfileResult` read from Kineto traces, or one part) with the tables
    torch users read: the op table ``op_stats`` (:func:`op_stats_table`), the kernel tables
    (:func:`omniprof.analysis.kernels.add_kernel_stats`) and the ``flops`` summary, built from each
    Kineto part's spans (a part whose ``metadata["format"]`` is ``"kineto"``)."""
    if isinstance(result, BackendResult):
        return _part_with_tables(result)
    parts = tuple(_part_with_tables(p) if p.metadata.get("format") == "kineto" else p for p in result.parts)
    return attrs.evolve(result, parts=parts)
