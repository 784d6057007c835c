"""``omniprof doctor``: what this machine can profile, and why not.

Reports the environment (Python, jax and its devices, the torch build, xprof, the NVIDIA
libraries), each machine check a backend runs (its ``checks()``: cupti's GPU checks) with its fix,
and every registered backend's status from its own ``probe()`` and ``capabilities()``. It knows no
backend by name: everything backend-specific comes through the registry. Builds plain data first
(:func:`run_doctor`), formats second (:func:`format_doctor`).
"""

from __future__ import annotations

import contextlib
import importlib.metadata as md
import logging
import os
import platform
import sys
import warnings
from typing import Any

import attrs

__all__ = ["DoctorReport", "run_doctor", "format_doctor", "environment_facts", "backend_capabilities"]


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


def _dist_version(name: str) -> str:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "not installed"


@contextlib.contextmanager
def _quiet() -> Any:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    loggers = [logging.getLogger(n) for n in ("jax", "jax._src.xla_bridge", "absl")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, lvl in zip(loggers, levels):
            lg.setLevel(lvl)


def environment_facts(*, frameworks: bool = True) -> list[tuple[str, str]]:
    """(key, value) facts. ``frameworks=False`` skips importing jax and torch (slow)."""
    from omniprof import __version__

    facts = [("omniprof", __version__), ("python", f"{platform.python_version()} ({sys.executable})"),
             ("platform", platform.platform())]
    if frameworks:
        try:
            with _quiet():
                import jax

                devs = jax.devices()
            facts.append(("jax", f"{jax.__version__}, jaxlib {_dist_version('jaxlib')}"))
            facts.append(("jax devices", ", ".join(f"{d.platform}:{d.id} ({d.device_kind})" for d in devs)))
        except Exception as e:  # a broken jax install is a fact to report, not a crash
            facts.append(("jax", f"unavailable ({type(e).__name__}: {e})"))
        try:
            with _quiet():
                import torch

                cuda = torch.version.cuda
                build = f"CUDA {cuda}" if cuda else ("ROCm " + str(torch.version.hip) if getattr(
                    torch.version, "hip", None) else "CPU-only")
                facts.append(("torch", f"{torch.__version__} ({build} build), cuda available: "
                                       f"{bool(torch.cuda.is_available())}"))
        except Exception as e:
            facts.append(("torch", f"unavailable ({type(e).__name__}: {e})"))
    else:
        facts.append(("jax", _dist_version("jax")))
        facts.append(("torch", _dist_version("torch")))
    facts.append(("xprof", _dist_version("xprof")))
    facts.append(("nvidia-ml-py", _dist_version("nvidia-ml-py")))
    facts.append(("cupti-python", _dist_version("cupti-python")))
    if _dist_version("pynvml") != "not installed":
        facts.append(("pynvml (deprecated shim)", _dist_version("pynvml") + "; uninstall it: nvidia-ml-py provides "
                                                                             "the pynvml module"))
    for var in ("CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "NVTX_INJECTION64_PATH"):
        if os.environ.get(var):
            facts.append((var, os.environ[var]))
    return facts


def backend_capabilities(registry: Any, infos: Any) -> list[tuple[str, tuple[Any, ...]]]:
    """Each loadable backend's ``capabilities()``; one that raises gets a row saying so (never raises)."""
    from omniprof.core.backend import Capability

    out = []
    for info in infos:
        if info.status not in ("ok", "unavailable"):
            continue
        try:
            with _quiet():
                caps = tuple(registry.backend(info.name).capabilities())
            if not all(isinstance(c, Capability) for c in caps):
                raise TypeError("capabilities() must return Capability rows")
        except Exception as e:
            caps = (Capability("capabilities()", False, f"raised {type(e).__name__}: {e}"),)
        if caps:
            out.append((info.name, caps))
    return out


def backend_checks(registry: Any, infos: Any) -> list[Any]:
    """Every loadable backend's ``checks()`` rows, in registry order (a backend that raises gets a
    failed row naming it)."""
    out: list[Any] = []
    for info in infos:
        if info.status not in ("ok", "unavailable"):
            continue
        try:
            out.extend(registry.backend(info.name).checks())
        except Exception as e:
            out.append(_FailedCheck(f"{info.name}.checks()", False, f"raised {type(e).__name__}: {e}",
                                    "report this to the backend's authors"))
    return out


@attrs.frozen
class _FailedCheck:
    name: str
    ok: bool
    detail: str
    hint: str = ""


def run_doctor(registry: Any = None, *, frameworks: bool = True) -> DoctorReport:
    """Collect the environment, the GPU checks, each backend's status and, with ``frameworks``
    (it imports jax and torch), what each backend can do here. Never raises for a broken plugin."""
    from omniprof.core.registry import get_registry

    reg = registry or get_registry()
    backends = reg.infos("backend")
    gpu = backend_checks(reg, backends)
    caps = backend_capabilities(reg, backends) if frameworks else []
    return DoctorReport(tuple(environment_facts(frameworks=frameworks)), tuple(gpu), tuple(backends), tuple(caps))


def format_doctor(report: DoctorReport) -> str:
    lines = ["Environment"]
    width = max((len(k) for k, _ in report.environment), default=0)
    lines += [f"  {k.ljust(width)}  {v}" for k, v in report.environment]
    lines += ["", "NVIDIA GPU checks"]
    for c in report.gpu:
        lines.append(f"  [{'ok' if c.ok else 'FAIL'}] {c.name}: {c.detail}")
        if not c.ok and c.hint:
            lines.append(f"         fix: {c.hint}")
    lines += ["", "Backends"]
    caps = dict(report.capabilities)
    for b in report.backends:
        lines.append(f"  {b.name}: {b.status}" + (f" - {b.summary}" if b.status == "ok" and b.summary else ""))
        if b.reason:
            lines.append(f"    why: {b.reason}")
        for c in caps.get(b.name, ()):
            lines.append(f"    [{'yes' if c.available else 'no '}] {c.feature}" + (f": {c.detail}" if c.detail else ""))
    return "\n".join(lines)
