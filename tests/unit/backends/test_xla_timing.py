"""omniprof.jax.time / timed / profile on real jax (CPU), and their summaries."""

from __future__ import annotations

import io

import pytest

pytest.importorskip("jax")

import omniprof  # noqa: E402
from omniprof.backends.xla import timing  # noqa: E402
from omniprof.errors import InvalidArgumentError  # noqa: E402


def _matmul_args(n=16):
    import jax.numpy as jnp

    return jnp.ones((n, n), jnp.float32)


def test_time_separates_compile_and_runtime_and_returns_value():
    """time() compiles then runs once; the value is f's result, both times are positive."""
    import jax.numpy as jnp

    r = omniprof.jax.time(lambda x: x * 3, jnp.arange(4.0))
    assert r.value.tolist() == [0.0, 3.0, 6.0, 9.0]
    assert r.runtime_s > 0 and r.compile_time_s > 0
    text = repr(r)
    assert text.startswith("runtime: ") and "compile time: " in text


def test_timed_counts_runs_and_reads_flops_from_cost_analysis():
    """timed() runs nrepeat measured runs; RawFlops is XLA's count for an n*n matmul (2 n^3)."""
    x = _matmul_args(16)
    calls = []

    def f(a):
        calls.append(1)  # runs at trace time only: the compiled function is what is timed
        return a @ a

    agg = omniprof.jax.timed(f, x, nrepeat=7)
    assert agg.nrepeat == 7 and len(calls) == 1
    assert agg.flops.raw_flops == pytest.approx(2 * 16**3, rel=0.01)
    assert agg.runtime_min_s <= agg.runtime_median_s and agg.runtime_s > 0
    assert agg.flops.raw_flops_rate == pytest.approx(agg.flops.raw_flops / agg.runtime_s)
    assert agg.memory.argument_bytes == 16 * 16 * 4 and agg.memory.output_bytes == 16 * 16 * 4
    assert (agg.value == x @ x).all()


def test_timed_on_cpu_says_peak_and_allocator_unknown():
    """On CPU the peak FLOP/s and the allocator statistics are unknown, and the repr says so."""
    agg = omniprof.jax.timed(lambda a: a + 1, _matmul_args(4), nrepeat=3)
    assert agg.flops.peak_flops_per_s is None and agg.flops.utilization is None
    assert agg.memory.allocator is None
    text = repr(agg)
    assert "AggregateProfilingResult(" in text and "compile_time = " in text
    assert "unknown" in text and "RawFlops = " in text


def test_timed_validates_nrepeat():
    """nrepeat must be a positive integer."""
    with pytest.raises(InvalidArgumentError, match="'nrepeat'"):
        omniprof.jax.timed(lambda a: a, _matmul_args(2), nrepeat=0)
    with pytest.raises(InvalidArgumentError, match="function"):
        omniprof.jax.time(3, _matmul_args(2))


def test_already_jitted_function_is_used_as_is():
    """A jitted function is lowered directly (static args of the jit are respected)."""
    import functools

    import jax

    @functools.partial(jax.jit, static_argnums=1)
    def scale(a, k):
        return a * k

    r = omniprof.jax.time(scale, _matmul_args(2), 5)
    assert float(r.value[0, 0]) == 5.0


def test_utilization_against_known_peak_is_capped():
    """With a listed device the utilisation is flops / (peak * time), capped at 1."""
    s = timing.flops_summary({"flops": 989e12, "bytes accessed": 10.0}, 0.5, "NVIDIA H100 80GB HBM3")
    assert s.peak_flops_per_s == 989e12
    assert s.uncapped_utilization == pytest.approx(2.0) and s.utilization == 1.0
    slow = timing.flops_summary({"flops": 1e12}, 1.0, "TPU v4")
    assert slow.utilization == pytest.approx(1e12 / 275e12)


def test_allocator_summary_from_device_memory_stats():
    """GPU-style memory_stats become peak, in-use, capacity and fragmentation of free memory."""
    stats = {"bytes_in_use": 30 * 1024, "peak_bytes_in_use": 81 * 1024, "bytes_limit": 1 << 30,
             "largest_free_block_bytes": (1 << 29), "num_allocs": 12}
    a = timing.allocator_summary(stats, "GPU_0_bfc")
    assert a.free_memory_bytes == (1 << 30) - 30 * 1024
    assert a.fragmentation == pytest.approx(1 - (1 << 29) / ((1 << 30) - 30 * 1024))
    assert a.peak_bytes_in_use == 81 * 1024 and a.memory_capacity_bytes == 1 << 30
    assert "fragmentation" in repr(a)
    assert timing.allocator_summary(None, "CPU_0_bfc") is None


def test_profile_prints_op_table_and_summary():
    """profile() runs once under the trace and prints the framework op table and the summary."""
    out = io.StringIO()
    run = omniprof.jax.profile(lambda a: (a @ a).sum(), _matmul_args(32), file=out)
    text = out.getvalue()
    assert "FRAMEWORK OP STATISTICS" in text and "SUMMARY" in text and "KERNEL STATISTICS" not in text
    assert run.op_rows and {"name", "self_share_pct", "self_ns"} <= set(run.op_rows[0])
    for r in run.op_rows:
        assert r["name"] in text
    assert run.result.part("xla").table("op_stats") is not None
    assert float(run.value) == 32 * 32 * 32


def test_kernel_table_rendering_matches_seed_columns():
    """Kernel rows render with the seed's columns: block/grid dims, shared memory, tensor core, occupancy."""
    rows = [{"kernel_name": "gemm_fusion_dot_1", "occurrences": 1, "total_ns": 2500, "avg_ns": 2500, "min_ns": 2500,
             "max_ns": 2500, "static_shared_memory_bytes": 2048, "block_dim": "64,1,1", "grid_dim": "1,1,1",
             "tensor_core": False, "occupancy_pct": 100.0}]
    agg = omniprof.jax.timed(lambda a: a, _matmul_args(2), nrepeat=1)
    text = timing.render_profile(timing.ProfileRun(value=None, result=None, summary=agg, kernel_rows=tuple(rows)))
    assert "KERNEL STATISTICS" in text
    line = next(ln for ln in text.splitlines() if "gemm_fusion_dot_1" in ln)
    for cell in ("0.00000250s", "2.0 KiB", "64,1,1", "1,1,1", "✗", "100.0%"):
        assert cell in line
