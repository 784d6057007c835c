"""omniprof: one profiling API over many profilers.

This module only re-exports; see ``omniprof.core`` for the implementation. Importing it imports
no backend module and none of jax, torch, pynvml or xprof.
"""

from omniprof._version import __version__
from omniprof.core.annotations import StepTraceAnnotation, TraceAnnotation, annotate, annotate_function
from omniprof.core.options import ProfileOptions
from omniprof.core.profiler import Profiler
from omniprof.core.registry import PluginInfo, get_registry
from omniprof.core.reporting import report
from omniprof.core.results import BackendResult, ProfileResult, load
from omniprof.core.schedule import Action, Schedule, schedule
from omniprof.errors import (
    BackendError,
    BackendUnavailableError,
    ConfigError,
    DataLossWarning,
    InvalidArgumentError,
    OmniprofError,
    OmniprofWarning,
    PluginError,
    PluginLoadError,
    PluginValidationError,
    ProfilerStateError,
    TraceReadError,
)

__all__ = [
    "__version__",
    "Profiler", "ProfileOptions", "ProfileResult", "BackendResult", "load", "report",
    "Schedule", "schedule", "Action",
    "annotate", "annotate_function", "TraceAnnotation", "StepTraceAnnotation",
    "PluginInfo", "get_registry",
    "OmniprofError", "InvalidArgumentError", "ConfigError", "ProfilerStateError", "PluginError",
    "PluginLoadError", "PluginValidationError", "BackendUnavailableError", "BackendError", "TraceReadError",
    "OmniprofWarning", "DataLossWarning",
    "time", "timed", "profile", "start_server", "stop_server",
]

# jax-backed entry points, imported on first use so `import omniprof` never imports jax.
_LAZY = {
    "time": "omniprof.backends.xla.timing",
    "timed": "omniprof.backends.xla.timing",
    "profile": "omniprof.backends.xla.timing",
    "start_server": "omniprof.backends.xla.remote",
    "stop_server": "omniprof.backends.xla.remote",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'omniprof' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
