"""Limits: every cap that stops recording is detected, counted in the result (``Loss``), warned
about and shown by the reporters; nothing truncated or empty is presented as a success."""

from __future__ import annotations

import io
import time
import warnings

import pytest

import omniprof
import omniprof.core.readers
import omniprof.core.reporting
from omniprof.backends.cpu.sampler import Sampler
from omniprof.errors import DataLossWarning
from omniprof.testing.fakes import FakeClock


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(range(500))


@pytest.mark.parametrize("engine", ["signal", "thread"])
def test_sampler_buffer_full_counted_warned_reported(engine, tally):
    """A full sample buffer stops recording; the samples not taken are counted in the result's
    losses, warned about once, and shown by the table report."""
    with pytest.warns(DataLossWarning, match="sample buffer is full") as rec:
        with omniprof.Profiler(backend="cpu", backend_options={"cpu": {"max_samples": 20, "engine": engine,
                                                                       "interval_s": 0.001, "accumulate": False}}) as prof:
            _busy(0.4)
    assert len([w for w in rec if issubclass(w.category, DataLossWarning)]) == 1
    part = prof.result.part("cpu")
    assert len(part.samples) == 20
    (loss,) = [x for x in prof.result.losses if x.kind == "samples_dropped"]
    assert loss.count > 0 and loss.source == "cpu"
    text = omniprof.core.reporting.make_reporter("table").render(prof.result)
    assert "samples_dropped" in text or "not recorded" in text.lower() or str(loss.count) in text
    tally.check("limits: sampler buffer full", engine)


def test_sampler_nested_sample_never_negative_weight(tally):
    """A sample taken while another is in progress (a nested SIGALRM during the stack walk, seen
    under load) never gives a sample of negative weight, and the weights add up to the time
    covered (no time counted twice)."""
    clock = FakeClock(step_ns=1000)
    state = {"nested": 0}
    box: list[Sampler] = []

    def source():
        if state["nested"] < 50:  # every outer sample is interrupted by another one
            state["nested"] += 1
            box[0].sample()
        return [(1, (("f", 1),))]

    s = Sampler(source, clock, max_samples=10_000)
    box.append(s)
    s.begin()
    t_begin = s._t_begin
    for _ in range(50):
        s.sample()
    tally.check("limits: nested sampler re-entry", "checked")
    assert min(s.weights_ns) >= 0, f"negative weights: {[w for w in s.weights_ns if w < 0][:5]}"
    assert sum(s.weights_ns) <= max(s.t_ns) - t_begin


def test_table_marks_partial_and_losses_in_empty_result(tally):
    """A result with no samples but a loss is reported as such, never as an empty success."""
    from omniprof.core.results import BackendResult, Loss

    loss = Loss("cpu", "samples_dropped", 1234, "samples", "buffer full")
    r = omniprof.ProfileResult(partial=True, parts=(BackendResult(backend="cpu", losses=(loss,)),))
    buf = io.StringIO()
    omniprof.report(r, "table", buf)
    text = buf.getvalue()
    assert "PARTIAL" in text and "1234" in text
    tally.check("limits: loss shown", "table")


def test_xla_empty_xspace_is_a_counted_loss(monkeypatch, tmp_path, tally):
    """When XLA hands back an empty XSpace (what jax does when a trace exceeds protobuf's 2 GB
    limit), the run is not a silent empty success: a size_limit loss is counted, warned about and
    reported, and no 0-byte xplane is written."""
    pytest.importorskip("jax")
    from omniprof.formats import xprof_runtime as _runtime

    real = _runtime.import_profiler_bindings

    def bindings():
        profiler, profile_data = real()

        class OversizedSession:
            """XLA's real session; only its serialised output is what jax returns past 2 GB (a trace
            that size cannot be produced on this machine)."""

            def __init__(self, options):
                self._session = profiler.ProfilerSession(options)

            def stop(self):
                self._session.stop()
                return b""

        class Profiler:
            ProfilerSession = OversizedSession

            def __getattr__(self, name):
                return getattr(profiler, name)

        return Profiler(), profile_data

    monkeypatch.setattr(_runtime, "import_profiler_bindings", bindings)
    import jax.numpy as jnp

    with pytest.warns(omniprof.errors.DataLossWarning, match="2 GB"):
        with omniprof.Profiler(backend="xla", logdir=tmp_path) as prof:
            (jnp.arange(100.0) * 2).block_until_ready()
    (loss,) = prof.result.losses
    assert (loss.source, loss.kind, loss.count) == ("xla", "size_limit", 1)
    assert not list(tmp_path.rglob("*.xplane.pb"))
    text = omniprof.core.reporting.make_reporter("table").render(prof.result)
    assert "size_limit" in text or "2 GB" in text
    tally.check("limits: XSpace 2 GB (empty xplane)", "counted")


def test_empty_xplane_file_is_an_error_not_an_empty_trace(tmp_path, tally):
    """A 0-byte .xplane.pb (left by jax after an oversized trace) is a TraceReadError naming the
    cause, not an empty profile."""
    pytest.importorskip("jax")
    f = tmp_path / "host.xplane.pb"
    f.write_bytes(b"")
    with pytest.raises(omniprof.errors.TraceReadError, match="empty file.*2 GB"):
        omniprof.core.readers.read_any(f)
    with pytest.raises(omniprof.errors.TraceReadError, match="empty file"):
        omniprof.core.readers.read_any(tmp_path)
    tally.check("limits: empty xplane file", "TraceReadError")


@pytest.mark.parametrize("reporter, fmt", [("perfetto", "proto"), ("chrome", "json")])
def test_perfetto_trace_past_browser_limit_is_reported(tmp_path, monkeypatch, reporter, fmt, tally):
    """A Perfetto or Chrome trace larger than ui.perfetto.dev can open in a browser is still
    written whole, and the user is told its size and how to open it instead. (The limit, about
    1 GiB / 512 MiB, is lowered here so that a small trace crosses it.)"""
    from omniprof.reporters import perfetto
    from omniprof.testing.fakes import make_result

    result = make_result()
    monkeypatch.setitem(perfetto.UI_LIMIT_BYTES, fmt, 100)
    with pytest.warns(omniprof.errors.OmniprofWarning, match="more than ui.perfetto.dev can usually open"):
        path = omniprof.report(result, reporter, tmp_path)
    monkeypatch.setitem(perfetto.UI_LIMIT_BYTES, fmt, 1 << 30)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = omniprof.report(result, reporter, tmp_path / "below")
    assert path.read_bytes() == again.read_bytes()  # nothing cut: the same bytes as below the limit
    tally.check("limits: Perfetto browser size", reporter)


def test_cpu_annotations_bounded_counted(tally):
    """A tight loop under omniprof.annotate cannot grow memory without end: the cpu backend keeps
    at most max_samples annotation spans per session and counts the rest (found by the soak run)."""
    with pytest.warns(DataLossWarning, match="annotation span"):
        with omniprof.Profiler(backend="cpu", backend_options={"cpu": {"max_samples": 50, "accumulate": False,
                                                                       "interval_s": 1.0}}) as prof:
            for _ in range(120):
                with omniprof.annotate("step"):
                    pass
    part = prof.result.part("cpu")
    assert sum(1 for s in part.spans if s.name == "step") == 50
    (loss,) = [x for x in part.losses if x.kind == "annotations_dropped"]
    assert loss.count == 70
    tally.check("limits: cpu annotation spans", "bounded")


def test_cpu_checkpoint_keeps_latest_window_counted(tmp_path, monkeypatch, tally):
    """A checkpoint of a long cpu session writes only the latest CHECKPOINT_MAX_SAMPLES samples
    (bounded cost) and counts the rest; the final result still has every sample. (The window is
    lowered here so a short run crosses it.)"""
    from omniprof.backends.cpu import backend as cpu_backend

    monkeypatch.setattr(cpu_backend, "CHECKPOINT_MAX_SAMPLES", 10)
    monkeypatch.setenv("OMNIPROF_CHECKPOINT_S", "0")  # only the checkpoint taken by hand below
    with omniprof.Profiler(backend="cpu", logdir=tmp_path,
                           backend_options={"cpu": {"accumulate": False, "interval_s": 0.001}}) as prof:
        _busy(0.3)
        path = prof.checkpoint()
        snap = omniprof.load(path)
    part = snap.part("cpu")
    assert len(part.samples) == 10
    (loss,) = [x for x in part.losses if x.kind == "checkpoint_window"]
    assert loss.count > 0
    assert len(prof.result.part("cpu").samples) >= 10 + loss.count
    tally.check("limits: checkpoint window", "counted")
