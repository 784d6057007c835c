"""Stacks of ``omniprof run`` start at the target: the runner gives its own Profiler the launcher's
frames (``Profiler(launcher_codes=...)``), and each backend that records stacks cuts there. The cut
belongs to that Profiler: a plain Profiler in the same process, before, after or inside a run,
keeps every frame. (It was a process-wide setting once, which made that impossible.)"""

from __future__ import annotations

import runpy
import sys
import textwrap
import threading

import pytest

import omniprof
from omniprof import runner
from omniprof.config import load_config

WORK = '''
import time

RESULTS = []


def hot(seconds=0.15):
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < seconds:
        n += sum(len(str(i)) for i in range(2_000))
    return n


def main():
    return hot()


def nested():
    import omniprof
    with omniprof.Profiler(backend="cpu") as prof:   # a plain Profiler inside the runner's
        hot()
    RESULTS.append(prof.result)
    hot(0.05)


if __name__ == "__main__":
    main()
'''


@pytest.fixture
def workmod(tmp_path, monkeypatch):
    """A module in tmp_path with a name of its own (sys.modules keeps a module once imported)."""
    name = "work_" + tmp_path.name.replace("-", "_")
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(WORK), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    yield name, path
    sys.modules.pop(name, None)


def _stacks(part):
    """(frames, weight) of the main thread's samples or allocations (the target runs there; pytest's
    timeout thread waits beside it)."""
    main = threading.main_thread().ident
    if part.samples:
        return [(tuple(part.frames[i] for i in part.stacks[s.stack_id]), s.weight_ns) for s in part.samples
                if s.thread_id == main]
    return [(tuple(part.frames[i] for i in part.stacks[a.stack_id]), a.size_bytes) for a in part.allocations
            if a.thread_id == main]


def _run(text):
    out = runner.run(load_config(text=text, environ={}))
    assert out.error is None and out.problem is None, (out.error, out.problem)
    return out.results[0]


def _in(frame, path):
    """The frame is in ``path`` (py-spy names files relative to their sys.path entry)."""
    return frame.file == str(path) or (bool(frame.file) and str(path).endswith("/" + frame.file))


def _starts_at_target(part, path, root):
    """Every stack that reached the target starts at ``root`` in ``path``: nothing of the
    launcher, runpy or pytest above it; and the target's stacks hold most of the weight."""
    stacks = _stacks(part)
    assert stacks, part.backend
    target = [(fr, w) for fr, w in stacks if any(_in(f, path) for f in fr)]
    assert target, part.backend
    for fr, _ in target:
        assert _in(fr[0], path) and fr[0].name == root, [(f.name, f.file) for f in fr]
    assert not any(f.name in ("_run_code", "call_function") for fr, _ in stacks for f in fr)
    assert sum(w for _, w in target) >= 0.9 * sum(w for _, w in stacks)


def _reaches(part, name):
    return any(any(f.name == name for f in fr) for fr, _ in _stacks(part))


def test_a_run_and_plain_profilers_in_one_process_do_not_affect_each_other(workmod, request):
    """A plain Profiler before the run, the run (function target: cut at call_function), a plain
    Profiler after it running the same code through runpy: only the run's stacks are cut, for the
    cpu and the memory backend; the process-wide sample buffer keeps each session's own cut."""
    name, path = workmod
    me = request.node.originalname

    def plain():
        with omniprof.Profiler(backend=["cpu", "memory"]) as prof:
            runpy.run_path(str(path), run_name="__main__")   # runpy's _run_code, then the module's main()
        return prof.result

    before = plain()
    ran = _run(f'function = "{name}:main"\nbackend = ["cpu", "memory"]\n')
    after = plain()
    for part in ran.parts:
        _starts_at_target(part, path, "main")
    for res in (before, after):
        for part in res.parts:  # this test's frame and runpy's are there: nothing was cut
            assert _reaches(part, me) and _reaches(part, "hot"), part.backend
        assert _reaches(res.part("cpu"), "_run_code")
    # the Julia-style buffer holds all three sessions; each keeps its own cut
    buf = omniprof.cpu.retrieve().parts[0]
    frames = {s.t_ns: tuple(buf.frames[i] for i in buf.stacks[s.stack_id]) for s in buf.samples}
    run_cpu = ran.part("cpu")
    in_run = [fr for t, fr in frames.items() if run_cpu.start_ns <= t <= run_cpu.end_ns]
    assert in_run and not any(f.name == me for fr in in_run for f in fr)
    assert any(f.name == me for t, fr in frames.items() if t > run_cpu.end_ns for f in fr)


def test_a_plain_profiler_inside_a_run_keeps_its_frames(workmod, request):
    """The run records memory while the target runs a plain cpu Profiler: the run's allocation
    stacks start at the target; the plain Profiler's samples keep the runner's frames and this
    test's above the target."""
    name, path = workmod
    ran = _run(f'function = "{name}:nested"\nbackend = ["memory"]\n')
    _starts_at_target(ran.part("memory"), path, "nested")
    inner = sys.modules[name].RESULTS[0].part("cpu")
    assert _reaches(inner, "call_function") and _reaches(inner, request.node.originalname)


@pytest.mark.parametrize("engine", ["native", "signal", "thread", "py-spy"])
def test_every_engine_cuts_at_the_launcher(workmod, engine):
    """Each cpu engine's stacks of a run start at the target (py-spy's frames, recorded out of
    process, are matched by name and file)."""
    name, path = workmod
    ran = _run(f'function = "{name}:main"\nbackend = ["cpu"]\n[backends.cpu]\nengine = "{engine}"\n')
    assert ran.part("cpu").metadata["engine"] == engine
    _starts_at_target(ran.part("cpu"), path, "main")


def test_script_and_module_runs_start_at_the_module(workmod):
    """A script and a -m module start at their ``<module>`` (cut at runpy's _run_code)."""
    name, path = workmod
    for target in (f'script = "{path}"', f'module = "{name}"'):
        ran = _run(f'{target}\nbackend = ["cpu", "memory"]\n[backends.cpu]\nengine = "signal"\n')
        for part in ran.parts:
            _starts_at_target(part, path, "<module>")


def test_launcher_codes_must_be_code_objects():
    """Profiler(launcher_codes=...) takes code objects, and says so otherwise."""
    with pytest.raises(omniprof.InvalidArgumentError, match="'launcher_codes' must be code objects"):
        omniprof.Profiler(backend="cpu", launcher_codes=[runner.call_function])
    prof = omniprof.Profiler(backend="cpu", launcher_codes=runner.launcher_codes())
    assert prof.launcher_codes == (runpy._run_code.__code__, runner.call_function.__code__)
