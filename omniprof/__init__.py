"""omniprof: one profiling API over many profilers.

This module only re-exports; see ``omniprof.core`` for the implementation. Importing it imports
no backend module and none of jax, torch, pynvml or xprof, and none of the kernel either: each
public name is imported on first use (PEP 562 ``__getattr__``), so ``import omniprof`` in a program
that never profiles costs next to nothing. ``dir(omniprof)`` (and tab completion) lists every name.
"""

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (type checkers know the name)

from omniprof._version import __version__
from omniprof.errors import (
    BackendError,
    BackendUnavailableError,
    ConfigError,
    DataLossWarning,
    DistributedError,
    InvalidArgumentError,
    OmniprofError,
    OmniprofWarning,
    OutputError,
    PluginError,
    PluginLoadError,
    PluginValidationError,
    ProfilerStateError,
    TraceReadError,
)

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time these come from __getattr__
    from omniprof.core.annotations import StepTraceAnnotation, TraceAnnotation, annotate, annotate_function
    from omniprof.core.options import ProfileOptions
    from omniprof.core.profiler import Profiler
    from omniprof.core.registry import PluginInfo, get_registry
    from omniprof.core.reporting import report
    from omniprof.core.results import BackendResult, ProfileResult, load
    from omniprof.core.schedule import Action, Schedule, schedule

_LAZY = {
    # The kernel's public names: imported on first use.
    "annotate": ("omniprof.core.annotations", "annotate"),
    "annotate_function": ("omniprof.core.annotations", "annotate_function"),
    "TraceAnnotation": ("omniprof.core.annotations", "TraceAnnotation"),
    "StepTraceAnnotation": ("omniprof.core.annotations", "StepTraceAnnotation"),
    "ProfileOptions": ("omniprof.core.options", "ProfileOptions"),
    "Profiler": ("omniprof.core.profiler", "Profiler"),
    "PluginInfo": ("omniprof.core.registry", "PluginInfo"),
    "get_registry": ("omniprof.core.registry", "get_registry"),
    "report": ("omniprof.core.reporting", "report"),
    "BackendResult": ("omniprof.core.results", "BackendResult"),
    "ProfileResult": ("omniprof.core.results", "ProfileResult"),
    "load": ("omniprof.core.results", "load"),
    "Action": ("omniprof.core.schedule", "Action"),
    "Schedule": ("omniprof.core.schedule", "Schedule"),
    "schedule": ("omniprof.core.schedule", "schedule"),
    # Each backend's own helpers, in their public homes (the names below them are older aliases).
    "cpu": ("omniprof.cpu", None),
    "memory": ("omniprof.memory", None),
    "jax": ("omniprof.jax", None),
    "allocs": ("omniprof.backends.memory.api", None),
    "take_heap_snapshot": ("omniprof.backends.memory.heapsnapshot", "take_heap_snapshot"),
    "assemble_snapshot": ("omniprof.backends.memory.heapsnapshot", "assemble_snapshot"),
    "load_config": ("omniprof.config", "load_config"),
    "RunConfig": ("omniprof.config", "RunConfig"),
    "diff": ("omniprof.analysis.diff", "diff"),
    "distributed": ("omniprof.core.distributed", None),
    # jax-backed entry points: `import omniprof` never imports jax.
    "time": ("omniprof.backends.xla.timing", "time"),
    "timed": ("omniprof.backends.xla.timing", "timed"),
    "profile": ("omniprof.backends.xla.timing", "profile"),
    "start_server": ("omniprof.backends.xla.remote", "start_server"),
    "stop_server": ("omniprof.backends.xla.remote", "stop_server"),
    "sampler": ("omniprof.backends.cpu.api", None),
    "enable_peek": ("omniprof.backends.cpu.api", "enable_peek"),
    "disable_peek": ("omniprof.backends.cpu.api", "disable_peek"),
    "set_peek_duration": ("omniprof.backends.cpu.api", "set_peek_duration"),
    "load_ipython_extension": ("omniprof.notebook", "load_ipython_extension"),  # %load_ext omniprof
    "view": ("omniprof.viewers", "view"),
}


#: Subpackages reachable as attributes after a bare ``import omniprof`` (``omniprof.core.results``),
#: as when the kernel was imported eagerly.
_SUBMODULES = frozenset({"core", "analysis", "formats", "backends", "reporters", "config", "viewers", "cli",
                         "testing", "plugin", "runner", "errors", "notebook", "pytest_plugin"})


def __getattr__(name: str) -> object:
    # Public names whose modules are imported on first use, so `import omniprof` stays light.
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        mod = importlib.import_module(module)
        value = mod if attr is None else getattr(mod, attr)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f"omniprof.{name}")
    raise AttributeError(f"module 'omniprof' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted((set(globals()) | set(_LAZY) | set(__all__)) - {"TYPE_CHECKING"})


__all__ = [
    "__version__",
    "Profiler", "ProfileOptions", "ProfileResult", "BackendResult", "load", "report",
    "Schedule", "schedule", "Action",
    "annotate", "annotate_function", "TraceAnnotation", "StepTraceAnnotation",
    "PluginInfo", "get_registry", "allocs", "take_heap_snapshot", "assemble_snapshot",
    "load_config", "RunConfig", "diff", "distributed",
    "OmniprofError", "InvalidArgumentError", "ConfigError", "ProfilerStateError", "DistributedError", "PluginError",
    "PluginLoadError", "PluginValidationError", "BackendUnavailableError", "BackendError", "TraceReadError",
    "OutputError",
    "OmniprofWarning", "DataLossWarning",
    "time", "timed", "profile", "start_server", "stop_server",
    "sampler", "enable_peek", "disable_peek", "set_peek_duration", "cpu", "memory", "jax", "view",
]
