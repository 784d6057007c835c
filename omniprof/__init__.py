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
    "sampler", "enable_peek", "disable_peek", "set_peek_duration",
]

_LAZY = {"sampler": None, "enable_peek": "enable_peek", "disable_peek": "disable_peek",
         "set_peek_duration": "set_peek_duration"}


def __getattr__(name: str) -> object:
    # ``omniprof.sampler`` (Julia's Profile API for the cpu backend) and peek, loaded on first use.
    if name in _LAZY:
        from omniprof.backends.cpu import api

        attr = _LAZY[name]
        return api if attr is None else getattr(api, attr)
    raise AttributeError(f"module 'omniprof' has no attribute {name!r}")
