"""The example `rusage` backend: omniprof's conformance suite plus its own behaviour."""

from __future__ import annotations

import pytest

pytest.importorskip("omniprof_example_plugins", reason="not installed: pip install -e examples/plugins")

import time

from omniprof import InvalidArgumentError, Profiler, ProfileOptions
from omniprof.plugin import BackendContext
from omniprof.core.options import build_options
from omniprof.testing.conformance import BackendConformance
from omniprof_example_plugins.rusage import RusageBackend


class TestRusageConformance(BackendConformance):
    """Every check omniprof asks of a backend, run against RusageBackend."""

    backend_cls = RusageBackend

    def backend_options(self):
        return RusageBackend.Options(interval_s=0.002)


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(i * i for i in range(1000))


def test_counters_record_cpu_time_of_busy_work():
    """Busy work shows as CPU time in the summary and as a cpu_utilization series with several samples."""
    b = RusageBackend(RusageBackend.Options(interval_s=0.005))
    b.start()
    _busy(0.15)
    part = b.stop()
    b.close()
    names = {c.name for c in part.counters}
    assert {"cpu_utilization", "max_rss", "voluntary_context_switches", "page_faults"} <= names
    cpu = next(c for c in part.counters if c.name == "cpu_utilization")
    assert len(cpu.values) >= 5 and len(cpu.t_ns) == len(part.counters[1].t_ns) - 1
    assert part.summaries["rusage"]["cpu_time_s"] > 0.02
    assert part.summaries["rusage"]["max_rss_bytes"] > 1 << 20


def test_full_buffer_is_counted_not_silent():
    """With max_samples=2 every later sample is counted in a buffer_full loss."""
    b = RusageBackend(RusageBackend.Options(interval_s=0.001, max_samples=2))
    b.start()
    time.sleep(0.05)
    part = b.stop()
    b.close()
    assert len(next(c for c in part.counters if c.name == "max_rss").values) == 2
    (loss,) = part.losses
    assert loss.kind == "buffer_full" and loss.count >= 1


def test_level_zero_records_nothing():
    """host_tracer_level=0 records no counters."""
    ctx = BackendContext(profile_options=ProfileOptions(host_tracer_level=0))
    b = RusageBackend(context=ctx)
    b.start()
    part = b.stop()
    assert part.counters == () and part.tracks == ()


def test_clock_offset_maps_monotonic_onto_reference():
    """The part's ClockInfo offset maps its monotonic times onto perf_counter_ns within a few ms."""
    b = RusageBackend(RusageBackend.Options(interval_s=0.002))
    before = time.perf_counter_ns()
    b.start()
    time.sleep(0.01)
    part = b.stop()
    after = time.perf_counter_ns()
    assert part.clock.name == "monotonic_ns"
    assert before - 5_000_000 <= part.start_ns + part.clock.offset_ns <= part.end_ns + part.clock.offset_ns <= after + 5_000_000


def test_bad_options_are_rejected_with_the_key():
    """A too-small interval is refused naming the option and the range."""
    with pytest.raises(InvalidArgumentError, match="interval_s"):
        build_options(RusageBackend.Options, {"interval_s": 0}, owner="backend 'rusage'")


def test_runs_under_the_profiler_by_name():
    """Profiler(backend='rusage') finds the plugin through its entry point."""
    with Profiler(backend="rusage", backend_options={"rusage": {"interval_s": 0.002}}) as prof:
        _busy(0.03)
    assert prof.result.part("rusage").counters
