"""The one call tree: filters and aggregation on hand-built stacks (expected values counted by hand)."""

from __future__ import annotations

import os

import omniprof
from omniprof.analysis import calltree as ct
from omniprof.core.results import BackendResult, Frame, StackSample, ThreadInfo

M = Frame("main", "app.py", 1)
F = Frame("f", "app.py", 10)
F11 = Frame("f", "app.py", 11)
G = Frame("g", "app.py", 20)
SLEEP = Frame("clock_nanosleep", "", 0, module="libc.so.6", kind="native")
WAIT = Frame("Condition.wait", "/usr/lib/python3.11/threading.py", 320)
OWN = Frame("_run", os.path.join(os.path.dirname(omniprof.__file__), "cli.py"), 700)
RUNPY = Frame("_run_code", "<frozen runpy>", 88)


def S(*frames, n=1, w=None, t=None):
    return ct.Stack(tuple(frames), n, 1_000_000 * n if w is None else w, t)


def test_fold_recursion_goes_back_to_the_first_place_on_the_path():
    """f -> g -> f -> g -> h becomes f -> g -> h; a plain stack is left as it is (the same object)."""
    h = Frame("h", "app.py", 30)
    out = ct.fold_recursion([S(M, F, G, F, G, h), S(M, F)])
    assert [s.frames for s in out] == [(M, F, G, h), (M, F)]
    plain = S(M, F)
    assert ct.fold_recursion([plain])[0] is plain


def test_deep_recursion_folds_to_one_tree_level():
    """500 nested calls of f: 2 tree rows folded, 501 unfolded."""
    deep = S(M, *([F] * 500))
    assert len(ct.tree_rows(ct.build_tree(ct.fold_recursion([deep])))) == 2
    assert len(ct.tree_rows(ct.build_tree([deep]))) == 501


def test_merge_by_function_joins_lines():
    """main:1 -> f:10 and main:1 -> f:11 are one f by function, two by line."""
    stacks = [S(M, F, n=2), S(M, F11, n=3)]
    by_line = ct.flat_rows(ct.merge_frames(stacks, "line"))
    by_func = ct.flat_rows(ct.merge_frames(stacks, "function"))
    assert sorted((r.frame.line, r.count) for r in by_line if r.frame.name == "f") == [(10, 2), (11, 3)]
    assert [(r.frame.name, r.count, r.self_ns) for r in by_func if r.frame.name == "f"] == [("f", 5, 5_000_000)]


def test_idle_stacks_are_recognised_and_hidden():
    """A native sleep leaf, a threading wait leaf and a backend's own idle frame are idle; a busy
    leaf is not, even with a wait further up."""
    idle_mark = Frame("<idle>", kind="idle")
    stacks = [S(M, G, SLEEP), S(M, WAIT), S(M, idle_mark), S(WAIT, G), S(M, F)]
    assert [ct.is_idle(s.frames) for s in stacks] == [True, True, True, False, False]
    assert [s.frames for s in ct.hide_idle(stacks)] == [(WAIT, G), (M, F)]


def test_own_frames_are_cut():
    """omniprof's and runpy's frames are removed; a stack made only of them goes away, and so does
    one of the launcher that never reached the user's code (runpy looking up an importer)."""
    importer = Frame("get_importer", "/usr/lib/python3.11/pkgutil.py", 400)
    run_path = Frame("run_path", "<frozen runpy>", 290)
    handler = Frame("handler", OWN.file, 120)
    out = ct.cut_own_frames([S(OWN, RUNPY, M, F), S(OWN, RUNPY), S(M, G), S(OWN, run_path, importer),
                             S(M, handler)])
    assert [s.frames for s in out] == [(M, F), (M, G), (M,)]


def test_tree_and_flat_times_and_counts():
    """Counts and times per node, and the flat view counting a recurring frame once per sample."""
    stacks = [S(M, F, n=3), S(M, F, G, n=5), S(M, G, n=2), S(M, F, F, n=1)]
    rows = ct.tree_rows(ct.build_tree(stacks))
    assert [(r.depth, r.frame.name, r.count, r.self_count, r.total_ns, r.self_ns) for r in rows] == [
        (0, "main", 11, 0, 11_000_000, 0), (1, "f", 9, 3, 9_000_000, 3_000_000),
        (2, "g", 5, 5, 5_000_000, 5_000_000), (2, "f", 1, 1, 1_000_000, 1_000_000),
        (1, "g", 2, 2, 2_000_000, 2_000_000)]
    flat = {r.frame.name: (r.count, r.self_count, r.total_ns) for r in ct.flat_rows(stacks)}
    assert flat == {"main": (11, 0, 11_000_000), "f": (9, 4, 9_000_000), "g": (7, 7, 7_000_000)}


def test_min_share_hides_small_subtrees():
    stacks = [S(M, F, n=99), S(M, G, F, n=1)]
    rows = ct.tree_rows(ct.build_tree(stacks), min_share=0.02)
    assert [r.frame.name for r in rows] == ["main", "f"]


def test_threads_busiest_first_idle_last():
    """Threads ordered by busy time; one that only waited comes last and is marked."""
    part = BackendResult(backend="cpu", threads=[ThreadInfo(1, "MainThread"), ThreadInfo(2, "worker"),
                                                 ThreadInfo(3, "sleeper")])
    stacks = [S(M, F, n=2, t=1), S(M, WAIT, n=50, t=1), S(G, n=9, t=2), S(G, SLEEP, n=90, t=3)]
    groups = ct.by_thread(part, stacks)
    assert [(g.name, g.busy, g.idle, g.idle_only) for g in groups] == [
        ("worker", 9_000_000, 0, False), ("MainThread", 2_000_000, 50_000_000, False),
        ("sleeper", 0, 90_000_000, True)]


def test_sample_stacks_aggregate_and_skip_unknown_stacks():
    frames = [M, F]
    part = BackendResult(backend="cpu", frames=frames, stacks=[(0, 1), (0,)],
                         samples=[StackSample(0, 1, 0, 10), StackSample(1, 1, 0, 30), StackSample(2, 1, 1, 5),
                                  StackSample(3, 1, 7, 5)], threads=[ThreadInfo(1, "MainThread")])
    got = sorted((s.frames, s.count, s.weight) for s in ct.sample_stacks(part))
    assert got == [((M,), 1, 5), ((M, F), 2, 40)]
    assert ct.unknown_stack_samples(part) == 1


def test_labels_shorten_paths_one_way(tmp_path, monkeypatch):
    """Under the working directory: relative; in the standard library: from its root; native: the library."""
    import threading

    monkeypatch.chdir(tmp_path)
    assert ct.frame_label(Frame("f", str(tmp_path / "pkg" / "m.py"), 3)) == f"f  {os.path.join('pkg', 'm.py')}:3"
    assert ct.frame_label(Frame("Thread.run", threading.__file__, 9), line=False) == "Thread.run  threading.py"
    assert ct.frame_label(SLEEP) == "clock_nanosleep  libc.so.6"


def test_negative_sample_weights_count_as_zero():
    """A sample with a negative weight (invalid data) still counts, with weight 0: no report shows
    negative time (the stack records of pprof and folded stacks come from here)."""
    part = BackendResult(backend="cpu", frames=(M,), stacks=((0,),),
                         samples=(StackSample(1, 1, 0, 5), StackSample(2, 1, 0, -3), StackSample(3, 1, 0, 4)))
    [stack] = ct.sample_stacks(part)
    assert (stack.count, stack.weight) == (3, 9)


def test_allocation_stacks_alive_only():
    """alive_only keeps the allocations alive at the end: in use 2 x 64 of the 3 allocations' 2 x 64 + 100 bytes."""
    from omniprof.core.results import Allocation

    part = BackendResult(backend="mem", frames=(M, F), stacks=((0,), (0, 1)),
                         allocations=(Allocation(1, 64, 1, 7, alive_at_end=True, count=2), Allocation(2, 100, 1, 7),
                                      Allocation(3, 8, 0, 7)))
    everything = {s.frames: (s.count, s.weight) for s in ct.allocation_stacks(part)}
    alive = {s.frames: (s.count, s.weight) for s in ct.allocation_stacks(part, alive_only=True)}
    assert everything == {(M, F): (3, 228), (M,): (1, 8)}
    assert alive == {(M, F): (2, 128)}
