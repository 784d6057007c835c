"""Four real torch.distributed ranks (gloo, 127.0.0.1) profiled with distributed=True.

One job is run for the module (it costs ~20 s on this machine), profiled with the torch and cpu
backends together: rank 2 sleeps in every step (the straggler), rank 1 profiles with a clock 5 s
ahead (the skew to undo). Everything below reads what
that job left: the run directory, the Kineto traces each rank wrote, and each rank's own record of
its sleeps.
"""

from __future__ import annotations

import collections
import gzip
import json
import shutil
import socket
from pathlib import Path

import pytest

pytest.importorskip("torch")

import omniprof
from omniprof.analysis import crossrank
from omniprof.core.distributed import load_run
from omniprof.reporters.perfetto import ChromeTraceOptions, PerfettoOptions, write_chrome_json, write_proto
from omniprof.testing.trace_processor import import_problems, open_trace, query_rows
from tests.integration import ddp_job
from tests.tools import check_clock_alignment, free_port

WORLD = 4
SLOW = 2
SKEWED = 1
SKEW_NS = 5_000_000_000


BUSY = 2  # processes spinning beside the job: the straggler must still be the one rank that sleeps


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> dict:
    import subprocess
    import sys

    logdir = tmp_path_factory.mktemp("ddp")
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(BUSY)]
    try:
        ddp_job.spawn(WORLD, free_port(), str(logdir), slow_rank=SLOW, skew_rank=SKEWED, skew_ns=SKEW_NS,
                      backends=("torch", "cpu"))
    finally:
        for p in busy:
            p.kill()
            p.wait()
    truth = {r: json.loads((logdir / f"truth_rank{r}.json").read_text()) for r in range(WORLD)}
    runs = list((logdir / "plugins" / "profile").iterdir())
    return {"logdir": logdir, "truth": truth, "runs": runs}


def _kineto_events(rank_dir: Path) -> list[dict]:
    (trace,) = rank_dir.glob("*.pt.trace.json")
    return json.loads(trace.read_text())["traceEvents"]


def test_one_run_dir_with_a_part_per_rank_and_a_merged_result(job: dict) -> None:
    """Rank 0 named one run dir for the job; every rank's result and Kineto trace are in rank<N>/."""
    (run,) = job["runs"]
    assert {job["truth"][r]["run_dir"] for r in range(WORLD)} == {str(run)}
    assert [job["truth"][r]["merged"] for r in range(WORLD)] == [True, False, False, False]
    for r in range(WORLD):
        part = omniprof.load(run / f"rank{r}" / "omniprof.result.json")
        assert part.metadata.distributed["rank"] == r and part.metadata.distributed["world_size"] == WORLD
        assert part.metadata.pid == job["truth"][r]["pid"]
        assert len(list((run / f"rank{r}").glob("*.pt.trace.json"))) == 1
    merged = omniprof.load(run / "omniprof.result.json")
    assert merged.metadata.distributed["merged"] is True
    assert sorted((p.metadata["rank"], p.backend) for p in merged.parts) == [
        (r, b) for r in range(WORLD) for b in ("cpu", "torch")]
    assert load_run(run) == merged  # the parts alone rebuild the same merged result


def test_all_reduce_on_every_rank_in_every_recorded_step(job: dict) -> None:
    """Each rank's part holds gloo all-reduce spans, as many as its own Kineto trace has."""
    (run,) = job["runs"]
    merged = omniprof.load(run / "omniprof.result.json")
    for r in range(WORLD):
        ours = [s for p in merged.parts if p.metadata["rank"] == r for s in p.spans if s.name == "gloo:all_reduce"]
        theirs = [e for e in _kineto_events(run / f"rank{r}") if e.get("name") == "gloo:all_reduce"]
        assert len(ours) == len(theirs) >= len(ddp_job.RECORDED)


def test_clock_skew_is_undone_within_the_stated_uncertainty(job: dict) -> None:
    """Rank 1's clock ran 5 s ahead: its offset is -5 s within its uncertainty; the others' ~0
    (all ranks share this machine's CLOCK_MONOTONIC, so the true offsets are known exactly)."""
    (run,) = job["runs"]
    check_clock_alignment(run, WORLD, SKEWED, SKEW_NS, "gloo:all_reduce")


def test_merged_timeline_opens_in_perfetto_with_one_process_per_rank(job: dict, tmp_path: Path) -> None:
    """Perfetto's trace processor sees 4 processes 'host / rank N', every slice and every flow."""
    (run,) = job["runs"]
    merged = omniprof.load(run / "omniprof.result.json")
    # What Perfetto must find, counted here from the result (not by the reporter's expected_counts()):
    # every span and instant a slice; k spans sharing a flow id within a part, k-1 arrows.
    flows = 0
    for p in merged.parts:
        members = collections.Counter(f for s in p.spans for f in set(s.flow_ids))
        flows += sum(n - 1 for n in members.values())
    want = {"slices": sum(len(p.spans) + len(p.instants) for p in merged.parts), "flows": flows}
    proto = tmp_path / "t.perfetto-trace"
    with open(proto, "wb") as fh:
        write_proto(merged, fh, PerfettoOptions())
    chrome = tmp_path / "t.json.gz"
    with open(chrome, "wb") as fh:
        # Sampled stacks are checked in the protobuf; the JSON importer turns JSON samples into extra slices.
        write_chrome_json(merged, fh, ChromeTraceOptions(include_samples=False))
    host = merged.metadata.host
    for path in (proto, chrome):
        with open_trace(path) as tp:
            assert import_problems(tp) == []
            procs = query_rows(tp, "select p.name as name, p.pid as pid, count(*) as n from slice s join "
                                   "(select id, upid from process_track union all select tt.id, t.upid "
                                   "from thread_track tt join thread t using(utid)) x on s.track_id = x.id "
                                   "join process p using(upid) group by p.upid order by p.name")
            assert [x["name"] for x in procs] == [f"{host} / rank {r}" for r in range(WORLD)]
            assert [x["pid"] for x in procs] == [job["truth"][r]["pid"] for r in range(WORLD)]
            per_rank = [sum(len(p.spans) for p in merged.parts if p.metadata["rank"] == r) for r in range(WORLD)]
            assert [x["n"] for x in procs] == per_rank
            assert query_rows(tp, "select count(*) as n from slice")[0]["n"] == want["slices"]
            assert query_rows(tp, "select count(*) as n from flow")[0]["n"] == want["flows"] > 0
            if path == proto:  # sampled stacks of every rank's cpu part, each on its rank's threads
                rows = query_rows(tp, "select p.name as name, count(*) as n from perf_sample s join thread using(utid) "
                                      "join process p using(upid) group by p.upid order by p.name")
                samples = [sum(len(p.samples) for p in merged.parts if p.metadata["rank"] == r) for r in range(WORLD)]
                assert [x["name"] for x in rows] == [f"{host} / rank {r}" for r in range(WORLD)]
                assert [x["n"] for x in rows] == samples and all(samples)
    with gzip.open(chrome, "rt") as fh:
        names = {e["args"]["name"] for e in json.load(fh)["traceEvents"] if e.get("name") == "process_name"}
    assert names == {f"{host} / rank {r}" for r in range(WORLD)}


def _caused_from_the_raw_traces(run: Path) -> tuple[dict[int, int], int]:
    """Independent reference, from each rank's Kineto JSON (read with the json module, times in µs
    on the one host's clock): for the k-th gloo all-reduce of every rank, the rank that started it
    last is charged every other rank's duration less the shortest. Returns ns charged per rank and
    the number of all-reduces compared."""
    starts = {r: sorted((e["ts"], e["dur"]) for e in _kineto_events(run / f"rank{r}")
                        if e.get("name") == "gloo:all_reduce") for r in range(WORLD)}
    n = min(len(v) for v in starts.values())
    caused: dict[int, int] = {}
    for k in range(n):
        per = {r: starts[r][k] for r in range(WORLD)}
        last = max(per, key=lambda r: per[r][0])
        low = min(d for _, d in per.values())
        caused[last] = caused.get(last, 0) + round(sum(d - low for r, (_, d) in per.items() if r != last) * 1000)
    return caused, n


def _check_straggler(rep: crossrank.CrossRankReport, job: dict, run: Path, *, exact: bool) -> None:
    assert [s.rank for s in rep.stragglers] == [SLOW]
    (s,) = rep.stragglers
    # The waiting it cost the others, against the raw traces: to the µs when the traces themselves
    # are read (their own clocks: one host's), within 5 % from the run's aligned clocks (rank
    # offsets measured with an uncertainty of up to a few hundred µs).
    caused, compared = _caused_from_the_raw_traces(run)
    assert s.compared == compared
    assert max(caused, key=caused.get) == SLOW and caused[SLOW] > 0  # the raw traces say so too
    assert abs(s.wait_caused_ns - caused[SLOW]) <= (compared * 1000 if exact else 0.05 * caused[SLOW])
    if exact:
        assert {x.rank: x.wait_caused_ns for x in rep.wait_caused} == pytest.approx(caused, abs=compared * 1000)
    sleeps = {int(k): v for k, v in job["truth"][SLOW]["sleep_ns"].items()}
    # Its step times are the ProfilerStep spans of its own Kineto trace (microseconds there).
    steps = {int(e["name"].split("#")[1]): round(float(e["dur"]) * 1000)
             for e in _kineto_events(run / f"rank{SLOW}") if e.get("name", "").startswith("ProfilerStep#")}
    assert set(s.slow_steps) == set(steps) == ddp_job.RECORDED
    for st in s.slow_steps:
        assert abs(s.step_ns[st] - steps[st]) <= 1000
        # The sleep was in the step, outside every op and every collective: all of it is own time.
        # The median rank's own time is not much below: with two busy processes beside the job the
        # other ranks' own work stretches too (they then wait less): the second figure, not the rule.
        assert s.own_ns[st] >= sleeps[st]
        assert s.own_ns[st] > s.median_own_ns[st]
    assert s.outside_ops_ns >= sum(sleeps[st] for st in s.slow_steps)
    text = rep.to_text()
    assert f"Straggler: rank {SLOW} cost the others" in text


def test_straggler_named_from_the_run_dir_and_from_the_merged_result(job: dict) -> None:
    """The sleeping rank is named, with its step times; both inputs give the same report."""
    (run,) = job["runs"]
    from_dir = crossrank.analyze(run, workers=2)
    from_merged = crossrank.analyze(omniprof.load(run / "omniprof.result.json"))
    _check_straggler(from_dir, job, run, exact=False)
    assert from_dir.to_text() == from_merged.to_text()
    for r in from_dir.ranks:
        assert r.source == "cpu"
        assert r.compute_ns + r.exposed_communication_ns + r.exposed_memory_ns + r.idle_ns == r.window_ns
        assert r.communication_ns > 0


def test_straggler_named_from_a_directory_of_kineto_traces(job: dict, tmp_path: Path) -> None:
    """HTA's input: the ranks' Kineto traces alone in one directory, rank read from distributedInfo."""
    (run,) = job["runs"]
    for r in range(WORLD):
        (trace,) = (run / f"rank{r}").glob("*.pt.trace.json")
        shutil.copy(trace, tmp_path / f"trace_{r}.json")
    rep = crossrank.analyze(tmp_path, workers=1)
    assert [r.rank for r in rep.ranks] == list(range(WORLD))
    _check_straggler(rep, job, run, exact=True)


def test_report_command_on_the_run_dir_and_on_a_kineto_directory(job: dict, tmp_path: Path, capsys) -> None:
    """`omniprof report RUN_DIR -r table` and the same on the bare Kineto traces: the cross-rank
    section names the straggler; perfetto of the run dir writes one timeline."""
    from omniprof.cli import main

    (run,) = job["runs"]
    for r in range(WORLD):
        (trace,) = (run / f"rank{r}").glob("*.pt.trace.json")
        shutil.copy(trace, tmp_path / f"host_rank{r}.pt.trace.json")
    for src, workers in ((run, "2"), (tmp_path, "1")):
        # The cross-rank section alone: ranks read and reduced in worker processes.
        assert main(["report", str(src), "-r", "table", "-R", "table.include_rank_parts=false", "-j", workers]) == 0
        out = capsys.readouterr().out
        assert f"{WORLD} ranks" in out and f"Straggler: rank {SLOW} cost the others" in out
        assert "== backend torch (rank" not in out
    assert main(["report", str(run), "-r", "table", "-R", "table.width=200"]) == 0  # whole merged result
    out = capsys.readouterr().out
    assert f"Straggler: rank {SLOW} cost the others" in out and "== backend cpu (rank 2, " in out
    outdir = tmp_path / "out"
    assert main(["report", str(run), "-r", "perfetto,table", "-o", str(outdir)]) == 0
    out = capsys.readouterr().out
    assert "== backend torch (rank 3, " in out and "== backend cpu (rank 3, " in out
    with open_trace(next(outdir.glob("*.perfetto-trace"))) as tp:
        names = [x["name"] for x in query_rows(tp, "select name from process where name like '% / rank %' order by name")]
    assert names == [f"{omniprof.load(run / 'omniprof.result.json').metadata.host} / rank {r}" for r in range(WORLD)]


def test_no_shared_filesystem_rank0_holds_every_part(tmp_path: Path) -> None:
    """Two ranks, each with its own logdir (no shared filesystem): rank 0 named the run, rank 1 used
    the same name in its own logdir, and rank 0's run dir holds both parts (sent over the process
    group) and the merged result."""
    ddp_job.spawn(2, free_port(), str(tmp_path / "host{rank}"))
    (run0,) = (tmp_path / "host0" / "plugins" / "profile").iterdir()
    (run1,) = (tmp_path / "host1" / "plugins" / "profile").iterdir()
    assert run0.name == run1.name
    assert sorted(p.name for p in run0.iterdir()) == ["omniprof.result.json", "rank0", "rank1"]
    assert sorted(p.name for p in run1.iterdir()) == ["rank1"]
    theirs = omniprof.load(run1 / "rank1" / "omniprof.result.json")
    assert omniprof.load(run0 / "rank1" / "omniprof.result.json") == theirs  # the copy rank 0 received
    assert not list((run0 / "rank1").glob("*.pt.trace.json"))  # native artifacts stay on their host
    merged = omniprof.load(run0 / "omniprof.result.json")
    assert sorted(p.metadata["rank"] for p in merged.parts) == [0, 1]


def test_op_duration_distribution_equals_each_ranks_kineto_trace(job: dict, capsys) -> None:
    """Per op and rank: count, median, p90, max and total equal numpy's over the `dur` of that
    rank's own Kineto trace (read with the json module): every aten op and the gloo all-reduce
    annotations. The report's table section lists them, slowest rank marked."""
    import numpy as np

    from omniprof.cli import main

    (run,) = job["runs"]
    rep = crossrank.analyze(run, workers=1)
    rows = {r.name: r for r in rep.durations()}
    checked = 0
    for r in range(WORLD):
        by: dict[str, list[float]] = {}
        for e in _kineto_events(run / f"rank{r}"):
            if e.get("ph") == "X" and (e.get("cat") == "cpu_op" or e.get("name", "").startswith("gloo:")):
                by.setdefault(e["name"], []).append(float(e["dur"]) * 1000)
        assert "gloo:all_reduce" in by and "aten::addmm" in by
        assert {n for n, row in rows.items() if any(x.rank == r for x in row.per_rank)} == set(by)
        for name, durs in by.items():
            a = np.array(durs)
            got = rows[name].rank(r)
            assert got.count == len(a), name
            ref = (np.median(a), np.percentile(a, 90), a.max(), a.sum())
            for ours, theirs in zip((got.median_ns, got.p90_ns, got.max_ns, got.total_ns), ref):
                assert abs(ours - theirs) <= 0.5 + 1e-9 * theirs, (name, r, got, ref)
            checked += 1
    assert checked >= 4 * 20
    assert main(["report", str(run), "-r", "table", "-R", "table.include_rank_parts=false", "-j", "1"]) == 0
    out = capsys.readouterr().out
    assert "Op duration by rank" in out
    top = rep.durations(top=1)[0]
    assert top.name in out and top.total_ns == max(r.total_ns for r in rows.values())


def test_torch_job_with_the_xla_backend_puts_every_xplane_in_rank0s_run(tmp_path: Path) -> None:
    """A torch.distributed job that also runs jax, profiled with the torch and xla backends, each
    rank in its own logdir: each rank's xplane is `<host>_rank<N>.xplane.pb` in its run, and rank 0's
    run holds rank 1's too (sent over the process group), byte for byte."""
    pytest.importorskip("jax")
    ddp_job.spawn(2, free_port(), str(tmp_path / "host{rank}"), backends=("torch", "xla"))
    host = socket.gethostname()
    (run0,) = (tmp_path / "host0" / "plugins" / "profile").iterdir()
    (run1,) = (tmp_path / "host1" / "plugins" / "profile").iterdir()
    assert sorted(p.name for p in run0.glob("*.xplane.pb")) == [f"{host}_rank0.xplane.pb", f"{host}_rank1.xplane.pb"]
    assert sorted(p.name for p in run1.glob("*.xplane.pb")) == [f"{host}_rank1.xplane.pb"]
    assert (run0 / f"{host}_rank1.xplane.pb").read_bytes() == (run1 / f"{host}_rank1.xplane.pb").read_bytes()
    merged = omniprof.load(run0 / "omniprof.result.json")
    paths = {p.metadata["rank"]: [a.path for a in p.artifacts if a.kind == "xplane"] for p in merged.parts
             if p.backend == "xla"}
    assert paths == {r: [str(run0 / f"{host}_rank{r}.xplane.pb")] for r in (0, 1)}
