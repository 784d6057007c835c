"""Julia-style tree/flat reports, every print option, and callers(), on synthetic results."""

from __future__ import annotations

import io

import pytest

import omniprof
from omniprof.core.results import BackendResult, Frame, ProfileResult, StackSample, TaskInfo, ThreadInfo
from omniprof.analysis.stackreport import PrintOptions, build_report, callers, format_report
from omniprof.errors import InvalidArgumentError

M = Frame("main", "app.py", 1)
F = Frame("f", "app.py", 10)
G = Frame("g", "app.py", 20)
H = Frame("h", "lib.py", 5)
F2 = Frame("f", "app.py", 10, offset=8)  # same line as F, other bytecode offset
N = Frame("sqrt", "", 0, module="libm.so", kind="native")


def part(stack_counts, *, frames=(M, F, G, H, F2, N), threads=None, tasks=(), thread_of=None, task_of=None):
    """A BackendResult with ``count`` samples of each stack (frame tuples, root first), weight 1 ms."""
    frames = list(frames)
    stacks, samples = [], []
    for i, (st, count) in enumerate(stack_counts):
        stacks.append(tuple(frames.index(f) for f in st))
        for _ in range(count):
            samples.append(StackSample(len(samples), thread_of(i) if thread_of else 1, i, 1_000_000,
                                       task_of(i) if task_of else None))
    return BackendResult(backend="cpu", frames=frames, stacks=stacks, samples=samples,
                         threads=threads or [ThreadInfo(1, "MainThread")], tasks=tasks)


def test_tree_counts_self_and_nesting():
    """Tree rows have exact counts, self counts (overhead) and depths."""
    p = part([((M, F), 3), ((M, F, G), 5), ((M, H), 2)])
    rows = build_report(p, sortedby="count")[0].tree
    got = [(r.depth, r.frame.name, r.count, r.self_count) for r in rows]
    assert got == [(0, "main", 10, 0), (1, "f", 8, 3), (2, "g", 5, 5), (1, "h", 2, 2)]


def test_flat_counts_recursion_once_per_sample():
    """Flat rows count a frame once per sample even when it recurs in the stack."""
    p = part([((M, F, F, F), 4), ((M, G), 1)])
    rows = {r.frame.name: r for r in build_report(p, format="flat")[0].flat}
    assert rows["f"].count == 4 and rows["f"].self_count == 4
    assert rows["main"].count == 5 and rows["main"].self_count == 0


def test_sortedby_orders_flat_rows():
    """filefuncline sorts by file/function/line; count and overhead sort largest first."""
    p = part([((M, F), 1), ((M, G), 6), ((M, H), 3)])
    names = lambda **k: [r.frame.name for r in build_report(p, format="flat", **k)[0].flat]  # noqa: E731
    assert names() == ["f", "g", "main", "h"]  # by file, then function, then line
    assert names(sortedby="count") == ["main", "g", "h", "f"]
    assert names(sortedby="overhead") == ["g", "h", "f", "main"]


def test_combine_false_keeps_offsets_apart():
    """combine=True merges two offsets on one line; combine=False keeps them as separate rows."""
    p = part([((M, F), 2), ((M, F2), 3)])
    merged = build_report(p, format="flat", combine=True)[0].flat
    split = build_report(p, format="flat", combine=False)[0].flat
    assert [r.count for r in merged if r.frame.name == "f"] == [5]
    assert sorted(r.count for r in split if r.frame.name == "f") == [2, 3]
    text = "\n".join(format_report(p, format="tree", combine=False, cols=100))
    assert "app.py:10@8; f" in text


def test_maxdepth_and_mincount():
    """maxdepth cuts deeper levels; mincount hides rows with fewer samples."""
    p = part([((M, F, G), 5), ((M, H), 1)])
    assert max(r.depth for r in build_report(p, maxdepth=2)[0].tree) == 1
    assert [r.frame.name for r in build_report(p, mincount=2)[0].tree] == ["main", "f", "g"]
    assert [r.frame.name for r in build_report(p, format="flat", mincount=2)[0].flat] == ["f", "g", "main"]


def test_noisefloor_hides_rows_within_sqrt_noise():
    """noisefloor hides a child with n <= noisefloor * sqrt(N) of its parent's N samples."""
    p = part([((M, F), 96), ((M, G), 4)])  # sqrt(100) = 10
    assert [r.frame.name for r in build_report(p, noisefloor=0.5)[0].tree] == ["main", "f"]  # 4 <= 5
    assert [r.frame.name for r in build_report(p, noisefloor=0.3)[0].tree] == ["main", "f", "g"]  # 4 > 3


def test_recur_flat_folds_recursion():
    """recur='flat' re-enters a frame already on the path instead of nesting deeper."""
    p = part([((M, F, G, F, G, H), 2)])
    off = [(r.depth, r.frame.name) for r in build_report(p)[0].tree]
    flat = [(r.depth, r.frame.name, r.count) for r in build_report(p, recur="flat")[0].tree]
    assert len(off) == 6
    assert flat == [(0, "main", 2), (1, "f", 2), (2, "g", 2), (3, "h", 2)]


def test_recur_flatc_folds_native_frames_too():
    """recur='flat' folds Python frames only, as Julia's :flat leaves C frames; 'flatc' folds native
    frames too (Julia's :flatc)."""
    p = part([((M, N, F, N, F, G), 2)])
    flat = [(r.depth, r.frame.name) for r in build_report(p, recur="flat", native=True)[0].tree]
    flatc = [(r.depth, r.frame.name) for r in build_report(p, recur="flatc", native=True)[0].tree]
    # flat: the second f goes back to the first (dropping the sqrt between); sqrt itself is not folded
    assert flat == [(0, "main"), (1, "sqrt"), (2, "f"), (3, "g")]
    p2 = part([((M, N, F, N, G), 2)])
    flat2 = [(r.depth, r.frame.name) for r in build_report(p2, recur="flat", native=True)[0].tree]
    flatc2 = [(r.depth, r.frame.name) for r in build_report(p2, recur="flatc", native=True)[0].tree]
    assert flat2 == [(0, "main"), (1, "sqrt"), (2, "f"), (3, "sqrt"), (4, "g")]  # sqrt nests again
    assert flatc2 == [(0, "main"), (1, "sqrt"), (2, "g")]  # sqrt re-entered: back to the first one
    assert flatc == [(0, "main"), (1, "sqrt"), (2, "f"), (3, "g")]
    with pytest.raises(InvalidArgumentError, match="'recur' must be one of"):
        PrintOptions(recur="flatx")


def test_native_frames_hidden_unless_requested():
    """Native frames are left out by default and shown with native=True (Julia's C=true)."""
    p = part([((M, F, N), 3)])
    assert "sqrt" not in [r.frame.name for r in build_report(p)[0].tree]
    rows = build_report(p, native=True)[0].tree
    assert rows[-1].frame.name == "sqrt" and rows[-1].self_count == 3
    assert build_report(p)[0].tree[-1].self_count == 3  # hidden native time goes to its Python caller


def test_groupby_thread_task_and_filters():
    """groupby splits by thread, task and both nestings; threads/tasks filters keep only those ids."""
    threads = [ThreadInfo(1, "MainThread"), ThreadInfo(2, "worker")]
    tasks = [TaskInfo(7, "fetch", 1), TaskInfo(8, "parse", 1)]
    p = part([((M, F), 3), ((M, G), 2), ((M, H), 4)], threads=threads, tasks=tasks,
             thread_of=lambda i: 1 if i < 2 else 2, task_of=lambda i: [7, 8, None][i])
    by_thread = build_report(p, groupby="thread")
    assert [(g.path[0][2], g.samples) for g in by_thread] == [("MainThread", 5), ("worker", 4)]
    by_task = build_report(p, groupby="task")
    assert [(g.path[0][1], g.samples) for g in by_task] == [(7, 3), (8, 2), (None, 4)]
    nested = build_report(p, groupby=["thread", "task"])
    assert [(g.path[0][1], g.path[1][1], g.samples) for g in nested] == [(1, 7, 3), (1, 8, 2), (2, None, 4)]
    rev = build_report(p, groupby=("task", "thread"))
    assert [(g.path[0][0], g.path[1][0]) for g in rev][0] == ("task", "thread")
    assert sum(g.samples for g in build_report(p, threads=2)) == 4
    assert sum(g.samples for g in build_report(p, tasks=[7, 8])) == 5
    text = "\n".join(format_report(p, groupby="thread", cols=100))
    assert "Thread 2 (worker)  Total snapshots: 4" in text


def test_cols_truncates_with_dots_and_plus_indent():
    """Narrow cols truncate names with '...' and show deep indentation as '+n'."""
    deep = [Frame(f"level_{i}_with_a_long_function_name", "/very/long/path/to/some/module_file.py", i) for i in range(40)]
    p = part([(tuple(deep), 1)], frames=deep)
    lines = format_report(p, cols=60, header=False)
    assert all(len(ln) <= 60 for ln in lines)
    assert any("..." in ln for ln in lines)
    plus = [ln for ln in lines[2:] if ln.split("╎", 1)[1].startswith("+")]
    assert plus and plus[-1].split("╎", 1)[1].startswith("+")
    wide = format_report(p, cols=400, header=False)
    assert not any(ln.split("╎", 1)[1].startswith("+") for ln in wide[2:])


def test_options_are_validated():
    """Bad print options raise InvalidArgumentError naming the option and allowed values."""
    with pytest.raises(InvalidArgumentError, match="'sortedby' must be one of"):
        PrintOptions(sortedby="time")
    with pytest.raises(InvalidArgumentError, match="'groupby' must be one of"):
        PrintOptions(groupby="process")
    with pytest.raises(InvalidArgumentError, match="did you mean 'maxdepth'"):
        omniprof.cpu.print(part([((M,), 1)]), max_depth=2)


def test_callers_counts_each_caller():
    """callers() returns (samples, caller frame), most first; filename and linerange narrow the match."""
    p = part([((M, F, H), 3), ((M, G, H), 5), ((H,), 1)])
    got = [(n, fr.name) for n, fr in callers("h", p)]
    assert got == [(5, "g"), (3, "f"), (1, "<root>")]
    assert callers("h", p, filename="app.py") == []
    assert [n for n, _ in callers("h", p, filename="lib.py", linerange=(1, 9))] == [5, 3, 1]
    assert callers("h", p, linerange=range(6, 9)) == []


def test_print_writes_julia_layout_and_overhead():
    """print() writes the Julia header and the sampler's overhead line."""
    p = part([((M, F), 3)])
    p = BackendResult(**{**{a: getattr(p, a) for a in ("backend", "frames", "stacks", "samples", "threads")},
                         "summaries": {"overhead": {"samples": 3, "ticks": 3, "engine": "signal", "achieved_rate_hz": 990.0,
                                                    "requested_rate_hz": 1000.0, "sampler_time_ns": 6000,
                                                    "sampler_overhead_pct": 0.2}}})
    buf = io.StringIO()
    omniprof.cpu.print(ProfileResult(parts=(p,)), file=buf, C=True)
    text = buf.getvalue()
    assert "Overhead ╎ [+additional indent] Count Time % File:Line; Function" in text
    assert "990 Hz achieved of 1000 Hz requested" in text and "0.20% of the session" in text
    assert "3 3.00 ms 100.0% app.py:10; f" in text


def test_print_tree_is_julias_with_time_beside_the_counts():
    """What Julia's Profile.print shows (../shared/seeds/julia-profile-*.txt: "Overhead ╎
    [+additional indent] Count File:Line; Function", the count of samples at or below a line
    first, the line's own samples in the gutter), with the time and its % beside the count
    (samples weigh 1 ms each here: 10 samples = 10 ms). The counts are the hand-counted ones of
    the sample list: main 10 (3 + 5 + 2), f 8 with 3 of its own, g 5 of its own, h 2."""
    p = part([((M, F), 3), ((M, F, G), 5), ((M, H), 2)])
    buf = io.StringIO()
    omniprof.cpu.print(p, file=buf, cols=100)
    lines = buf.getvalue().splitlines()
    assert lines[0] == "Overhead ╎ [+additional indent] Count Time % File:Line; Function"
    rows = [ln.replace("╎", " ").split() for ln in lines[2:]]
    assert rows[0] == ["10", "10.00", "ms", "100.0%", "app.py:1;", "main"]
    assert rows[1] == ["3", "8", "8.00", "ms", "80.0%", "app.py:10;", "f"]
    assert rows[2] == ["5", "5", "5.00", "ms", "50.0%", "app.py:20;", "g"]
    assert rows[3] == ["2", "2", "2.00", "ms", "20.0%", "lib.py:5;", "h"]
    # the gutter is Julia's: overhead right-aligned before the bar, the count right after the indent
    assert lines[3].index("╎") == len("Overhead") and lines[3].split("╎", 1)[1].startswith(" 8 ")
    buf = io.StringIO()
    omniprof.cpu.print(p, file=buf, cols=100, format="flat")
    flat = buf.getvalue().splitlines()
    assert flat[0].split() == ["Count", "Overhead", "Time", "%", "Self", "time", "File", "Line", "Function"]
    assert [ln.split()[:6] for ln in flat[2:] if ln.split()[-1] == "f"] == [["8", "3", "8.00", "ms", "80.0%", "3.00"]]


def test_print_counts_false_shows_time_and_percent_only():
    """counts=False: time and its % of the group's sampled time, self time in the gutter."""
    p = part([((M, F), 3), ((M, F, G), 5), ((M, H), 2)])
    buf = io.StringIO()
    omniprof.cpu.print(p, file=buf, cols=100, counts=False)
    lines = buf.getvalue().splitlines()
    assert lines[0].startswith("Self time ╎ [+additional indent] Time % File:Line; Function")
    rows = [ln.replace("╎", " ").split() for ln in lines[2:]]
    assert rows[0] == ["10.00", "ms", "100.0%", "app.py:1;", "main"]
    assert rows[1] == ["3.00", "ms", "8.00", "ms", "80.0%", "app.py:10;", "f"]
    assert rows[2] == ["5.00", "ms", "5.00", "ms", "50.0%", "app.py:20;", "g"]
    buf = io.StringIO()
    omniprof.cpu.print(p, file=buf, cols=100, format="flat", counts=False)
    flat = buf.getvalue().splitlines()
    assert flat[0].split() == ["Time", "%", "Self", "time", "Self", "%", "File", "Line", "Function"]
    assert [ln.split()[:6] for ln in flat[2:] if ln.split()[-1] == "g"] == [["5.00", "ms", "50.0%", "5.00", "ms",
                                                                            "50.0%"]]


def test_many_samples_aggregate_exactly():
    """2*10^5 samples over 50 stacks aggregate into exact tree and flat counts (the 10^6-in-2-s target
    is measured in benchmarks/cpu_sampler.py)."""
    frames = [Frame(f"f{i}", "x.py", i) for i in range(30)]
    stacks = [tuple(range(k % 20 + 5)) for k in range(50)]
    samples = [StackSample(i, 1, i % 50, 1000) for i in range(200_000)]
    p = BackendResult(backend="cpu", frames=frames, stacks=stacks, samples=samples)
    tree = build_report(p, sortedby="count")[0]
    flat = build_report(p, format="flat")[0]
    assert tree.samples == 200_000 and tree.tree[0].count == 200_000
    counts = {r.frame.name: r.count for r in flat.flat}
    assert counts["f0"] == 200_000
    assert counts["f23"] == 2 * 200_000 // 50  # only stacks 19 and 39 (24 deep) reach frame 23
    assert "f24" not in counts
