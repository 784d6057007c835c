"""Real multi-process JAX jobs (``jax.distributed.initialize``, coordinator on 127.0.0.1, gloo CPU
collectives) profiled with ``distributed=True`` and the xla and cpu backends together.

One 3-rank job is run for the module (~15 s here): rank 2 sleeps in every step (the straggler),
rank 1 profiles with a clock 5 s ahead (the skew to undo). Each step's jitted function sums one row
per process, an all-reduce across the processes (its value checks that it really crossed them).
A 2-rank job with one logdir per rank stands for hosts without a shared filesystem.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import select
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("jax")
pytest.importorskip("xprof", reason="XProf is not installed (pip install 'omniprof[tensorboard]')")

import omniprof
from omniprof.analysis import crossrank
from omniprof.core.distributed import load_run
from tests.integration import jax_job
from tests.tools import check_clock_alignment, free_port, stop_process

pytestmark = pytest.mark.slow

WORLD = 3
SLOW = 2
SKEWED = 1
SKEW_NS = 5_000_000_000
ROOT = Path(__file__).resolve().parents[2]
QUIET_ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "JAX_PLATFORMS": "cpu"}


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> dict:
    logdir = tmp_path_factory.mktemp("jaxjob")
    jax_job.spawn(WORLD, free_port(), str(logdir), slow_rank=SLOW, skew_rank=SKEWED, skew_ns=SKEW_NS)
    truth = {r: json.loads((logdir / f"truth_rank{r}.json").read_text()) for r in range(WORLD)}
    (run,) = (logdir / "plugins" / "profile").iterdir()
    return {"logdir": logdir, "truth": truth, "run": run, "host": socket.gethostname()}


def _expected_sum(world: int) -> float:
    """What each step returns: rank r holds a row of r+1; tanh of its mean, summed over ranks."""
    return sum(math.tanh(r + 1.0) for r in range(world))


def test_one_run_dir_in_the_xprof_multihost_layout(job: dict) -> None:
    """Rank 0 named one run for the job; every rank's xplane is `<host>_rank<N>.xplane.pb` in it,
    its result in rank<N>/, and rank 0 wrote the merged result."""
    run, host = job["run"], job["host"]
    truth = job["truth"]
    assert {truth[r]["run_dir"] for r in range(WORLD)} == {str(run)}
    assert [truth[r]["merged"] for r in range(WORLD)] == [True, False, False]
    assert [(truth[r]["process_index"], truth[r]["process_count"]) for r in range(WORLD)] == [
        (r, WORLD) for r in range(WORLD)]
    for r in range(WORLD):  # the psum really crossed the processes
        assert truth[r]["psum"] == pytest.approx(_expected_sum(WORLD), rel=1e-5)
    assert truth[0]["keys_left"] == 0  # the coordination cleaned up jax's key-value store
    assert sorted(p.name for p in run.glob("*.xplane.pb")) == [f"{host}_rank{r}.xplane.pb" for r in range(WORLD)]
    assert not list(run.glob("rank*/*.xplane.pb"))
    for r in range(WORLD):
        part = omniprof.load(run / f"rank{r}" / "omniprof.result.json")
        d = part.metadata.distributed
        assert (d["rank"], d["world_size"], d["launcher"]) == (r, WORLD, "jax.distributed")
        assert part.metadata.pid == truth[r]["pid"]
        (xplane,) = [a.path for a in part.part("xla").artifacts if a.kind == "xplane"]
        assert xplane == str(run / f"{host}_rank{r}.xplane.pb")
    merged = omniprof.load(run / "omniprof.result.json")
    assert merged.metadata.distributed["merged"] is True and not merged.partial
    assert sorted((p.metadata["rank"], p.backend) for p in merged.parts) == [
        (r, b) for r in range(WORLD) for b in ("cpu", "xla")]
    assert load_run(run) == merged


def _host_traces(run: Path, tmp: Path) -> dict[str, dict]:
    """XProf's own converter, per host file (on copies: it caches results beside its input)."""
    from xprof.convert import raw_to_tool_data

    out = {}
    for p in sorted(run.glob("*.xplane.pb")):
        shutil.copy(p, tmp / p.name)
        data, _ = raw_to_tool_data.xspace_to_tool_data([str(tmp / p.name)], "trace_viewer", {"use_saved_result": False})
        out[p.name[:-len(".xplane.pb")]] = json.loads(data)
    return out


def test_xprof_converter_reads_the_run_as_one_task_per_rank(job: dict, tmp_path: Path) -> None:
    """XProf's overview over the run's files counts one task per rank (one for a single file), and
    each host file's trace holds that rank's all-reduces and annotations, as many as its part."""
    from xprof.convert import raw_to_tool_data

    run, host = job["run"], job["host"]
    copies = tmp_path / "run"
    copies.mkdir()
    for p in run.glob("*.xplane.pb"):
        shutil.copy(p, copies / p.name)
    files = sorted(str(p) for p in copies.glob("*.xplane.pb"))

    def environment(paths: list[str]) -> dict:
        data, _ = raw_to_tool_data.xspace_to_tool_data(paths, "overview_page", {"use_saved_result": False})
        return next(t["p"] for t in json.loads(data) if "task_count" in (t.get("p") or {}))

    assert environment(files)["task_count"].startswith(f"{WORLD} ")
    assert environment(files[:1])["task_count"].startswith("1 ")
    traces = _host_traces(run, tmp_path)
    assert sorted(traces) == [f"{host}_rank{r}" for r in range(WORLD)]
    merged = omniprof.load(run / "omniprof.result.json")
    for r in range(WORLD):
        names = [e.get("name") for e in traces[f"{host}_rank{r}"]["traceEvents"] if e.get("ph") == "X"]
        spans = [s.name for p in merged.parts if p.metadata["rank"] == r and p.backend == "xla" for s in p.spans]
        assert names.count("all-reduce") == spans.count("all-reduce") == jax_job.STEPS - 2
        assert names.count("train_step") == spans.count("train_step") == jax_job.STEPS - 2


def test_xprof_server_lists_every_rank_as_a_host(job: dict) -> None:
    """The real XProf server (`omniprof view`) lists one run, and the ranks' files as its hosts."""
    proc = subprocess.Popen([sys.executable, "-m", "omniprof", "view", str(job["logdir"]), "--port", "0"],
                            stderr=subprocess.PIPE, stdout=subprocess.PIPE, env=QUIET_ENV, cwd=ROOT)
    try:
        url, lines = None, []
        deadline = time.monotonic() + 180
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            if select.select([proc.stderr], [], [], 1.0)[0]:
                line = proc.stderr.readline().decode()
                lines.append(line)
                if " at http://" in line:
                    url = line.split(" at ", 1)[1].split()[0].rstrip("/")
        assert url, f"XProf did not start: {''.join(lines)}"

        def get(route: str) -> object:
            with urllib.request.urlopen(f"{url}/data/plugin/profile{route}", timeout=120) as resp:
                data = resp.read()
            return json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)

        run = job["run"].name
        assert get("/runs") == [run]
        hosts = [h["hostname"] for h in get(f"/hosts?run={run}&tag=trace_viewer")]  # type: ignore[union-attr]
        assert hosts == [f"{job['host']}_rank{r}" for r in range(WORLD)]
    finally:
        stop_process(proc)


def test_clock_skew_is_undone_within_the_stated_uncertainty(job: dict) -> None:
    """Rank 1's clock ran 5 s ahead: its offset over jax's key-value store is -5 s within the
    uncertainty (the ranks share this machine's clock, so the true offsets are known); on the merged
    timeline every rank leaves each all-reduce together."""
    spreads = check_clock_alignment(job["run"], WORLD, SKEWED, SKEW_NS, "all-reduce")
    assert len(spreads) == jax_job.STEPS - 2


def test_straggler_and_all_reduce_distribution(job: dict) -> None:
    """The sleeping rank is named with its step times; the all-reduce's duration distribution
    across ranks equals the one computed here from each rank's all-reduce spans; the straggler
    waits least in it (its peers wait for it)."""
    run = job["run"]
    rep = crossrank.analyze(run, workers=1)
    assert [s.rank for s in rep.stragglers] == [SLOW]
    (s,) = rep.stragglers
    sleeps = {int(k): v for k, v in job["truth"][SLOW]["sleep_ns"].items()}
    assert set(s.slow_steps) == {1, 2}
    for st in s.slow_steps:
        assert s.own_ns[st] >= sleeps[st]
    merged = omniprof.load(run / "omniprof.result.json")
    row = next(x for x in rep.durations() if x.name == "all-reduce")
    for r in range(WORLD):
        durs = sorted(sp.dur_ns for p in merged.parts if p.metadata["rank"] == r and p.backend == "xla"
                      for sp in p.spans if sp.name == "all-reduce")
        got = row.rank(r)
        assert (got.count, got.max_ns, got.total_ns) == (len(durs), max(durs), sum(durs))
        assert got.median_ns == round((durs[0] + durs[1]) / 2)  # two recorded steps
    assert row.fastest_rank == SLOW and row.slowest_rank != SLOW
    assert crossrank.analyze(merged).durations() == rep.durations()  # the merged result says the same
    assert "Op duration by rank" in rep.to_text() and "all-reduce" in rep.to_text()


def test_no_shared_filesystem_rank0_gets_every_xplane(tmp_path: Path) -> None:
    """Two ranks, one logdir each: rank 0's run holds both xplanes (rank 1's sent over jax's
    key-value store in 1 KiB pieces), both result parts and the merged result; XProf's converter
    counts two tasks there."""
    from xprof.convert import raw_to_tool_data

    jax_job.spawn(2, free_port(), str(tmp_path / "host{rank}"), chunk_bytes=1024)
    host = socket.gethostname()
    (run0,) = (tmp_path / "host0" / "plugins" / "profile").iterdir()
    (run1,) = (tmp_path / "host1" / "plugins" / "profile").iterdir()
    assert run0.name == run1.name
    assert sorted(p.name for p in run0.iterdir()) == sorted(
        ["omniprof.result.json", "rank0", "rank1", f"{host}_rank0.xplane.pb", f"{host}_rank1.xplane.pb"])
    assert sorted(p.name for p in run1.iterdir()) == ["rank1", f"{host}_rank1.xplane.pb"]
    sent = (run1 / f"{host}_rank1.xplane.pb").read_bytes()
    assert len(sent) > 4 * 1024 and (run0 / f"{host}_rank1.xplane.pb").read_bytes() == sent
    copy = omniprof.load(run0 / "rank1" / "omniprof.result.json")  # rank 0's copy points at its own file
    assert [a.path for a in copy.part("xla").artifacts if a.kind == "xplane"] == [str(run0 / f"{host}_rank1.xplane.pb")]
    theirs = omniprof.load(run1 / "rank1" / "omniprof.result.json")
    assert [a.path for a in theirs.part("xla").artifacts if a.kind == "xplane"] == [str(run1 / f"{host}_rank1.xplane.pb")]
    assert copy.part("xla").spans == theirs.part("xla").spans
    merged = omniprof.load(run0 / "omniprof.result.json")
    assert sorted({p.metadata["rank"] for p in merged.parts}) == [0, 1]
    truth = json.loads((tmp_path / "host0" / "truth_rank0.json").read_text())
    assert truth["keys_left"] == 0 and truth["psum"] == pytest.approx(_expected_sum(2), rel=1e-5)
    copies = tmp_path / "copies"
    copies.mkdir()
    for p in run0.glob("*.xplane.pb"):
        shutil.copy(p, copies / p.name)
    data, _ = raw_to_tool_data.xspace_to_tool_data(sorted(str(p) for p in copies.glob("*.xplane.pb")), "overview_page",
                                                   {"use_saved_result": False})
    env = next(t["p"] for t in json.loads(data) if "task_count" in (t.get("p") or {}))
    assert env["task_count"].startswith("2 ")


def test_profiler_without_a_job_says_how_to_start_one() -> None:
    """distributed=True in a process where neither torch.distributed nor jax.distributed is set up:
    one error naming both ways in, and nothing runs."""
    code = ("import jax, omniprof\n"
            "from omniprof.errors import DistributedError\n"
            "p = omniprof.Profiler(backend='cpu', distributed=True)\n"
            "try:\n    p.start()\nexcept DistributedError as e:\n    print('ERR', e)\n"
            "print('running', p.is_running)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=QUIET_ENV, cwd=ROOT,
                         timeout=120, check=True).stdout
    assert "jax.distributed.initialize" in out and "init_process_group" in out and "running False" in out


def test_merged_timeline_has_one_process_per_rank_with_both_backends(job: dict, tmp_path: Path) -> None:
    """Chrome JSON of the merged result: one process `host / rank N` per rank, holding that rank's
    xla events and its cpu backend's annotation spans, as many slices as its parts have spans."""
    from omniprof.reporters.perfetto import ChromeTraceOptions, write_chrome_json

    merged = omniprof.load(job["run"] / "omniprof.result.json")
    out = tmp_path / "t.json.gz"
    with open(out, "wb") as fh:
        write_chrome_json(merged, fh, ChromeTraceOptions(include_samples=False))
    with gzip.open(out, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    want = {f"{job['host']} / rank {r}" for r in range(WORLD)}
    assert want <= set(procs.values())
    for r in range(WORLD):
        (pid,) = [p for p, n in procs.items() if n == f"{job['host']} / rank {r}"]
        names = [e["name"] for e in events if e.get("pid") == pid and e.get("ph") == "X"]
        spans = [s.name for p in merged.parts if p.metadata["rank"] == r for s in p.spans]
        assert sorted(names) == sorted(spans)
        assert names.count("all-reduce") == jax_job.STEPS - 2
        assert {p.backend for p in merged.parts if p.metadata["rank"] == r} == {"xla", "cpu"}
