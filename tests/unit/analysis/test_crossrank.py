"""Cross-rank analysis against references computed another way: a sweep line over interval ends
(not the union/intersect code under test), hand-worked small cases, and real GPU traces."""

from __future__ import annotations

import gzip
import json
import random
import warnings
from pathlib import Path

import attrs
import pytest

import omniprof

from omniprof.formats.kineto import read_trace
from omniprof.analysis import crossrank as cr
from omniprof.core.results import BackendResult, ProfileResult, RunMetadata, Span, Track
from omniprof.errors import TraceReadError
from tests.tools import shared_data


def _sweep(classes: dict[str, list[tuple[int, int]]], lo: int, hi: int) -> dict[str, int]:
    """Reference: walk every interval end in time order with a counter per class and add up, per
    elementary segment, which classes are active (the partition the module documents)."""
    points = sorted({lo, hi, *(t for iv in classes.values() for a, b in iv for t in (a, b) if lo <= t <= hi)})
    out = {"compute": 0, "comm": 0, "mem": 0, "comm_exposed": 0, "mem_exposed": 0, "idle": 0, "overlap": 0}
    for a, b in zip(points, points[1:]):
        mid = (a + b) / 2
        on = {k for k, iv in classes.items() if any(x <= mid < y for x, y in iv)}
        d = b - a
        out["compute"] += d if "compute" in on else 0
        out["comm"] += d if "comm" in on else 0
        out["mem"] += d if "mem" in on else 0
        out["overlap"] += d if {"comm", "compute"} <= on else 0
        out["comm_exposed"] += d if "comm" in on and "compute" not in on else 0
        out["mem_exposed"] += d if on == {"mem"} else 0
        out["idle"] += d if not on else 0
    return out


def test_interval_union_matches_a_sweep() -> None:
    """union() of random intervals has the sweep's covered length and is sorted and disjoint."""
    rng = random.Random(3)
    for _ in range(50):
        iv = [(a, a + rng.randrange(0, 50)) for a in (rng.randrange(0, 500) for _ in range(rng.randrange(0, 30)))]
        u = cr.union(iv)
        assert all(a < b for a, b in u) and all(u[i][1] < u[i + 1][0] for i in range(len(u) - 1))
        ref = _sweep({"compute": iv}, 0, 600)["compute"]
        assert sum(b - a for a, b in u) == ref


def _part(spans: list[Span]) -> BackendResult:
    tracks = sorted({s.track for s in spans})
    return BackendResult(backend="torch", tracks=[Track(t, t) for t in tracks], spans=spans)


def test_cpu_breakdown_hand_worked() -> None:
    """One 100 ns step: ops 0-30 and 20-50 (two threads), gloo all-reduce 40-80 on the comm thread,
    c10d op 90-95: compute 50, comm 45 of which 10 under compute, idle 15 (50-..: 80-90, 95-100)."""
    spans = [Span("ProfilerStep#7", "main", 0, 100, "step"),
             Span("aten::mm", "main", 0, 30, "cpu_op"), Span("aten::add", "bwd", 20, 30, "cpu_op"),
             Span("gloo:all_reduce", "gloo", 40, 40, "annotation"), Span("c10d::allreduce_", "main", 90, 5, "cpu_op"),
             Span("DistributedDataParallel.forward", "main", 0, 60, "annotation")]
    s = cr.reduce_rank([_part(spans)], rank=0)
    assert (s.source, s.window_ns, s.compute_ns, s.communication_ns, s.overlap_ns) == ("cpu", 100, 50, 45, 10)
    assert (s.exposed_communication_ns, s.exposed_memory_ns, s.idle_ns) == (35, 0, 15)
    assert s.idle_causes == {"host outside ops": 15}
    assert s.overlap_pct == pytest.approx(100 * 10 / 45)
    (row,) = s.steps
    assert (row.step, row.dur_ns, row.compute_ns, row.communication_ns, row.idle_ns) == (7, 100, 50, 45, 15)
    assert row.top_ops == (("aten::add", 30), ("aten::mm", 30))  # longest first, ties by name; no comm ops
    assert tuple(s.collectives) == (("gloo:all_reduce", 40, 40),)  # gloo: spans are the primary kind


def test_gpu_breakdown_on_a_real_trace_matches_the_sweep() -> None:
    """AlexNet's real Kineto trace (HTA's test data): compute kernels, memcpy/memset and idle from
    the module agree with the sweep over the same spans, and partition the window."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = read_trace(shared_data("kineto", "alexnet_cuda_trace.json.gz"))
    part = res.parts[0]
    dev = [s for s in part.spans if s.category in ("kernel", "memcpy", "memset")]
    classes = {"compute": [(s.start_ns, s.end_ns) for s in dev if s.category == "kernel" and not cr.is_comm(s.name)],
               "comm": [(s.start_ns, s.end_ns) for s in dev if s.category == "kernel" and cr.is_comm(s.name)],
               "mem": [(s.start_ns, s.end_ns) for s in dev if s.category != "kernel"]}
    lo, hi = min(s.start_ns for s in dev), max(s.end_ns for s in dev)
    ref = _sweep(classes, lo, hi)
    s = cr.reduce_rank(res.parts, rank=0)
    assert s.source == "gpu" and s.window_ns == hi - lo
    assert (s.compute_ns, s.communication_ns, s.memory_ns) == (ref["compute"], ref["comm"], ref["mem"])
    assert (s.exposed_memory_ns, s.idle_ns, s.overlap_ns) == (ref["mem_exposed"], ref["idle"], ref["overlap"])
    assert s.compute_ns + s.exposed_communication_ns + s.exposed_memory_ns + s.idle_ns == s.window_ns
    assert sum(s.idle_causes.values()) == s.idle_ns


def test_gpu_idle_split_by_the_launch_that_ended_it() -> None:
    """Gap 1 (10-40) ends with a kernel launched at 30: 20 ns waiting on the host (10-30), 10 on
    other work; gap 2 (50-60) ends with a kernel launched long before: all sync/dependency."""
    spans = [Span("k1", "s", 0, 10, "kernel"), Span("launch", "cpu", 30, 2, "runtime", flow_ids=(2,)),
             Span("k2", "s", 40, 10, "kernel", flow_ids=(2,)), Span("launch", "cpu", 5, 2, "runtime", flow_ids=(3,)),
             Span("k3", "s", 60, 10, "kernel", flow_ids=(3,))]
    s = cr.reduce_rank([_part(spans)], rank=0)
    assert s.idle_ns == 40
    assert s.idle_causes == {"waiting on host launch": 20, "waiting on sync/dependency": 20,
                             "before first / after last kernel": 0}


def test_gpu_idle_before_an_nccl_kernel_follows_the_same_rule() -> None:
    """The documented rule holds for any kernel, a communication one too: gap 10-40 ends with an NCCL
    all-reduce launched at 30 (20 ns waiting on the host, 10 on other work); gap 50-60 ends with an
    NCCL kernel launched at 5 (all sync/dependency); gap 70-75 with a compute kernel launched at 72."""
    nccl = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
    spans = [Span("k1", "s", 0, 10, "kernel"), Span("cudaLaunchKernelExC", "cpu", 30, 2, "runtime", flow_ids=(2,)),
             Span(nccl, "s", 40, 10, "kernel", flow_ids=(2,)), Span("cudaLaunchKernelExC", "cpu", 5, 2, "runtime",
                                                                   flow_ids=(3,)),
             Span(nccl, "s", 60, 10, "kernel", flow_ids=(3,)), Span("cudaLaunchKernel", "cpu", 72, 2, "runtime",
                                                                   flow_ids=(4,)),
             Span("k2", "s", 75, 5, "kernel", flow_ids=(4,))]
    s = cr.reduce_rank([_part(spans)], rank=0)
    assert s.idle_ns == 30 + 10 + 5
    assert s.idle_causes == {"waiting on host launch": 20 + 0 + 2, "waiting on sync/dependency": 10 + 10 + 3,
                             "before first / after last kernel": 0}


def _rank(rank: int, steps: list[tuple[int, int]], colls: list[tuple[int, int]], gap: int = 0) -> RankSummary:
    spans = []
    for i, (a, d) in enumerate(steps):
        spans.append(Span(f"ProfilerStep#{i + 1}", "main", a, d, "step"))
    for a, d in colls:
        spans.append(Span("gloo:all_reduce", "gloo", a, d, "annotation"))
    return cr.reduce_rank([_part(spans)], rank=rank)


RankSummary = cr.RankSummary


def test_waiting_own_time_and_straggler_worked_by_hand() -> None:
    """Ranks 0 and 1 wait 60 ms in each step's all-reduce for rank 2, which has 10 ms ones: rank 2
    is the straggler in both steps; its own time 100 ms vs the median's 40 ms."""
    ms = 1_000_000
    fast = [(0, 100 * ms), (100 * ms, 100 * ms)]
    r0 = _rank(0, fast, [(30 * ms, 70 * ms), (130 * ms, 70 * ms)])
    r1 = _rank(1, fast, [(30 * ms, 70 * ms), (130 * ms, 70 * ms)])
    r2 = _rank(2, fast, [(90 * ms, 10 * ms), (190 * ms, 10 * ms)])
    rep = cr.combine([r2, r0, r1])
    assert [r.rank for r in rep.ranks] == [0, 1, 2]
    assert rep.wait_ns == {(0, 1): 60 * ms, (0, 2): 60 * ms, (1, 1): 60 * ms, (1, 2): 60 * ms,
                           (2, 1): 0, (2, 2): 0}
    (s,) = rep.stragglers
    assert (s.rank, s.slow_steps, s.steps) == (2, (1, 2), 2)
    # the waiting it caused: ranks 0 and 1 waited 60 ms for it in each of the 2 all-reduces it reached last
    assert (s.wait_caused_ns, s.last_in, s.compared) == (240 * ms, 2, 2)
    assert s.wait_caused_by_step == {1: 120 * ms, 2: 120 * ms}
    assert s.by_collective == (("gloo:all_reduce", 2, 240 * ms),)
    assert s.own_ns == {1: 100 * ms, 2: 100 * ms} and s.median_own_ns == {1: 40 * ms, 2: 40 * ms}
    assert s.step_ns == {1: 100 * ms, 2: 100 * ms}
    assert [(x.rank, x.wait_caused_ns) for x in rep.wait_caused] == [(2, 240 * ms)]
    rows = {(x["step"], x["rank"]): x for x in rep.step_rows()}
    assert rows[(1, 0)]["own_ns"] == 40 * ms and rows[(1, 2)]["wait_ns"] == 0
    assert "Straggler: rank 2 cost the others 240.000 ms of waiting" in rep.to_text()


def test_the_straggler_is_the_rank_the_others_waited_for_not_the_longest_own_time() -> None:
    """Issue 27's DLRM case in small (an all-to-all whose ranks move unequal data): in every step
    rank 3 reaches the collective last, 28 ms after the others; rank 1 starts with the others but has
    little to receive and is done in 2 ms, so by "duration - shortest" it waited least and its own
    time is the largest (100 ms vs the median's 70: the old own-time rule named ranks 1 and 3). Ranks
    0, 2 and 4 waited 30 ms each for rank 3 (rank 1 none): rank 3 alone is named, charged 90 ms a step."""
    ms = 1_000_000
    steps = [(0, 100 * ms), (100 * ms, 100 * ms), (200 * ms, 100 * ms)]
    ranks = []
    for rank in range(5):
        at, dur = {1: (30, 2), 3: (58, 4)}.get(rank, (30, 32))
        ranks.append(_rank(rank, steps, [(a + at * ms, dur * ms) for a, _ in steps]))
    rep = cr.combine(ranks)
    assert [s.rank for s in rep.stragglers] == [3]
    (s,) = rep.stragglers
    assert (s.wait_caused_ns, s.last_in, s.compared) == (3 * 90 * ms, 3, 3)
    assert s.wait_caused_by_step == {1: 90 * ms, 2: 90 * ms, 3: 90 * ms}
    assert s.own_ns == {1: 98 * ms, 2: 98 * ms, 3: 98 * ms} and s.median_own_ns == {1: 70 * ms, 2: 70 * ms, 3: 70 * ms}
    assert [x.rank for x in rep.wait_caused] == [3]
    own = {(x["rank"], x["step"]): x["own_ns"] for x in rep.step_rows()}
    assert max(own, key=own.get)[0] == 1  # the longest own time is rank 1's, which made no one wait


def test_arrivals_within_the_clocks_uncertainty_share_the_charge() -> None:
    """Ranks 1 and 2 reach the collective 0.3 ms apart with clocks known to ±0.2 ms each: either may
    have been last, so rank 0's 5 ms of waiting is charged half to each; with exact clocks, all to
    rank 2."""
    ms = 1_000_000

    def ranks(unc: int) -> list[RankSummary]:
        out = []
        for rank, a in ((0, 10 * ms), (1, 15 * ms - 300_000), (2, 15 * ms)):
            s = _rank(rank, [(0, 50 * ms)], [(a, 20 * ms - a)])
            out.append(attrs.evolve(s, clock_uncertainty_ns=unc))
        return out

    exact = cr.combine(ranks(0))
    assert [(x.rank, x.wait_caused_ns) for x in exact.wait_caused] == [(2, 5 * ms + 300_000)]
    shared = cr.combine(ranks(200_000))
    assert [(x.rank, x.wait_caused_ns, x.last_in) for x in shared.wait_caused] == [(1, 2_500_000, 1),
                                                                                  (2, 2_500_000, 1)]


def test_balanced_ranks_have_no_straggler_and_mismatched_collectives_are_noted() -> None:
    """Equal ranks: none named. A collective seen a different number of times is noted, not hidden."""
    ms = 1_000_000
    a = _rank(0, [(0, 50 * ms)], [(10 * ms, 5 * ms)])
    b = _rank(1, [(0, 50 * ms)], [(10 * ms, 5 * ms), (20 * ms, 5 * ms)])
    rep = cr.combine([a, b])
    assert rep.stragglers == () and rep.wait_caused == ()
    assert rep.notes and "'gloo:all_reduce' occurs {0: 1, 1: 2}" in rep.notes[0]
    assert "No straggler" in rep.to_text()


def _write_trace(path: Path, rank: int | None, step_ms: float) -> None:
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0,
               "dur": step_ms * 1000},
              {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": step_ms * 900}]
    doc = {"traceEvents": events, "baseTimeNanoseconds": 0}
    if rank is not None:
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": 2}
    with gzip.open(path, "wt") as fh:
        json.dump(doc, fh)


def test_kineto_directory_ranks_from_file_names_or_distributed_info(tmp_path: Path) -> None:
    """HTA-style inputs: a rank number in the name, or distributedInfo.rank inside (which wins)."""
    _write_trace(tmp_path / "worker_rank1.pt.trace.json.gz", None, 5)
    _write_trace(tmp_path / "anything.json.gz", 0, 3)
    rep = cr.analyze(tmp_path, workers=1)
    assert [(r.rank, r.steps[0].dur_ns) for r in rep.ranks] == [(0, 3_000_000), (1, 5_000_000)]
    _write_trace(tmp_path / "other.json.gz", None, 3)
    with pytest.raises(TraceReadError, match="no rank in the trace"):
        cr.analyze(tmp_path, workers=1)


def test_kineto_directory_problems_are_named(tmp_path: Path) -> None:
    """Two files for one rank, an empty directory, a file instead of a directory: one clear error each."""
    with pytest.raises(TraceReadError, match="no rank<N>/omniprof.result.json and no Kineto trace"):
        cr.analyze(tmp_path)
    _write_trace(tmp_path / "a_rank0.json.gz", None, 1)
    _write_trace(tmp_path / "b_rank0.json.gz", None, 1)
    with pytest.raises(TraceReadError, match=r"several files claim rank\(s\) \[0\]"):
        cr.analyze(tmp_path, workers=1)
    with pytest.raises(TraceReadError, match="not a directory"):
        cr.analyze(tmp_path / "a_rank0.json.gz")


def test_parallel_reading_gives_the_same_report(tmp_path: Path) -> None:
    """Ranks reduced in worker processes give exactly what reading them here gives."""
    with gzip.open(shared_data("kineto", "alexnet_cuda_trace.json.gz"), "rt") as fh:
        doc = json.load(fh)
    for r in range(3):
        doc["distributedInfo"]["rank"] = r
        with gzip.open(tmp_path / f"trace{r}.json.gz", "wt") as fh:
            json.dump(doc, fh)
    assert cr.analyze(tmp_path, workers=2) == cr.analyze(tmp_path, workers=1)


def test_merged_result_without_rank_metadata_is_one_rank() -> None:
    """A plain single-process result analyses as rank 0."""
    res = ProfileResult(metadata=RunMetadata(host="h"), parts=(_part([Span("aten::mm", "m", 0, 10, "cpu_op")]),))
    rep = cr.analyze(res)
    assert [r.rank for r in rep.ranks] == [0] and rep.ranks[0].compute_ns == 10


def test_steps_marked_by_two_backends_come_from_the_framework() -> None:
    """torch's ProfilerStep#3 and the cpu backend's "step 3" (which runs on until the session stops):
    the step is torch's."""
    torch_part = _part([Span("ProfilerStep#3", "main", 10, 80, "step", args={"step_num": 3}),
                        Span("aten::mm", "main", 20, 10, "cpu_op")])
    cpu_part = attrs.evolve(_part([Span("step 3", "steps", 5, 500, "step", args={"step_num": 3})]), backend="cpu")
    for parts in ([torch_part, cpu_part], [cpu_part, torch_part]):
        s = cr.reduce_rank(parts, rank=0)
        assert [(r.step, r.start_ns, r.dur_ns) for r in s.steps] == [(3, 10, 80)]
        assert s.window_ns == 80 and s.idle_ns == 70


# -- duration distribution across ranks -------------------------------------------------------------
def _numpy_stats(durs_ns: list[float]) -> tuple[float, ...]:
    import numpy as np

    a = np.array(durs_ns, dtype=float)
    return (len(a), float(np.median(a)), float(np.percentile(a, 90)), float(a.max()), float(a.sum()))


def test_duration_stats_agree_with_numpy_on_random_samples() -> None:
    """Median and p90 interpolate as numpy's default method does (to the rounding ns)."""
    rng = random.Random(7)
    for n in (1, 2, 3, 9, 10, 11, 100, 1001):
        xs = [rng.randrange(1, 10_000_000) for _ in range(n)]
        ours = cr.duration_stats(xs)
        ref = _numpy_stats(xs)
        assert ours[0] == ref[0] and ours[3] == ref[3] and ours[4] == ref[4]
        assert abs(ours[1] - ref[1]) <= 0.5 and abs(ours[2] - ref[2]) <= 0.5, (n, ours, ref)
    assert cr.duration_stats([]) == (0, 0, 0, 0, 0)


def test_kernel_distribution_equals_numpy_over_the_raw_kineto_json(tmp_path: Path) -> None:
    """Two real GPU traces as two ranks (alexnet: distributedInfo.rank 0; triton: rank 1 from its
    file name): every kernel, memcpy and memset's count, median, p90, max and total per rank equal
    numpy's over the `dur` of the trace's own events, read with the json module."""
    import shutil

    shutil.copy(shared_data("kineto", "alexnet_cuda_trace.json.gz"), tmp_path / "alexnet.json.gz")
    shutil.copy(shared_data("kineto", "triton_cuda_trace.json.gz"), tmp_path / "triton_rank1.json.gz")
    rep = cr.analyze(tmp_path, workers=1)
    rows = {r.name: r for r in rep.durations()}
    checked = 0
    for file, rank in (("alexnet.json.gz", 0), ("triton_rank1.json.gz", 1)):
        with gzip.open(tmp_path / file, "rt") as fh:
            events = json.load(fh)["traceEvents"]
        by: dict[str, list[float]] = {}
        for e in events:
            if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
                by.setdefault(e["name"], []).append(float(e["dur"]) * 1000)
        assert by
        assert {n for n, r in rows.items() if any(x.rank == rank for x in r.per_rank)} == set(by)
        for name, durs in by.items():
            got = rows[name].rank(rank)
            ref = _numpy_stats(durs)
            assert got.count == ref[0], name
            for ours, theirs in zip((got.median_ns, got.p90_ns, got.max_ns, got.total_ns), ref[1:]):
                assert abs(ours - theirs) <= 0.5 + 1e-9 * theirs, (name, got, ref)
            checked += 1
    assert checked == 19
    # Sorted by total time on all ranks; kernels only rank 0 ran name rank 1 as missing.
    totals = [r.total_ns for r in rep.durations()]
    assert totals == sorted(totals, reverse=True)
    assert rows["ampere_sgemm_32x32_sliced1x4_tn"].missing_ranks == (1,)
    assert len(rep.durations(top=3)) == 3


def _rank_with(rank: int, durs: dict[str, list[int]]) -> cr.RankSummary:
    spans, t = [], 0
    for name, ds in durs.items():
        for d in ds:
            spans.append(Span(name, "s", t, d, "kernel"))
            t += d + 10
    part = BackendResult("torch", tracks=[Track("s", "stream 7", kind="gpu")], spans=spans)
    return cr.reduce_rank([part], rank=rank)


def test_slowest_rank_spread_and_text() -> None:
    """The slowest rank is the one with the highest median (not the highest max); the text marks it;
    with more than 8 ranks only each kernel's 2 slowest ranks and its fastest are listed."""
    ranks = [_rank_with(0, {"gemm": [100, 100, 100, 5000]}), _rank_with(1, {"gemm": [300, 300, 300]}),
             _rank_with(2, {"gemm": [200, 200], "copy": [50]})]
    rep = cr.combine(ranks)
    gemm = next(r for r in rep.durations() if r.name == "gemm")
    assert (gemm.slowest_rank, gemm.fastest_rank, gemm.spread) == (1, 0, 3.0)
    assert gemm.rank(0).max_ns == 5000 and gemm.rank(0).p90_ns == round(100 + 0.7 * 4900)
    copy = next(r for r in rep.durations() if r.name == "copy")
    assert copy.missing_ranks == (0, 1)
    text = rep.to_text()
    assert "Kernel duration by rank" in text
    assert [ln.split()[:2] for ln in text.splitlines() if ln.startswith("gemm")] == [["gemm", "0"]]
    assert any(ln.split()[:1] == ["1*"] for ln in text.splitlines())
    many = cr.combine([_rank_with(r, {"gemm": [100 + r] * 3}) for r in range(12)])
    lines = many.to_text().split("Kernel duration by rank")[1].splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("kernel "))
    rows = [ln for ln in lines[start + 1:] if ln.strip() and not ln.startswith("─")]  # the renderer's rule: not a row
    listed = [next(t for t in ln.split() if t.rstrip("*").isdigit()) for ln in rows]
    assert listed == ["0", "10", "11*"]  # in rank order


def test_distribution_keeps_the_names_with_most_time_and_says_how_many_went(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past MAX_DURATION_NAMES distinct names on a rank, those with the least total time are summed
    into one counted row (their runs and time exact), and the report says so."""
    monkeypatch.setattr(cr.reduce, "MAX_DURATION_NAMES", 3)
    s = _rank_with(0, {f"k{i}": [100 * (i + 1)] * (i + 1) for i in range(5)})
    assert sorted(s.durations) == ["k2", "k3", "k4"] and s.durations_left_out == 2
    assert s.durations_other is not None
    assert (s.durations_other.count, s.durations_other.total_ns) == (1 + 2, 100 + 2 * 200)
    rep = cr.combine([s])
    assert [r.name for r in rep.durations()] == ["k4", "k3", "k2"]
    note = ("rank 0 ran more than 3 distinct kernel/op names: the 2 with the least total time are summed as one row "
            "out of the duration distribution (3 runs, 0.001 ms)")
    assert note in rep.notes
    assert "note: rank 0 ran more than 3 distinct kernel/op names" in rep.to_text()


def test_report_json_carries_the_cross_rank_analysis(tmp_path: Path) -> None:
    """`omniprof report DIR -r json` on five per-rank Kineto traces (the all-to-all case above,
    written as raw trace JSON): the saved result holds the analysis under
    metadata.distributed.cross_rank, valid against docs/schema/cross-rank.schema.json, with the
    hand-worked figures: rank 3 named, 90 ms a step charged to it, and each rank's wait/own per step."""
    import jsonschema

    from omniprof.cli import main

    for rank in range(5):
        at, dur = {1: (30, 2), 3: (58, 4)}.get(rank, (30, 32))
        events = []
        for st in range(3):
            t0 = 1_000_000 + st * 100_000  # µs
            events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{st + 1}", "pid": 1, "tid": 1,
                           "ts": t0, "dur": 100_000})
            events.append({"ph": "X", "cat": "user_annotation", "name": "nccl:all_to_all", "pid": 1, "tid": 2,
                           "ts": t0 + at * 1000, "dur": dur * 1000})
        doc = {"traceEvents": events, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 5}}
        (tmp_path / f"rank{rank}.pt.trace.json").write_text(json.dumps(doc))
    out = tmp_path / "out"
    assert main(["report", str(tmp_path), "-r", "json", "-o", str(out)]) == 0
    (saved,) = out.glob("*.json")
    cross = json.loads(saved.read_text())["metadata"]["distributed"]["cross_rank"]
    schema = json.loads((Path(__file__).resolve().parents[3] / "docs" / "schema" / "cross-rank.schema.json").read_text())
    jsonschema.validate(cross, schema)
    ms = 1_000_000
    assert [s["rank"] for s in cross["stragglers"]] == [3]
    (s,) = cross["stragglers"]
    assert (s["wait_caused_ns"], s["last_in"], s["compared"]) == (270 * ms, 3, 3)
    assert s["by_step"] == [{"step": st, "ns": 90 * ms} for st in (1, 2, 3)]
    assert s["own"][0] == {"step": 1, "step_ns": 100 * ms, "own_ns": 98 * ms, "median_own_ns": 70 * ms}
    waits = {(x["rank"], x["step"]): (x["wait_ns"], x["own_ns"]) for x in cross["steps"]}
    assert waits == {(r, st): ({1: 0, 3: 2 * ms}.get(r, 30 * ms), 100 * ms - {1: 0, 3: 2 * ms}.get(r, 30 * ms))
                     for r in range(5) for st in (1, 2, 3)}
    assert [x["rank"] for x in cross["ranks"]] == list(range(5)) and cross["version"] == 1
    assert {d["name"] for d in cross["durations"]} == {"nccl:all_to_all"}
    assert omniprof.load(saved).metadata.distributed["cross_rank"] == cross  # the result still loads
