"""torch's op statistics from a Kineto part's spans: the op table (``key_averages()``) and stacks.

This is analysis of what :mod:`omniprof.formats.kineto` reads: :func:`with_tables` adds the op
table, the kernel tables and the FLOPs summary to a torch part (the Kineto reader plugin and the
torch backend call it after reading); :func:`op_table` rebuilds the op table grouped by input shape
or stack.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, overload

import attrs

from omniprof.formats.kernels import add_kernel_stats
from omniprof.analysis.nesting import TORCH, Nest, nest
from omniprof.core import opstats
from omniprof.core.results import BackendResult, ProfileResult, Span, Table
from omniprof.errors import InvalidArgumentError

__all__ = ["OP_STATS_COLUMNS", "op_stats_table", "op_table", "call_stacks", "with_tables"]

_DEVICE_WORK = frozenset({"kernel", "memcpy", "memset"})


# -- op statistics -----------------------------------------------------------------------------------
#: Frames torch leaves out of an event's stack (``torch.autograd.profiler_util._filter_stack_entry``).
_STACK_FILTER = (("autograd/__init__", "_make_grads"), ("autograd/__init__", "backward"), ("torch/tensor", "backward"),
                 ("_internal/common_utils", "prof_callable"), ("_internal/common_utils", "prof_func_call"),
                 ("_internal/common_utils", "prof_meth_call"))
_EVALUATE = "autograd::engine::evaluate_function: "
#: The op table's row name of every ``ProfilerStep#N`` (torch's ``_rewrite_name``).
STEP_ROW = "ProfilerStep*"


def _keep_frame(frame: str) -> bool:
    return not any(a in frame and b in frame for a, b in _STACK_FILTER)


def call_stacks(spans: Sequence[Span], nested: Nest | None = None) -> dict[int, tuple[str, ...]]:
    """The Python stack of each span of torch's op table (by index in ``spans``), innermost frame
    first, as torch's ``FunctionEvent.stack``; ``nested`` is :func:`~omniprof.analysis.nesting.nest`
    of ``spans`` by the torch rule, when the caller has it.

    Where the trace wrote stacks (``Call stack`` args, kept as ``call_stack``: torch 1.x with
    ``with_stack``, torch 2.x with ``_ExperimentalConfig(verbose=True)``) they are used as written,
    and a span without one has an empty stack. Otherwise (torch 2.x's default) the stack is rebuilt
    from the ``python`` spans: the Python functions running on the span's thread when it started.
    Runtime calls have none (Kineto records no stack for them). Then, as torch does: frames of
    autograd's own ``backward`` entry points are left out, and every span inside a backward node (a
    ``cpu_op`` run by ``autograd::engine::evaluate_function: <its name>``) takes the stack of the
    forward op that created the node (same ``sequence_number``, found on the node's own thread
    first; a node without a forward thread id gets an empty stack).
    """
    nested = nested if nested is not None else nest(spans, TORCH)
    order = nested.order  # each track's spans, parents before their children
    written = any("call_stack" in spans[i].args for i in order)
    per_track: dict[str, list[int]] = {}
    for i in order:
        per_track.setdefault(spans[i].track, []).append(i)
    stacks: dict[int, tuple[str, ...]] = {}
    for idx in per_track.values():
        # The Python calls open when each span starts: a Python call before the op it makes at the same instant.
        py: list[int] = []
        for i in sorted(idx, key=lambda i: (spans[i].start_ns, -spans[i].end_ns, spans[i].category != "python")):
            s = spans[i]
            while py and spans[py[-1]].end_ns <= s.start_ns:
                py.pop()
            if s.category == "runtime":
                frames: tuple[Any, ...] = ()
            elif written:
                cs = s.args.get("call_stack")
                frames = tuple(cs) if isinstance(cs, (list, tuple)) else ()
            else:
                frames = tuple(spans[j].name for j in reversed(py))
            stacks[i] = tuple(f for f in frames if isinstance(f, str) and _keep_frame(f))
            if s.category == "python":
                py.append(i)
    parent = {i: (nested.parent[i] if nested.parent[i] >= 0 else None) for i in order}
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
    """``op_stats`` like torch's ``key_averages().table()``: one row per op, annotation, runtime call or
    Python function name (columns: :data:`OP_STATS_COLUMNS`, the vocabulary of :mod:`omniprof.core.opstats`).

    With ``group_by_input_shape`` (torch's ``key_averages(group_by_input_shape=True)``): one row per
    name and input shapes, in a table ``op_stats_by_input_shape`` with an ``input_shapes`` column
    after the name. With ``group_by_stack_n=N`` (torch's ``key_averages(group_by_stack_n=N)``): one
    row per name and top ``N`` frames of its Python stack (:func:`call_stacks`), in a table
    ``op_stats_by_stack`` with a ``stack`` column (JSON, innermost frame first); both together give
    ``op_stats_by_input_shape_and_stack``.

    Spans nest by torch's rule, :data:`omniprof.analysis.nesting.TORCH`: per thread, a span is a
    child of the innermost open span that holds it whole; the CUDA/HIP runtime and driver calls
    (``cudaLaunchKernel``, ``cudaMemcpyAsync``, ``cudaStreamSynchronize``, ...) are children of the
    op that made them and rows of their own, so an op's self time leaves them out; torch's utility
    ops (``aten::is_leaf``, ...) are left out; an op whose only child has its own name (a dispatcher
    re-entry such as ``aten::sum`` inside ``aten::sum``) counts once, its child folded into it; every
    ``ProfilerStep#N`` is one row, ``ProfilerStep*``. Self time is the span's time minus its direct
    children's. Device time is the time of the GPU work (kernels, memcpy, memset) attached to its op
    by correlation (the op that made the launch whose correlation id the work carries), with its
    children's; "self" counts the op's own launches; None when the trace has no GPU work. Memory is
    the sum of the ``[memory]`` events' bytes inside the op (allocations minus frees), CPU and
    device apart.

    Returns None when there are no op or annotation spans.
    """
    if isinstance(group_by_stack_n, bool) or not isinstance(group_by_stack_n, int) or group_by_stack_n < 0:
        raise InvalidArgumentError(f"'group_by_stack_n' must be an integer >= 0, e.g. 5 (got {group_by_stack_n!r})")
    spans = list(spans)
    nested = nest(spans, TORCH)
    if not any(spans[i].category in ("cpu_op", "annotation", "step") for i in nested.order):
        return None
    stacks = call_stacks(spans, nested) if group_by_stack_n else {}
    memory = list(memory)
    if has_memory is None:
        has_memory = bool(memory)
    device_by_corr: dict[int, int] = {}
    for s in spans:
        if s.category in _DEVICE_WORK:
            c = s.args.get("correlation_id")
            if isinstance(c, int):
                device_by_corr[c] = device_by_corr.get(c, 0) + s.dur_ns
    counted = list(nested.counted())
    parent, owner = nested.parent, nested.owner
    n = len(spans)
    # Per counted span, what it holds itself: the GPU work it launched (by correlation: the launch's
    # op), the [memory] events while it was the innermost span (CPU, device); then its totals, the
    # same with its children's added.
    own_dev, own_cm, own_dm = [0] * n, [0] * n, [0] * n
    flops: list[int | None] = [None] * n
    for i in nested.order:
        sp = spans[i]
        if device_by_corr and sp.category == "runtime":
            c = sp.args.get("correlation_id")
            d = device_by_corr.get(c, 0) if isinstance(c, int) else 0
            op = nested.launcher(i) if d else -1
            if op >= 0:
                own_dev[op] += d
        f = sp.args.get("flops")
        if isinstance(f, int) and flops[owner[i]] is None:  # a folded re-dispatch's FLOPs count where its op has none
            flops[owner[i]] = f
    for (_, _, nbytes, on_device), i in zip(memory, nested.enclosing((m[0], m[1]) for m in memory)):
        if i >= 0:
            (own_dm if on_device else own_cm)[i] += nbytes
    tot_dev, tot_cm, tot_dm = own_dev[:], own_cm[:], own_dm[:]
    for i in reversed(counted):  # children before their parents
        p = parent[i]
        if p >= 0:
            q = owner[p]
            tot_dev[q] += tot_dev[i]
            tot_cm[q] += tot_cm[i]
            tot_dm[q] += tot_dm[i]
    rows: dict[Any, list[Any]] = {}
    for i in counted:
        sp = spans[i]
        name = STEP_ROW if sp.category == "step" else sp.name
        key: Any = name
        if group_by_input_shape or group_by_stack_n:
            key = (name,
                   json.dumps(sp.args.get("input_shapes", [])) if group_by_input_shape else None,
                   json.dumps(list(stacks.get(i, ())[:group_by_stack_n])) if group_by_stack_n else None)
        row = rows.get(key)
        if row is None:
            row = rows[key] = [name, 0, 0, 0, 0, 0, 0, None, 0, 0, 0, 0]
        row[1] += 1
        row[2] += sp.dur_ns
        row[3] += sp.dur_ns - nested.children_ns[i]
        row[5] += tot_dev[i]
        row[6] += own_dev[i]
        if flops[i] is not None:
            row[7] = (row[7] or 0) + flops[i]
        row[8] += tot_cm[i]
        row[9] += own_cm[i]
        row[10] += tot_dm[i]
        row[11] += own_dm[i]
    out = []
    rows_keys = []
    for key, row in rows.items():
        name, calls, total_ns, self_ns, _, tdev, sdev, row_flops, tcm, scm, tdm, sdm = row
        has_device = bool(device_by_corr)  # no GPU work in the trace: device columns are unknown, not 0
        out.append((name, calls, total_ns, self_ns, total_ns // calls, tdev if has_device else None,
                    sdev if has_device else None, row_flops,
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


@overload
def with_tables(result: ProfileResult) -> ProfileResult: ...


@overload
def with_tables(result: BackendResult) -> BackendResult: ...


def with_tables(result: ProfileResult | BackendResult) -> ProfileResult | BackendResult:
    """``result`` (a :class:`ProfileResult` read from Kineto traces, or one part) with the tables
    torch users read: the op table ``op_stats`` (:func:`op_stats_table`), the kernel tables
    (:func:`omniprof.formats.kernels.add_kernel_stats`) and the ``flops`` summary, built from each
    Kineto part's spans (a part whose ``metadata["format"]`` is ``"kineto"``)."""
    if isinstance(result, BackendResult):
        return _part_with_tables(result)
    parts = tuple(_part_with_tables(p) if p.metadata.get("format") == "kineto" else p for p in result.parts)
    return attrs.evolve(result, parts=parts)
