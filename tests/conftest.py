"""Shared test setup: --run-gpu, the leak check after every test, fake entry points."""

from __future__ import annotations

import getpass
import importlib.metadata as md
import os
import signal
import sys
import tempfile
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


def _open_fds() -> dict[int, str]:
    """fd -> what it points at, from /proc (empty where there is no /proc)."""
    out = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return out
    for fd in names:
        try:
            out[int(fd)] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
    return out


def _listening_inodes() -> set[str]:
    """Socket inodes of this machine's listening TCP sockets (state 0A in /proc/net/tcp*)."""
    inodes = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as fh:
                next(fh, None)
                for line in fh:
                    f = line.split()
                    if len(f) > 9 and f[3] == "0A":
                        inodes.add(f[9])
        except OSError:
            continue
    return inodes


def _fd_leaks(before: dict[int, str], tmp_root: str) -> list[str]:
    """Descriptors a test opened and left open that are certainly its own: files under pytest's
    temporary directory, and listening sockets (a server not stopped). Libraries imported for the
    first time keep other descriptors (eventfds, pipes, caches) on purpose; those are not counted."""
    new = {fd: t for fd, t in _open_fds().items() if before.get(fd) != t}
    if not new:
        return []
    listening = _listening_inodes() if any(t.startswith("socket:[") for t in new.values()) else set()
    leaks = []
    for fd, target in sorted(new.items()):
        if tmp_root and target.startswith(tmp_root):
            leaks.append(f"fd {fd} -> {target}")
        elif target.startswith("socket:[") and target[8:-1] in listening:
            leaks.append(f"fd {fd} -> listening {target}")
    return leaks


_TMP_ROOT = os.path.realpath(os.path.join(tempfile.gettempdir(), f"pytest-of-{getpass.getuser()}"))


@pytest.fixture(autouse=True)
def leak_check():
    """After every test: no profiler running, no annotation sinks, profile hooks, signal handlers
    and itimers restored, no new non-daemon or sampler threads left behind, no file of the test's
    temporary directory or listening socket left open."""
    before_fds = _open_fds()
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
    fd_leaks = _fd_leaks(before_fds, _TMP_ROOT)
    if fd_leaks:
        problems.append(f"file descriptors left open: {fd_leaks}")
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


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # type: ignore[no-untyped-def]
    """Name each real reader (viewer, validator) that was missing, once, at the end of the run."""
    reasons = set()
    for rep in terminalreporter.stats.get("skipped", []):
        longrepr = getattr(rep, "longrepr", None)
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else ""
        if "not installed" in reason or "not found" in reason:
            reasons.add(reason.removeprefix("Skipped: "))
    if reasons:
        terminalreporter.write_sep("-", f"{len(reasons)} real reader(s) missing: their tests were skipped")
        for reason in sorted(reasons):
            terminalreporter.write_line(reason)
