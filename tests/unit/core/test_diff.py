"""omniprof.analysis.diff: function, op and kernel tables compared; what counts as a regression."""

from __future__ import annotations

import pytest

from omniprof import InvalidArgumentError
from omniprof.analysis.diff import TOTAL_KEY, diff, format_diff
from omniprof.formats.kernels import kernel_stats_table
from omniprof.core.results import BackendResult, Frame, ProfileResult, Span, StackSample, Table
from omniprof.testing import make_result


def sampled(weights: dict[str, int]) -> ProfileResult:
    """A cpu part whose samples end in the named functions (one sample each, weight in ns), under main."""
    frames = [Frame("main", "app.py", 1)] + [Frame(n, "app.py", 10 + i) for i, n in enumerate(weights)]
    stacks = [(0, i + 1) for i in range(len(weights))]
    samples = [StackSample(i, 1, i, w) for i, w in enumerate(weights.values())]
    return ProfileResult(parts=(BackendResult(backend="cpu", frames=frames, stacks=stacks, samples=samples),))


def ops(rows: dict[str, int], backend: str = "xla") -> ProfileResult:
    t = Table("op_stats", ("name", "count", "total_ns"), [(n, 1, v) for n, v in rows.items()])
    return ProfileResult(parts=(BackendResult(backend=backend, tables=(t,)),))


def rows_by_key(d, table="op_stats"):
    t = next(t for t in d.tables if t.name == table)
    return {r.key: r for r in t.rows}


def test_identical_results_have_no_regression():
    """A result compared with itself: every row 'same', zero deltas, nothing regressed."""
    d = diff(make_result(), make_result())
    assert d.regressions == []
    assert all(r.status == "same" and r.delta_ns == 0 for t in d.tables for r in t.rows)


def test_function_self_times_and_shares_are_compared():
    """Sampled functions compare by self time; shares and share deltas come from each run's total."""
    d = diff(sampled({"f": 600, "g": 400}), sampled({"f": 600, "g": 1400}))
    rows = rows_by_key(d, "functions")
    g = rows["g  app.py"]
    assert (g.a_ns, g.b_ns, g.delta_ns, g.delta_pct) == (400, 1400, 1000, 250.0)
    assert (round(g.a_share_pct), round(g.b_share_pct)) == (40, 70)
    assert g.regressed and not rows["f  app.py"].regressed
    assert rows[TOTAL_KEY].a_ns == 1000 and rows[TOTAL_KEY].b_ns == 2000 and rows[TOTAL_KEY].regressed
    assert rows["main  app.py"].a_ns == 0  # main has no self time


def test_threshold_decides_regression():
    """A 30% growth regresses at threshold 10 and not at threshold 50."""
    a, b = ops({"dot": 1000}), ops({"dot": 1300})
    assert rows_by_key(diff(a, b, threshold_pct=10))["dot"].regressed
    assert not rows_by_key(diff(a, b, threshold_pct=50))["dot"].regressed


def test_small_entries_are_noise_below_min_share():
    """An entry that doubles but holds under min_share_pct of the table does not regress."""
    a = ops({"big": 100_000, "tiny": 100})
    b = ops({"big": 100_000, "tiny": 200})
    assert not rows_by_key(diff(a, b, min_share_pct=1.0))["tiny"].regressed
    assert rows_by_key(diff(a, b, min_share_pct=0.0))["tiny"].regressed


def test_new_and_vanished_entries():
    """New entries regress when large enough; vanished entries never regress."""
    d = diff(ops({"dot": 1000, "old": 500}), ops({"dot": 1000, "conv": 400}))
    rows = rows_by_key(d)
    assert rows["conv"].status == "new" and rows["conv"].regressed and rows["conv"].delta_pct is None
    assert rows["old"].status == "vanished" and not rows["old"].regressed
    assert not diff(ops({"dot": 1000}), ops({"dot": 1000, "conv": 1}), min_share_pct=1.0).regressions


def test_kernel_stats_compared_by_kernel_name():
    """kernel_stats tables compare total_ns per kernel name (launch configs summed)."""
    def part(durs):
        spans = [Span("gemm", "s", i * 100, d, "kernel", {"block": [b, 1, 1]}) for i, (d, b) in enumerate(durs)]
        return ProfileResult(parts=(BackendResult(backend="cupti", tables=(kernel_stats_table(spans),)),))
    d = diff(part([(100, 128), (100, 256)]), part([(150, 128), (150, 256)]))
    t = next(t for t in d.tables if t.name == "kernel_stats")
    assert t.time_column == "total_ns"
    gemm = {r.key: r for r in t.rows}["gemm"]
    assert (gemm.a_ns, gemm.b_ns, gemm.regressed) == (200, 300, True)


def test_tables_that_cannot_be_compared_are_listed():
    """A table only in one result, or a backend only in one, is named in `skipped`, never silently dropped."""
    a = ops({"dot": 1})
    b = ProfileResult(parts=(BackendResult(backend="xla", tables=(Table("hlo_stats", ("name", "total_ns"), [("x", 1)]),)),
                             BackendResult(backend="torch")))
    d = diff(a, b)
    assert d.tables == ()
    assert set(d.skipped) == {"xla/op_stats: only in A", "xla/hlo_stats: only in B", "backend torch: only in B"}
    assert "note: not compared: backend torch: only in B" in format_diff(d)


def test_format_marks_regressions_and_cuts_rows():
    """The text form marks regressed rows with '!' and says how many rows it left out."""
    d = diff(ops({f"op{i}": 100 for i in range(5)}), ops({**{f"op{i}": 100 for i in range(4)}, "op4": 500}))
    text = format_diff(d, max_rows=2)
    assert text.startswith("== omniprof diff: 2 regression(s)")
    assert any(line.startswith("!") and line.rstrip().endswith("op4") for line in text.splitlines())
    assert "3 more rows not shown" in text


@pytest.mark.parametrize("bad", [-1, float("nan"), "10", True])
def test_bad_thresholds_are_refused(bad):
    """A negative, NaN or non-numeric threshold raises InvalidArgumentError naming it."""
    with pytest.raises(InvalidArgumentError, match="threshold_pct"):
        diff(make_result(), make_result(), threshold_pct=bad)


def test_functions_match_across_checkouts():
    """The same function under /ci/run1/app/x.py and /home/me/app/x.py is one row, not new + vanished."""
    def at(root, w):
        frames = [Frame("f", f"{root}/app/x.py", 3)]
        return ProfileResult(parts=(BackendResult(backend="cpu", frames=frames, stacks=[(0,)],
                                                  samples=[StackSample(0, 1, 0, w)]),))
    rows = rows_by_key(diff(at("/ci/run1", 100), at("/home/me", 300)), "functions")
    assert set(rows) == {TOTAL_KEY, "f  app/x.py"} and rows["f  app/x.py"].status == "changed"


def test_permutation_p_exact_and_sampled_agree():
    """The exact p counts splits by hand-checkable rules; the sampled p (past the split limit) is close to it."""
    from omniprof.analysis.diff import permutation_p

    assert permutation_p([1, 2, 3], [4, 5, 6]) == pytest.approx(1 / 20)   # only the observed split is as extreme
    assert permutation_p([1, 2, 4], [3, 5, 6]) == pytest.approx(2 / 20)   # and {4,5,6}
    a = [10, 12, 11, 13, 12, 11, 10, 14]
    b = [12, 13, 15, 14, 13, 16, 12, 15]
    exact = permutation_p(a, b)                      # C(16, 8) = 12870 splits, enumerated
    sampled = permutation_p(a, b, max_splits=5000, draws=5000)   # drawn
    assert 0 < exact < 0.01 and sampled == pytest.approx(exact, abs=0.004)


def test_repeated_runs_need_significance_and_say_when_alpha_is_out_of_reach():
    """3 vs 3 runs where 'dot' grows 30% but overlaps: not significant; 2 vs 2 cannot reach alpha, and says so."""
    base = [ops({"dot": v, "add": 1000}) for v in (1000, 1400, 1100)]
    new = [ops({"dot": v, "add": 1000}) for v in (1500, 1200, 1400)]
    d = diff(base, new, alpha=0.05)
    dot = rows_by_key(d)["dot"]
    assert dot.delta_pct > 10 and not dot.regressed and dot.status == "same" and dot.p_value > 0.05
    sep = diff(base, [ops({"dot": v, "add": 1000}) for v in (1600, 1700, 1650)], alpha=0.05)
    assert rows_by_key(sep)["dot"].regressed and rows_by_key(sep)["dot"].p_value == pytest.approx(1 / 20)
    two = diff(base[:2], new[:2])
    assert not two.regressions and "smallest possible p is 0.167 > alpha 0.01" in two.notes[0]


@pytest.mark.parametrize("bad", [0, 1, -0.1, "0.05", True])
def test_bad_alpha_is_refused(bad):
    with pytest.raises(InvalidArgumentError, match="alpha"):
        diff(make_result(), make_result(), alpha=bad)


# -- calls capped at a multiple of their median over all runs ---------------------------------------
def _torch_run(mm_us, preempted=(), add_us=(50, 50)):
    """A torch-like part: ``aten::mm`` calls of ``mm_us`` microseconds then two ``aten::add`` calls,
    back to back on one thread, the op table built from them; ``preempted``: (call index, extra ms)
    pairs, time the scheduler gave another process in the middle of that mm call."""
    from omniprof.analysis.torch_ops import op_stats_table

    extra = dict(preempted)
    spans, t = [], 0
    for i, us in enumerate(mm_us):
        dur = round(us * 1000) + round(extra.get(i, 0) * 1_000_000)
        spans.append(Span("aten::mm", "thread:1", t, dur, "cpu_op"))
        t += dur + 1000
    for us in add_us:
        spans.append(Span("aten::add", "thread:1", t, us * 1000, "cpu_op"))
        t += us * 1000 + 1000
    return ProfileResult(parts=(BackendResult(backend="torch", spans=tuple(spans),
                                              tables=(op_stats_table(spans),)),))


def _five(scale, preempted):
    return [_torch_run([(400 + i) * scale, (380 + i) * scale, (360 + i) * scale], preempted.get(i, ()))
            for i in range(5)]


def test_a_call_lost_to_another_process_does_not_hide_a_slower_op():
    """mm 20% slower in every call of B, but two of A's five runs had one call stretched by 8 ms (the
    scheduler ran another process): with plain sums those runs outrank B's and the rank test cannot
    tell (p > alpha); with each call capped at 1.1x the median of the same call over all ten runs the
    separation is complete (p = 1/252) and mm alone (with the table's total) regresses."""
    base = _five(1.0, {1: [(0, 8)], 3: [(2, 8)]})
    slow = _five(1.2, {2: [(1, 8)]})
    plain = diff(base, slow, clip_calls=None)
    plain_mm = next(r for t in plain.tables for r in t.rows if r.key == "aten::mm")
    assert plain_mm.p_value > 0.01 and not plain_mm.regressed
    capped = diff(base, slow)
    table = next(t for t in capped.tables if t.name == "op_stats")
    assert table.clipped == 2 and "judged with each call at most 1.1x its median over all runs" in format_diff(capped)
    assert {r.key for _, r in capped.regressions} == {"aten::mm", TOTAL_KEY}
    mm = next(r for r in table.rows if r.key == "aten::mm")
    # By hand: the call at place 0 over the ten runs sorts 400, 402, 403, 404, 480, 481.2, ... us, so
    # its median is 480.6 us and the cap 528.66 us; A's run 1 counts 528.66 + 381 + 361 = 1270.66 us.
    # Place 2: median (432 + 433.2) / 2 = 432.6 us, cap 475.86; A's run 3: 403 + 383 + 475.86 = 1261.86.
    # Place 1: 380, ..., 384, 456, 457.2, 459.6, 460.8, 8458.4: median 420, cap 462, so B's run 2
    # counts 482.4 + 462 + 434.4 = 1378.8 us. A's runs 1140, 1270.66, 1146, 1261.86, 1152 all lie
    # under B's 1368, 1371.6, 1378.8, 1378.8, 1382.4: complete separation, p = 1/252.
    assert mm.p_value == 1 / 252 and mm.regressed
    # The times shown stay the medians of the runs as recorded (plain sums), capped or not.
    assert (mm.a_ns, mm.b_ns) == (plain_mm.a_ns, plain_mm.b_ns) == (1_152_000, 1_378_800)
    # identical setups, one of them hit by the same kind of stall: nothing regresses, capped or not
    again = _five(1.0, {0: [(1, 8)]})
    for clip in (None, 1.1):
        assert diff(base, again, clip_calls=clip).regressions == []


def test_calls_are_not_capped_where_runs_differ_or_with_one_run_a_side():
    """Runs whose numbers of calls differ keep their plain sums; so does a single run per side."""
    a = _five(1.0, {})
    b = [_torch_run([400 * 1.2, 380 * 1.2]) for _ in range(5)]  # 2 mm calls instead of 3
    d = diff(a, b)
    table = next(t for t in d.tables if t.name == "op_stats")
    assert table.clipped == 1  # aten::add only
    mm = next(r for r in table.rows if r.key == "aten::mm")
    assert mm.a_ns == (402 + 382 + 362) * 1000 and mm.b_ns == round((400 + 380) * 1.2 * 1000)
    one = diff(a[0], b[0])
    assert next(t for t in one.tables if t.name == "op_stats").clipped == 0


@pytest.mark.parametrize("bad", [0.5, -1, True, float("nan"), float("inf"), "1.1"])
def test_bad_clip_calls_is_refused(bad):
    with pytest.raises(InvalidArgumentError, match="clip_calls"):
        diff(make_result(), make_result(), clip_calls=bad)
