"""Shared test setup: --run-gpu, the leak check after every test, fake entry points."""

from __future__ import annotations

import importlib.metadata as md
import signal
import sys
import threading

import pytest

from omniprof.core import annotations
from omniprof.core import profiler as profiler_mod
from omniprof.core.registry import Registry, reset_registry


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-gpu", action="store_true", default=False, help="run tests that need an NVIDIA GPU")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-gpu"):
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU: run with --run-gpu on a machine that has one")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


collect_ignore = ["unit/core/broken_plugin_module.py"]

_SIGNALS = [s for s in (getattr(signal, n, None) for n in ("SIGALRM", "SIGPROF", "SIGUSR1", "SIGUSR2")) if s]


@pytest.fixture(autouse=True)
def leak_check():
    """After every test: no profiler running, no annotation sinks, profile hooks, signal handlers
    and itimers restored, no new non-daemon or sampler threads left behind."""
    before_threads = {t.ident for t in threading.enumerate()}
    before_signals = {s: signal.getsignal(s) for s in _SIGNALS}
    before_profile = sys.getprofile()
    reset_registry(None)
    yield
    reset_registry(None)
    problems = []
    if profiler_mod._active:
        problems.append(f"profilers still active: {sorted(profiler_mod._active)}")
        profiler_mod._active.clear()
    if annotations.active_sinks():
        problems.append(f"annotation sinks left: {annotations.active_sinks()}")
        annotations.set_sinks(())
    for s, h in before_signals.items():
        if signal.getsignal(s) != h:
            problems.append(f"signal handler for {signal.Signals(s).name} not restored")
            signal.signal(s, h)
    if hasattr(signal, "getitimer") and signal.getitimer(signal.ITIMER_REAL)[0]:
        problems.append("ITIMER_REAL still armed")
        signal.setitimer(signal.ITIMER_REAL, 0)
    if sys.getprofile() is not before_profile:
        problems.append("sys.setprofile hook not restored")
        sys.setprofile(before_profile)
    stray = [t for t in threading.enumerate() if t.ident not in before_threads and t.is_alive()
             and (t.name.startswith("omniprof") or not t.daemon)]
    if stray:
        problems.append(f"threads left running: {[t.name for t in stray]}")
    if problems:
        pytest.fail("leak check: " + "; ".join(problems))


def fake_entry_points(*specs: tuple[str, str, str]) -> list[md.EntryPoint]:
    """EntryPoints for (kind, name, target); kind is 'backend' or 'reporter'."""
    groups = {"backend": "omniprof.backends", "reporter": "omniprof.reporters"}
    return [md.EntryPoint(name=n, value=t, group=groups[k]) for k, n, t in specs]


BUILTIN_EPS = [ep for g in ("omniprof.backends", "omniprof.reporters") for ep in md.entry_points(group=g)]


@pytest.fixture
def registry_with():
    """Build a Registry from the built-in entry points plus extra fake ones, and install it."""

    def make(*specs: tuple[str, str, str], **kw) -> Registry:
        reg = Registry(entry_points=[*BUILTIN_EPS, *fake_entry_points(*specs)], **kw)
        reset_registry(reg)
        return reg

    return make
