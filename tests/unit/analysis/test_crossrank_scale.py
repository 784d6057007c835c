"""Cross-rank analysis at scale: ranks read in a stream (bounded memory), and on a real Dask cluster.

References: the in-memory reader's spans (``read_trace``) reduced, a brute-force pass over the spans
per step, a sweep line over interval ends, and the local analysis (the executor must give exactly
what the local pool gives)."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import random
import socket
import tracemalloc
import warnings
from pathlib import Path

import attrs
import pytest

from omniprof.analysis import crossrank as cr
from omniprof.analysis.crossrank import executor as ex
from omniprof.cli import main
from omniprof.errors import InvalidArgumentError, TraceReadError
from omniprof.formats.kineto import read_trace
from tests.tools import shared_data


def _read(path: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return read_trace(path)


def _trace(path: Path, rank: int, steps: int, *, slow: float = 1.0, seed: int = 0, kernels: int = 4) -> None:
    """A GPU-rank trace: per step ``kernels`` launched GEMM kernels (3 names), a memcpy, an NCCL
    all-reduce that ends when the slowest rank's compute is done, and the step annotation (times in
    µs, as Kineto writes)."""
    import random

    rng = random.Random(seed * 1000 + rank)
    ev = []
    corr = 0
    t0 = 1_000_000.0
    for st in range(steps):
        t = t0
        for k in range(kernels):
            corr += 1
            d = round(rng.uniform(900, 1100) * slow, 3)
            ev.append({"ph": "X", "cat": "cpu_op", "name": f"aten::op{k % 2}", "pid": 1, "tid": 1, "ts": t, "dur": d})
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t + 1,
                       "dur": 3, "args": {"correlation": corr}})
            ev.append({"ph": "X", "cat": "kernel", "name": f"gemm{k % 3}", "pid": 0, "tid": 7, "ts": t + 5 + rng.random(),
                       "dur": d, "args": {"correlation": corr, "device": 0, "stream": 7}})
            t += d + 8
        ev.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "pid": 0, "tid": 7, "ts": t, "dur": 4,
                   "args": {"device": 0, "stream": 7}})
        end = t0 + kernels * (1100 * 1.5 + 8) + 20
        ev.append({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce", "pid": 0, "tid": 8, "ts": t + 2,
                   "dur": round(end - t, 3), "args": {"device": 0, "stream": 8}})
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{st}", "pid": 1, "tid": 1, "ts": t0,
                   "dur": round(end + 5 - t0, 3)})
        t0 = end + 10
    rng.shuffle(ev)  # a stream in no particular order: the reduction must not depend on it
    doc = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 4},
           "traceEvents": ev}
    with gzip.open(path, "wt") as fh:
        json.dump(doc, fh)


def _fields(s: cr.RankSummary) -> dict:
    d = attrs.asdict(s)
    d.pop("label")
    return d


@pytest.fixture(scope="module")
def rank_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ranks")
    for r in range(4):
        _trace(d / f"rank{r}.pt.trace.json.gz", r, 30, slow=1.5 if r == 2 else 1.0)
    return d


@pytest.mark.parametrize("chunk", [4, 1 << 16])
def test_streamed_reduction_equals_the_in_memory_one(rank_dir: Path, monkeypatch, chunk: int) -> None:
    """reduce_file (a stream, events in shuffled order, unions merged every few intervals) gives the
    very summary reduce_rank gives over read_trace's spans, on the real AlexNet trace and ours."""
    monkeypatch.setattr(cr.intervals, "CHUNK", chunk)
    for path in (shared_data("kineto", "alexnet_cuda_trace.json.gz"), rank_dir / "rank2.pt.trace.json.gz"):
        streamed = cr.reduce_file(str(path), "kineto", 0)
        res = _read(path)
        whole = cr.reduce_rank(res.parts, rank=streamed.rank, host=res.metadata.host)
        assert _fields(streamed) == _fields(whole)
        assert streamed.compute_ns + streamed.exposed_communication_ns + streamed.exposed_memory_ns \
            + streamed.idle_ns == streamed.window_ns


def test_per_step_figures_against_brute_force(rank_dir: Path) -> None:
    """Each step's compute, communication, idle and top kernels, recomputed by brute force: a pass
    over every nanosecond boundary of the step's spans and a plain sum of kernels by name."""
    path = rank_dir / "rank1.pt.trace.json.gz"
    s = cr.reduce_file(str(path), "kineto", None)
    spans = _read(path).parts[0].spans
    kern = [x for x in spans if x.category == "kernel" and not cr.is_comm(x.name)]
    comm = [x for x in spans if x.category == "kernel" and cr.is_comm(x.name)]
    mem = [x for x in spans if x.category == "memcpy"]
    steps = sorted((x for x in spans if x.category == "step"), key=lambda x: x.start_ns)
    assert [r.step for r in s.steps] == [int(x.name.split("#")[1]) for x in steps]
    for row, st in zip(s.steps, steps):
        a, b = st.start_ns, st.end_ns
        pts = sorted({a, b, *(t for x in kern + comm + mem for t in (x.start_ns, x.end_ns) if a < t < b)})
        on = {"c": 0, "m": 0, "idle": 0}
        for p, q in zip(pts, pts[1:]):
            mid = (p + q) / 2
            c = any(x.start_ns <= mid < x.end_ns for x in kern)
            m = any(x.start_ns <= mid < x.end_ns for x in comm)
            busy = c or m or any(x.start_ns <= mid < x.end_ns for x in mem)
            on["c"] += (q - p) * c
            on["m"] += (q - p) * m
            on["idle"] += (q - p) * (not busy)
        top: dict[str, int] = {}
        for x in kern:
            if a <= x.start_ns < b:
                top[x.name] = top.get(x.name, 0) + x.dur_ns
        assert (row.dur_ns, row.compute_ns, row.communication_ns, row.idle_ns) == (b - a, on["c"], on["m"], on["idle"])
        assert row.top_ops == tuple(sorted(top.items(), key=lambda kv: (-kv[1], kv[0])))


def test_streaming_holds_less_per_event_than_the_trace(tmp_path: Path) -> None:
    """Bounded memory: what a rank's reduction holds at its peak (tracemalloc) grows, per added
    step, by well under what reading the trace into memory grows by."""
    peaks = {}
    for steps in (300, 1200):
        path = tmp_path / f"rank{steps}.json.gz"
        _trace(path, 0, steps)
        tracemalloc.start()
        try:
            _read(path)
            whole = tracemalloc.get_traced_memory()[1]
            tracemalloc.reset_peak()
            cr.reduce_file(str(path), "kineto", None)
            peaks[steps] = (whole, tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
    grow_whole = peaks[1200][0] - peaks[300][0]
    grow_streamed = peaks[1200][1] - peaks[300][1]
    assert grow_streamed < 0.6 * grow_whole, peaks


def test_read_losses_reach_the_report(tmp_path: Path) -> None:
    """What the streamed reader skips is noted in the report, naming the file, never silent."""
    doc = {"distributedInfo": {"rank": 0}, "traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 5},
        {"ph": "X", "cat": "cpu_op", "name": "bad", "pid": 1, "tid": 1, "ts": "x", "dur": 5},
        {"ph": "Z", "name": "odd"}]}
    (tmp_path / "rank0.json").write_text(json.dumps(doc))
    rep = cr.analyze(tmp_path, workers=1)
    assert any("rank0.json: 1 malformed events skipped" in n for n in rep.notes), rep.notes
    assert any("'Z' x1" in n for n in rep.notes), rep.notes


def _sizes(s: cr.RankSummary) -> dict[str, int]:
    """What a summary weighs: pickled bytes (what travels back from a worker) and bytes allocated
    to hold it once unpickled (tracemalloc: what the combining process keeps), whole and in parts."""
    blob = pickle.dumps(s)
    tracemalloc.start()
    try:
        held = pickle.loads(blob)
        mem = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    del held
    return {"pickled": len(blob), "memory": mem, "durations": len(pickle.dumps(s.durations)),
            "sketch_entries": sum(x.entries for x in s.durations.values())}


def test_summary_size_independent_of_ranks_and_of_events(tmp_path: Path) -> None:
    """A rank's summary weighs the same in a run of 4 ranks and of 24; the combiner folds the
    collectives into one shortest-duration table per name (as long as one rank's, not 24 ranks');
    and 4x the kernels per step (4x the events) adds nothing to the duration distribution's size."""
    d = tmp_path / "many"
    d.mkdir()
    for r in range(24):
        _trace(d / f"rank{r}.pt.trace.json.gz", r, 20, seed=r % 3)
    few = tmp_path / "few"
    few.mkdir()
    for r in range(4):
        (few / f"rank{r}.pt.trace.json.gz").symlink_to(d / f"rank{r}.pt.trace.json.gz")
    combiners = {}
    for name, where in (("few", few), ("many", d)):
        c = cr.Combiner(str(where))
        for x in cr.rank_inputs(where):
            c.add(cr.reduce_file(*x))
        combiners[name] = c
    a, b = combiners["few"], combiners["many"]
    for r in range(4):  # the same rank, reduced in a run of 4 and of 24: the same object, the same weight
        assert a.summaries[r] == b.summaries[r]
        sa, sb = _sizes(a.summaries[r]), _sizes(b.summaries[r])
        assert sa["pickled"] == sb["pickled"] and abs(sa["memory"] - sb["memory"]) <= 512, (sa, sb)
    weights = [_sizes(s)["pickled"] for s in b.summaries.values()]
    assert max(weights) - min(weights) <= 64, weights  # every rank alike, whatever its number
    assert {k: len(v) for k, v in a.shortest.items()} == {k: len(v) for k, v in b.shortest.items()} \
        == {"ncclDevKernel_AllReduce": 20}
    # Steps hold 8 bytes a figure; collectives 8 per number.
    s0 = b.summaries[0]
    assert [len(s0.steps.step), len(s0.collectives)] == [20, 20]
    # 4x the kernels per step (4x the events): every GEMM's sketch past its exact limit holds as many
    # buckets as before (those its durations' span needs), so the distribution weighs the same.
    longs = []
    for k in (24, 96):
        _trace(tmp_path / f"rank0_{k}.json.gz", 0, 200, kernels=k, seed=5)
        longs.append(cr.reduce_file(str(tmp_path / f"rank0_{k}.json.gz"), "kineto", None))
    short, long = longs
    gemms = [n for n in short.durations if n.startswith("gemm")]
    assert len(gemms) == 3 and all(not short.durations[n].exact for n in gemms)
    assert [long.durations[n].count for n in gemms] == [4 * short.durations[n].count for n in gemms]
    assert [long.durations[n].entries for n in gemms] == [short.durations[n].entries for n in gemms]
    assert all(short.durations[n].entries <= 40 for n in gemms)  # 900..1650 µs: ln(1.83) / ln(GAMMA) = 30 buckets
    assert abs(_sizes(long)["durations"] - _sizes(short)["durations"]) <= 64 * len(short.durations)


def test_bucketed_quantiles_from_a_trace_within_the_error_of_numpy_over_the_raw_json(tmp_path: Path) -> None:
    """A rank whose kernels have more distinct durations than EXACT_VALUES: the report's median and
    p90 per kernel are within the sketch's 1 % of numpy's over the trace's own `dur` values (read
    with the json module), count, max and total exact; the sketch says it is approximate."""
    import numpy as np

    from omniprof.analysis import sketch as sk

    for r in range(2):
        _trace(tmp_path / f"rank{r}.pt.trace.json.gz", r, 1100, slow=1.2 if r else 1.0)
    rep = cr.analyze(tmp_path, workers=1)
    checked = 0
    for r in range(2):
        with gzip.open(tmp_path / f"rank{r}.pt.trace.json.gz", "rt") as fh:
            events = json.load(fh)["traceEvents"]
        by: dict[str, list[float]] = {}
        for e in events:
            if e.get("cat") in ("kernel", "gpu_memcpy"):
                by.setdefault(e["name"], []).append(round(float(e["dur"]) * 1000))
        summary = rep.rank(r)
        for name, durs in by.items():
            got = next(x for x in rep.durations() if x.name == name).rank(r)
            sketch = summary.durations[name]
            a = np.array(durs, dtype=np.float64)
            if len(set(durs)) > sk.EXACT_VALUES:
                assert not sketch.exact and sketch.relative_error == sk.RELATIVE_ERROR and not got.exact
                checked += 1
            else:
                assert sketch.exact and got.exact
            assert (got.count, got.max_ns, got.total_ns) == (len(durs), max(durs), sum(durs))
            for ours, q in ((got.median_ns, 0.5), (got.p90_ns, 0.9)):
                ref = float(np.quantile(a, q))
                assert abs(ours - ref) <= sketch.relative_error * ref + 0.5, (name, q, ours, ref)
    assert checked == 8  # the 3 GEMMs and the all-reduce went past the exact limit on both ranks
    text = rep.to_text()
    gemm = next(ln for ln in text.splitlines() if ln.startswith("gemm0"))
    assert gemm.split()[3].startswith("~") and "~: within 1% (from the rank's log-bucketed sketch" in text
    assert next(ln for ln in text.splitlines() if ln.startswith("Memcpy HtoD")).split()[4] == "4.0"  # exact: no ~


def _reference_waits(ranks: list[cr.RankSummary]) -> dict[tuple[int, int], int]:
    """The waiting worked out the plain way: every (name, k-th occurrence) on every rank, its
    shortest duration over the ranks, each rank's excess added to the step its start falls in."""
    occ: dict[tuple[str, int], dict[int, tuple[int, int]]] = {}
    for r in ranks:
        seen: dict[str, int] = {}
        for name, a, dur in r.collectives:
            k = seen.get(name, 0)
            seen[name] = k + 1
            occ.setdefault((name, k), {})[r.rank] = (a, dur)
    out: dict[tuple[int, int], int] = {}
    for per in occ.values():
        if len(per) != len(ranks) or len(ranks) < 2:
            continue
        low = min(x for _, x in per.values())
        for rank, (a, dur) in per.items():
            steps = [s for s in next(r for r in ranks if r.rank == rank).steps if s.start_ns <= a]
            if steps and a < steps[-1].start_ns + steps[-1].dur_ns:
                key = (rank, steps[-1].step)
                out[key] = out.get(key, 0) + dur - low
    return out


def _reference_caused(ranks: list[cr.RankSummary]) -> dict[int, int]:
    """The waiting each rank caused, the plain way: per (name, k-th occurrence) seen on every rank,
    the latest start; the ranks within both clocks' uncertainty of it are last; the others'
    excess over the shortest duration is split evenly among them."""
    occ: dict[tuple[str, int], dict[int, tuple[int, int, int]]] = {}
    for r in ranks:
        seen: dict[str, int] = {}
        for name, a, dur in r.collectives:
            k = seen.get(name, 0)
            seen[name] = k + 1
            occ.setdefault((name, k), {})[r.rank] = (a, dur, r.clock_uncertainty_ns)
    out: dict[int, int] = {}
    for per in occ.values():
        if len(per) != len(ranks):
            continue
        low = min(d for _, d, _ in per.values())
        a_max, _, u_max = max(per.values(), key=lambda x: (x[0], x[2]))
        last = {rank for rank, (a, _, u) in per.items() if a >= a_max - u - u_max}
        waited = sum(d - low for rank, (_, d, _) in per.items() if rank not in last)
        for rank in last:
            out[rank] = out.get(rank, 0) + waited // len(last)
    return {rank: v for rank, v in out.items() if v}


def test_combiner_in_any_arrival_order_equals_a_plain_reference() -> None:
    """Random ranks (two collective names, some ranks with extra or missing occurrences, some
    collectives outside every step) added in shuffled orders: the waits equal the plain
    reference's, the report is the same whatever the order, and the mismatches are noted."""
    from omniprof.core.results import BackendResult, Span, Track

    rng = random.Random(11)
    ranks = []
    for rank in range(9):
        spans = [Span(f"ProfilerStep#{i}", "main", i * 1000, 900, "step") for i in range(12)]
        for i in range(12):
            for name in ("gloo:all_reduce", "gloo:broadcast"):
                if rank == 4 and name == "gloo:broadcast" and i == 11:
                    continue  # one occurrence short on rank 4
                a = i * 1000 + rng.randrange(0, 800)
                spans.append(Span(name, "gloo", a, rng.randrange(1, 300), "annotation"))
        spans.append(Span("gloo:all_reduce", "gloo", 50_000 + rank, 40, "annotation"))  # after every step
        part = BackendResult("torch", tracks=[Track("main", "main"), Track("gloo", "gloo")], spans=spans)
        ranks.append(cr.reduce_rank([part], rank=rank, clock_uncertainty_ns=rng.choice([0, 0, 40, 150])))
    ref = _reference_waits(ranks)
    reports = []
    for _ in range(3):
        order = ranks[:]
        rng.shuffle(order)
        reports.append(cr.combine(order))
    assert dict(reports[0].wait_ns) == ref and len(ref) > 9 * 10
    caused = _reference_caused(ranks)
    assert {x.rank: x.wait_caused_ns for x in reports[0].wait_caused} == caused and len(caused) == 9
    assert reports[0] == reports[1] == reports[2]
    assert any("'gloo:broadcast' occurs" in n and "4: 11" in n for n in reports[0].notes), reports[0].notes
    for rank in range(9):  # step rows carry the same waits
        for row in reports[0].step_rows():
            assert row["wait_ns"] == ref.get((row["rank"], row["step"]), 0)


# -- Dask ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster():
    from distributed import LocalCluster

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # distributed's own deprecation chatter at start-up
        c = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                         dashboard_address=None)
    try:
        yield c
    finally:
        c.close()


def test_dask_executor_equals_the_local_analysis(rank_dir: Path, cluster) -> None:
    """A real LocalCluster (2 worker processes on 127.0.0.1): every figure equals the local pool's,
    the straggler is the slowed rank, and the reductions ran as tasks on the cluster."""
    address = "dask://" + cluster.scheduler_address.removeprefix("tcp://")
    local = cr.analyze(rank_dir, workers=1)
    remote = cr.analyze(rank_dir, executor=address)
    assert remote == local
    assert [s.rank for s in remote.stragglers] == [2]
    assert "omniprof-reduce" in cluster.scheduler.task_prefixes
    from distributed import Client

    with Client(cluster.scheduler_address) as client:
        pids = set(client.run(os.getpid).values())
    assert len(pids) == 2 and os.getpid() not in pids


def test_dask_cli_and_errors(rank_dir: Path, cluster, capsys, monkeypatch, tmp_path: Path) -> None:
    """`omniprof report DIR --executor dask://...` prints what `-j 1` prints; an unreachable address,
    a Ray address and a directory no worker sees are one line each, exit 2."""
    address = "dask://" + cluster.scheduler_address.removeprefix("tcp://")
    assert main(["report", str(rank_dir), "-j", "1", "-R", "table.include_rank_parts=false"]) == 0
    here = capsys.readouterr().out
    assert main(["report", str(rank_dir), "--executor", address]) == 0
    assert capsys.readouterr().out == here and "Straggler: rank 2" in here
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(ex, "CONNECT_TIMEOUT_S", 1.0)
    assert main(["report", str(rank_dir), "--executor", f"dask://127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"cannot reach a Dask scheduler at tcp://127.0.0.1:{port}" in err[0] \
        and "dask scheduler" in err[0], err
    assert main(["report", str(rank_dir), "--executor", "ray://127.0.0.1:10001"]) == 2
    assert "Ray is not supported" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "nowhere"), "--executor", address]) == 2
    assert "none of the 2 Dask worker(s)" in capsys.readouterr().err
    assert main(["report", str(rank_dir), "--executor", address, "-r", "json"]) == 2
    assert "--executor prints the cross-rank section only" in capsys.readouterr().err


def test_executor_addresses() -> None:
    assert ex.parse_address("dask://10.0.0.5:8786") == "tcp://10.0.0.5:8786"
    assert ex.parse_address("tls://head:8786") == "tls://head:8786"
    for bad in ("10.0.0.5:8786", "dask://host", "dask://host:99999", "http://h:1"):
        with pytest.raises(InvalidArgumentError, match="dask://host:port|not in 1..65535"):
            ex.parse_address(bad)
    with pytest.raises(InvalidArgumentError, match="give the run directory"):
        cr.analyze(_read(shared_data("kineto", "triton_cuda_trace.json.gz")), executor="dask://h:1")
    with pytest.raises(TraceReadError):
        cr.reduce_file(str(shared_data("kineto", "triton_cuda_trace.json.gz")), "kineto", None)  # no rank anywhere
