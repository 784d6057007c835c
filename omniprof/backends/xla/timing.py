"""``omniprof.jax.time`` / ``omniprof.jax.timed`` / ``omniprof.jax.profile``: Reactant's ``@time``, ``@timed``
and ``@profile`` for jax functions.

Compilation (``jit(f).lower(*args).compile()``) is timed apart from execution; every run is
synchronised with ``jax.block_until_ready`` so the time is the device's, not the dispatch's.
FLOPs and bytes come from the compiled executable's ``cost_analysis()``; memory from its
``memory_analysis()`` and, where the device reports them, the allocator's statistics
(``device.memory_stats()``: None on CPU).
"""

from __future__ import annotations

import contextlib
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

import attrs

from omniprof.analysis.render import Column, render_table, terminal_width
from omniprof.core.units import format_bytes
from omniprof.formats import xprof_runtime as _runtime
from omniprof.core import validators as v
from omniprof.core.clock import perf_counter, perf_counter_ns
from omniprof.errors import InvalidArgumentError

__all__ = ["time", "timed", "profile", "TimeResult", "AggregateProfilingResult", "FlopsSummary", "MemorySummary",
           "AllocatorSummary", "ProfileRun", "PEAK_FLOPS_PER_S", "allocator_summary", "flops_summary",
           "compile_function"]

#: Dense peak FLOP/s per device kind (bf16 where the device has it), from vendor data sheets.
#: Matched as a case-insensitive substring of ``device.device_kind``; others are unknown.
PEAK_FLOPS_PER_S: Mapping[str, float] = {
    "H200": 989e12, "H100": 989e12, "A100": 312e12, "L4": 121e12, "A10G": 125e12, "V100": 125e12, "T4": 65e12,
    "TPU v6": 918e12, "TPU v5p": 459e12, "TPU v5 lite": 197e12, "TPU v5e": 197e12, "TPU v4": 275e12,
    "TPU v3": 123e12, "TPU v2": 45e12,
}


def _fmt_bytes(n: float | None) -> str:
    """A size in the shared units (:func:`omniprof.core.units.format_bytes`), ``unknown`` when XLA gave none."""
    return "unknown" if n is None else format_bytes(n)


@attrs.frozen
class FlopsSummary:
    """FLOPs of one execution and what they mean against the time it took.

    Attributes:
        raw_flops: FLOPs of one execution (compiled cost analysis), None when XLA gives none.
        bytes_accessed: bytes read and written by one execution (cost analysis).
        raw_time_s: the time one execution took.
        raw_flops_rate: ``raw_flops / raw_time_s`` in FLOP/s.
        peak_flops_per_s: the device's peak, None when unknown (CPUs, unlisted devices).
        utilization: ``raw_flops / (peak * time)`` capped at 1.0; None when the peak is unknown.
        uncapped_utilization: the same, not capped.
        device_kind: what the peak was looked up for.
    """

    raw_flops: float | None
    bytes_accessed: float | None
    raw_time_s: float
    raw_flops_rate: float | None
    peak_flops_per_s: float | None
    utilization: float | None
    uncapped_utilization: float | None
    device_kind: str = ""

    def __repr__(self) -> str:
        def g(x: float | None) -> str:
            return "unknown" if x is None else repr(float(x))

        util_note = "" if self.peak_flops_per_s else f"  # peak FLOP/s of {self.device_kind or 'this device'} unknown"
        return ("FlopsSummary(\n"
                f"    Flops = {g(self.utilization)},{util_note or '  # [flops / (peak flops * program time)], capped at 1.0'}\n"
                f"    UncappedFlops = {g(self.uncapped_utilization)},\n"
                f"    RawFlops = {g(self.raw_flops)},  # Total FLOPs performed\n"
                f"    BytesAccessed = {_fmt_bytes(self.bytes_accessed)},\n"
                f"    RawTime = {self.raw_time_s:.8f}s,  # Raw time in seconds\n"
                f"    RawFlopsRate = {g(self.raw_flops_rate)},  # Raw FLOPs rate in FLOPs/seconds\n"
                f"    PeakFlopsRate = {g(self.peak_flops_per_s)},\n"
                ")")


@attrs.frozen
class AllocatorSummary:
    """A device allocator's statistics (``device.memory_stats()``), as XProf's memory profile names them.

    Attributes:
        name: allocator (e.g. ``GPU_0_bfc``).
        peak_bytes_in_use, bytes_in_use, memory_capacity_bytes (``bytes_limit``),
        largest_free_block_bytes, num_allocs: as the device reports them (None when not reported).
        fragmentation: ``1 - largest_free_block / free``, in [0, 1]; None when not computable.
        free_memory_bytes: ``capacity - in use``.
    """

    name: str
    peak_bytes_in_use: int | None
    bytes_in_use: int | None
    memory_capacity_bytes: int | None
    largest_free_block_bytes: int | None
    free_memory_bytes: int | None
    fragmentation: float | None
    num_allocs: int | None

    def __repr__(self) -> str:
        frag = "unknown" if self.fragmentation is None else f"{self.fragmentation:.6f}"
        return (f"MemoryProfileSummary(\n"
                f"        peak_bytes_in_use = {_fmt_bytes(self.peak_bytes_in_use)},  # peak over the allocator's lifetime\n"
                f"        bytes_in_use = {_fmt_bytes(self.bytes_in_use)},\n"
                f"        free_memory_bytes = {_fmt_bytes(self.free_memory_bytes)},\n"
                f"        fragmentation = {frag},  # fragmentation of free memory within [0, 1]\n"
                f"        memory_capacity = {_fmt_bytes(self.memory_capacity_bytes)}  # capacity of the allocator\n"
                f"    )")


@attrs.frozen
class MemorySummary:
    """Memory of one compiled function: XLA's static analysis plus the device allocator, if any.

    Attributes:
        argument_bytes, output_bytes, temp_bytes, alias_bytes, generated_code_bytes: compiled
            memory analysis (None when the backend gives none).
        peak_bytes: XLA's peak estimate, when the backend gives it.
        allocator: the device allocator's statistics, None when the device reports none (CPU).
    """

    argument_bytes: int | None = None
    output_bytes: int | None = None
    temp_bytes: int | None = None
    alias_bytes: int | None = None
    generated_code_bytes: int | None = None
    peak_bytes: int | None = None
    allocator: AllocatorSummary | None = None

    def __repr__(self) -> str:
        alloc = (f"    {self.allocator.name} = {self.allocator!r}" if self.allocator is not None
                 else "    allocator = unknown  # the device reports no allocator statistics")
        return ("MemorySummary(\n"
                f"    argument_bytes = {_fmt_bytes(self.argument_bytes)},\n"
                f"    output_bytes = {_fmt_bytes(self.output_bytes)},\n"
                f"    temp_bytes = {_fmt_bytes(self.temp_bytes)},\n"
                f"    peak_bytes = {_fmt_bytes(self.peak_bytes)},  # XLA's estimate for one execution\n"
                f"{alloc}\n"
                ")")


@attrs.frozen
class TimeResult:
    """What :func:`time` measured: one run after compiling. ``value`` is what ``f`` returned."""

    value: Any = attrs.field(repr=False)
    runtime_s: float
    compile_time_s: float

    def __repr__(self) -> str:
        return f"runtime: {self.runtime_s:.8f}s\ncompile time: {self.compile_time_s:.8f}s"


@attrs.frozen
class AggregateProfilingResult:
    """Reactant's ``AggregateProfilingResult``: runtime per execution, compile time, FLOPs, memory.

    Attributes:
        runtime_s: mean time of one execution over ``nrepeat`` runs (synchronised).
        compile_time_s: lowering + compilation.
        nrepeat: runs measured (after ``warmup`` unmeasured ones).
        runtime_min_s, runtime_median_s: of the individual runs.
        flops: :class:`FlopsSummary`. memory: :class:`MemorySummary`.
        device: the device it ran on.
        value: what the last run returned.
    """

    runtime_s: float
    compile_time_s: float
    nrepeat: int
    runtime_min_s: float
    runtime_median_s: float
    flops: FlopsSummary
    memory: MemorySummary
    device: str = ""
    warmup: int = 1
    value: Any = attrs.field(default=None, repr=False, eq=False)

    def __repr__(self) -> str:
        ind = "\n    "
        return ("AggregateProfilingResult(\n"
                f"    runtime = {self.runtime_s:.8f}s,  # mean of {self.nrepeat} synchronised run(s)\n"
                f"    runtime_min = {self.runtime_min_s:.8f}s,\n"
                f"    compile_time = {self.compile_time_s:.8f}s,  # lower + compile\n"
                f"    memory = {ind.join(repr(self.memory).splitlines())}\n"
                f"    flops = {ind.join(repr(self.flops).splitlines())}\n"
                ")")

    def to_dict(self) -> dict[str, Any]:
        d = attrs.asdict(self, filter=lambda a, _: a.name != "value")
        return d


# -- pieces ---------------------------------------------------------------------------------
def _check_callable(f: Any) -> None:
    if not callable(f):
        raise InvalidArgumentError(f"expected a function to time (got {f!r} of type {type(f).__name__})")


class _Compiled:
    """A compiled executable plus how to call it with the user's arguments.

    ``jit(f, static_argnums=...)``'s compiled object takes only the dynamic arguments; rather than
    re-deriving which those are, a call that the compiled object rejects goes through the jitted
    function, which hits the executable just compiled.
    """

    def __init__(self, compiled: Any, jitted: Any) -> None:
        self.compiled = compiled
        self.jitted = jitted
        self.direct = True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.direct:
            try:
                return self.compiled(*args, **kwargs)
            except TypeError:
                self.direct = False
        return self.jitted(*args, **kwargs)

    def cost_analysis(self) -> Any:
        return self.compiled.cost_analysis()

    def memory_analysis(self) -> Any:
        return self.compiled.memory_analysis()


def compile_function(f: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[Any, float]:
    """``(compiled, seconds)``: ``f`` jitted (unless it already is), lowered for ``args`` and compiled."""
    jax = _runtime.import_jax()
    _check_callable(f)
    jitted = f if hasattr(f, "lower") else jax.jit(f)
    t0 = perf_counter()
    compiled = jitted.lower(*args, **kwargs).compile()
    return _Compiled(compiled, jitted), perf_counter() - t0


def _blocker(jax: Any) -> Callable[[Any], Any]:
    """Wait for a result: one array's own ``block_until_ready`` (cheapest), else jax's tree-wide one."""
    tree_block = jax.block_until_ready

    def block(value: Any) -> Any:
        method = getattr(value, "block_until_ready", None)
        if method is not None:
            return method()
        return tree_block(value)

    return block


def _callable_directly(compiled: Any, args: Sequence[Any], kwargs: Mapping[str, Any], block: Any) -> bool:
    try:
        block(compiled.compiled(*args, **kwargs))
        return True
    except TypeError:
        return False


def _run_once(compiled: Any, args: Sequence[Any], kwargs: Mapping[str, Any], block: Callable[[Any], Any]) -> Any:
    return block(compiled(*args, **kwargs))


def _cost(compiled: Any) -> dict[str, float]:
    try:
        ca = compiled.cost_analysis()
    except Exception:  # some backends raise instead of returning nothing
        return {}
    if isinstance(ca, (list, tuple)):  # older jax: one dict per computation
        ca = ca[0] if ca else {}
    return {k: float(v) for k, v in (ca or {}).items() if isinstance(v, (int, float))}


def peak_flops_for(device_kind: str) -> float | None:
    low = device_kind.lower()
    for key, peak in sorted(PEAK_FLOPS_PER_S.items(), key=lambda kv: -len(kv[0])):
        if key.lower() in low:
            return peak
    return None


def flops_summary(cost: Mapping[str, float], time_s: float, device_kind: str) -> FlopsSummary:
    flops = cost.get("flops")
    flops = flops if flops is not None and flops >= 0 else None
    rate = flops / time_s if flops is not None and time_s > 0 else None
    peak = peak_flops_for(device_kind)
    util = rate / peak if rate is not None and peak else None
    return FlopsSummary(raw_flops=flops, bytes_accessed=cost.get("bytes accessed"), raw_time_s=time_s,
                        raw_flops_rate=rate, peak_flops_per_s=peak,
                        utilization=min(util, 1.0) if util is not None else None, uncapped_utilization=util,
                        device_kind=device_kind)


def allocator_summary(stats: Mapping[str, Any] | None, name: str) -> AllocatorSummary | None:
    """From ``device.memory_stats()`` (None on CPU) to an :class:`AllocatorSummary`."""
    if not stats:
        return None

    def i(key: str) -> int | None:
        val = stats.get(key)
        return int(val) if isinstance(val, (int, float)) and not isinstance(val, bool) else None

    in_use, limit, largest = i("bytes_in_use"), i("bytes_limit"), i("largest_free_block_bytes")
    free = limit - in_use if limit is not None and in_use is not None else None
    frag = None
    if free and largest is not None:
        frag = max(0.0, min(1.0, 1.0 - largest / free))
    return AllocatorSummary(name=name, peak_bytes_in_use=i("peak_bytes_in_use"), bytes_in_use=in_use,
                            memory_capacity_bytes=limit, largest_free_block_bytes=largest, free_memory_bytes=free,
                            fragmentation=frag, num_allocs=i("num_allocs"))


def memory_summary(compiled: Any, device: Any) -> MemorySummary:
    try:
        m = compiled.memory_analysis()
    except Exception:
        m = None

    def get(attr: str) -> int | None:
        val = getattr(m, attr, None) if m is not None else None
        return int(val) if isinstance(val, int) else None

    try:
        stats = device.memory_stats()
    except Exception:
        stats = None
    alloc_name = f"{str(device.platform).upper()}_{device.id}_bfc"
    return MemorySummary(argument_bytes=get("argument_size_in_bytes"), output_bytes=get("output_size_in_bytes"),
                         temp_bytes=get("temp_size_in_bytes"), alias_bytes=get("alias_size_in_bytes"),
                         generated_code_bytes=get("generated_code_size_in_bytes"),
                         peak_bytes=get("peak_memory_in_bytes"), allocator=allocator_summary(stats, alloc_name))


def _device_of(jax: Any, value: Any) -> Any:
    for leaf in jax.tree_util.tree_leaves(value):
        devs = getattr(leaf, "devices", None)
        if callable(devs):
            with contextlib.suppress(Exception):
                return next(iter(devs()))
    return jax.devices()[0]


# -- public ---------------------------------------------------------------------------------
def time(f: Callable[..., Any], *args: Any, **kwargs: Any) -> TimeResult:
    """Compile ``f`` for ``args`` and run it once: compile time and (synchronised) runtime.

    Reactant's ``@time``. ``f`` is jitted unless it already is; ``value`` holds what it returned.

    >>> import jax.numpy as jnp, omniprof
    >>> r = omniprof.jax.time(lambda x: x * 2, jnp.ones(4))
    >>> r.runtime_s > 0 and r.compile_time_s > 0
    True

    .. versionadded:: 0.1
    """
    jax = _runtime.import_jax()
    compiled, compile_s = compile_function(f, args, kwargs)
    t0 = perf_counter()
    value = _run_once(compiled, args, kwargs, _blocker(jax))
    return TimeResult(value=value, runtime_s=perf_counter() - t0, compile_time_s=compile_s)


def timed(f: Callable[..., Any], *args: Any, nrepeat: int = 100, warmup: int = 1, **kwargs: Any) -> AggregateProfilingResult:
    """Compile ``f``, run it ``warmup`` times unmeasured, then ``nrepeat`` times measured.

    Reactant's ``@timed``: mean runtime, compile time, FLOPs (raw, rate, utilisation where the peak
    is known) and memory (compiled analysis, allocator statistics where the device has them).

    >>> import jax.numpy as jnp, omniprof
    >>> agg = omniprof.jax.timed(lambda x: x @ x, jnp.ones((8, 8)), nrepeat=5)
    >>> agg.nrepeat, agg.flops.raw_flops > 0
    (5, True)

    .. versionadded:: 0.1
    """
    v.int_in_range(1, 10**9)(None, "nrepeat", nrepeat)
    v.int_in_range(0, 10**6)(None, "warmup", warmup)
    jax = _runtime.import_jax()
    compiled, compile_s = compile_function(f, args, kwargs)
    block = _blocker(jax)
    value = None
    for _ in range(warmup):
        value = _run_once(compiled, args, kwargs, block)
    if warmup == 0:  # settle how the compiled object is called before measuring
        compiled.direct = _callable_directly(compiled, args, kwargs, block)
    call = compiled.compiled if compiled.direct else compiled.jitted
    stamps = [0] * (nrepeat + 1)
    clock = perf_counter_ns
    stamps[0] = clock()
    for i in range(1, nrepeat + 1):
        value = block(call(*args, **kwargs))
        stamps[i] = clock()
    runs = [(stamps[i + 1] - stamps[i]) / 1e9 for i in range(nrepeat)]
    mean = (stamps[-1] - stamps[0]) / 1e9 / nrepeat
    device = _device_of(jax, value)
    kind = str(getattr(device, "device_kind", ""))
    return AggregateProfilingResult(
        runtime_s=mean, compile_time_s=compile_s, nrepeat=nrepeat, runtime_min_s=min(runs),
        runtime_median_s=statistics.median(runs), flops=flops_summary(_cost(compiled), mean, kind),
        memory=memory_summary(compiled, device), device=f"{device.platform}:{device.id} ({kind})", warmup=warmup,
        value=value)


@attrs.frozen
class ProfileRun:
    """What :func:`profile` produced: the function's value, the trace's result, the summary and the
    rows of the tables it printed (plain data: ``kernel_rows``, ``op_rows``)."""

    value: Any = attrs.field(repr=False)
    result: Any = attrs.field(repr=False)
    summary: AggregateProfilingResult
    kernel_rows: tuple[dict[str, Any], ...] = ()
    op_rows: tuple[dict[str, Any], ...] = ()

    def render(self) -> str:
        return render_profile(self)


def profile(f: Callable[..., Any], *args: Any, file: IO[str] | None = None, logdir: str | None = None,
            options: Any = None, quiet: bool = False, **kwargs: Any) -> ProfileRun:
    """Compile ``f``, run it once unmeasured, then once under the ``xla`` backend, and print the
    kernel table (when there are kernels), the framework op table and the summary.

    Reactant's ``@profile``. Output goes to ``file`` (default stdout) unless ``quiet``.

    .. versionadded:: 0.1
    """
    from omniprof.core.profiler import Profiler
    from omniprof.core.results import Table

    jax = _runtime.import_jax()
    compiled, compile_s = compile_function(f, args, kwargs)
    block = _blocker(jax)
    _run_once(compiled, args, kwargs, block)  # warm-up: first-run allocations stay out of the trace
    prof = Profiler(backend="xla", options=options, logdir=logdir)
    with prof:
        t0 = perf_counter()
        value = _run_once(compiled, args, kwargs, block)
        runtime_s = perf_counter() - t0
    result = prof.result
    part = result.part("xla")
    device = _device_of(jax, value)
    kind = str(getattr(device, "device_kind", ""))
    summary = AggregateProfilingResult(
        runtime_s=runtime_s, compile_time_s=compile_s, nrepeat=1, runtime_min_s=runtime_s, runtime_median_s=runtime_s,
        flops=flops_summary(_cost(compiled), runtime_s, kind), memory=memory_summary(compiled, device),
        device=f"{device.platform}:{device.id} ({kind})", warmup=1, value=value)

    def rows(t: Table | None) -> tuple[dict[str, Any], ...]:
        return tuple(t.records()) if t is not None else ()

    run = ProfileRun(value=value, result=result, summary=summary, kernel_rows=rows(part.table("kernel_stats")),
                     op_rows=rows(part.table("op_stats")))
    if not quiet:
        out = file if file is not None else sys.stdout
        out.write(render_profile(run, width=terminal_width(out)))
    return run


# -- rendering (rows first, then boxes) -----------------------------------------------------
def _s(ns: Any) -> str:
    return "-" if ns is None else f"{ns / 1e9:.8f}s"


def kernel_table_cells(rows: Sequence[Mapping[str, Any]]) -> tuple[list[Column], list[list[str]]]:
    """The kernel table's columns and cells (Reactant's columns), for the one renderer."""
    head = [Column("Kernel Name", min_width=24), Column("Occurrences", kind="num"),
            Column("Total Duration", kind="num"), Column("Avg Duration", kind="num", drop=3),
            Column("Min Duration", kind="num", drop=5), Column("Max Duration", kind="num", drop=4),
            Column("Static Shmem", kind="num", drop=2), Column("Block Dim", kind="label", drop=1),
            Column("Grid Dim", kind="label", drop=1), Column("TensorCore", kind="label"),
            Column("Occupancy %", kind="num")]
    cells = [[str(r["kernel_name"]), str(r["occurrences"]), _s(r["total_ns"]), _s(r["avg_ns"]), _s(r["min_ns"]),
              _s(r["max_ns"]), _fmt_bytes(r["static_shared_memory_bytes"]), str(r["block_dim"] or "-"),
              str(r["grid_dim"] or "-"), "✓" if r["tensor_core"] else "✗",
              "-" if r["occupancy_pct"] is None else f"{r['occupancy_pct']:.1f}%"] for r in rows]
    return head, cells


def op_table_cells(rows: Sequence[Mapping[str, Any]]) -> tuple[list[Column], list[list[str]]]:
    """The framework op table's columns and cells (Reactant's columns), for the one renderer."""
    head = [Column("Operation", min_width=24), Column("Type", kind="label"), Column("Host/Device", kind="label"),
            Column("Occurrences", kind="num"), Column("Total Self-Time", kind="num"),
            Column("Avg Self-Time", kind="num", drop=2), Column("Device %", kind="num"),
            Column("Memory BW", kind="num", drop=1), Column("FLOP Rate", kind="num", drop=1),
            Column("Bound By", kind="label")]

    def rate(x: Any, unit: str) -> str:
        return "-" if x is None else f"{x / 1e9:.2f} {unit}"

    cells = [[str(r["name"]), str(r["op_type"]), str(r["runs_on"]), str(r["calls"]),
              _s(r["self_ns"]), _s(r["avg_self_ns"]),
              "-" if r["self_share_pct"] is None else f"{r['self_share_pct']:.2f}%",
              rate(r["memory_bandwidth_bytes_per_s"], "GB/s"), rate(r["flops_per_s"], "GFLOP/s"),
              str(r["bound_by"] or "-")] for r in rows]
    return head, cells


def _banner(title: str, width: int) -> list[str]:
    inner = max(width - 2, len(title) + 2)
    return ["╔" + "═" * inner + "╗", "║ " + title.ljust(inner - 1) + "║", "╚" + "═" * inner + "╝"]


def render_profile(run: ProfileRun, width: int | None = None) -> str:
    """The kernel table, the op table and the summary, fitted to ``width`` (None: 80-wide banners,
    tables never cut)."""
    lines: list[str] = []
    bw = min(width or 80, 80)
    if run.kernel_rows:
        lines += _banner("KERNEL STATISTICS", bw)
        lines.append(render_table(*kernel_table_cells(run.kernel_rows), width=width))
    if run.op_rows:
        lines += _banner("FRAMEWORK OP STATISTICS", bw)
        lines.append(render_table(*op_table_cells(run.op_rows), width=width))
    lines += _banner("SUMMARY", bw)
    lines += repr(run.summary).splitlines()
    return "\n".join(lines) + "\n"
