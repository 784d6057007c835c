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
    "load_config", "RunConfig", "diff",
    "OmniprofError", "InvalidArgumentError", "ConfigError", "ProfilerStateError", "PluginError",
    "PluginLoadError", "PluginValidationError", "BackendUnavailableError", "BackendError", "TraceReadError",
    "OmniprofWarning", "DataLossWarning",
]

# Imported on first use, so `import omniprof` stays fast.
_LAZY = {"load_config": "omniprof.core.config", "RunConfig": "omniprof.core.config", "diff": "omniprof.core.diff"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'omniprof' has no attribute {name!r}")
