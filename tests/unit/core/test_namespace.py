"""The top-level namespace holds what every backend shares; each backend's helpers live in their
public home (omniprof.cpu, .memory, .jax), and the older top-level spellings still work for one
deprecation period, warning with the new spelling."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings

import pytest

import omniprof

#: What every backend shares, written out here (not read from omniprof) so a stale or added name fails.
SHARED = {
    "__version__",
    "Profiler", "ProfileOptions", "ProfileResult", "BackendResult", "load", "report",
    "Schedule", "schedule", "Action",
    "annotate", "annotate_function", "StepTraceAnnotation",
    "PluginInfo", "get_registry", "load_config", "RunConfig", "diff", "distributed", "view",
    "OmniprofError", "InvalidArgumentError", "ConfigError", "ProfilerStateError", "DistributedError", "PluginError",
    "PluginLoadError", "PluginValidationError", "BackendUnavailableError", "BackendError", "TraceReadError",
    "OutputError", "OmniprofWarning", "DataLossWarning",
    "cpu", "memory", "jax",
}

#: old top-level name -> (module that is its new home, attribute there; None: the module itself)
DEPRECATED = {
    "time": ("omniprof.jax", "time"),
    "timed": ("omniprof.jax", "timed"),
    "profile": ("omniprof.jax", "profile"),
    "start_server": ("omniprof.jax", "start_server"),
    "stop_server": ("omniprof.jax", "stop_server"),
    "sampler": ("omniprof.cpu", None),
    "enable_peek": ("omniprof.cpu", "enable_peek"),
    "disable_peek": ("omniprof.cpu", "disable_peek"),
    "set_peek_duration": ("omniprof.cpu", "set_peek_duration"),
    "allocs": ("omniprof.memory", None),
    "take_heap_snapshot": ("omniprof.memory", "take_heap_snapshot"),
    "assemble_snapshot": ("omniprof.memory", "assemble_snapshot"),
    "TraceAnnotation": ("omniprof", "annotate"),
}


@pytest.mark.parametrize("old", sorted(DEPRECATED))
def test_old_name_warns_with_its_new_spelling_and_is_the_same_object(old):
    home, attr = DEPRECATED[old]
    new = home if attr is None else f"{home}.{attr}"
    with pytest.warns(DeprecationWarning) as records:
        first = getattr(omniprof, old)
        second = getattr(omniprof, old)  # never cached: every use warns, and dir() never lists it
    messages = [str(r.message) for r in records]
    assert messages == [f"omniprof.{old} is deprecated and will be removed in a future release; use {new}"] * 2
    assert {r.filename for r in records} == {__file__}  # points at the caller's line, not omniprof's
    expected = importlib.import_module(home) if attr is None else getattr(importlib.import_module(home), attr)
    assert first is second is expected
    assert old not in vars(omniprof) and old not in dir(omniprof) and old not in omniprof.__all__


def test_old_functions_are_the_objects_their_backends_define():
    """The homes re-export the backends' own functions; no wrapper sits between old and new names."""
    from omniprof.backends.cpu import api as cpu_api
    from omniprof.backends.memory import api as memory_api
    from omniprof.backends.xla import remote, timing
    from omniprof.core import annotations

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert omniprof.time is timing.time and omniprof.timed is timing.timed and omniprof.profile is timing.profile
        assert omniprof.start_server is remote.start_server and omniprof.stop_server is remote.stop_server
        assert omniprof.enable_peek is cpu_api.enable_peek and omniprof.set_peek_duration is cpu_api.set_peek_duration
        assert omniprof.take_heap_snapshot is memory_api.take_heap_snapshot
        assert omniprof.TraceAnnotation is annotations.annotate
        old_cpu, old_memory = omniprof.sampler, omniprof.allocs
    # The module aliases offer every public name the backend modules offered under them.
    assert [n for n in cpu_api.__all__ if getattr(old_cpu, n) is not getattr(cpu_api, n)] == []
    assert [n for n in memory_api.__all__ if getattr(old_memory, n) is not getattr(memory_api, n)] == []


def test_memory_home_reads_the_live_buffer_limit():
    """MAX_KEPT_ALLOCATIONS is read where init() sets it, never a copy taken at import."""
    before = omniprof.memory.init()
    try:
        assert omniprof.memory.init(1234) == 1234
        assert omniprof.memory.MAX_KEPT_ALLOCATIONS == 1234
    finally:
        omniprof.memory.init(before)
    assert omniprof.memory.MAX_KEPT_ALLOCATIONS == before


def test_from_import_of_an_old_name_warns_at_the_import_line():
    with pytest.warns(DeprecationWarning, match=r"^omniprof\.sampler is deprecated.*; use omniprof\.cpu$") as records:
        from omniprof import sampler
    assert sampler is omniprof.cpu
    assert {r.filename for r in records} == {__file__}


def test_profile_has_one_meaning_per_home():
    """omniprof.profile (jax) against omniprof.allocs.profile (memory) was one name, two meanings."""
    assert "profile" not in dir(omniprof) and "profile" not in omniprof.__all__
    assert omniprof.jax.profile is not omniprof.memory.profile
    assert omniprof.jax.profile.__module__ == "omniprof.backends.xla.timing"
    assert omniprof.memory.profile.__module__ == "omniprof.backends.memory.api"
    with pytest.warns(DeprecationWarning, match=r"use omniprof\.jax\.profile$"):
        assert omniprof.profile is omniprof.jax.profile


def test_old_names_import_no_framework():
    """In a fresh process, resolving every old name (as the new homes do) imports neither jax nor torch."""
    code = ("import sys, warnings, omniprof\n"
            f"names = {sorted(DEPRECATED)!r}\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    [getattr(omniprof, n) for n in names]\n"
            "print(len(caught), 'jax' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == [str(len(DEPRECATED)), "False", "False"]


def test_namespace_holds_only_shared_names_and_each_resolves():
    """In a fresh process: __all__ is the shared names, dir() adds only the IPython hook and the
    errors module that `import omniprof` loads; each name resolves without a warning, is its own
    object (no aliases) and says what it is in its docstring."""
    code = ("import warnings, omniprof\n"
            "warnings.simplefilter('error')\n"
            "public = sorted(n for n in dir(omniprof) if not n.startswith('_') or n == '__version__')\n"
            "values = [getattr(omniprof, n) for n in omniprof.__all__]\n"
            "print(' '.join(omniprof.__all__)); print(' '.join(public))\n"
            "print(len({id(v) for v in values}) == len(values))\n"
            "print(' '.join(n for n, v in zip(omniprof.__all__, values) if n != '__version__' and not v.__doc__))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    all_line, dir_line, distinct, undocumented = proc.stdout.split("\n")[:4]
    assert sorted(all_line.split()) == sorted(SHARED) and len(all_line.split()) == len(SHARED)
    assert set(dir_line.split()) == SHARED | {"load_ipython_extension", "errors"}
    assert distinct == "True" and undocumented == ""
    assert proc.stderr == ""
    assert SHARED.isdisjoint(DEPRECATED)

