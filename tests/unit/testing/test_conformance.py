"""The conformance kit itself: the FakeBackend conforms, and the suites catch plugins that break the
contract. (Each built-in plugin runs its suite once, beside its own tests: tests/unit/backends/,
tests/unit/reporters/.)"""

from __future__ import annotations

import threading
import time

import pytest

from omniprof.plugin import Backend
from omniprof.core.results import BackendResult, CounterSeries
from omniprof.reporters.table import TableReporter
from omniprof.testing import FakeBackend
from omniprof.testing.conformance import BackendConformance, ReporterConformance


class TestFakeConformance(BackendConformance):
    """The FakeBackend used in tests is itself a conforming backend."""

    backend_cls = FakeBackend


# -- the suite catches broken plugins ------------------------------------------------------------------
RELEASE = threading.Event()


class LeakyBackend(Backend):
    """Starts a thread that close() joins, and puts a counter on a track it never declares."""

    name = "leaky"
    single_session = False

    def start(self):
        self._t = threading.Thread(target=RELEASE.wait, args=(5,), daemon=True)
        self._t.start()

    def stop(self):
        return BackendResult(backend=self.name, counters=[CounterSeries("c", "n", "undeclared", (1, 2), (0.0, 1.0))])

    def close(self):
        if getattr(self, "_t", None) is not None:
            RELEASE.set()
            self._t.join()
            self._t = None
            RELEASE.clear()


class NoCloseBackend(LeakyBackend):
    """Never stops its thread."""

    name = "noclose"

    def close(self):
        pass


class FailingStopBackend(FakeBackend):
    name = "failingstop"

    def stop(self):
        raise RuntimeError("boom at stop")


class NotAttrsOptionsBackend(FakeBackend):
    name = "notattrs"

    class Options:
        def __init__(self, **kw):
            self.kw = kw


def suite_for(cls):
    return type(f"Suite_{cls.name}", (BackendConformance,), {"backend_cls": cls})()


def test_suite_catches_a_thread_left_running(tmp_path):
    """The thread check passes when close() joins the thread and fails when close() leaves it running."""
    suite_for(LeakyBackend).test_leaves_no_threads_running(tmp_path)
    try:
        with pytest.raises(AssertionError, match="threads still running after close"):
            suite_for(NoCloseBackend).test_leaves_no_threads_running(tmp_path)
    finally:
        RELEASE.set()
        time.sleep(0.01)
        RELEASE.clear()


def test_suite_catches_counters_on_undeclared_tracks(tmp_path):
    """A counter on a track the part does not declare fails the track check."""
    with pytest.raises(AssertionError, match="undeclared track"):
        suite_for(LeakyBackend).test_counters_and_spans_reference_declared_tracks(tmp_path)


def test_suite_catches_options_that_are_not_attrs():
    """An Options class that is not an attrs class fails the plugin-API check."""
    with pytest.raises(AssertionError):
        suite_for(NotAttrsOptionsBackend).test_declares_plugin_api()


class ClockyReporter(TableReporter):
    name = "clocky"
    calls = 0

    def report(self, result, dest):
        type(self).calls += 1
        dest.write(f"run {self.calls}\n")


def test_suite_catches_a_nondeterministic_reporter(tmp_path):
    """A reporter whose output changes between calls fails test_output_is_deterministic."""
    suite = type("Suite", (ReporterConformance,), {"reporter_cls": ClockyReporter})()
    with pytest.raises(AssertionError):
        suite.test_output_is_deterministic(tmp_path)


def test_suite_runs_the_backend_under_the_profiler(tmp_path):
    """The Profiler check passes for FakeBackend and fails for a backend whose stop() raises."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    TestFakeConformance().test_runs_under_the_profiler_through_an_entry_point(tmp_path / "a")
    with pytest.raises(Exception, match="boom at stop"):
        suite_for(FailingStopBackend).test_runs_under_the_profiler_through_an_entry_point(tmp_path / "b")


class WrongOffsetBackend(FakeBackend):
    """Records on a clock 1 s behind but forgets to say so in its ClockInfo."""

    name = "wrongoffset"

    def stop(self):
        import attrs

        part = super().stop()
        return attrs.evolve(part, clock=attrs.evolve(part.clock, offset_ns=0))


def test_suite_catches_a_wrong_clock_offset(tmp_path):
    """A backend whose times are 1 s off the reference clock fails the alignment check; the shifted fake passes."""
    suite = suite_for(FakeBackend)
    suite.backend_options = lambda: FakeBackend.Options(clock_shift_ns=1_000_000_000)
    suite.test_times_line_up_with_the_reference_clock(tmp_path)
    bad = suite_for(WrongOffsetBackend)
    bad.backend_options = lambda: FakeBackend.Options(clock_shift_ns=1_000_000_000)
    with pytest.raises(AssertionError, match="is clock.offset_ns right"):
        bad.test_times_line_up_with_the_reference_clock(tmp_path)
