"""Several backends in one run: one timeline with aligned clocks; one backend failing keeps the others' data."""

from __future__ import annotations

import importlib.metadata as md
import time

import pytest

import omniprof
from omniprof import BackendError, OmniprofWarning, Profiler
from omniprof.core.registry import get_registry
from omniprof.analysis.timeline import measure_offset, merge
from omniprof.testing import FakeClock

FAKE = ("backend", "fake", "omniprof.testing.fakes:FakeBackend")
SHIFT_NS = 5_000_000_000


def busy(seconds: float) -> int:
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += sum(i * i for i in range(500))
    return n


@pytest.mark.timing
def test_parts_on_their_own_clocks_line_up_on_one_timeline(registry_with):
    """cpu and a backend whose clock runs 5 s behind: raw times differ by 5 s, merged ones coincide."""
    reg = registry_with(FAKE)
    with Profiler(backend=["cpu", "fake"], registry=reg,
                  backend_options={"fake": {"clock_shift_ns": SHIFT_NS, "span_name": "fake-session"}}) as prof:
        with omniprof.annotate("phase"):
            busy(0.03)
    r = prof.result
    assert r.metadata.backends == ("cpu", "fake")
    cpu, fake = r.part("cpu"), r.part("fake")
    assert fake.clock.offset_ns == SHIFT_NS and cpu.clock.offset_ns == 0
    raw_cpu = next(s for s in cpu.spans if s.name == "phase")
    raw_fake = next(s for s in fake.spans if s.name == "phase")
    assert raw_cpu.start_ns - raw_fake.start_ns == pytest.approx(SHIFT_NS, abs=50_000_000)
    tl = merge(r)
    phases = [s for s in tl.spans if s.name == "phase"]
    assert {s.track for s in phases} == {f"cpu/{raw_cpu.track}", "fake/main"}
    assert abs(phases[0].start_ns - phases[1].start_ns) < 50_000_000
    assert abs(phases[0].dur_ns - phases[1].dur_ns) < 50_000_000
    # both sessions inside the run window on the reference clock
    for backend, (start, end) in tl.parts.items():
        assert r.metadata.start_ns - 50_000_000 <= start <= end <= r.metadata.end_ns + 50_000_000, backend
    assert [t.id for t in tl.tracks if t.id.startswith("fake/")] == ["fake/main"]


def test_timeline_is_sorted_and_counters_shifted():
    """merge() sorts spans by aligned start and shifts counter timestamps by the part's offset."""
    from omniprof.core.results import BackendResult, ClockInfo, CounterSeries, ProfileResult, Span, Track

    a = BackendResult(backend="a", tracks=[Track("t", "t")], spans=[Span("late", "t", 500, 1)], start_ns=0, end_ns=600)
    b = BackendResult(backend="b", clock=ClockInfo("dev", 100), tracks=[Track("c", "c", "counter")],
                      spans=[Span("early", "c", 0, 1)], counters=[CounterSeries("x", "n", "c", (10, 20), (1.0, 2.0))],
                      start_ns=0, end_ns=600)
    tl = merge(ProfileResult(parts=(a, b)))
    assert [(s.name, s.start_ns) for s in tl.spans] == [("early", 100), ("late", 500)]
    assert tl.counters[0].t_ns == (110, 120) and tl.counters[0].track == "b/c"
    assert (tl.start_ns, tl.end_ns) == (0, 700)


class ScriptedClock:
    name = "scripted"

    def __init__(self, values):
        self.values = list(values)

    def now_ns(self):
        return self.values.pop(0)


def test_measure_offset_keeps_the_tightest_bracket():
    """Of three (ref, own, ref) readings, the narrowest bracket gives the offset (true offset 42 here)."""
    ref = ScriptedClock([0, 100, 1000, 1002, 2000, 2050])
    own = ScriptedClock([48, 959, 1998])  # read at reference times 90, 1001, 2040
    assert measure_offset(own.now_ns, ref, rounds=3) == 42


def test_measure_offset_of_a_constant_shift():
    """A clock 42 ns behind a still reference gives offset 42."""
    assert measure_offset(FakeClock(-42, 0).now_ns, FakeClock(0, 0)) == 42


def test_one_backend_failing_to_start_keeps_the_others(registry_with):
    """A backend that fails at start is warned about and recorded; cpu's samples are still in the result."""
    reg = registry_with(FAKE)
    with pytest.warns(OmniprofWarning, match="backend 'fake' failed to start"):
        with Profiler(backend=["cpu", "fake"], registry=reg, backend_options={"fake": {"fail_at": "start"}}) as prof:
            busy(0.05)
    r = prof.result
    assert [p.backend for p in r.parts] == ["cpu"] and r.part("cpu").samples
    assert r.partial and [(e.source, e.phase, e.type) for e in r.errors] == [("fake", "start", "RuntimeError")]


def test_one_backend_failing_to_prepare_keeps_the_others(registry_with):
    """A backend that fails during prepare is recorded with phase 'prepare'; the run goes on with cpu."""
    reg = registry_with(FAKE)
    with pytest.warns(OmniprofWarning, match="backend 'fake' failed to prepare"):
        with Profiler(backend=["fake", "cpu"], registry=reg, backend_options={"fake": {"fail_at": "prepare"}}) as prof:
            busy(0.05)
    r = prof.result
    assert [p.backend for p in r.parts] == ["cpu"] and r.part("cpu").samples
    assert [(e.source, e.phase) for e in r.errors] == [("fake", "prepare")]


def test_one_backend_failing_to_stop_keeps_the_others(registry_with):
    """A backend that fails at stop raises BackendError after the result with cpu's data is saved."""
    reg = registry_with(FAKE)
    prof = Profiler(backend=["cpu", "fake"], registry=reg, backend_options={"fake": {"fail_at": "stop"}})
    with pytest.raises(BackendError, match="backend 'fake' failed to stop"):
        with prof:
            busy(0.05)
    r = prof.result
    assert r.part("cpu").samples and r.partial
    assert [(e.source, e.phase) for e in r.errors] == [("fake", "stop")]


def test_all_backends_failing_raises(registry_with):
    """When the only backend fails to start, the run fails with BackendError naming it."""
    reg = registry_with(FAKE)
    with pytest.raises(BackendError, match="backend 'fake' failed to start"):
        with Profiler(backend=["fake"], registry=reg, backend_options={"fake": {"fail_at": "start"}}):
            pass


def test_backend_list_from_config_runs_together(registry_with, tmp_path, monkeypatch):
    """backend = ["cpu", "fake"] in a config file runs both backends in one result."""
    from omniprof.config import load_config
    from omniprof.runner import execute

    monkeypatch.chdir(tmp_path)
    reg = registry_with(FAKE)
    cfg = load_config(text='function = "time:sleep"\nargs = [0.02]\nbackend = ["cpu", "fake"]\n'
                           '[backends.fake]\nclock_shift_ns = 1000\n', environ={}, registry=reg)
    out = execute(cfg, registry=reg)
    assert [p.backend for p in out.results[0].parts] == ["cpu", "fake"]
    assert out.results[0].part("fake").clock.offset_ns == 1000


# -- real second backends ----------------------------------------------------------------------------
def _registered(name: str) -> bool:
    return name in get_registry().names("backend")


@pytest.mark.timing
def test_cpu_and_example_rusage_plugin_align():
    """cpu + the example 'rusage' plugin (its own monotonic clock): its counter samples fall inside cpu's session."""
    try:
        md.distribution("omniprof-example-plugins")
    except md.PackageNotFoundError:
        pytest.skip("omniprof-example-plugins is not installed (pip install -e examples/plugins)")
    with Profiler(backend=["cpu", "rusage"], backend_options={"rusage": {"interval_s": 0.002}}) as prof:
        busy(0.1)
    r = prof.result
    tl = merge(r)
    cpu_start, cpu_end = tl.parts["cpu"]
    cpu_series = next(c for c in tl.counters if c.name == "cpu_utilization")
    assert len(cpu_series.t_ns) >= 3  # the sampler thread competes for the GIL with the busy loop
    # rusage starts right after cpu and takes its last sample in stop(), right after cpu stops. The
    # band allows a loaded machine's scheduling delays; a clock misalignment would be far larger.
    assert cpu_start - 5_000_000 <= cpu_series.t_ns[0] <= cpu_start + 250_000_000
    assert cpu_end - 250_000_000 <= cpu_series.t_ns[-1] <= cpu_end + 250_000_000
    assert r.part("rusage").clock.name == "monotonic_ns"


@pytest.mark.parametrize("other", ["xla", "torch"])
def test_cpu_with_a_framework_backend(other):
    """cpu + xla / cpu + torch on one timeline: both parts present, the framework's spans inside the run window."""
    if not _registered(other):
        pytest.skip(f"backend {other!r} is not registered in this installation (it comes with the {other} backend "
                    f"branch); run again after it is merged")
    if other == "xla":
        jax = pytest.importorskip("jax")
        import jax.numpy as jnp

        f = jax.jit(lambda x: (x @ x).sum())
        x = jnp.ones((128, 128))
        f(x).block_until_ready()

        def work():
            for _ in range(5):
                f(x).block_until_ready()
    else:
        torch = pytest.importorskip("torch")
        x = torch.ones((128, 128))

        def work():
            for _ in range(5):
                (x @ x).sum()
    with Profiler(backend=["cpu", other]) as prof:
        work()
        busy(0.02)
    r = prof.result
    assert {p.backend for p in r.parts} == {"cpu", other}, r.errors
    tl = merge(r)
    theirs = [s for s in tl.spans if s.track.startswith(f"{other}/")]
    assert theirs, f"{other} recorded no spans"
    slack = 50_000_000
    assert all(r.metadata.start_ns - slack <= s.start_ns <= r.metadata.end_ns + slack for s in theirs)


def test_unavailable_backend_among_several_is_recorded_and_skipped(tmp_path, monkeypatch, registry_with):
    """cpu + a backend whose probe says 'no GPU here': the run goes on with cpu, the probe failure is recorded."""
    (tmp_path / "nogpu_plugin.py").write_text(
        "from omniprof.plugin import Backend\n"
        "from omniprof.errors import BackendUnavailableError\n"
        "class NoGpuBackend(Backend):\n"
        "    name = 'nogpu'\n"
        "    @classmethod\n"
        "    def probe(cls):\n"
        "        raise BackendUnavailableError('no NVIDIA driver found', 'install the driver', plugin=cls.name)\n"
        "    def start(self): pass\n"
        "    def stop(self): pass\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = registry_with(("backend", "nogpu", "nogpu_plugin:NoGpuBackend"))
    with pytest.warns(OmniprofWarning, match="backend 'nogpu' is unavailable .*no NVIDIA driver found"):
        with Profiler(backend=["cpu", "nogpu"], registry=reg) as prof:
            busy(0.2)  # long enough for a sample when the engine waits for a CPU
    r = prof.result
    assert [p.backend for p in r.parts] == ["cpu"] and r.part("cpu").samples
    assert [(e.source, e.phase, e.type) for e in r.errors] == [("nogpu", "probe", "BackendUnavailableError")]
    with pytest.raises(omniprof.BackendUnavailableError, match="no NVIDIA driver found"):
        with Profiler(backend="nogpu", registry=reg):  # alone, it is an error
            pass
