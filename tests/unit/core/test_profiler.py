"""Profiler: lifecycle, schedules, errors, partial results, several backends."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import omniprof
from omniprof import Action, Profiler, ProfilerStateError, schedule
from omniprof.core.profiler import RESULT_FILENAME
from omniprof.errors import BackendError, InvalidArgumentError, OmniprofWarning
from omniprof.testing import FakeClock
from omniprof.testing.fakes import FakeBackend

FAKE = ("backend", "fake", "omniprof.testing.fakes:FakeBackend")


@pytest.fixture
def reg(registry_with):
    return registry_with(FAKE)


def test_context_manager_produces_result(reg):
    """Entering and leaving records one session with the backend's data and run metadata."""
    clock = FakeClock(step_ns=10)
    with Profiler(backend="fake", clock=clock, label="unit") as prof:
        pass
    r = prof.result
    assert [p.backend for p in r.parts] == ["fake"]
    assert r.parts[0].spans[0].name == "work"
    assert r.metadata.label == "unit" and r.metadata.backends == ("fake",)
    assert r.metadata.options["host_tracer_level"] == 2
    assert r.partial is False and r.errors == ()


def test_decorator_profiles_each_call(reg):
    """As a decorator, each call is one session; the function's value is returned."""
    prof = Profiler(backend="fake", clock=FakeClock(step_ns=1))

    @prof
    def f(x):
        return x * 2

    assert f(21) == 42 and f(1) == 2
    assert len(prof.results) == 2
    assert f.profiler is prof


def test_stop_without_start_and_double_start(reg):
    """stop() before start() and a second start() raise ProfilerStateError."""
    prof = Profiler(backend="fake")
    with pytest.raises(ProfilerStateError, match="not running"):
        prof.stop()
    prof.start()
    with pytest.raises(ProfilerStateError, match="already running"):
        prof.start()
    prof.stop()
    with pytest.raises(ProfilerStateError, match="no result yet"):
        Profiler(backend="fake").result


def test_single_session_backend_refuses_second_profiler():
    """A second Profiler on the cpu backend (one session per process) fails clearly."""
    a = Profiler(backend="cpu")
    a.start()
    try:
        with pytest.raises(ProfilerStateError, match="already profiling in this process"):
            Profiler(backend="cpu").start()
    finally:
        a.stop()
    with Profiler(backend="cpu"):  # free again once the first stopped
        pass


def test_workload_exception_propagates_and_partial_result_is_saved(reg, tmp_path):
    """The original exception propagates unchanged; the partial result is kept and written."""
    err = ValueError("boom")
    prof = Profiler(backend="fake", logdir=tmp_path)
    with pytest.raises(ValueError) as e:
        with prof:
            raise err
    assert e.value is err
    r = prof.result
    assert r.partial is True
    assert (r.errors[0].source, r.errors[0].type, r.errors[0].message) == ("workload", "ValueError", "boom")
    saved = omniprof.load(prof.session_dir / RESULT_FILENAME)
    assert saved == r
    assert prof.session_dir.parent == tmp_path / "plugins" / "profile"


def test_runs_never_share_a_directory(reg, tmp_path):
    """Two sessions in the same second get different run directories."""
    dirs = []
    for _ in range(3):
        with Profiler(backend="fake", logdir=tmp_path) as prof:
            pass
        dirs.append(prof.session_dir)
    assert len(set(dirs)) == 3 and all((d / RESULT_FILENAME).is_file() for d in dirs)


@pytest.mark.parametrize("wait,warmup,active,repeat,steps,expected", [
    (1, 1, 2, 0, 8, 2),
    (0, 0, 1, 0, 5, 6),  # as torch: the cycle running at stop() is saved too
    (1, 0, 1, 2, 10, 2),
    (2, 1, 3, 1, 20, 1),
])
def test_schedule_number_of_results(reg, wait, warmup, active, repeat, steps, expected):
    """N step()s under a wait/warmup/active/repeat schedule give the torch-compatible result count."""
    prof = Profiler(backend="fake", schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=repeat),
                    clock=FakeClock(step_ns=1))
    prof.start()
    for _ in range(steps):
        prof.step()
    prof.stop()
    assert len(prof.results) == expected


def test_schedule_records_only_active_steps(reg):
    """Backends see step() only while recording, and each result covers its two active steps."""
    prof = Profiler(backend="fake", schedule=schedule(wait=1, warmup=1, active=2), clock=FakeClock(step_ns=1))
    prof.start()
    for _ in range(8):
        prof.step()
    prof.stop()
    assert [r.parts[0].metadata["steps"] for r in prof.results] == [[2, 3], [6, 7]]


@pytest.mark.parametrize("step,action", [(0, Action.NONE), (1, Action.WARMUP), (2, Action.RECORD),
                                         (3, Action.RECORD_AND_SAVE), (4, Action.NONE), (7, Action.RECORD_AND_SAVE)])
def test_schedule_table(step, action):
    """schedule(wait=1, warmup=1, active=2) maps steps to actions like torch.profiler.schedule."""
    assert schedule(wait=1, warmup=1, active=2)(step) is action


def test_schedule_validates():
    """Schedule arguments are validated with clear messages."""
    with pytest.raises(InvalidArgumentError, match="'active' must be"):
        schedule(active=0)


def test_step_outside_session(reg):
    """step() on a stopped profiler raises ProfilerStateError."""
    with pytest.raises(ProfilerStateError):
        Profiler(backend="fake").step()


def test_on_result_gets_plain_result(reg):
    """on_result receives the ProfileResult, never the profiler."""
    got = []
    with Profiler(backend="fake", on_result=got.append):
        pass
    assert len(got) == 1 and isinstance(got[0], omniprof.ProfileResult)


def test_annotations_reach_recording_backends_only(reg):
    """annotate() marks ranges in recording backends and is a no-op otherwise."""
    with omniprof.annotate("outside"):
        pass
    with Profiler(backend="fake", clock=FakeClock(step_ns=5)) as prof:
        with omniprof.annotate("load_batch"):
            pass

        @omniprof.annotate_function
        def train_step():
            return 1

        assert train_step() == 1
    names = [s.name for s in prof.result.parts[0].spans if s.category == "annotation"]
    assert names == ["load_batch", "test_annotations_reach_recording_backends_only.<locals>.train_step"]


def test_several_backends_one_failing_to_start(registry_with):
    """With two backends, one failing to start is recorded and the other's data kept."""
    reg = registry_with(FAKE, ("backend", "fake2", "tests.unit.core.plugins_for_tests:FailingStartBackend"))
    with pytest.warns(OmniprofWarning, match="failed to start"):
        with Profiler(backend=["fake", "fake2"], registry=reg) as prof:
            pass
    r = prof.result
    assert [p.backend for p in r.parts] == ["fake"]
    assert r.partial and r.errors[0].source == "fake2" and r.errors[0].phase == "start"


def test_single_backend_failing_to_start_raises(reg):
    """A lone backend failing to start raises BackendError naming it, and nothing stays active."""
    with pytest.raises(BackendError, match="backend 'fake' failed to start"):
        Profiler(backend="fake", backend_options={"fake": {"fail_at": "start"}}).start()


def test_backend_failing_at_stop_keeps_other_data(registry_with):
    """A backend failing at stop raises, but the result with the other backend's data is kept."""
    reg = registry_with(FAKE, ("backend", "fake2", "tests.unit.core.plugins_for_tests:FailingStopBackend"))
    prof = Profiler(backend=["fake", "fake2"], registry=reg)
    prof.start()
    with pytest.raises(BackendError, match="'fake2' failed to stop"):
        prof.stop()
    assert [p.backend for p in prof.result.parts] == ["fake"]
    assert prof.result.partial and prof.result.errors[0].phase == "stop"
    assert not prof.is_running


def test_bad_arguments(reg):
    """Bad backend lists and options raise InvalidArgumentError before anything starts."""
    with pytest.raises(InvalidArgumentError):
        Profiler(backend=[])
    with pytest.raises(InvalidArgumentError, match="twice"):
        Profiler(backend=["fake", "fake"])
    with pytest.raises(InvalidArgumentError, match="not among the selected"):
        Profiler(backend="fake", backend_options={"cpu": {}})
    with pytest.raises(InvalidArgumentError, match="did you mean 'span_name'"):
        Profiler(backend="fake", backend_options={"fake": {"span_nam": "x"}})
    with pytest.raises(InvalidArgumentError, match="host_tracer_level"):
        Profiler(backend="fake", options={"host_tracer_level": 9})


def test_unknown_backend_lists_available(reg):
    """Selecting an unknown backend names the nearest and lists the available ones."""
    with pytest.raises(omniprof.PluginLoadError, match=r"Did you mean 'fake'\?.*Available backends: .*cpu"):
        Profiler(backend="fakr")


def test_cpu_backend_records_samples_and_overhead():
    """The cpu backend samples the running code and reports its own overhead and rate."""
    def spin():
        t = 0
        for i in range(1_500_000):
            t += i % 7
        return t

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with Profiler(backend="cpu") as prof:
            spin()
    part = prof.result.part("cpu")
    assert len(part.samples) > 5
    names = {part.frames[f].name for s in part.samples for f in part.stacks[s.stack_id]}
    assert "test_cpu_backend_records_samples_and_overhead.<locals>.spin" in names
    over = part.summaries["overhead"]
    assert over["requested_rate_hz"] == 1000.0 and over["achieved_rate_hz"] > 0 and over["sampler_time_ns"] > 0


# -- the viewer: passed in by the front end, never loaded by the kernel -------------------------
class _Viewing(FakeBackend):
    """The fake, asking to show its trace once the result is saved (as xla's create_perfetto_link)."""

    name = "viewing"

    def stop(self):
        part = super().stop()
        self.view_request = {"viewer": "perfetto_link", "path": "trace.perfetto-trace", "port": 0, "wait": False,
                             "timeout_s": 1.0}
        return part


VIEWING = ("backend", "viewing", "tests.unit.core.test_profiler:_Viewing")


def test_viewer_passed_in_gets_the_request_once_the_result_is_saved(registry_with, tmp_path):
    """The viewer the front end passes (``viewer=``) is called with what the backend asked to show
    and the saved result file, which exists by then."""
    registry_with(VIEWING)
    seen = []

    def viewer(requests, saved):
        seen.append(([dict(r) for r in requests], list(saved), [Path(s).is_file() for s in saved]))

    with Profiler(backend="viewing", logdir=tmp_path, viewer=viewer) as prof:
        pass
    assert seen == [([{"viewer": "perfetto_link", "path": "trace.perfetto-trace", "port": 0, "wait": False,
                       "timeout_s": 1.0}], [str(prof.session_dir / RESULT_FILENAME)], [True])]


def test_without_a_viewer_a_request_is_a_warning_naming_the_trace(registry_with, monkeypatch):
    """A Profiler with no viewer (none passed, no default installed) loses nothing: a warning
    names the trace and how to open it."""
    from omniprof.core import views

    registry_with(VIEWING)
    monkeypatch.setattr(views, "_default_viewer", [])
    with pytest.warns(OmniprofWarning, match="open trace.perfetto-trace with omniprof view --perfetto"):
        with Profiler(backend="viewing") as prof:
            pass
    assert prof.result.parts[0].backend == "viewing"


def test_front_doors_install_the_viewer_layer():
    """``omniprof.Profiler`` (the library's front door) and ``omniprof.cli.main`` hand the kernel
    ``omniprof.viewers.open_views``; importing the kernel alone installs none."""
    import subprocess
    import sys

    code = ("import omniprof.core.views as p, omniprof.viewers as v\n"
            "before = list(p._default_viewer)\n"
            "omniprof_profiler = __import__('omniprof').Profiler\n"
            "after_profiler = list(p._default_viewer)\n"
            "p.set_default_viewer(None)\n"
            "from omniprof.cli import main\n"
            "main(['plugins'])\n"
            "print(before == [], after_profiler == [v.open_views], p._default_viewer == [v.open_views])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "True True True", out.stdout + out.stderr


def test_viewer_that_cannot_be_called_is_refused(reg):
    """``viewer=`` must be callable: anything else is refused when the Profiler is made."""
    with pytest.raises(InvalidArgumentError, match="'viewer' must be callable, such as omniprof.viewers.open_views "
                                                   r"\(got int\)"):
        Profiler(backend="fake", viewer=3)
