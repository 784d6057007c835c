"""``omniprof diff`` on real torch profiles: self time, shares of the recorded time, one change in one
row, and repeated runs that tell a real slowdown from run-to-run noise.

The workload's time is mostly sleeps inside ``record_function`` ranges (their self time), beside
small real matmuls: sleeps keep their length on a loaded machine far better than CPU-bound work,
so the verdicts here do not hang on other processes. The 20%-slower target on CPU-bound torch ops is
measured by ``benchmarks/diff_noise.py``."""

from __future__ import annotations

import gc
import gzip
import json
import time
from pathlib import Path

import pytest

import omniprof
from omniprof.cli import main
from omniprof.analysis.diff import TOTAL_KEY, diff, format_diff

torch = pytest.importorskip("torch")
from torch.profiler import record_function  # noqa: E402

OPTS = omniprof.ProfileOptions(device_tracer_level=0)
A = torch.randn(48, 48)


def _work(inner_ms: float) -> None:
    """Nested ranges with known sleeps (their self time) around real matmuls. The matmuls run before
    the inner sleep: run after it, they were slower when the sleep was longer (aten::mm +14.8% on 5 vs 5
    runs in one CI run after a 25 ms sleep instead of 5 ms: a CPU idle longer comes back slower), and
    diff rightly reported it, beside the one change the test made."""
    with record_function("outer"):
        time.sleep(0.002)
        for _ in range(4):
            torch.mm(A, A)
        with record_function("inner"):
            time.sleep(inner_ms / 1000)


def _run(inner_ms: float, logdir: Path | None = None) -> omniprof.ProfileResult:
    gc.collect()  # the previous run's garbage (a whole result) is not collected on this run's time
    with omniprof.Profiler(backend="torch", options=OPTS, logdir=logdir) as prof:
        _work(inner_ms)
    return prof.result


def _runs(n: int, slow_ms: float) -> tuple[list, list]:
    base, new = [], []
    for i in range(n):  # interleaved, order flipped every pair: load changes and position hit both sides alike
        if i % 2:
            new.append(_run(slow_ms))
            base.append(_run(5.0))
        else:
            base.append(_run(5.0))
            new.append(_run(slow_ms))
    return base, new


def _rows(d, table="op_stats"):
    return {r.key: r for r in next(t for t in d.tables if t.name == table).rows}


def test_op_tables_compare_self_time_and_total_is_the_recorded_time(tmp_path):
    """The total is the time recorded in ops (top-level ranges, read from the Kineto JSON itself), not the
    sum of inclusive times; a slower inner range shows in its own row only, not in its parent's."""
    _work(1.0)  # warm up torch's kernels outside the measured runs
    a = _run(5.0, tmp_path / "a")
    b = _run(45.0, tmp_path / "b")
    d = diff(a, b)
    trace = next(Path(x.path) for x in a.parts[0].artifacts if x.kind == "kineto")
    events = json.loads(trace.read_text()) if trace.suffix == ".json" else json.load(gzip.open(trace))
    spans = [e for e in events["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")]
    top = [e for e in spans if not any(o is not e and o["tid"] == e["tid"] and o["ts"] <= e["ts"] and
                                       e["ts"] + e["dur"] <= o["ts"] + o["dur"] and o["dur"] > e["dur"]
                                       for o in spans)]
    recorded_ns = round(sum(float(e["dur"]) for e in top) * 1000)
    rows = _rows(d)
    assert next(t for t in d.tables if t.name == "op_stats").time_column == "self_ns"
    assert abs(rows[TOTAL_KEY].a_ns - recorded_ns) <= len(spans)  # ns rounding of each event at most
    # outer's row is its self time: its span minus its direct children, counted here from the spans
    part = a.parts[0]
    outer = next(s for s in part.spans if s.name == "outer")
    children = [s for s in part.spans if s.track == outer.track and s.category in ("cpu_op", "annotation")
                and outer.start_ns <= s.start_ns and s.end_ns <= outer.end_ns and s is not outer]
    direct = [c for c in children if not any(o is not c and o.start_ns <= c.start_ns and c.end_ns <= o.end_ns
                                             and o.dur_ns > c.dur_ns for o in children)]
    assert rows["outer"].a_ns == outer.dur_ns - sum(c.dur_ns for c in direct)
    # inner's 40 ms more shows in inner's row, not in its parent's
    assert rows["inner"].regressed and rows["inner"].delta_ns > 30_000_000
    assert rows["outer"].delta_ns < rows["inner"].delta_ns / 2
    assert "1 vs 1 run(s): no run-to-run spread" in d.notes[0]  # one run each: the threshold alone decides
    assert abs(sum(r.a_share_pct for r in rows.values() if r.key != TOTAL_KEY) - 100.0) < 1e-6


def test_repeated_identical_runs_report_nothing_and_a_slower_op_alone(tmp_path):
    """5 vs 5 runs of one setup: 0 regressions. 8 vs 8 with 'inner' 5x slower: 'inner' (and the total
    it drags up) regressed with the confidence stated; nothing else. Eight runs a side, not five: on
    a loaded machine a base run may have its 5 ms call stretched past the slow side's 25 ms (the
    scheduler gave the CPU away mid-call); capped at 1.1x the pooled median, it ties with the slow
    runs, and with 5 vs 5 one such run alone gives p = C(6,5)/C(10,5) = 0.024 > alpha (the p=0.052
    seen on a busy machine); with 8 vs 8 one gives 9/12870 and two give 45/12870 = 0.0035."""
    _work(1.0)
    base, same = _runs(5, 5.0)
    d = diff(base, same)
    assert d.regressions == [], format_diff(d)
    assert next(t for t in d.tables if t.name == "op_stats").runs_a == 5
    assert d.notes == ()
    base, slow = _runs(8, 25.0)
    d = diff(base, slow)
    inner = _rows(d)["inner"]
    assert inner.regressed, format_diff(d)
    assert inner.p_value <= 0.01 and inner.confidence_pct > 99, format_diff(d)
    assert {r.key for _, r in d.regressions} <= {"inner", TOTAL_KEY}, format_diff(d)
    rows = _rows(d)  # the one op made slower is the one that grew most (its 5x is wall time: load stretches both)
    assert max((r for r in rows.values() if r.key != TOTAL_KEY), key=lambda r: r.delta_ns) is inner
    text = format_diff(d)
    assert "test gives p <= 0.01" in text and "8 vs 8 runs" in text


def test_steps_of_one_profile_are_the_repeats():
    """repeats='steps': one profile of 5 steps per side gives 5 vs 5 samples."""
    _work(1.0)

    def profile(inner_ms):
        with omniprof.Profiler(backend="torch", options=OPTS) as prof:
            for _ in range(6):  # the first call runs before any step() opens a step; the last step is empty
                _work(inner_ms)
                prof.step()
        return prof.result

    a, b = profile(5.0), profile(25.0)
    d = diff(a, b, repeats="steps")
    t = next(t for t in d.tables if t.name == "op_stats")
    assert (t.runs_a, t.runs_b) == (5, 5)
    rows = _rows(d)
    # (The two profiles run one after the other, so a change of machine load between them is not
    # run-to-run noise the test can see: only the large change is asserted here.)
    assert rows["inner"].regressed and rows["inner"].p_value == pytest.approx(1 / 252), format_diff(d)
    assert "ProfilerStep#*" in rows  # step ranges compare as one row whatever their numbers
    # per-step self times add up to the op table's self time (every op ran inside a step)
    table = a.parts[0].table("op_stats")
    self_inner = next(r[3] for r in table.rows if r[0] == "inner")
    first = min((s for s in a.parts[0].spans if s.name == "inner"), key=lambda s: s.start_ns)
    from omniprof.analysis.diff import _op_self_by_step

    per_step = _op_self_by_step(a.parts[0])
    assert len(per_step) == 5
    assert sum(step["inner"] for step in per_step) == self_inner - first.dur_ns  # all but the unstepped call
    assert rows["inner"].a_ns == sorted(step["inner"] for step in per_step)[2]  # the median step


def test_cli_repeated_runs_gate(tmp_path, capsys):
    """`omniprof diff A1..A5 --vs B1..B5 --fail-on-regression`: exit 0 for the same setup, 1 for a slower op."""
    _work(1.0)
    base, same = _runs(5, 5.0)
    _, slow = _runs(5, 25.0)
    paths = {}
    for name, results in (("base", base), ("same", same), ("slow", slow)):
        paths[name] = []
        for i, r in enumerate(results):
            p = tmp_path / f"{name}{i}.json"
            r.save(p)
            paths[name].append(str(p))
    assert main(["diff", *paths["base"], "--vs", *paths["same"], "--fail-on-regression"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("== omniprof diff: 0 regression(s)")
    assert main(["diff", *paths["base"], "--vs", *paths["slow"], "--fail-on-regression"]) == 1
    out = capsys.readouterr().out
    assert any(line.startswith("!") and line.rstrip().endswith("inner") for line in out.splitlines())
    # the saved runs keep their op spans: calls are capped by default, plain sums with --clip-calls 0
    assert "judged with each call at most 1.1x its median over all runs" in out
    assert main(["diff", *paths["base"], "--vs", *paths["slow"], "--clip-calls", "0", "--format", "json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["clip_calls"] is None and all(t["clipped"] == 0 for t in got["tables"])
    assert main(["diff", *paths["base"][:3]]) == 2
    assert "--vs" in capsys.readouterr().err
