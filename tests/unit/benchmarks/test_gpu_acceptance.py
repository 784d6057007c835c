"""benchmarks/gpu_acceptance.py before any GPU: its "no GPU" exit, its harness, and docs/gpu.md's table.

The acceptance run itself needs an NVIDIA GPU (docs/gpu.md); here it must stop before its first
CUDA call, say so in one line, write nothing, and exit with its documented status 3.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "benchmarks" / "gpu_acceptance.py"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _has_gpu() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    return subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0


@pytest.mark.skipif(_has_gpu(), reason="this machine has an NVIDIA GPU: the acceptance run would run")
def test_without_a_gpu_it_says_so_in_one_line_writes_nothing_and_exits_3(tmp_path):
    results = tmp_path / "results"
    log = tmp_path / "log.txt"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--results-dir", str(results), "--log", str(log)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("no GPU: "), proc.stdout
    assert "nothing written" in lines[0]
    assert proc.stderr == ""
    assert not results.exists() and not log.exists()


def test_plan_lists_every_check_of_the_issue_and_fits_the_budget():
    """--plan names the groups and checks (each a path of the issue) and runs nothing."""
    proc = subprocess.run([sys.executable, str(SCRIPT), "--plan"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for check in ("cupti.kernel_names", "cupti.kernel_time", "cupti.memcpy_memset", "cupti.flows",
                  "nvml.counters_vs_nvidia_smi", "torch.op_table", "torch.kernel_stats", "torch.memory_by_category",
                  "xla.kernel_stats", "xla.op_stats", "xla.jax_profile", "options.activity_cap", "options.nvtx",
                  "doctor.truthful", "overhead.cupti_vs_kineto", "overhead.torch_vs_torch_profiler",
                  "overhead.xla_vs_jax_profiler"):
        assert check in out, check
    assert "budget 400 s" in out  # the checks, with the installs, inside the 8 minutes of one device command


def test_unknown_group_is_a_usage_error():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--only", "cupti,gpu_magic"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert "unknown group(s) ['gpu_magic']" in proc.stderr


def test_a_failing_check_is_recorded_with_its_traceback_and_the_next_one_still_runs():
    ga = _load("gpu_acceptance")
    records: list = []

    def broken():
        return {}["no such figure"]

    ga.run_check(records, "first", broken)
    ga.run_check(records, "second", lambda: (True, {"n": 3, "t": (1, 2)}))
    first, second = records
    assert first["name"] == "first" and first["ok"] is False and first["figures"] == {}
    assert first["error"].startswith("KeyError: 'no such figure'") and "in broken" in first["error"]
    assert second == {"name": "second", "ok": True, "figures": {"n": 3, "t": [1, 2]}, "wall_s": second["wall_s"]}


@pytest.mark.skipif(_has_gpu(), reason="this machine has an NVIDIA GPU: the doctor check would pass")
def test_a_group_runs_in_its_own_process_and_its_failure_comes_back_as_records(tmp_path):
    """The parent runs a group in a child process; the child's failed check comes back with its error,
    and the child's own output goes to the log."""
    ga = _load("gpu_acceptance")
    with open(tmp_path / "log.txt", "w") as log:
        got = ga.run_group("doctor", 120, log)
    assert [r["name"] for r in got] == ["doctor.truthful"]
    assert got[0]["ok"] is False and got[0]["error"].startswith("FileNotFoundError")
    assert "nvidia-smi" in got[0]["error"]
    assert (tmp_path / "log.txt").read_text().startswith("===== group doctor: rc=0")


def test_record_path_and_atomic_write(tmp_path):
    import datetime as dt

    ga = _load("gpu_acceptance")
    when = dt.datetime(2026, 11, 27, 18, 0, tzinfo=dt.timezone.utc)
    path = ga.record_path(tmp_path / "gpu", "NVIDIA H100 80GB HBM3", when)
    assert path == tmp_path / "gpu" / "2026-11-27-NVIDIA-H100-80GB-HBM3.json"
    ga.write_atomically(path, {"device": "x", "checks": []})
    assert json.loads(path.read_text()) == {"device": "x", "checks": []}
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left beside it


# -- the cupti comparisons on real GPU data ------------------------------------------------------
def _replayed_alexnet():
    """The cupti backend's part from AlexNet's real A100 records (replayed through the fakes), and
    that Kineto trace's own events: a capture that equals its reference."""
    import gzip

    import omniprof
    from omniprof.testing.gpu_fakes import FakeCupti, FakeNvml, fake_gpu_registry, records_from_kineto
    from tests.tools import shared_data

    trace = shared_data("kineto", "alexnet_cuda_trace.json.gz")
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    reg = fake_gpu_registry(nvml=FakeNvml(), cupti=FakeCupti(records_from_kineto(trace)))
    with omniprof.Profiler(backend="cupti", registry=reg) as prof:
        pass
    return prof.result.part("cupti"), events


def test_cupti_comparisons_pass_when_the_capture_equals_the_reference():
    ga = _load("gpu_acceptance")
    part, events = _replayed_alexnet()
    ok, fig = ga.compare_kernels(part, events)
    assert ok and fig["kernels_ours"] == fig["kernels_torch_profiler"] == 79
    ok, fig = ga.compare_kernel_time(part, events)
    assert ok and fig["diff_pct"] == 0
    ok, fig = ga.compare_copies(part, events)
    assert ok and sum(fig["ours"].values()) == 16 + 3  # the trace's memcpy and memset events
    assert any(k.startswith("HtoD ") for k in fig["ours"]) and any(k.startswith("memset ") for k in fig["ours"])
    ok, fig = ga.compare_flows(part, events)
    assert ok and fig["linked"] >= fig["linked_torch_profiler"] > 0 and fig["flow_ids_without_host_call"] == 0


def test_cupti_comparisons_fail_on_a_lost_kernel_a_wrong_size_and_a_lost_launch():
    import attrs

    ga = _load("gpu_acceptance")
    part, events = _replayed_alexnet()
    kernel = next(i for i, s in enumerate(part.spans) if s.category == "kernel")
    lost_kernel = attrs.evolve(part, spans=part.spans[:kernel] + part.spans[kernel + 1:])
    ok, fig = ga.compare_kernels(lost_kernel, events)
    assert not ok and fig["kernels_ours"] == 78
    copy = next(i for i, s in enumerate(part.spans) if s.category == "memcpy")
    wrong = attrs.evolve(part.spans[copy], args={**part.spans[copy].args, "bytes": 1})
    assert not ga.compare_copies(attrs.evolve(part, spans=part.spans[:copy] + (wrong,) + part.spans[copy + 1:]),
                                 events)[0]
    ok, fig = ga.compare_copies(part, events, expected={"HtoD": 99}, nbytes=20736)
    assert not ok and fig["ours_20736B"] == {"HtoD": 0}
    no_launch = attrs.evolve(part, spans=[s for s in part.spans if s.category != "runtime"])
    ok, fig = ga.compare_flows(no_launch, events)
    assert not ok and fig["flow_ids_without_host_call"] > 0


def test_op_table_comparison_against_key_averages_of_the_same_run_on_cpu():
    """The torch check's machinery on this machine's CPU: a torch session through the registry that
    keeps torch's profile, and our op table against key_averages() of that very profile."""
    import attrs

    torch = pytest.importorskip("torch")
    from torch.autograd import DeviceType

    import omniprof

    ga = _load("gpu_acceptance")
    reg, kept = ga.kept_torch_registry()
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    with omniprof.Profiler(backend="torch", registry=reg, options=omniprof.ProfileOptions(device_tracer_level=0)) as p:
        for _ in range(3):
            model(torch.randn(8, 32)).sum().backward()
    part = p.result.part("torch")
    host = [e for e in kept[-1].key_averages() if e.device_type == DeviceType.CPU]
    ok, fig = ga.compare_op_table(part, host, require_runtime=False)
    assert ok, fig
    assert fig["rows_torch"] == len(host) > 5 and fig["missing_in_ours"] == []
    assert not ga.compare_op_table(part, host)[0]  # a CUDA run must show runtime rows; a CPU run has none
    addmm = [s for s in part.spans if s.name == "aten::addmm"]
    fewer = attrs.evolve(part, spans=[s for s in part.spans if s is not addmm[0]], tables=())
    from omniprof.analysis.torch_ops import op_table

    fewer = attrs.evolve(fewer, tables=(op_table(fewer),))
    ok, fig = ga.compare_op_table(fewer, host, require_runtime=False)
    assert not ok and fig["mismatches"]["aten::addmm"]["calls"] == [5, 6]


# -- docs/gpu.md's table ----------------------------------------------------------------------------
#: AN EXAMPLE RECORD, MADE UP FOR THIS TEST: not a measurement (no real record exists yet).
EXAMPLE_RECORD = {
    "device": "EXAMPLE GPU (made up for a test)", "driver": "000.00", "torch": "0.0.0", "jax": "0.0.0",
    "date": "2000-01-01T00:00:00+00:00",
    "checks": [
        {"name": "cupti.kernel_time", "ok": True,
         "figures": {"total_kernel_ms_ours": 12.3456, "total_kernel_ms_torch_profiler": 12.3, "diff_pct": 0.3707,
                     "tolerance_pct": 2.0, "note": "two runs"}},
        {"name": "nvml.counters_vs_nvidia_smi", "ok": False,
         "figures": {"window_s": 2.4, "power": {"ours_median": 301.5, "nvidia_smi_median": 400.0, "ok": False},
                     "series": ["gpu0.power", "gpu0.sm_clock"]}},
        {"name": "xla.kernel_stats", "ok": False, "figures": {},
         "error": "ImportError: no module named xprof | really [x.py:1 in f]"},
        {"name": "cupti.flows", "ok": True,
         "figures": {"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6, "g": 7, "h": None}},
    ],
}


def test_table_renderer_turns_a_record_into_one_row_per_check():
    gt = _load("gpu_table")
    assert gt.table_rows(EXAMPLE_RECORD) == [
        ("cupti.kernel_time", "ok", "total_kernel_ms_ours=12.35, total_kernel_ms_torch_profiler=12.3, "
                                    "diff_pct=0.3707, tolerance_pct=2, note=two runs"),
        ("nvml.counters_vs_nvidia_smi", "FAIL", "window_s=2.4, power.ours_median=301.5, power.nvidia_smi_median=400, "
                                                "power.ok=no, series=[gpu0.power, gpu0.sm_clock]"),
        ("xla.kernel_stats", "FAIL", "error: ImportError: no module named xprof \\| really [x.py:1 in f]"),
        ("cupti.flows", "ok", "a=1, b=2, c=3, d=4, e=5, f=6 (+1 more)"),
    ]
    text = gt.render(EXAMPLE_RECORD, "benchmarks/results/gpu/2000-01-01-EXAMPLE.json")
    lines = text.splitlines()
    assert lines[0].startswith("Latest record: `benchmarks/results/gpu/2000-01-01-EXAMPLE.json`: EXAMPLE GPU")
    assert "**2/4 checks passed**" in lines[0]
    assert lines[2:4] == ["| check | result | figures |", "| --- | --- | --- |"]
    assert len(lines) == 4 + 4
    cells = [[c.strip() for c in re.split(r"(?<!\\)\|", line)] for line in lines[4:]]  # unescaped pipes only
    assert [c[1:4] for c in cells] == [list(r) for r in gt.table_rows(EXAMPLE_RECORD)]
    assert all(c[0] == c[4] == "" and len(c) == 5 for c in cells)


def test_table_goes_between_the_markers_of_docs_gpu_md(tmp_path):
    gt = _load("gpu_table")
    doc = tmp_path / "gpu.md"
    doc.write_text(f"# GPU\n\nbefore\n{gt.BEGIN}\nold table\n{gt.END}\nafter\n")
    gt.write_doc("new table", doc)
    assert doc.read_text() == f"# GPU\n\nbefore\n{gt.BEGIN}\nnew table\n{gt.END}\nafter\n"
    real = (ROOT / "docs" / "gpu.md").read_text()
    assert real.count(gt.BEGIN) == 1 and real.count(gt.END) == 1


def test_docs_gpu_md_shows_the_latest_record_or_says_there_is_none():
    """What docs/gpu.md shows between its markers is what the renderer makes of the newest record."""
    gt = _load("gpu_table")
    real = (ROOT / "docs" / "gpu.md").read_text()
    shown = real[real.index(gt.BEGIN) + len(gt.BEGIN):real.index(gt.END)].strip()
    latest = gt.latest_record()
    if latest is None:
        assert shown == gt.NO_RECORD
    else:
        record = json.loads(latest.read_text())
        assert shown == gt.render(record, str(latest.relative_to(ROOT)))
