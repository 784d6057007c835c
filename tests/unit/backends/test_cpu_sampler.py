"""The cpu sampling engine driven by synthetic stacks and a FakeClock: exact counts and weights."""

from __future__ import annotations

import warnings

import pytest

from omniprof.backends.cpu.sampler import BYTES_PER_SAMPLE, Sampler
from omniprof.backends.cpu.stacks import GC_KEY, walk
from omniprof.errors import DataLossWarning
from omniprof.testing import FakeClock

MAIN = 1
WORKER = 2


def stack(*names_lines):
    """Leaf-first raw stack from ("func@file", line) pairs given root first."""
    flat = []
    for name, line in reversed(names_lines):
        flat += [name, line]
    return tuple(flat)


def make(ticks, max_samples=100, tasks=None):
    """A sampler whose source replays ``ticks`` (a list of [(tid, raw)] per tick)."""
    clock = FakeClock(start_ns=0)
    it = iter(ticks)
    s = Sampler(lambda: next(it), clock, max_samples, tasks=tasks)
    return s, clock


def run(s, clock, n, step_ns=1_000_000):
    for _ in range(n):
        clock.advance(step_ns)
        s.sample()


def test_weights_are_time_since_previous_sample_per_thread():
    """Each sample weighs the time since its thread's previous one (since begin for the first)."""
    a = stack(("main@m.py", 1), ("f@m.py", 10))
    s, clock = make([[(MAIN, a)], [(MAIN, a), (WORKER, a)], [(MAIN, a)]])
    s.begin()
    clock.advance(1_000_000)
    s.sample()
    clock.advance(3_000_000)  # a coalesced tick: 3 ms pass
    s.sample()
    clock.advance(1_000_000)
    s.sample()
    assert list(s.weights_ns) == [1_000_000, 3_000_000, 4_000_000, 1_000_000]
    assert list(s.thread_ids) == [MAIN, MAIN, WORKER, MAIN]
    assert s.ticks == 3


def test_identical_stacks_are_interned_once():
    """Repeated stacks share one stack id; distinct ones get new ids."""
    a = stack(("main@m.py", 1), ("f@m.py", 10))
    b = stack(("main@m.py", 1), ("g@m.py", 20))
    s, clock = make([[(MAIN, a)], [(MAIN, b)], [(MAIN, a)]])
    s.begin()
    run(s, clock, 3)
    assert list(s.stack_ids) == [0, 1, 0]
    assert len(s.stack_list) == 2


def test_full_buffer_stops_recording_counts_and_warns_once():
    """A full buffer keeps the program going, counts every sample not taken, warns once."""
    a = stack(("main@m.py", 1))
    s, clock = make([[(MAIN, a), (WORKER, a)]] * 5, max_samples=3)
    s.begin()
    with pytest.warns(DataLossWarning, match="buffer is full") as rec:
        run(s, clock, 5)
    assert len(rec) == 1
    assert len(s) == 3
    assert s.dropped == 7
    frames, stacks, samples, losses = s.export()
    assert losses[0].kind == "samples_dropped" and losses[0].count == 7


def test_samples_accumulate_across_sessions_until_clear():
    """A second session appends to the buffer; export(start) gives only that session; clear empties."""
    a = stack(("main@m.py", 1), ("f@m.py", 10))
    s, clock = make([[(MAIN, a)]] * 5)
    s.begin()
    run(s, clock, 2)
    start = s.begin()
    run(s, clock, 3)
    assert start == 2 and len(s) == 5
    _, _, session, _ = s.export(start)
    assert len(session) == 3
    s.clear()
    assert len(s) == 0 and s.ticks == 0 and not s.stack_list


def test_export_resolves_frames_root_first():
    """Exported stacks are root-first frame indices with names, files and lines."""
    a = stack(("main@m.py", 1), ("f@m.py", 10))
    s, clock = make([[(MAIN, a)]])
    s.begin()
    run(s, clock, 1)
    frames, stacks, samples, _ = s.export()
    assert [(frames[i].name, frames[i].file, frames[i].line) for i in stacks[0]] == [("main", "m.py", 1), ("f", "m.py", 10)]
    assert samples[0].weight_ns == 1_000_000


def test_tasks_are_identified_per_thread():
    """Samples carry the id of the asyncio task running on their thread; TaskInfo keeps its name."""

    class Task:
        def __init__(self, name):
            self.name = name

        def get_name(self):
            return self.name

    t1, t2 = Task("fetch"), Task("parse")
    current = [{MAIN: t1}, {MAIN: t2}, {}, {MAIN: t1}]
    it = iter(current)
    a = stack(("main@m.py", 1))
    s, clock = make([[(MAIN, a)]] * 4, tasks=lambda: next(it))
    s.begin()
    run(s, clock, 4)
    _, _, samples, _ = s.export()
    ids = [x.task_id for x in samples]
    assert ids[0] == ids[3] and ids[0] != ids[1] and ids[2] is None
    assert {t.name for t in s.task_info.values()} == {"fetch", "parse"}


def test_gc_sample_takes_its_time_from_the_next_sample():
    """A recorded collection becomes a <gc gen N> leaf sample; the thread's next sample gives that time back."""
    import sys

    clock = FakeClock(start_ns=0)
    frame = sys._getframe()
    s = Sampler(lambda: [(MAIN, walk(frame))], clock, 100, tasks=None)
    s.begin()
    clock.advance(1_000_000)
    s.sample()
    s.record_gc(MAIN, frame, 2, 1_200_000, 1_500_000)
    clock.advance(1_000_000)
    s.sample()
    frames, stacks, samples, _ = s.export()
    gc_samples = [x for x in samples if frames[stacks[x.stack_id][-1]].kind == "gc"]
    assert len(gc_samples) == 1 and gc_samples[0].weight_ns == 300_000
    assert frames[stacks[gc_samples[0].stack_id][-1]].name == "<gc gen 2>"
    assert sum(x.weight_ns for x in samples) == 2_000_000
    assert GC_KEY == 0


def test_gc_samples_as_many_as_their_time_is_worth():
    """With a quantum (the sampling interval), collections add up per thread and generation and each
    whole quantum of GC time is one <gc> sample of that weight: 4 x 0.3 ms -> one 1 ms sample (0.2 ms
    carried), then 2.5 ms -> two more (0.7 ms carried); the next real sample gives back exactly the
    time recorded as GC, so the total is the elapsed time."""
    import sys

    clock = FakeClock(start_ns=0)
    frame = sys._getframe()
    s = Sampler(lambda: [(MAIN, walk(frame))], clock, 100, tasks=None)
    s.gc_quantum_ns = 1_000_000
    s.begin()
    clock.advance(1_000_000)
    s.sample()
    for k in range(4):
        s.record_gc(MAIN, frame, 0, 1_000_000 + k * 400_000, 1_300_000 + k * 400_000)
    s.record_gc(MAIN, frame, 0, 3_000_000, 5_500_000)
    clock.advance(5_000_000)
    s.sample()
    frames, stacks, samples, _ = s.export()
    gc_w = [x.weight_ns for x in samples if frames[stacks[x.stack_id][-1]].kind == "gc"]
    assert gc_w == [1_000_000] * 3
    assert sum(x.weight_ns for x in samples) == 6_000_000


def test_real_frames_resolve_to_lines_and_offsets():
    """walk() stores bytecode offsets; export resolves them to this function's file and line."""
    import sys

    clock = FakeClock(start_ns=0)
    frame = sys._getframe()
    s = Sampler(lambda: [(MAIN, frame)], clock, 10, tasks=None)
    s.begin()
    clock.advance(10)
    line = sys._getframe().f_lineno + 1
    s.sample()
    frames, stacks, _, _ = s.export()
    leaf = frames[stacks[0][-1]]
    assert leaf.name == "test_real_frames_resolve_to_lines_and_offsets"
    assert leaf.file == __file__ and leaf.offset is not None
    assert leaf.line == line  # the line of s.sample(), where the frame was when sampled


def test_memory_per_sample_is_stated():
    """The buffer costs BYTES_PER_SAMPLE bytes per stored sample."""
    a = stack(("main@m.py", 1))
    s, clock = make([[(MAIN, a)]] * 10)
    s.begin()
    run(s, clock, 10)
    assert s.nbytes() == 10 * BYTES_PER_SAMPLE


def test_reentrant_sample_is_skipped():
    """A sample() entered while another runs (nested signal) records nothing and does not corrupt."""
    a = stack(("main@m.py", 1))
    s, clock = make([[(MAIN, a)]] * 3)
    s.begin()
    s._busy = True
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s.sample()
    s._busy = False
    assert len(s) == 0 and s.ticks == 1


def test_fast_walk_matches_python_walk():
    """The C in-place walk gives the Python walk's tuple for the callers and the same code objects."""
    import sys

    from omniprof.backends.cpu import stacks

    if not stacks.FAST_WALK:
        pytest.skip("the _fastwalk extension is not in use (not built: no C compiler or not CPython 3.11/3.12; or OMNIPROF_NO_FASTWALK is set)")

    def nested(d):
        if d:
            return nested(d - 1)
        f = sys._getframe(1)  # a suspended caller: its position cannot move between the two walks
        return stacks.walk_python(f), stacks.walk(f), stacks._codes(f)

    slow, fast, codes = nested(30)
    assert fast == slow and len(fast) > 60
    assert [id(c) for c in codes] == list(fast[0::2])
    assert stacks.walk(None) == ()


def _outer():
    pass


def _launcher():
    pass


def _target():
    pass


def test_each_session_exports_with_its_own_stack_cut():
    """A session begun with a StackCut has its stacks cut there (the frame and its callers left
    out); a session begun without one keeps every frame, in the same buffer; an explicit cut
    overrides them all; clear() forgets them."""
    from omniprof.backends.cpu.stacks import NO_CUT, StackCut

    codes = [f.__code__ for f in (_outer, _launcher, _target)]
    raw = tuple(x for c in reversed(codes) for x in (id(c), 0))  # leaf first
    s, clock = make([[(MAIN, raw)]] * 6)
    for c in codes:
        s.code_table.codes[id(c)] = c
    cut = StackCut([_launcher.__code__])
    for session_cut, n in ((cut, 2), (NO_CUT, 1), (cut, 1), (NO_CUT, 2)):
        s.begin(cut=session_cut)
        run(s, clock, n)

    def names(export):
        frames, stacks, samples, _ = export
        return [[frames[i].name for i in stacks[x.stack_id]] for x in samples]

    full, short = ["_outer", "_launcher", "_target"], ["_target"]
    assert names(s.export()) == [short, short, full, short, full, full]
    assert names(s.export(3)) == [short, full, full]
    assert names(s.export(0, 3)) == [short, short, full]
    assert names(s.export(cut=NO_CUT)) == [full] * 6
    assert names(s.export(cut=cut)) == [short] * 6
    s.clear()
    assert s.cuts == []


def test_stack_cut_matches_out_of_process_frames_by_name_and_file():
    """py-spy's frames (Frame keys) match a cut code object by name and file, its relative file
    (below a sys.path entry) by the end of the code's file."""
    import os

    from omniprof.backends.cpu.stacks import StackCut
    from omniprof.core.results import Frame

    code = _launcher.__code__
    cut = StackCut([code])
    assert cut.hit(id(code)) and cut.hit(code) and not cut.hit(id(_target.__code__))
    assert cut.hit(Frame("_launcher", code.co_filename, 1))
    rel = os.path.join(*code.co_filename.split(os.sep)[-3:])
    assert cut.hit(Frame("_launcher", rel, 1))
    assert not cut.hit(Frame("_launcher", "other/" + os.path.basename(code.co_filename), 1))
    assert not cut.hit(Frame("_target", code.co_filename, 1)) and not StackCut().hit(Frame("_launcher", rel, 1))


def test_pyspy_unnamed_c_frames_fold_by_library():
    """py-spy --native prints frames it cannot name as addresses inside a library; each run of them
    is one ``[library]`` frame, named frames are kept as py-spy names them."""
    from omniprof.backends.cpu.pyspy import parse_raw

    raw = ("thread (0x1a2b): MainThread;<module> (app.py:3);digest (app.py:9);"
           "EVP_hash (libcrypto.so.3);0x7f00000010 (libcrypto.so.3);0x7f00000020 (libcrypto.so.3);"
           "0x7f00000030 (libcrypto.so.3);0x7f00000040 (libc.so.6);0x7f00000050 ([vdso]) 7\n")
    [(tid, name, frames, count)] = parse_raw(raw)
    assert (tid, name, count) == (0x1A2B, "MainThread", 7)
    assert [f.name for f in frames] == ["<module>", "digest", "EVP_hash", "[libcrypto.so.3]", "[libc.so.6]", "[vdso]"]
    assert [f.module for f in frames[3:]] == ["libcrypto.so.3", "libc.so.6", "[vdso]"]
