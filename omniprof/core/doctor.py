"""``omniprof doctor``: what this machine can profile, and why not.

Reports the environment (Python, the platform, and what each backend says about the libraries it
uses: its ``environment()``, e.g. jax and its devices from ``xla``, the torch build from ``torch``),
each machine check a backend runs (its ``checks()``: cupti's GPU checks) with its fix, and every
registered backend's status from its own ``probe()`` and ``capabilities()``. It knows no backend or
framework by name and imports none: everything backend-specific comes through the registry.

Rows are found one at a time (:func:`doctor_rows`), so a caller can show each as soon as it is
known (the command line prints the first line at once, then each backend's rows as its probes
finish); :func:`run_doctor` collects them into plain data, :func:`format_doctor` formats it.
"""

from __future__ import annotations

import contextlib
import logging
import platform
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import attrs

__all__ = ["DoctorReport", "run_doctor", "doctor_rows", "format_doctor", "format_row", "environment_facts",
           "backend_capabilities", "backend_checks", "dist_version", "HEADINGS", "KEY_WIDTH"]

#: The report's sections, in order: (row kind, heading).
HEADINGS = (("environment", "Environment"), ("gpu", "NVIDIA GPU checks"), ("backend", "Backends"))
#: Width of the environment's key column (rows are printed as they come, before every key is known).
KEY_WIDTH = 24


@attrs.frozen
class DoctorReport:
    """Attributes: environment ((key, value) pairs), gpu (the backends' ``checks()`` rows), backends (``PluginInfo``),
    capabilities (backend name -> its ``Capability`` rows: what it can do on this machine)."""

    environment: tuple[tuple[str, str], ...]
    gpu: tuple[Any, ...]
    backends: tuple[Any, ...]
    capabilities: tuple[tuple[str, tuple[Any, ...]], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"environment": dict(self.environment), "gpu": [attrs.asdict(c) for c in self.gpu],
                "backends": [attrs.asdict(b) for b in self.backends],
                "capabilities": {name: [attrs.asdict(c) for c in caps] for name, caps in self.capabilities}}


def dist_version(name: str) -> str:
    """The installed version of distribution ``name``, or ``"not installed"``."""
    import importlib.metadata as md

    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "not installed"


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """A backend's probe without warnings or library chatter below ERROR on the terminal."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        root.setLevel(level)


def environment_facts() -> list[tuple[str, str]]:
    """The facts no backend is needed for: omniprof, Python, the platform (instant)."""
    from omniprof import __version__
    from omniprof.core.host import platform_string

    return [("omniprof", __version__), ("python", f"{platform.python_version()} ({sys.executable})"),
            ("platform", platform_string())]


def _usable(infos: Any) -> list[Any]:
    return [info for info in infos if info.status in ("ok", "unavailable")]


def backend_environment(registry: Any, info: Any, *, frameworks: bool) -> list[tuple[str, str]]:
    """``info``'s backend's ``environment()`` facts; one that raises gives a fact saying so."""
    try:
        with _quiet():
            facts = [(str(k), str(val)) for k, val in registry.backend(info.name).environment(frameworks=frameworks)]
    except Exception as e:  # a broken plugin is a fact to report, not a crash
        facts = [(f"{info.name}.environment()", f"raised {type(e).__name__}: {e}")]
    return facts


def _capabilities(registry: Any, info: Any) -> tuple[Any, ...]:
    from omniprof.core.backend import Capability

    try:
        with _quiet():
            caps = tuple(registry.backend(info.name).capabilities())
        if not all(isinstance(c, Capability) for c in caps):
            raise TypeError("capabilities() must return Capability rows")
    except Exception as e:
        caps = (Capability("capabilities()", False, f"raised {type(e).__name__}: {e}"),)
    return caps


def backend_capabilities(registry: Any, infos: Any) -> list[tuple[str, tuple[Any, ...]]]:
    """Each loadable backend's ``capabilities()``; one that raises gets a row saying so (never raises)."""
    return [(info.name, caps) for info in _usable(infos) if (caps := _capabilities(registry, info))]


def _checks(registry: Any, info: Any) -> list[Any]:
    try:
        with _quiet():
            return list(registry.backend(info.name).checks())
    except Exception as e:
        return [_FailedCheck(f"{info.name}.checks()", False, f"raised {type(e).__name__}: {e}",
                             "report this to the backend's authors")]


def backend_checks(registry: Any, infos: Any) -> list[Any]:
    """Every loadable backend's ``checks()`` rows, in registry order (a backend that raises gets a
    failed row naming it)."""
    return [c for info in _usable(infos) for c in _checks(registry, info)]


@attrs.frozen
class _FailedCheck:
    name: str
    ok: bool
    detail: str
    hint: str = ""


def doctor_rows(registry: Any = None, *, frameworks: bool = True,
                on_probe: Callable[[str], None] | None = None) -> Iterator[tuple[str, Any]]:
    """The report's rows as they are found: ``("environment", (key, value))``, ``("gpu", check)``,
    ``("backend", (info, capabilities))``, in that order. The first comes before any backend is
    loaded. ``on_probe(what)`` is called before each probe that may take a while (a backend's
    facts and capabilities, which may import its framework); ``frameworks=False`` imports none of
    them and lists no capabilities. Never raises for a broken plugin."""
    from omniprof.core.registry import get_registry

    for fact in environment_facts():
        yield "environment", fact
    reg = registry or get_registry()
    infos = reg.infos("backend")
    for info in _usable(infos):
        if on_probe is not None:
            on_probe(f"{info.name}: environment")
        for fact in backend_environment(reg, info, frameworks=frameworks):
            yield "environment", fact
    for info in _usable(infos):
        if on_probe is not None:
            on_probe(f"{info.name}: checks")
        for check in _checks(reg, info):
            yield "gpu", check
    usable = {info.name for info in _usable(infos)}
    for info in infos:
        caps: tuple[Any, ...] = ()
        if frameworks and info.name in usable:
            if on_probe is not None:
                on_probe(f"{info.name}: capabilities")
            caps = _capabilities(reg, info)
        yield "backend", (info, caps)


def run_doctor(registry: Any = None, *, frameworks: bool = True) -> DoctorReport:
    """Collect the environment, the GPU checks, each backend's status and, with ``frameworks``
    (it imports jax and torch), what each backend can do here. Never raises for a broken plugin."""
    env: list[tuple[str, str]] = []
    gpu: list[Any] = []
    backends: list[Any] = []
    caps: list[tuple[str, tuple[Any, ...]]] = []
    for kind, row in doctor_rows(registry, frameworks=frameworks):
        if kind == "environment":
            env.append(row)
        elif kind == "gpu":
            gpu.append(row)
        else:
            backends.append(row[0])
            if row[1]:
                caps.append((row[0].name, row[1]))
    return DoctorReport(tuple(env), tuple(gpu), tuple(backends), tuple(caps))


def format_row(kind: str, row: Any) -> list[str]:
    """The text lines of one row of :func:`doctor_rows`."""
    if kind == "environment":
        k, value = row
        return [f"  {k.ljust(KEY_WIDTH)}  {value}"]
    if kind == "gpu":
        lines = [f"  [{'ok' if row.ok else 'FAIL'}] {row.name}: {row.detail}"]
        if not row.ok and row.hint:
            lines.append(f"         fix: {row.hint}")
        return lines
    b, caps = row
    lines = [f"  {b.name}: {b.status}" + (f" - {b.summary}" if b.status == "ok" and b.summary else "")]
    if b.reason:
        lines.append(f"    why: {b.reason}")
    lines += [f"    [{'yes' if c.available else 'no '}] {c.feature}" + (f": {c.detail}" if c.detail else "")
              for c in caps]
    return lines


def format_lines(rows: Iterator[tuple[str, Any]]) -> Iterator[str]:
    """The report's text, line by line, as ``rows`` come (headings included, even of empty sections)."""
    order = [kind for kind, _ in HEADINGS]
    headings = dict(HEADINGS)
    at = -1
    for kind, row in rows:
        while at < order.index(kind):
            at += 1
            if at:
                yield ""
            yield headings[order[at]]
        yield from format_row(kind, row)
    while at < len(order) - 1:
        at += 1
        if at:
            yield ""
        yield headings[order[at]]


def _report_rows(report: DoctorReport) -> Iterator[tuple[str, Any]]:
    caps = dict(report.capabilities)
    for fact in report.environment:
        yield "environment", fact
    for check in report.gpu:
        yield "gpu", check
    for b in report.backends:
        yield "backend", (b, caps.get(b.name, ()))


def format_doctor(report: DoctorReport) -> str:
    return "\n".join(format_lines(_report_rows(report)))

