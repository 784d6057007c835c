"""omniprof: one profiling API over many profilers.

This module only re-exports what every backend shares; see ``omniprof.core`` for the
implementation. Each backend's own helpers live in its public home: ``omniprof.cpu`` (the sample
buffer, Julia's ``Profile`` API, peek), ``omniprof.memory`` (allocation profiling, heap snapshots),
``omniprof.jax`` (``time``/``timed``/``profile`` of jax code, the profiler server). Their older
top-level spellings (``omniprof.time``, ``omniprof.sampler``, ``omniprof.allocs``, ...) still work
for one deprecation period, with a ``DeprecationWarning`` naming the new spelling.

Importing it imports no backend module and none of jax, torch, pynvml or xprof, and none of the
kernel either: each public name is imported on first use (PEP 562 ``__getattr__``), so
``import omniprof`` in a program that never profiles costs next to nothing. ``dir(omniprof)`` (and
tab completion) lists every public name.
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
    from omniprof.core.annotations import StepTraceAnnotation, annotate, annotate_function
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
    "load_config": ("omniprof.config", "load_config"),
    "RunConfig": ("omniprof.config", "RunConfig"),
    "diff": ("omniprof.analysis.diff", "diff"),
    "distributed": ("omniprof.core.distributed", None),
    # Each backend's own helpers, in their public homes (light modules: omniprof.jax imports no jax).
    "cpu": ("omniprof.cpu", None),
    "memory": ("omniprof.memory", None),
    "jax": ("omniprof.jax", None),
    "load_ipython_extension": ("omniprof.notebook", "load_ipython_extension"),  # %load_ext omniprof
    "view": ("omniprof.viewers", "view"),
}

#: Older top-level spellings, served for one deprecation period with a DeprecationWarning that names
#: the new spelling: (module, attribute or None for the module itself). Not in __all__ nor dir().
_DEPRECATED = {
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
    "TraceAnnotation": ("omniprof", "annotate"),  # was an alias: one name, one meaning
}

#: Subpackages reachable as attributes after a bare ``import omniprof`` (``omniprof.core.results``),
#: as when the kernel was imported eagerly.
_SUBMODULES = frozenset({"core", "analysis", "formats", "backends", "reporters", "config", "viewers", "cli",
                         "testing", "plugin", "runner", "errors", "notebook", "pytest_plugin"})


def _resolve(module: str, attr: str | None) -> object:
    """``module`` itself (``attr`` None) or its attribute ``attr``, the module imported now."""
    import importlib

    mod = importlib.import_module(module)
    return mod if attr is None else getattr(mod, attr)


def __getattr__(name: str) -> object:
    # Public names whose modules are imported on first use, so `import omniprof` stays light.
    if name in _LAZY:
        value = globals()[name] = _resolve(*_LAZY[name])
        if name == "Profiler":  # the library's front door hands the kernel its viewer (core never imports viewers)
            _resolve("omniprof.core.views", "set_default_viewer")(_resolve("omniprof.viewers", "open_views"))
        return value
    if name in _SUBMODULES:
        return _resolve(f"omniprof.{name}", None)
    if name in _DEPRECATED:  # never cached in globals(): each use warns (shown once per call site)
        import warnings

        module, attr = _DEPRECATED[name]
        new = module if attr is None else f"{module}.{attr}"
        warnings.warn(f"omniprof.{name} is deprecated and will be removed in a future release; use {new}",
                      DeprecationWarning, stacklevel=2)
        return _resolve(module, attr)
    raise AttributeError(f"module 'omniprof' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted((set(globals()) | set(_LAZY) | set(__all__)) - {"TYPE_CHECKING"})


__all__ = [
    "__version__",
    "Profiler", "ProfileOptions", "ProfileResult", "BackendResult", "load", "report",
    "Schedule", "schedule", "Action",
    "annotate", "annotate_function", "StepTraceAnnotation",
    "PluginInfo", "get_registry",
    "load_config", "RunConfig", "diff", "distributed", "view",
    "OmniprofError", "InvalidArgumentError", "ConfigError", "ProfilerStateError", "DistributedError", "PluginError",
    "PluginLoadError", "PluginValidationError", "BackendUnavailableError", "BackendError", "TraceReadError",
    "OutputError",
    "OmniprofWarning", "DataLossWarning",
    "cpu", "memory", "jax",
]
