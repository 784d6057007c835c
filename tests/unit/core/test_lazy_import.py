"""`import omniprof` stays light: no backend module and none of jax, torch, pynvml, xprof."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("jax", "jaxlib", "torch", "pynvml", "xprof", "cupti", "tensorflow", "numpy")


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout


def test_import_omniprof_imports_nothing_heavy():
    """After `import omniprof`, sys.modules holds no heavy library and no backend module."""
    out = _run("import sys, omniprof; print('\\n'.join(sorted(sys.modules)))").split()
    heavy = [m for m in out if m.split(".")[0] in HEAVY]
    assert heavy == []
    assert not [m for m in out if m == "omniprof.backends" or m.startswith("omniprof.backends.")]


def test_importtime_lists_no_heavy_module():
    """python -X importtime -c 'import omniprof' lists none of the heavy libraries."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", "import omniprof"], capture_output=True, text=True,
                          check=True)
    names = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in proc.stderr.splitlines() if "|" in line}
    assert names.isdisjoint(HEAVY)


def test_plugins_listing_imports_no_framework():
    """Listing plugins (with probes) imports no framework: jax, torch, xprof stay unloaded.

    The cupti probe may load nvidia-ml-py's small ctypes module: asking NVML is how it knows."""
    out = _run("import sys, omniprof\n"
               "omniprof.get_registry().infos()\n"
               "print('\\n'.join(sorted(sys.modules)))").split()
    frameworks = {"jax", "jaxlib", "torch", "xprof", "tensorflow"}
    assert [m for m in out if m.split(".")[0] in frameworks] == []


def test_backend_homes_import_no_framework():
    """omniprof.cpu / .memory / .jax hold each backend's helpers; loading them imports neither jax
    nor torch (omniprof.jax.time imports jax when called)."""
    out = _run("import sys, omniprof\n"
               "omniprof.jax.time, omniprof.jax.start_server, omniprof.cpu.fetch, omniprof.memory.take_heap_snapshot\n"
               "print('jax' in sys.modules, 'torch' in sys.modules)")
    assert out.strip() == "False False"


#: Modules the kernel needs only for some calls: reading entry points, host names, temporary names,
#: logging, TOML, key suggestions, gzip, tracebacks. `import omniprof` (and loading the kernel's
#: classes) must not pay for them.
DEFERRED = ("importlib.metadata", "socket", "secrets", "email", "zipfile", "tempfile", "shutil", "logging",
            "tomllib", "difflib", "gzip", "traceback", "csv", "random", "hmac")


def _modules(code: str) -> set[str]:
    return set(_run(code + "\nimport sys; print('\\n'.join(sorted(sys.modules)))").split())


def test_import_omniprof_imports_no_deferred_module():
    """`import omniprof` imports none of DEFERRED, nor attrs or the kernel: its names load on first use."""
    out = _modules("import omniprof")
    assert [m for m in DEFERRED if m in out] == []
    assert "attrs" not in out and "omniprof.core.profiler" not in out


def test_loading_the_kernel_imports_no_deferred_module():
    """Touching the kernel's classes (Profiler, ProfileResult, ProfileOptions, annotate, report) still
    imports none of DEFERRED; importlib.metadata comes with the first plugin listing."""
    out = _modules("import omniprof\n"
                   "omniprof.Profiler, omniprof.ProfileResult, omniprof.ProfileOptions, omniprof.annotate, omniprof.report")
    assert "omniprof.core.profiler" in out
    assert [m for m in DEFERRED if m in out] == []
    assert "importlib.metadata" in _modules("import omniprof\nomniprof.get_registry().infos()")


def test_every_public_name_resolves_and_is_listed():
    """Every name of __all__ is an attribute (from omniprof import * too), dir() lists them all for
    tab completion, and a subpackage is reachable after a bare import."""
    out = _run("import omniprof\n"
               "missing = [n for n in omniprof.__all__ if getattr(omniprof, n, None) is None]\n"
               "unlisted = sorted(set(omniprof.__all__) - set(dir(omniprof)))\n"
               "ns = {}\nexec('from omniprof import *', ns)\n"
               "from omniprof.core.profiler import Profiler\n"
               "assert omniprof.Profiler is Profiler and ns['Profiler'] is Profiler\n"
               "assert omniprof.core.results.ProfileResult is omniprof.ProfileResult\n"
               "print(missing, unlisted, sorted(set(omniprof.__all__) - set(ns)))")
    assert out.strip() == "[] [] []"
